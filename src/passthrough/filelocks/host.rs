//! The host calls locks come down to: OFD locks (`F_OFD_SETLK`, `F_OFD_SETLKW`,
//! `F_OFD_GETLK`) on an owner's open file description, and flock(2) on a guest handle's fd.

use std::io;
use std::os::fd::RawFd;

use super::range_set::{Range, OFFSET_MAX};
use crate::sys::{cvt, errno};

impl Range {
    fn flock(&self) -> libc::flock {
        // SAFETY: flock is plain data; all-zero is valid (l_pid must be 0 for OFD locks).
        let mut f: libc::flock = unsafe { std::mem::zeroed() };
        f.l_type = self.typ as libc::c_short;
        f.l_whence = libc::SEEK_SET as libc::c_short;
        f.l_start = self.start as libc::off_t;
        f.l_len = if self.end == OFFSET_MAX {
            0
        } else {
            (self.end - self.start + 1) as libc::off_t
        };
        f
    }

    fn of_flock(f: &libc::flock) -> Range {
        let start = f.l_start.max(0) as u64;
        let end = if f.l_len <= 0 {
            OFFSET_MAX
        } else {
            (start + f.l_len as u64 - 1).min(OFFSET_MAX)
        };
        Range {
            start,
            end,
            typ: f.l_type as i32,
        }
    }
}

/// F_OFD_GETLK of `r` on `fd`: the first lock that would conflict with it, if any.
pub(super) fn ofd_getlk(fd: RawFd, r: &Range) -> io::Result<Option<Range>> {
    let mut f = r.flock();
    // SAFETY: plain fcntl on a live fd (the owner's, or the caller's handle's) with a
    // live flock.
    cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut f) })?;
    if f.l_type as i32 == libc::F_UNLCK {
        return Ok(None);
    }
    Ok(Some(Range::of_flock(&f)))
}

/// F_OFD_SETLKW of `r` on `fd`, its error as the host gives it.
pub(super) fn ofd_setlkw(fd: RawFd, r: &Range) -> io::Result<()> {
    let f = r.flock();
    // SAFETY: plain fcntl on an fd the caller owns with a live flock.
    cvt(unsafe { libc::fcntl(fd, libc::F_OFD_SETLKW, &f) }).map(drop)
}

/// Removes every OFD lock of description `fd`.
pub fn ofd_unlock_all(fd: RawFd) {
    let all = Range {
        start: 0,
        end: OFFSET_MAX,
        typ: libc::F_UNLCK,
    };
    let _ = ofd_lock(fd, &all, false);
}

/// F_OFD_SETLK (F_OFD_SETLKW when `wait`) of `r` on `fd`; a conflict is EAGAIN.
pub fn ofd_lock(fd: RawFd, r: &Range, wait: bool) -> io::Result<()> {
    let f = r.flock();
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: plain fcntl on an fd the caller owns with a live flock.
    match cvt(unsafe { libc::fcntl(fd, cmd, &f) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Err(errno(libc::EAGAIN)),
        Err(e) => Err(e),
    }
}

/// flock(2) on a guest handle's host fd; `wait` for LOCK_EX/LOCK_SH without LOCK_NB.
pub fn flock(fd: RawFd, typ: i32, wait: bool) -> io::Result<()> {
    let mut op = match typ {
        libc::F_RDLCK => libc::LOCK_SH,
        libc::F_WRLCK => libc::LOCK_EX,
        libc::F_UNLCK => libc::LOCK_UN,
        _ => return Err(errno(libc::EINVAL)),
    };
    if !wait {
        op |= libc::LOCK_NB;
    }
    // SAFETY: plain syscall on an fd the caller owns.
    match cvt(unsafe { libc::flock(fd, op) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(errno(libc::EAGAIN)),
        Err(e) => Err(e),
    }
}
