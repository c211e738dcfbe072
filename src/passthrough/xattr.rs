//! Extended attributes (only with `--xattr`; otherwise ENOSYS, which tells the guest to
//! stop asking).
//!
//! Guest names go through the xattr map (`Config::xattrmap`, see `xattrmap`) on the way in,
//! and listxattr replies on the way out.
//!
//! No file is opened for an xattr request: a node's O_PATH fd is named as `N` inside the
//! /proc/self/fd directory fd, and the path-following xattr calls (`getxattrat` and the
//! rest, or the old path calls from that directory) resolve that magic link to the inode
//! itself. An open would cost an open and a close per request, break a host lease, show
//! the host's watchers an open, and need read permission the xattr calls don't; for a
//! FIFO it would block, for a device reach hardware. The host kernel then applies its own
//! rules (no `user.*` on a symlink or device). Only where a seccomp profile refuses both
//! path forms (`sys::probe_xattrat`) are regular files and directories opened after all.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use fuse_backend_rs::api::filesystem::{GetxattrReply, ListxattrReply};

use super::idtranslate::Direction;
use super::PassthroughFs;
use crate::sys::{self, cvt, errno};

/// Largest value or list the VFS allows (XATTR_SIZE_MAX / XATTR_LIST_MAX).
const XATTR_MAX: usize = 65536;
/// Values and lists up to this size are read into a stack buffer; most files have a few
/// short xattrs or none, and a zeroed 64 KiB heap buffer per request costs page faults.
const SMALL: usize = 4096;

/// Where an xattr call goes.
pub(super) enum Target<'a> {
    /// An fd opened for reading.
    Fd(RawFd),
    /// `name` (an O_PATH fd's number) inside the /proc/self/fd directory fd.
    Proc(RawFd, &'a CStr),
}

impl Target<'_> {
    pub(super) fn get(&self, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            // SAFETY: the kernel writes at most buf.len() bytes (0 asks for the size only).
            Target::Fd(fd) => cvt(unsafe {
                libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            })
            .map(|n| n as usize),
            Target::Proc(dir, path) => sys::getxattr_path(dir, path, name, buf),
        }
    }

    pub(super) fn set(&self, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
        match *self {
            // SAFETY: name is NUL-terminated and value is a live slice of the given length.
            Target::Fd(fd) => cvt(unsafe {
                libc::fsetxattr(fd, name.as_ptr(), value.as_ptr().cast(), value.len(), flags)
            })
            .map(drop),
            Target::Proc(dir, path) => sys::setxattr_path(dir, path, name, value, flags),
        }
    }

    pub(super) fn list(&self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            // SAFETY: the kernel writes at most buf.len() bytes.
            Target::Fd(fd) => {
                cvt(unsafe { libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) })
                    .map(|n| n as usize)
            }
            Target::Proc(dir, path) => sys::listxattr_path(dir, path, buf),
        }
    }

    pub(super) fn remove(&self, name: &CStr) -> io::Result<()> {
        match *self {
            // SAFETY: name is NUL-terminated.
            Target::Fd(fd) => cvt(unsafe { libc::fremovexattr(fd, name.as_ptr()) }).map(drop),
            Target::Proc(dir, path) => sys::removexattr_path(dir, path, name),
        }
    }
}

impl PassthroughFs {
    /// ENOSYS without `--xattr`, EROFS for a change to a read-only share: both before
    /// the name is mapped, so they win over the map's errnos.
    fn xattr_checks(&self, write: bool) -> io::Result<()> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        if write {
            self.check_writable()?;
        }
        Ok(())
    }

    /// Runs `f` on the node's file (see `with_path_target`).
    pub(super) fn with_xattr_target<R>(
        &self,
        inode: u64,
        f: impl FnOnce(&Target) -> io::Result<R>,
    ) -> io::Result<R> {
        let i = self.inode(inode)?;
        // Held while its /proc name is in use.
        let pfd = i.path_fd()?;
        self.with_path_target(pfd.as_raw_fd(), i.file_type, f)
    }

    /// Runs `f` on the file behind O_PATH fd `path` of type `kind` (`S_IFMT` bits), named
    /// as `N` in /proc/self/fd. Only where neither path form may run (`sys::probe_xattrat`)
    /// is a regular file or directory opened there instead, as the one way left; opening
    /// those can't block or reach a device.
    pub(super) fn with_path_target<R>(
        &self,
        path: RawFd,
        kind: u32,
        f: impl FnOnce(&Target) -> io::Result<R>,
    ) -> io::Result<R> {
        let name = sys::fd_name(path);
        if !sys::xattr_path_form() && (kind == libc::S_IFREG || kind == libc::S_IFDIR) {
            let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
            let fd = sys::openat(self.proc_self_fd.as_raw_fd(), &name, flags, 0)?;
            return f(&Target::Fd(fd.as_raw_fd()));
        }
        f(&Target::Proc(self.proc_self_fd.as_raw_fd(), &name))
    }

    pub(super) fn do_setxattr(
        &self,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.xattr_checks(true)?;
        self.refuse_acl(name)?;
        let host = self.cfg.xattrmap.to_host(name).or_errno(false)?;
        let value = self.acl_ids(name, value, Direction::ToHost)?;
        self.with_xattr_target(inode, |t| t.set(&host, &value, flags as i32))
    }

    pub(super) fn do_getxattr(
        &self,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.xattr_checks(false)?;
        self.refuse_acl(name)?;
        let host = self.cfg.xattrmap.to_host(name).or_errno(true)?;
        let want = (size as usize).min(XATTR_MAX);
        let (mut small, mut big) = ([0u8; SMALL], Vec::new());
        let buf = if want <= SMALL {
            &mut small[..want]
        } else {
            big.resize(want, 0);
            &mut big[..]
        };
        let n = self.with_xattr_target(inode, |t| t.get(&host, buf))?;
        if size == 0 {
            return Ok(GetxattrReply::Count(n as u32));
        }
        let value = self
            .acl_ids(name, &buf[..n], Direction::ToGuest)?
            .into_owned();
        Ok(GetxattrReply::Value(value))
    }

    pub(super) fn do_listxattr(&self, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        self.xattr_checks(false)?;
        // The whole host list, whatever the guest's size: mapping can hide and shorten
        // names, so only the mapped list tells the size the guest needs.
        let map = &self.cfg.xattrmap;
        let names = self.with_xattr_target(inode, |t| {
            let mut small = [0u8; SMALL];
            match t.list(&mut small) {
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                    let mut buf = vec![0u8; XATTR_MAX];
                    let n = t.list(&mut buf)?;
                    Ok(map.list_to_guest(&buf[..n]))
                }
                r => r.map(|n| map.list_to_guest(&small[..n])),
            }
        })?;
        if size == 0 {
            return Ok(ListxattrReply::Count(names.len() as u32));
        }
        if names.len() > size as usize {
            return Err(errno(libc::ERANGE));
        }
        Ok(ListxattrReply::Names(names))
    }

    pub(super) fn do_removexattr(&self, inode: u64, name: &CStr) -> io::Result<()> {
        self.xattr_checks(true)?;
        self.refuse_acl(name)?;
        let host = self.cfg.xattrmap.to_host(name).or_errno(false)?;
        self.with_xattr_target(inode, |t| t.remove(&host))
    }
}

impl PassthroughFs {
    /// Without `--posix-acl` (no FUSE_POSIX_ACL), the guest kernel gives the share no ACL
    /// semantics: storing `system.posix_acl_*` on the host anyway would let programs
    /// believe ACLs work while permission checks ignore them. Refused, as virtiofsd does.
    fn refuse_acl(&self, name: &CStr) -> io::Result<()> {
        if !self.cfg.posix_acl && name.to_bytes().starts_with(b"system.posix_acl_") {
            return Err(errno(libc::EOPNOTSUPP));
        }
        Ok(())
    }

    /// An ACL's user and group ids as the other side sees them (`--translate-uid/gid`);
    /// other values, and every value without translation, pass unchanged.
    fn acl_ids<'a>(
        &self,
        name: &CStr,
        value: &'a [u8],
        dir: Direction,
    ) -> io::Result<std::borrow::Cow<'a, [u8]>> {
        let ids = &self.cfg.id_translate;
        let acl = matches!(
            name.to_bytes(),
            b"system.posix_acl_access" | b"system.posix_acl_default"
        );
        if !acl || ids.is_identity() {
            return Ok(std::borrow::Cow::Borrowed(value));
        }
        Ok(std::borrow::Cow::Owned(
            ids.translate_acl_xattr(value, dir)?,
        ))
    }
}
