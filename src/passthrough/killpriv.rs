//! Privileges a data change takes away (the kernel's `file_remove_privs`).
//!
//! On a local filesystem a write, truncate, fallocate, copy into a file or O_TRUNC open by
//! a caller without CAP_FSETID clears S_ISUID, clears S_ISGID when group-exec is set, and
//! drops `security.capability`. The guest kernel's direct-I/O path leaves this to the
//! daemon, and the host kernel can't do it since the daemon writes with CAP_FSETID. So vfsd
//! does it itself, whether or not the guest set a KILL_SUIDGID flag: a non-root guest user
//! never has CAP_FSETID, and a hostile guest kernel would not ask.

use std::io;
use std::os::fd::RawFd;

use crate::sys::{self, cvt};

/// Whether a data change for guest user `uid` must drop privileges. `guest_asked` is the
/// request's KILL_SUIDGID flag (the guest kernel found the caller without CAP_FSETID).
pub fn needed(uid: u32, guest_asked: bool) -> bool {
    guest_asked || uid != 0
}

/// Drops set-id bits and the file capability of the regular file open as `fd` (an fd
/// opened for I/O, not O_PATH), as a write by a caller without CAP_FSETID would.
pub fn kill_suidgid(fd: RawFd) -> io::Result<()> {
    let st = sys::statx(fd, sys::EMPTY, libc::AT_EMPTY_PATH)?.st;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let mode = st.st_mode & 0o7777;
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        // Without group-exec, S_ISGID marks mandatory locking and stays.
        kill |= mode & libc::S_ISGID;
    }
    if kill != 0 {
        // SAFETY: plain syscall on an fd the caller owns.
        cvt(unsafe { libc::fchmod(fd, mode & !kill) })?;
    }
    // Only remove a capability that is there: removing security.* names needs
    // CAP_SETFCAP even when there is nothing to remove, which an unprivileged daemon
    // lacks (every non-root write would fail with EPERM).
    // SAFETY: NUL-terminated name; size 0 only asks for the length.
    let has = unsafe { libc::fgetxattr(fd, CAP.as_ptr(), std::ptr::null_mut(), 0) } >= 0;
    if has {
        // SAFETY: NUL-terminated name; plain syscall on an fd the caller owns.
        cvt(unsafe { libc::fremovexattr(fd, CAP.as_ptr()) })?;
    }
    Ok(())
}

const CAP: &std::ffi::CStr = c"security.capability";
