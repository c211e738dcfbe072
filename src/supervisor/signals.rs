//! The signals the supervisor acts on, taken through a signalfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::SupervisorError;

/// Blocks the signals the supervisor acts on and gives a signalfd for them.
pub(super) fn signal_fd() -> Result<OwnedFd, SupervisorError> {
    // SAFETY: sigset_t is plain data set up by sigemptyset/sigaddset; sigprocmask and
    // signalfd take valid pointers; the supervisor has no other thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGCHLD,
        ] {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(SupervisorError::SignalFd(io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The signals that came, in order.
pub(super) fn read_signals(fd: &OwnedFd) -> Vec<libc::c_int> {
    let mut out = Vec::new();
    loop {
        // SAFETY: signalfd_siginfo is plain data; read into it from our signalfd.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reads at most `size` bytes into `info`.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                &mut info as *mut _ as *mut libc::c_void,
                size,
            )
        };
        if n != size as isize {
            return out;
        }
        out.push(info.ssi_signo as libc::c_int);
    }
}
