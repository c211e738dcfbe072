//! The keeper: the process that shares the serving process's fd table (it is the serving
//! process's parent, `sandbox`, which cloned it with CLONE_FILES) and so still holds every
//! fd when the serving process dies. It then tells the supervisor, and hands the fds a
//! new serving process asks for (and the crash record) over, before it exits.
//!
//! The channel is a SOCK_SEQPACKET pair the supervisor makes for each serving process:
//! the keeper holds one end; the supervisor keeps the other and gives it to the next
//! serving process after a death. Messages:
//! - keeper → supervisor: `D` and the dead process's wait status (le32);
//! - new process → keeper: `R` (the record: one fd back), `F` and up to `BATCH` fd numbers
//!   (le32 each; back: one byte per number, 1 if its fd follows, with the fds), `Q` (done:
//!   the keeper exits).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Fds per message (SCM_MAX_FD is 253).
pub const BATCH: usize = 200;
/// How long the keeper waits for the next request before it gives up and exits.
const IDLE: Duration = Duration::from_secs(10);

/// A connected SOCK_SEQPACKET pair, close-on-exec.
pub fn channel() -> io::Result<(UnixStream, UnixStream)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair into a valid array of two.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair gave two new fds nothing else owns.
    Ok(unsafe {
        (
            UnixStream::from_raw_fd(fds[0]),
            UnixStream::from_raw_fd(fds[1]),
        )
    })
}

/// In the keeper, after the serving process died with wait status `status`: reports it
/// on `ctl` and serves the new process's requests; returns when it is done, or gone, or
/// silent for too long.
pub fn serve(ctl: &UnixStream, record: RawFd, status: libc::c_int) {
    let mut msg = vec![b'D'];
    msg.extend_from_slice(&status.to_le_bytes());
    if send(ctl, &msg, &[]).is_err() {
        return;
    }
    let _ = ctl.set_read_timeout(Some(IDLE));
    let mut buf = vec![0u8; 1 + 4 * BATCH];
    loop {
        let n = match std::io::Read::read(&mut { ctl }, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match buf[0] {
            b'R' => {
                if send(ctl, b"r", &[record]).is_err() {
                    return;
                }
            }
            b'F' => {
                let asked: Vec<RawFd> = buf[1..n]
                    .chunks_exact(4)
                    .take(BATCH)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                // Only fds open in the table, never the standard ones, the channel
                // itself or the record's (given once, by `R`).
                let open = |fd: RawFd| {
                    // SAFETY: F_GETFD only inspects the fd number.
                    fd > 2
                        && fd != ctl.as_raw_fd()
                        && fd != record
                        && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0
                };
                let flags: Vec<u8> = asked.iter().map(|&fd| open(fd) as u8).collect();
                let fds: Vec<RawFd> = asked.iter().copied().filter(|&fd| open(fd)).collect();
                if send(ctl, &flags, &fds).is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

fn send(s: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    // An empty payload can't carry fds: every message has at least one byte.
    let bytes = if bytes.is_empty() { &[0u8][..] } else { bytes };
    s.send_with_fds(&[bytes], fds)
        .map(|_| ())
        .map_err(io::Error::other)
}

/// The new serving process's side of a dead one's keeper.
pub struct Client {
    s: UnixStream,
}

impl Client {
    /// `fd`: the channel the supervisor passed on (`--recover-fd`).
    pub fn new(s: UnixStream) -> io::Result<Client> {
        // The supervisor's end asked for senders' credentials, which would take the
        // room the fds come in.
        pass_senders(&s, false)?;
        s.set_read_timeout(Some(IDLE))?;
        s.set_write_timeout(Some(IDLE))?;
        Ok(Client { s })
    }

    fn recv(&self, room: usize, max_fds: usize) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
        let mut buf = vec![0u8; room.max(1)];
        let mut fds = vec![-1 as RawFd; max_fds.max(1)];
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: `iov` points at `buf`, which outlives the call; `fds` has its room.
        let (n, nfds) =
            unsafe { self.s.recv_with_fds(&mut iov, &mut fds) }.map_err(io::Error::other)?;
        // SAFETY: recvmsg gave us these `nfds` fds; nothing else owns them.
        let owned = unsafe { crate::sys::adopt_received(&fds[..nfds]) };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the keeper is gone",
            ));
        }
        buf.truncate(n);
        Ok((buf, owned))
    }

    /// The dead process's crash record.
    pub fn record(&self) -> io::Result<OwnedFd> {
        send(&self.s, b"R", &[])?;
        let (_, mut fds) = self.recv(1, 1)?;
        fds.pop()
            .ok_or_else(|| io::Error::other("the keeper sent no record"))
    }

    /// The dead process's fds `wanted` (by their numbers there), each if it was open.
    pub fn fetch(&self, wanted: &[RawFd]) -> io::Result<Vec<Option<OwnedFd>>> {
        let mut out = Vec::with_capacity(wanted.len());
        for batch in wanted.chunks(BATCH) {
            let mut msg = vec![b'F'];
            for fd in batch {
                msg.extend_from_slice(&fd.to_le_bytes());
            }
            send(&self.s, &msg, &[])?;
            let (flags, fds) = self.recv(batch.len(), batch.len())?;
            if flags.len() != batch.len() || flags.iter().filter(|&&f| f == 1).count() != fds.len()
            {
                return Err(io::Error::other("a malformed answer from the keeper"));
            }
            let mut fds = fds.into_iter();
            out.extend(
                flags
                    .iter()
                    .map(|&f| if f == 1 { fds.next() } else { None }),
            );
        }
        Ok(out)
    }

    /// Lets the keeper go: the fds it held close (all but those taken).
    pub fn done(self) {
        let _ = send(&self.s, b"Q", &[]);
    }
}

/// What the supervisor reads from a keeper: the dead process's wait status.
pub fn death_report(bytes: &[u8]) -> Option<libc::c_int> {
    match bytes {
        [b'D', s @ ..] if s.len() == 4 => Some(i32::from_le_bytes(s.try_into().ok()?)),
        _ => None,
    }
}

/// Has the kernel tell, with each message on `s`, which process sent it (`recv_from`).
pub fn want_senders(s: &UnixStream) -> io::Result<()> {
    pass_senders(s, true)
}

fn pass_senders(s: &UnixStream, on: bool) -> io::Result<()> {
    let one: libc::c_int = on.into();
    // SAFETY: setsockopt with a valid int option value.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The next message on `s` (set up by `want_senders`) and the pid of the process that
/// sent it, as the kernel says (in this process's pid namespace; a sender can't claim
/// another's without CAP_SYS_ADMIN over its own pid namespace, where the keeper is not
/// to be named). Fds sent with it are closed.
pub fn recv_from(s: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, libc::pid_t)> {
    // Room for the credentials and a few stray fds.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zero is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg into buffers that outlive the call, sizes as given.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut pid = 0;
    // SAFETY: walking the control messages recvmsg wrote, with the libc macros, within
    // msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) => {
                    let cred: libc::ucred = std::ptr::read_unaligned(data.cast());
                    pid = cred.pid;
                }
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                    for i in 0..len / std::mem::size_of::<RawFd>() {
                        let fd: RawFd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        drop(OwnedFd::from_raw_fd(fd));
                    }
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_hands_over_open_fds_and_marks_closed_ones() {
        let (keeper_end, client_end) = channel().unwrap();
        let rec = crate::recovery::record::create().unwrap();
        let file = tempfile::tempfile().unwrap();
        let open_fd = file.as_raw_fd();
        // Above any fd limit: never open (a number just closed could be reused by
        // another test's thread meanwhile).
        let closed_fd = i32::MAX - 1;
        let rec_fd = rec.as_raw_fd();
        let t = std::thread::spawn(move || serve(&keeper_end, rec_fd, 9));
        let c = Client::new(client_end).unwrap();
        let (report, _) = c.recv(16, 1).unwrap();
        assert_eq!(death_report(&report), Some(9));
        let r = c.record().unwrap();
        assert!(crate::recovery::record::Record::map(r, true).is_ok());
        let got = c.fetch(&[open_fd, closed_fd, -1]).unwrap();
        assert!(got[0].is_some() && got[1].is_none() && got[2].is_none());
        c.done();
        t.join().unwrap();
        drop(file);
    }
}
