//! Data operations: open, create, read, write, flush, fsync, fallocate, lseek and
//! copy_file_range. Reads and writes go straight between the host fd and guest memory
//! (preadv/pwritev on the virtqueue buffers) under the inode's I/O lock (see `lock`).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::{Context, Entry, OpenOptions, ZeroCopyWriter};

use super::handle::Handle;
use super::inode::Inode;
use super::killpriv;
use super::lock::IoGuard;
use super::node_handle::Need;
use super::nowait;
use super::PassthroughFs;
use crate::filesystem::{CreateExt, OpenWait};
use crate::sys::{self, cvt, errno};

impl PassthroughFs {
    /// Host open flags for guest open flags.
    pub(super) fn host_flags(&self, flags: u32) -> i32 {
        // O_PATH and O_TMPFILE's bit never reach OPEN or CREATE from a kernel (O_PATH
        // opens stay in the guest, O_TMPFILE is FUSE_TMPFILE); a guest that sends them
        // anyway must not get an O_PATH handle, or an O_EXCL create that opens an existing
        // file because O_PATH ignores O_CREAT and O_EXCL.
        const NEVER_SENT: i32 = libc::O_PATH | (libc::O_TMPFILE & !libc::O_DIRECTORY);
        let mut f = flags as i32 & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | NEVER_SENT);
        if !self.cfg.preserve_noatime {
            f &= !libc::O_NOATIME;
        }
        if !self.cfg.allow_direct_io {
            f &= !libc::O_DIRECT;
        }
        if self.writeback_enabled() {
            // With a writeback cache the guest reads pages it writes and does appends itself.
            if f & libc::O_ACCMODE == libc::O_WRONLY {
                f = (f & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            f &= !libc::O_APPEND;
        }
        f
    }

    pub(super) fn check_open_flags(&self, flags: i32) -> io::Result<()> {
        if self.cfg.readonly
            && (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0)
        {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }

    /// OPEN, and CREATE of a name that exists. `kill`: an O_TRUNC drops privileges too
    /// (see `killpriv`).
    pub(super) fn do_open(
        &self,
        inode: u64,
        flags: u32,
        kill: Option<u32>,
        wait: OpenWait,
    ) -> io::Result<(u64, OpenOptions)> {
        let i = self.inode(inode)?;
        let hflags = self.host_flags(flags);
        self.check_open_flags(hflags)?;
        if i.is_dir() {
            return Err(errno(libc::EISDIR));
        }
        let fd = if hflags & libc::O_TRUNC != 0 {
            self.open_truncating(&i, hflags, kill, wait)?
        } else {
            self.reopen_to_open(&i, hflags, wait)?
        };
        let opts = self.open_options_for(flags, &fd);
        let nowait = self.nowait_unsupported.worth_trying(i.key.mnt_id);
        let fh = self.handles.insert(Handle {
            inode: i,
            fd,
            flags: hflags,
            dir: None,
            nowait_reads: AtomicBool::new(nowait),
            flock: std::sync::atomic::AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: Default::default(),
        });
        Ok((fh, opts))
    }

    /// An O_TRUNC open. It changes the size, so it holds the inode's lock exclusively, like
    /// a truncating SETATTR. A worker waits for the lock and, under it, for a host lease
    /// break (the file's READs and WRITEs wait with it; tests/it/parallel_writes.rs relies
    /// on that to hold the lock). A queue thread waits for neither: it hands the open on.
    fn open_truncating(
        &self,
        i: &Arc<Inode>,
        hflags: i32,
        kill: Option<u32>,
        wait: OpenWait,
    ) -> io::Result<std::os::fd::OwnedFd> {
        let g = match wait {
            OpenWait::Allowed => i.io.exclusive(),
            // A worker holds it, maybe through a lease break: this one would wait too.
            OpenWait::Never => i.io.try_exclusive().ok_or_else(nowait::would_wait)?,
        };
        let _w = i.io.write_started(&g);
        let fd = self.reopen_to_open(i, hflags, wait)?;
        if let Some(gid) = kill {
            killpriv::kill_suidgid(fd.as_raw_fd(), gid, self.mapped_cap.as_deref())?;
        }
        Ok(fd)
    }

    /// `reopen` for an OPEN with `hflags`; under `OpenWait::Never` it fails with
    /// `nowait::would_wait()` rather than wait for a lease break (`nowait`). The
    /// O_NONBLOCK that asks for that is taken off the fd again: on a regular file it
    /// changes nothing else on Linux, but a FUSE host filesystem sees the flag in its
    /// requests, and the guest did not ask for it.
    pub(super) fn reopen_to_open(
        &self,
        i: &Arc<Inode>,
        hflags: i32,
        wait: OpenWait,
    ) -> io::Result<std::os::fd::OwnedFd> {
        if wait == OpenWait::Allowed || hflags & libc::O_NONBLOCK != 0 {
            return self.reopen(i, hflags);
        }
        match self.reopen(i, hflags | libc::O_NONBLOCK) {
            Ok(fd) => {
                // An O_TRUNC open has truncated by now: keep the fd whatever F_SETFL says.
                if let Err(e) = sys::clear_nonblock(fd.as_raw_fd()) {
                    log::warn!("an open file keeps O_NONBLOCK: {e}");
                }
                Ok(fd)
            }
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(nowait::would_wait()),
            Err(e) => Err(e),
        }
    }

    /// CREATE. The host file is created with O_EXCL, always. A name that exists (the
    /// guest's negative entry was stale: a host process or another guest made the file
    /// since) is answered ESTALE, not opened: the guest kernel would count such an open as
    /// a create and check nothing on the file (permissions, a program running from it), and
    /// on ESTALE it walks the path again with LOOKUP_REVAL, finds the file, and opens it
    /// with every check an open of an existing file gets. O_EXCL keeps EEXIST.
    pub(super) fn do_create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        flags: u32,
        mode: u32,
        ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        let p = self.create_parent(parent, name)?;
        let hflags = self.host_flags(flags) & !libc::O_TRUNC;
        // Taken before the credentials change: reopening a file handle needs
        // CAP_DAC_READ_SEARCH, which setfsuid to a non-root user drops.
        let pfd = p.path_fd()?;
        let created = {
            let _cred = self.creator(ctx, &ext.groups)?;
            self.with_fd_room(|| {
                sys::openat(
                    pfd.as_raw_fd(),
                    name,
                    hflags | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    mode & 0o7777,
                )
            })
        };
        match created {
            Ok(fd) => {
                if let Err(e) = self.label_created_file(fd.as_raw_fd(), ext.secctx.as_ref()) {
                    // SAFETY: NUL-terminated name relative to the parent's fd.
                    unsafe { libc::unlinkat(pfd.as_raw_fd(), name.as_ptr(), 0) };
                    return Err(e);
                }
                self.created(fd, hflags, flags, Some((&p, name)))
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST) && flags as i32 & libc::O_EXCL == 0 =>
            {
                Err(errno(libc::ESTALE))
            }
            Err(e) => Err(e),
        }
    }

    /// The node and handle of a file CREATE just made, open as `fd`.
    fn created(
        &self,
        fd: std::os::fd::OwnedFd,
        hflags: i32,
        flags: u32,
        name: Option<(&Arc<Inode>, &CStr)>,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        // Take the O_PATH fd from the opened file itself, so the entry is exactly the file
        // created even if the name changes meanwhile.
        let path_fd = self.with_fd_room(|| {
            sys::openat(
                self.proc_self_fd.as_raw_fd(),
                &sys::fd_name(fd.as_raw_fd()),
                libc::O_PATH,
                0,
            )
        })?;
        let st = sys::statx(path_fd.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH)?;
        let inode = self.inodes.lookup_insert(path_fd, &st, name)?;
        let entry = self.entry(&inode, st.st);
        if self.cfg.no_open {
            // An O_TMPFILE under --no-open (CREATE is refused there): no RELEASE will come,
            // so the fd is the node's own (`node_handle`), handle 0.
            let opts = self.open_options_for(flags, &fd);
            let nowait = self.nowait_unsupported.worth_trying(inode.key.mnt_id);
            self.node_handles.put(inode, fd, hflags, nowait);
            return Ok((entry, 0, opts));
        }
        let opts = self.open_options_for(flags, &fd);
        let nowait = self.nowait_unsupported.worth_trying(inode.key.mnt_id);
        let fh = self.handles.insert(Handle {
            inode,
            fd,
            flags: hflags,
            dir: None,
            nowait_reads: AtomicBool::new(nowait),
            flock: std::sync::atomic::AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: Default::default(),
        });
        Ok((entry, fh, opts))
    }

    pub(super) fn do_read(
        &self,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
    ) -> io::Result<usize> {
        let h = self.handle_for(handle, inode, Need::Read)?;
        let _g = h.inode.io.shared();
        sys::with_file(&h.fd, |f| w.write_from(f, size as usize, offset))
    }

    /// The rules around every write of `size` bytes at `offset`: the privilege drop, then
    /// the I/O lock (shared inside EOF, exclusive when extending or appending); through a
    /// node's fd, the sync its `guest_flags` (the WRITE's copy of the guest's open flags)
    /// ask for.
    #[allow(clippy::too_many_arguments)]
    fn write_locked(
        &self,
        inode: u64,
        handle: u64,
        offset: u64,
        size: usize,
        kill: Option<u32>,
        guest_flags: u32,
        write: impl FnOnce(&Handle) -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.check_writable()?;
        let h = self.handle_for(handle, inode, Need::Write)?;
        if let Some(gid) = kill {
            killpriv::kill_suidgid(h.fd.as_raw_fd(), gid, self.mapped_cap.as_deref())?;
        }
        let end = offset
            .checked_add(size as u64)
            .ok_or_else(|| errno(libc::EFBIG))?;
        let guard = write_guard(&h, end)?;
        let _in_flight = h.inode.io.write_started(&guard);
        let n = write(&h)?;
        // An append lands at the host's end, not at `offset`.
        if !h.is_append() {
            h.inode.io.reached(offset + n as u64);
        }
        if handle == 0 && self.cfg.no_open {
            sync_node_write(&h, guest_flags)?;
        }
        Ok(n)
    }

    /// A WRITE of the guest's buffers `iov` to handle `fh` of node `nodeid` (vfsd's own
    /// WRITE path, `server::data`). `kill`: see `killpriv`.
    ///
    /// # Safety
    /// Every iovec must describe readable memory that stays mapped for the whole call.
    pub unsafe fn write_iov(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        iov: &[libc::iovec],
        kill: Option<u32>,
        guest_flags: u32,
    ) -> io::Result<usize> {
        let size = iov.iter().map(|v| v.iov_len).sum();
        self.write_locked(nodeid, fh, offset, size, kill, guest_flags, |h| {
            let off = libc::off64_t::try_from(offset).map_err(|_| errno(libc::EFBIG))?;
            let cnt = libc::c_int::try_from(iov.len()).map_err(|_| errno(libc::EINVAL))?;
            // SAFETY: the caller vouches for the buffers; pwritev only reads them.
            let n = cvt(unsafe { libc::pwritev64(h.fd.as_raw_fd(), iov.as_ptr(), cnt, off) })?;
            Ok(n as usize)
        })
    }

    pub(super) fn do_flush(&self, inode: u64, handle: u64) -> io::Result<()> {
        Self::close_dup(&*self.handles.get(handle, inode)?)
    }

    /// Closing a duplicate gives the host filesystem the close() the guest just did (NFS
    /// and FUSE hosts flush on it) while the handle stays open.
    pub(super) fn close_dup(h: &Handle) -> io::Result<()> {
        // SAFETY: dup of an fd we own; the new fd is closed right away.
        let fd = cvt(unsafe { libc::dup(h.fd.as_raw_fd()) })?;
        // SAFETY: `fd` is ours and used nowhere else.
        cvt(unsafe { libc::close(fd) })?;
        Ok(())
    }

    pub(super) fn do_fsync(&self, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        let h = self.handle(handle, inode)?;
        if handle == 0 && self.cfg.no_open && h.flags & libc::O_ACCMODE != libc::O_RDONLY {
            // Part of the guest's writing: the node's fd for writing stays for the next
            // write rather than be opened again.
            self.node_handles.wrote(&h);
        }
        let fd = h.fd.as_raw_fd();
        // SAFETY: plain syscalls on an fd we own.
        cvt(unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        })?;
        Ok(())
    }

    pub(super) fn do_fallocate(
        &self,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
        kill: Option<u32>,
    ) -> io::Result<()> {
        self.check_writable()?;
        let h = self.handle_for(handle, inode, Need::Write)?;
        if let Some(gid) = kill {
            killpriv::kill_suidgid(h.fd.as_raw_fd(), gid, self.mapped_cap.as_deref())?;
        }
        let g = h.inode.io.exclusive();
        let _w = h.inode.io.write_started(&g);
        // SAFETY: plain syscall on an fd we own; the kernel validates mode and range.
        cvt(unsafe {
            libc::fallocate64(h.fd.as_raw_fd(), mode as i32, offset as i64, length as i64)
        })?;
        Ok(())
    }

    pub(super) fn do_lseek(
        &self,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        let h = self.handle(handle, inode)?;
        let _g = h.inode.io.shared();
        // SAFETY: plain syscall on an fd we own. Only SEEK_DATA/SEEK_HOLE reach the daemon;
        // a position change does not matter since file I/O is positional.
        let r = cvt(unsafe { libc::lseek64(h.fd.as_raw_fd(), offset as i64, whence as i32) })?;
        Ok(r as u64)
    }

    /// COPY_FILE_RANGE (`kill`: `kill_privs` for its caller): the source under its shared lock, the
    /// destination exclusive.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        kill: Option<u32>,
        inode_in: u64,
        fh_in: u64,
        off_in: u64,
        inode_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> io::Result<usize> {
        self.check_writable()?;
        if flags != 0 {
            return Err(errno(libc::EINVAL));
        }
        let hin = self.handle_for(fh_in, inode_in, Need::Read)?;
        let hout = self.handle_for(fh_out, inode_out, Need::Write)?;
        if hout.flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(errno(libc::EBADF));
        }
        if let Some(gid) = kill {
            killpriv::kill_suidgid(hout.fd.as_raw_fd(), gid, self.mapped_cap.as_deref())?;
        }
        // The I/O lock belongs to the host file, so two nodes (a bind mount, a node
        // forgotten and looked up again) may share one: then it is taken once. Two locks
        // are taken in one order, by their address (stable while held), so copies in
        // opposite directions can't deadlock (found by the fuzz harness).
        let (lin, lout) = (&hin.inode.io, &hout.inode.io);
        let (gout, _gin) = if Arc::ptr_eq(lin, lout) {
            (hout.inode.io.exclusive(), None)
        } else if Arc::as_ptr(lin) < Arc::as_ptr(lout) {
            let gin = hin.inode.io.shared();
            (hout.inode.io.exclusive(), Some(gin))
        } else {
            let gout = hout.inode.io.exclusive();
            (gout, Some(hin.inode.io.shared()))
        };
        let _w = hout.inode.io.write_started(&gout);
        let mut oin = off_in as i64;
        let mut oout = off_out as i64;
        // SAFETY: both offsets point at live locals; the fds are ours.
        let n = cvt(unsafe {
            libc::copy_file_range(
                hin.fd.as_raw_fd(),
                &mut oin,
                hout.fd.as_raw_fd(),
                &mut oout,
                len.min(isize::MAX as u64) as usize,
                0,
            )
        })?;
        Ok(n as usize)
    }

    /// SYNCFS: flush the filesystem holding the share.
    pub fn syncfs(&self, inode: u64) -> io::Result<()> {
        let i = self.inode(inode)?;
        let fd = if i.is_dir() || i.is_reg() {
            self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK)?
        } else {
            self.reopen(
                &self.inode(fuse_backend_rs::api::filesystem::ROOT_ID)?,
                libc::O_RDONLY,
            )?
        };
        // SAFETY: plain syscall on an fd we own.
        cvt(unsafe { libc::syncfs(fd.as_raw_fd()) })?;
        Ok(())
    }
}

/// Takes the lock a write ending at `end` needs: shared if it stays inside the host file's
/// current size, exclusive if it extends it or appends. The size is read under the lock.
fn write_guard(h: &Handle, end: u64) -> io::Result<IoGuard<'_>> {
    let inode: &Inode = &h.inode;
    if h.is_append() {
        return Ok(inode.io.exclusive());
    }
    let g = inode.io.shared();
    if inode.io.known_to_reach(end) {
        return Ok(g);
    }
    inode.io.size_checked();
    let size = sys::file_size(&h.fd)?;
    inode.io.reached(size);
    if end <= size {
        return Ok(g);
    }
    drop(g);
    Ok(inode.io.exclusive())
}

/// The no-wait rules around one read of `size` bytes: Some only for a whole read done
/// without waiting for the disk or for the inode's I/O lock.
fn nowait_read(
    h: &Handle,
    size: usize,
    unsupported: &nowait::Unsupported,
    read: impl FnOnce(std::os::fd::RawFd) -> io::Result<usize>,
) -> Option<usize> {
    // O_DIRECT reads always wait for the device, RWF_NOWAIT or not.
    if h.flags & libc::O_DIRECT != 0 || !h.nowait_reads.load(Ordering::Relaxed) {
        return None;
    }
    let _g = h.inode.io.try_shared()?;
    match read(h.fd.as_raw_fd()) {
        Ok(n) if n == size => Some(n),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            // This host filesystem has no RWF_NOWAIT: stop trying on this handle, and on
            // every handle opened on it from now on.
            h.nowait_reads.store(false, Ordering::Relaxed);
            unsupported.record(h.inode.key.mnt_id);
            None
        }
        _ => None,
    }
}

impl PassthroughFs {
    /// A READ of handle `fh` of node `nodeid` into `iov` (the guest's reply buffers, as
    /// many bytes as the request asked for) if it can be done without blocking; None if
    /// not, having changed nothing the guest can see as a reply.
    ///
    /// # Safety
    /// Every iovec must describe writable memory that stays mapped for the whole call.
    pub unsafe fn read_nowait(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        iov: &[libc::iovec],
    ) -> Option<usize> {
        let h = self.open_handle(fh, nodeid)?;
        let size = iov.iter().map(|v| v.iov_len).sum();
        // SAFETY: the caller vouches for the iovecs.
        nowait_read(&h, size, &self.nowait_unsupported, |fd| unsafe {
            nowait::preadv2(fd, iov, offset)
        })
    }
}

impl PassthroughFs {
    /// FUSE_TMPFILE: an unnamed regular file in directory `parent` (the host's O_TMPFILE),
    /// open as the reply's handle. A later LINK gives it a name unless the guest asked
    /// for O_EXCL, as on a local filesystem.
    pub fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        flags: u32,
        mode: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        self.check_writable()?;
        let p = self.inode(parent)?;
        if !p.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let mode = self.creation_mode(parent, mode, umask)?;
        // The guest's O_TMPFILE carries O_DIRECTORY; vfsd adds its own.
        let guest = flags as i32 & !(libc::O_TMPFILE | libc::O_TRUNC);
        let mut hflags = self.host_flags(guest as u32);
        if hflags & libc::O_ACCMODE == libc::O_RDONLY {
            // The kernel refuses a read-only O_TMPFILE before asking.
            return Err(errno(libc::EINVAL));
        }
        if self.cfg.no_open {
            // The node's own fd (`node_handle`) serves every access.
            hflags = libc::O_RDWR;
        }
        hflags |= guest & libc::O_EXCL;
        let pfd = p.path_fd()?;
        let fd = {
            let _cred = self.creator(ctx, &ext.groups)?;
            sys::openat(
                pfd.as_raw_fd(),
                c".",
                hflags | libc::O_TMPFILE,
                mode & 0o7777,
            )?
        };
        self.label_created_file(fd.as_raw_fd(), ext.secctx.as_ref())?;
        // No name: its node keeps its fd (nothing else finds it) until a LINK names it.
        self.created(
            fd,
            hflags & !libc::O_EXCL,
            flags & !(libc::O_TMPFILE as u32),
            None,
        )
    }
}

/// After a WRITE through a node's own fd (`node_handle`), which has no open flags of the
/// guest's: the O_DSYNC or O_SYNC the write's flags carry, on the fd written through.
fn sync_node_write(h: &Handle, guest_flags: u32) -> io::Result<()> {
    let f = guest_flags as i32;
    if f & libc::O_DSYNC == 0 {
        return Ok(());
    }
    let fd = h.fd.as_raw_fd();
    // SAFETY: plain syscalls on an fd we own.
    cvt(unsafe {
        if f & libc::O_SYNC == libc::O_SYNC {
            libc::fsync(fd)
        } else {
            libc::fdatasync(fd)
        }
    })?;
    Ok(())
}
