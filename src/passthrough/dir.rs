//! Name operations: lookup, creating and removing names, rename, link and readdir.
//!
//! Confinement: every name is one component (no `/`, no NUL: the FUSE layer splits on NUL),
//! resolved with `*at()` relative to the parent's O_PATH fd and O_NOFOLLOW, so a host
//! symlink is never followed; `..` of the share's root is the root itself.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::{Context, DirEntry, Entry, OpenOptions, ROOT_ID};

use super::handle::Handle;
use super::{CachePolicy, Inode, PassthroughFs};
use crate::filesystem::CreateExt;
use crate::sys::{self, cvt, errno};

/// FUSE_ATTR_SUBMOUNT (FUSE 7.31): this directory is the root of another mount.
const FUSE_ATTR_SUBMOUNT: u32 = 1;

impl PassthroughFs {
    /// The directory `parent`, checked for a lookup of `name` in it.
    fn parent_dir(&self, parent: u64, name: &CStr) -> io::Result<Arc<Inode>> {
        sys::check_name(name)?;
        let p = self.inode(parent)?;
        if !p.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(p)
    }

    /// `name` in the directory `pfd` as an O_PATH fd, without following symlinks.
    fn open_name(&self, pfd: RawFd, name: &CStr) -> io::Result<OwnedFd> {
        self.with_fd_room(|| sys::openat(pfd, name, libc::O_PATH | libc::O_NOFOLLOW, 0))
    }

    /// Resolves `name` in `parent` to an O_PATH fd without following symlinks.
    fn open_child(&self, parent: u64, name: &CStr) -> io::Result<(Arc<Inode>, OwnedFd)> {
        let p = self.parent_dir(parent, name)?;
        let name = if parent == ROOT_ID && name.to_bytes() == b".." {
            c"."
        } else {
            name
        };
        let fd = self.open_name(p.path_fd()?.as_raw_fd(), name)?;
        Ok((p, fd))
    }

    /// LOOKUP. A name of a file the guest knows already, whose node holds its fd, is
    /// found by one statx, with nothing opened and closed again (`lookup_known`); a name
    /// that is not there costs that one call too.
    pub(super) fn lookup_name(&self, parent: u64, name: &CStr) -> io::Result<Entry> {
        if sys::is_dot_or_dotdot(name) {
            return self.do_lookup(parent, name);
        }
        let p = self.parent_dir(parent, name)?;
        let pfd = p.path_fd()?;
        // As the O_PATH open would: no symlink followed, no automount triggered.
        let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT;
        let st = sys::statx(pfd.as_raw_fd(), name, flags)?;
        match self.inodes.lookup_known(&st, Some((&p, name))) {
            Some(inode) => Ok(self.entry_in(&p, name, &inode, st)),
            None => {
                let fd = self.open_name(pfd.as_raw_fd(), name)?;
                self.lookup_opened(&p, name, fd)
            }
        }
    }

    /// Looks `name` up by opening it (a name just created, or `.` and `..`).
    pub(super) fn do_lookup(&self, parent: u64, name: &CStr) -> io::Result<Entry> {
        let (p, fd) = self.open_child(parent, name)?;
        self.lookup_opened(&p, name, fd)
    }

    /// The entry of `name` in `p`, opened as `fd`: a known node or a new one.
    fn lookup_opened(&self, p: &Arc<Inode>, name: &CStr, fd: OwnedFd) -> io::Result<Entry> {
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        // `..` and `.` are not names a node can be found by again.
        let seen = (!sys::is_dot_or_dotdot(name)).then_some((p, name));
        let inode = self.inodes.lookup_insert(fd, &st, seen)?;
        Ok(self.entry_in(p, name, &inode, st))
    }

    /// The entry of `inode`, found as `name` in `p`.
    fn entry_in(&self, p: &Inode, name: &CStr, inode: &Arc<Inode>, st: sys::StatX) -> Entry {
        let mut e = self.entry(inode, st.st);
        // A directory on another mount than its parent: with --announce-submounts the guest
        // mounts it separately, with its own st_dev, so inode numbers of different host
        // filesystems never meet in one guest filesystem.
        if self.enabled(crate::abi::flags::SUBMOUNTS)
            && !sys::is_dot_or_dotdot(name)
            && inode.is_dir()
            && (inode.key.dev != p.key.dev || inode.key.mnt_id != p.key.mnt_id)
        {
            e.attr_flags |= FUSE_ATTR_SUBMOUNT;
        }
        e
    }

    /// Parent inode for creating `name` in it, after the checks every create shares.
    ///
    /// Callers take the parent's `path_fd` before switching to the guest caller's
    /// credentials: reopening a file handle needs CAP_DAC_READ_SEARCH, which setfsuid to a
    /// non-root user drops.
    pub(super) fn create_parent(
        &self,
        parent: u64,
        name: &CStr,
    ) -> io::Result<std::sync::Arc<super::Inode>> {
        self.check_writable()?;
        sys::check_name(name)?;
        if sys::is_dot_or_dotdot(name) {
            return Err(errno(libc::EEXIST));
        }
        let p = self.inode(parent)?;
        if !p.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        Ok(p)
    }

    pub(super) fn do_symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        let p = self.create_parent(parent, name)?;
        let pfd = p.path_fd()?;
        {
            let _cred = self.creator(ctx, &ext.groups)?;
            // SAFETY: both strings are NUL-terminated; the link target is stored, not followed.
            cvt(unsafe { libc::symlinkat(linkname.as_ptr(), pfd.as_raw_fd(), name.as_ptr()) })?;
        }
        self.label_new(pfd.as_raw_fd(), name, false, ext.secctx.as_ref())?;
        self.do_lookup(parent, name)
    }

    pub(super) fn do_mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        let p = self.create_parent(parent, name)?;
        let pfd = p.path_fd()?;
        {
            let _cred = self.creator(ctx, &ext.groups)?;
            // SAFETY: `name` is NUL-terminated and relative to the parent's fd.
            cvt(unsafe {
                libc::mknodat(pfd.as_raw_fd(), name.as_ptr(), mode, rdev as libc::dev_t)
            })?;
        }
        self.label_new(pfd.as_raw_fd(), name, false, ext.secctx.as_ref())?;
        self.do_lookup(parent, name)
    }

    pub(super) fn do_mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        let p = self.create_parent(parent, name)?;
        let pfd = p.path_fd()?;
        {
            let _cred = self.creator(ctx, &ext.groups)?;
            // SAFETY: `name` is NUL-terminated and relative to the parent's fd.
            cvt(unsafe { libc::mkdirat(pfd.as_raw_fd(), name.as_ptr(), mode) })?;
        }
        self.label_new(pfd.as_raw_fd(), name, true, ext.secctx.as_ref())?;
        self.do_lookup(parent, name)
    }

    pub(super) fn do_unlink(&self, parent: u64, name: &CStr, flags: i32) -> io::Result<()> {
        self.check_writable()?;
        sys::check_name(name)?;
        if sys::is_dot_or_dotdot(name) {
            return Err(errno(if name.to_bytes() == b"." {
                libc::EINVAL
            } else {
                libc::ENOTEMPTY
            }));
        }
        let p = self.inode(parent)?;
        let pfd = p.path_fd()?;
        let victim = self.known_at(&pfd, name).filter(|v| v.is_at(&p, name));
        if let Some(v) = &victim {
            v.hold_for_name_change();
        }
        // SAFETY: `name` is NUL-terminated and relative to the parent's fd.
        let r = cvt(unsafe { libc::unlinkat(pfd.as_raw_fd(), name.as_ptr(), flags) });
        if let Some(v) = &victim {
            match r {
                Ok(_) => v.name_gone(),
                Err(_) => v.name_kept(),
            }
        }
        r.map(drop)
    }

    /// The known node of `name` in the directory `dir`, if any (before a rename or an
    /// unlink moves or removes the name it is found by).
    fn known_at(&self, dir: &impl AsRawFd, name: &CStr) -> Option<Arc<Inode>> {
        let st = sys::statx(dir.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW).ok()?;
        self.inodes.by_key(&st)
    }

    pub(super) fn do_rename(
        &self,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.check_writable()?;
        sys::check_name(oldname)?;
        sys::check_name(newname)?;
        if sys::is_dot_or_dotdot(oldname) || sys::is_dot_or_dotdot(newname) {
            return Err(errno(libc::EBUSY));
        }
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 {
            return Err(errno(libc::EINVAL));
        }
        let od = self.inode(olddir)?;
        let nd = self.inode(newdir)?;
        let (ofd, nfd) = (od.path_fd()?, nd.path_fd()?);
        let moved = self.known_at(&ofd, oldname);
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        // A node found by the name renamed over loses it: it keeps its fd first.
        let replaced = self.known_at(&nfd, newname).filter(|t| {
            !moved.as_ref().is_some_and(|m| Arc::ptr_eq(m, t))
                && (exchange || t.is_at(&nd, newname))
        });
        if let Some(t) = replaced.as_ref().filter(|_| !exchange) {
            t.hold_for_name_change();
        }
        // SAFETY: names are NUL-terminated and relative to their parents' fds.
        let r = cvt(unsafe {
            libc::renameat2(
                ofd.as_raw_fd(),
                oldname.as_ptr(),
                nfd.as_raw_fd(),
                newname.as_ptr(),
                flags,
            )
        });
        if let Err(e) = r {
            if let Some(t) = replaced.as_ref().filter(|_| !exchange) {
                t.name_kept();
            }
            return Err(e);
        }
        // The nodes' names move with their files.
        if let Some(t) = &replaced {
            if exchange {
                t.seen_at(&od, oldname);
            } else {
                t.name_gone();
            }
        }
        if let Some(m) = &moved {
            m.seen_at(&nd, newname);
        }
        Ok(())
    }

    pub(super) fn do_link(&self, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        let p = self.create_parent(newparent, newname)?;
        let i = self.inode(inode)?;
        if i.is_dir() {
            return Err(errno(libc::EPERM));
        }
        // Linking through /proc/self/fd/N names exactly this inode and needs no
        // CAP_DAC_READ_SEARCH (which AT_EMPTY_PATH would).
        let ipfd = i.path_fd()?;
        let src = sys::fd_name(ipfd.as_raw_fd());
        // SAFETY: names are NUL-terminated; the source is resolved inside /proc/self/fd.
        cvt(unsafe {
            libc::linkat(
                self.proc_self_fd.as_raw_fd(),
                src.as_ptr(),
                p.path_fd()?.as_raw_fd(),
                newname.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        self.do_lookup(newparent, newname)
    }

    pub(super) fn do_opendir(&self, inode: u64, _flags: u32) -> io::Result<(u64, OpenOptions)> {
        let i = self.inode(inode)?;
        if !i.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let fd = self.reopen(&i, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let fh = self.handles.insert(Handle {
            inode: i,
            fd,
            flags: libc::O_RDONLY | libc::O_DIRECTORY,
            dir: Some(Default::default()),
            nowait_reads: Default::default(),
            flock: std::sync::atomic::AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: Default::default(),
        });
        // As virtiofsd: where the guest caches metadata, it keeps a directory's entries
        // across opens too (without KEEP_CACHE its kernel drops them at every open).
        let opts = match self.cfg.cache {
            CachePolicy::Always | CachePolicy::Metadata => {
                OpenOptions::CACHE_DIR | OpenOptions::KEEP_CACHE
            }
            CachePolicy::Auto | CachePolicy::Never => OpenOptions::empty(),
        };
        Ok((fh, opts))
    }

    /// READDIR and READDIRPLUS. Entries are read with getdents64 from the guest's offset;
    /// entries that did not fit are read again on the next call (the offset says where).
    pub(super) fn do_readdir(
        &self,
        inode: u64,
        handle: u64,
        size: u32,
        offset: u64,
        add: &mut dyn FnMut(DirEntry, Option<Entry>) -> io::Result<usize>,
        plus: bool,
    ) -> io::Result<()> {
        let h = self.handles.get(handle, inode)?;
        let Some(dir) = &h.dir else {
            return Err(errno(libc::ENOTDIR));
        };
        // The fd's position is shared state: one READDIR per handle at a time.
        let _pos = dir.lock().unwrap();
        let fd = h.fd.as_raw_fd();
        // SAFETY: lseek on an fd we own.
        cvt(unsafe { libc::lseek64(fd, offset as i64, libc::SEEK_SET) })?;
        let mut buf = vec![0u8; (size as usize).clamp(1024, 1 << 17)];
        let mut added = false;
        loop {
            // SAFETY: the kernel writes at most buf.len() bytes into buf.
            let n = match cvt(unsafe {
                libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len())
            }) {
                Ok(n) => n as usize,
                // As below: keep what was already added.
                Err(_) if added => return Ok(()),
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(());
            }
            let mut pos = 0;
            while pos + 19 <= n {
                let rec = &buf[pos..n];
                let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap());
                let off = i64::from_ne_bytes(rec[8..16].try_into().unwrap()) as u64;
                let reclen = u16::from_ne_bytes(rec[16..18].try_into().unwrap()) as usize;
                let dtype = rec[18];
                if reclen < 19 || reclen > rec.len() {
                    return Err(errno(libc::EIO));
                }
                let name_bytes = &rec[19..reclen];
                let name_len = name_bytes
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name_bytes.len());
                let name = &name_bytes[..name_len];
                pos += reclen;
                let dirent = DirEntry {
                    ino,
                    offset: off,
                    type_: dtype as u32,
                    name,
                };
                let entry = if plus && name != b"." && name != b".." {
                    // A name whose lookup fails (gone since getdents, a mount without file
                    // handles, ...) stays in the listing as a plain entry (node id 0): the
                    // guest looks it up itself and gets the error then.
                    std::ffi::CString::new(name)
                        .ok()
                        .and_then(|n| self.do_lookup(inode, &n).ok())
                } else {
                    None
                };
                let looked_up = entry.as_ref().map(|e| e.inode);
                match add(dirent, entry) {
                    Ok(0) => {
                        // The guest's buffer is full: this entry was not delivered, so undo
                        // the lookup it would have owned.
                        if let Some(id) = looked_up {
                            self.inodes.forget(id, 1);
                        }
                        return Ok(());
                    }
                    Ok(_) => added = true,
                    Err(e) => {
                        if let Some(id) = looked_up {
                            self.inodes.forget(id, 1);
                        }
                        // An error reply would drop the entries already added, and the
                        // lookup counts they carry: send those instead.
                        return if added { Ok(()) } else { Err(e) };
                    }
                }
            }
        }
    }
}
