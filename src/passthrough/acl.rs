//! POSIX ACLs (`--posix-acl`): the guest kernel checks permissions against the ACLs it
//! reads through GETXATTR, and the host kernel keeps them, applying its own rules (chmod
//! updates the mask, a default ACL is inherited on create). What is left to vfsd:
//!
//! - the umask: with FUSE_DONT_MASK the guest sends mode and umask apart, because the
//!   umask must not apply where the parent has a default ACL. vfsd runs with umask 0, so
//!   it masks the mode itself, only when the parent has no default ACL (the check and
//!   the create are not atomic: a default ACL set or removed between them on the host
//!   decides for the next create, not this one);
//! - the set-group-ID bit an ACL change would clear for a caller outside the file's group
//!   (FUSE_SETXATTR_ACL_KILL_SGID): vfsd holds CAP_FSETID, so the host kernel keeps it.

use std::io;
use std::os::fd::AsRawFd;

use super::PassthroughFs;
use crate::sys::{self, cvt};

const DEFAULT_ACL: &std::ffi::CStr = c"system.posix_acl_default";

impl PassthroughFs {
    /// The mode a CREATE, MKDIR or MKNOD in `parent` gets, given the guest's `mode` and
    /// `umask` (only unapplied when the guest accepted FUSE_DONT_MASK).
    pub(super) fn creation_mode(&self, parent: u64, mode: u32, umask: u32) -> io::Result<u32> {
        if !self.enabled(crate::abi::flags::DONT_MASK) {
            return Ok(mode);
        }
        // An empty buffer only asks for the value's length.
        let has_default = match self.with_xattr_target(parent, |t| t.get(DEFAULT_ACL, &mut [])) {
            Ok(_) => true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => false,
            Err(e) => return Err(e),
        };
        Ok(if has_default { mode } else { mode & !umask })
    }

    /// Clears S_ISGID of `inode` after an ACL change the guest kernel found the caller
    /// not entitled to keep it through (FUSE_SETXATTR_ACL_KILL_SGID).
    pub fn acl_kill_sgid(&self, inode: u64) -> io::Result<()> {
        let fd = self.reopen(&self.inode(inode)?, libc::O_RDONLY | libc::O_NONBLOCK)?;
        let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH)?.st;
        let mode = st.st_mode & 0o7777;
        if mode & libc::S_ISGID == 0 {
            return Ok(());
        }
        // SAFETY: plain syscall on an fd this function owns.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode & !libc::S_ISGID) })?;
        Ok(())
    }
}
