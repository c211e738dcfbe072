//! Extended attributes (only with `--xattr`; otherwise ENOSYS, which tells the guest to
//! stop asking).
//!
//! Regular files and directories are opened through /proc/self/fd and use the f*xattr
//! calls. Other file types get EPERM/ENODATA: opening a FIFO or device on the host is not
//! safe, and the user.* namespace does not exist on them anyway.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use fuse_backend_rs::api::filesystem::{GetxattrReply, ListxattrReply};

use super::PassthroughFs;
use crate::sys::{cvt, errno};

/// Largest value or list the VFS allows (XATTR_SIZE_MAX / XATTR_LIST_MAX).
const XATTR_MAX: usize = 65536;

impl PassthroughFs {
    fn xattr_fd(&self, inode: u64, write: bool) -> io::Result<OwnedFd> {
        if !self.cfg.xattr {
            return Err(errno(libc::ENOSYS));
        }
        if write {
            self.check_writable()?;
        }
        let i = self.inode(inode)?;
        if !i.is_reg() && !i.is_dir() {
            return Err(errno(if write { libc::EPERM } else { libc::ENODATA }));
        }
        self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK)
    }

    pub(super) fn do_setxattr(
        &self,
        inode: u64,
        name: &CStr,
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        self.refuse_acl(name)?;
        let fd = self.xattr_fd(inode, true)?;
        // SAFETY: name is NUL-terminated and value is a live slice of the given length.
        cvt(unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags as i32,
            )
        })?;
        Ok(())
    }

    pub(super) fn do_getxattr(
        &self,
        inode: u64,
        name: &CStr,
        size: u32,
    ) -> io::Result<GetxattrReply> {
        self.refuse_acl(name)?;
        let fd = self.xattr_fd(inode, false)?;
        let mut buf = vec![0u8; (size as usize).min(XATTR_MAX)];
        // SAFETY: the kernel writes at most buf.len() bytes (0 asks for the size only).
        let n = cvt(unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })? as usize;
        if size == 0 {
            return Ok(GetxattrReply::Count(n as u32));
        }
        buf.truncate(n);
        Ok(GetxattrReply::Value(buf))
    }

    pub(super) fn do_listxattr(&self, inode: u64, size: u32) -> io::Result<ListxattrReply> {
        let fd = self.xattr_fd(inode, false)?;
        let mut buf = vec![0u8; (size as usize).min(XATTR_MAX)];
        // SAFETY: the kernel writes at most buf.len() bytes (0 asks for the size only).
        let n =
            cvt(unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })?
                as usize;
        if size == 0 {
            return Ok(ListxattrReply::Count(n as u32));
        }
        buf.truncate(n);
        Ok(ListxattrReply::Names(buf))
    }

    pub(super) fn do_removexattr(&self, inode: u64, name: &CStr) -> io::Result<()> {
        self.refuse_acl(name)?;
        let fd = self.xattr_fd(inode, true)?;
        // SAFETY: name is NUL-terminated.
        cvt(unsafe { libc::fremovexattr(fd.as_raw_fd(), name.as_ptr()) })?;
        Ok(())
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
}
