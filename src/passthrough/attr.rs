//! Attribute operations: getattr, setattr, readlink, statfs and access.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::api::filesystem::{Context, SetattrValid};

use super::handle::Handle;
use super::PassthroughFs;
use crate::sys::{self, cvt, errno};

impl PassthroughFs {
    /// The handle an attribute request names. Under `--no-open`, handle 0 is the node's
    /// fd if one is open (it names a file unlinked since), else none: the path fd serves
    /// without opening the file.
    fn attr_handle(&self, fh: Option<u64>, inode: u64) -> io::Result<Option<Arc<Handle>>> {
        match fh {
            None => Ok(None),
            Some(0) if self.cfg.no_open => Ok(self.node_handles.get(inode)),
            Some(fh) => self.handles.get(fh, inode).map(Some),
        }
    }

    pub(super) fn do_getattr(
        &self,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        let i = self.inode(inode)?;
        // Shared: a size change (exclusive) is never seen half done.
        let _g = i.is_reg().then(|| i.io.shared());
        let st = match self.attr_handle(handle, inode)? {
            Some(h) => sys::fstat(&h.fd)?,
            None => sys::fstat(&i.path_fd()?)?,
        };
        if i.is_reg() {
            i.io.measured(st.st_size as u64);
        }
        Ok((self.guest_attr(st), self.attr_timeout()))
    }

    pub(super) fn do_setattr(
        &self,
        inode: u64,
        attr: libc::stat64,
        handle: Option<u64>,
        valid: SetattrValid,
        kill: Option<u32>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.check_writable()?;
        // An explicit new mode in the same request wins over the privilege drop.
        // But not over a size change: without FUSE_HANDLE_KILLPRIV_V2 the guest kernel sends
        // its own idea of the mode with a truncate (it keeps S_ISGID without group-exec for
        // a non-member, where the host kernel drops it), so the drop follows the mode.
        let kill = kill
            .filter(|_| !valid.contains(SetattrValid::MODE) || valid.contains(SetattrValid::SIZE));
        let i = self.inode(inode)?;
        // Under --no-open an O_TRUNC open or ftruncate arrives as this, on handle 0: the
        // node's fd for writing serves it (kept for the writes that follow), taken before
        // anything changes so that a queue thread can still hand the request on whole if
        // the open would wait on a host lease.
        let h = match handle {
            Some(0) if self.cfg.no_open && valid.contains(SetattrValid::SIZE) && i.is_reg() => {
                Some(self.handle_for(0, inode, super::node_handle::Need::Write)?)
            }
            _ => self.attr_handle(handle, inode)?,
        };
        // A size change without a handle open for writing (the guest's O_TRUNC open and
        // truncate(2) come without one) goes through an fd opened for it, here, before
        // anything changes: the open waits for a host lease break as the host's O_TRUNC
        // open would, and a queue thread hands the request on whole rather than wait.
        let truncate_fd = match &h {
            Some(h) if h.flags & libc::O_ACCMODE != libc::O_RDONLY => None,
            _ if valid.contains(SetattrValid::SIZE) && i.is_reg() => {
                Some(self.reopen_to_open(&i, libc::O_WRONLY, super::nowait::open_wait_here())?)
            }
            _ => None,
        };
        // Held while the /proc name is in use: it names this fd. With a handle, its own fd
        // names the file (an open file unlinked since has no other way to be found).
        let path = match &h {
            Some(_) => None,
            None => Some(i.path_fd()?),
        };
        let pfd: std::os::fd::RawFd = match (&h, &path) {
            (Some(h), _) => h.fd.as_raw_fd(),
            (None, Some(p)) => p.as_raw_fd(),
            (None, None) => unreachable!("a node without a handle has its path fd"),
        };
        let proc_name = sys::fd_name(pfd);

        if valid.contains(SetattrValid::MODE) {
            // SAFETY: plain syscalls; the /proc name is resolved inside /proc/self/fd and names
            // exactly this inode.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::fchmod(h.fd.as_raw_fd(), attr.st_mode),
                    None if i.is_symlink() => return Err(errno(libc::EOPNOTSUPP)),
                    None => libc::fchmodat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_ptr(),
                        attr.st_mode,
                        0,
                    ),
                }
            })?;
        }

        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let ids = &self.cfg.id_translate;
            let uid = if valid.contains(SetattrValid::UID) {
                ids.uid.to_host(attr.st_uid)?
            } else {
                u32::MAX
            };
            let gid = if valid.contains(SetattrValid::GID) {
                ids.gid.to_host(attr.st_gid)?
            } else {
                u32::MAX
            };
            // SAFETY: AT_EMPTY_PATH makes this act on the O_PATH fd itself, never a path.
            cvt(unsafe {
                libc::fchownat(
                    pfd,
                    sys::EMPTY.as_ptr(),
                    uid,
                    gid,
                    libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
            if i.is_reg() {
                // As the host kernel drops a file capability on chown.
                let fd = self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK)?;
                super::killpriv::kill_mapped_capability(
                    fd.as_raw_fd(),
                    self.mapped_cap.as_deref(),
                )?;
            }
        }

        if valid.contains(SetattrValid::SIZE) {
            if !i.is_reg() {
                return Err(errno(if i.is_dir() {
                    libc::EISDIR
                } else {
                    libc::EINVAL
                }));
            }
            // A size change: exclusive against every in-EOF read and write.
            let g = i.io.exclusive();
            let _w = i.io.write_started(&g);
            let size = attr.st_size;
            let fd = match (&truncate_fd, &h) {
                (Some(fd), _) => fd.as_raw_fd(),
                (None, Some(h)) => h.fd.as_raw_fd(),
                (None, None) => unreachable!("a regular file's size change has its fd"),
            };
            if let Some(gid) = kill {
                super::killpriv::kill_suidgid(fd, gid, self.mapped_cap.as_deref())?;
            }
            // SAFETY: plain syscall on an fd we own.
            cvt(unsafe { libc::ftruncate64(fd, size) })?;
        }

        let times = SetattrValid::ATIME
            | SetattrValid::MTIME
            | SetattrValid::ATIME_NOW
            | SetattrValid::MTIME_NOW;
        // An O_TRUNC open or ftruncate asks for "mtime now" with the size, which the host's
        // ftruncate above has set, with ctime: setting one time alone would need ownership or
        // CAP_FOWNER, which writing the file does not.
        let set_by_truncate = valid.contains(SetattrValid::SIZE)
            && valid & times == SetattrValid::MTIME | SetattrValid::MTIME_NOW;
        if valid.intersects(times) && !set_by_truncate {
            let ts = |set: bool, now: bool, sec: i64, nsec: i64| libc::timespec {
                tv_sec: sec,
                tv_nsec: if now {
                    libc::UTIME_NOW
                } else if set {
                    nsec
                } else {
                    libc::UTIME_OMIT
                },
            };
            let times = [
                ts(
                    valid.contains(SetattrValid::ATIME),
                    valid.contains(SetattrValid::ATIME_NOW),
                    attr.st_atime,
                    attr.st_atime_nsec,
                ),
                ts(
                    valid.contains(SetattrValid::MTIME),
                    valid.contains(SetattrValid::MTIME_NOW),
                    attr.st_mtime,
                    attr.st_mtime_nsec,
                ),
            ];
            // SAFETY: `times` has the two entries utimensat reads; names are NUL-terminated.
            cvt(unsafe {
                match &h {
                    Some(h) => libc::futimens(h.fd.as_raw_fd(), times.as_ptr()),
                    None if i.is_symlink() => libc::utimensat(
                        pfd,
                        sys::EMPTY.as_ptr(),
                        times.as_ptr(),
                        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                    ),
                    None => libc::utimensat(
                        self.proc_self_fd.as_raw_fd(),
                        proc_name.as_ptr(),
                        times.as_ptr(),
                        0,
                    ),
                }
            })?;
        }

        self.do_getattr(inode, handle)
    }

    pub(super) fn do_readlink(&self, inode: u64) -> io::Result<Vec<u8>> {
        let i = self.inode(inode)?;
        if !i.is_symlink() {
            return Err(errno(libc::EINVAL));
        }
        // The empty name means the fd itself.
        sys::readlinkat(i.path_fd()?.as_raw_fd(), sys::EMPTY)
    }

    pub(super) fn do_statfs(&self, inode: u64) -> io::Result<libc::statvfs64> {
        let i = self.inode(inode)?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs64>::zeroed();
        // SAFETY: `st` is a writable statvfs64; fstatvfs works on O_PATH fds.
        cvt(unsafe { libc::fstatvfs64(i.path_fd()?.as_raw_fd(), st.as_mut_ptr()) })?;
        // SAFETY: initialised by the successful call above.
        Ok(unsafe { st.assume_init() })
    }

    /// ACCESS, checked against the host file's mode and owner as the guest caller.
    pub(super) fn do_access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        let i = self.inode(inode)?;
        // Owner and group as the guest caller knows them.
        let st = self.guest_attr(sys::fstat(&i.path_fd()?)?);
        let mask = mask as i32;
        if mask == libc::F_OK {
            return Ok(());
        }
        if mask & libc::W_OK != 0 && self.cfg.readonly {
            return Err(errno(libc::EROFS));
        }
        let mode = st.st_mode;
        if ctx.uid == 0 {
            // Root passes everything but execute of a file with no x bit at all.
            if mask & libc::X_OK != 0 && mode & 0o111 == 0 && mode & libc::S_IFMT != libc::S_IFDIR {
                return Err(errno(libc::EACCES));
            }
            return Ok(());
        }
        // A caller the guest does not name (FUSE_ALLOW_IDMAP's u32::MAX) owns nothing and
        // gets the others' bits; a virtio-fs guest mounts with default_permissions and checks
        // access itself, so it sends no ACCESS at all.
        let bits = if st.st_uid == ctx.uid {
            (mode >> 6) & 7
        } else if st.st_gid == ctx.gid {
            (mode >> 3) & 7
        } else {
            mode & 7
        } as i32;
        if mask & bits != mask {
            return Err(errno(libc::EACCES));
        }
        Ok(())
    }
}

impl PassthroughFs {
    /// FUSE_STATX: the host's statx of the node (or of the open handle `fh`), with the
    /// fields in `mask` the guest asked for (birth time among them) and ids as the guest
    /// sees them. `sync` is the guest's AT_STATX_* sync type.
    pub fn statx(
        &self,
        inode: u64,
        fh: Option<u64>,
        sync: i32,
        mask: u32,
    ) -> io::Result<(libc::statx, Duration)> {
        let i = self.inode(inode)?;
        let _g = i.is_reg().then(|| i.io.shared());
        let flags = libc::AT_EMPTY_PATH | (sync & libc::AT_STATX_SYNC_TYPE);
        let mask = mask | libc::STATX_BASIC_STATS;
        let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
        let mut run = |fd: i32| {
            // SAFETY: stx is a writable buffer of the right size; the path is empty and
            // NUL-terminated, so only `fd` is looked at.
            cvt(unsafe { libc::statx(fd, sys::EMPTY.as_ptr(), flags, mask, stx.as_mut_ptr()) })
        };
        match self.attr_handle(fh, inode)? {
            Some(h) => run(h.fd.as_raw_fd())?,
            None => run(i.path_fd()?.as_raw_fd())?,
        };
        // SAFETY: statx succeeded and filled the (zeroed) structure.
        let mut stx = unsafe { stx.assume_init() };
        let ids = &self.cfg.id_translate;
        stx.stx_uid = ids.uid.to_guest(stx.stx_uid);
        stx.stx_gid = ids.gid.to_guest(stx.stx_gid);
        Ok((stx, self.attr_timeout()))
    }
}
