//! The requests the supervisor itself sends a serving process, and the waits for their
//! answers.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::takeover::{DIED, WATCHED};
use super::wire::{self, code, Msg};
use super::ANSWER_WAIT;

/// Which of `fds` are readable (or hung up), waiting at most `timeout`.
pub(super) fn poll(fds: &[RawFd], timeout: Option<Duration>) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: `p` is a valid array of pollfds of the length given.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|p| p.revents != 0).collect()
}

/// The next message from the serving process, by `deadline`.
pub(super) fn recv_by(conn: &UnixStream, deadline: Instant) -> io::Result<Msg> {
    let left = deadline.saturating_duration_since(Instant::now());
    let ready = poll(&[conn.as_raw_fd(), WATCHED.get()], Some(left));
    if ready[1] && !ready[0] {
        return Err(io::Error::other(DIED));
    }
    if !ready[0] {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
    }
    wire::recv(conn)?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "it exited"))
}

/// Sends a request that is always answered and waits for the answer.
pub(super) fn ask(conn: &UnixStream, m: &Msg) -> io::Result<Msg> {
    wire::send(conn, m)?;
    let r = recv_by(conn, Instant::now() + ANSWER_WAIT)?;
    if !r.is_reply() || r.code != m.code {
        return Err(io::Error::other(format!(
            "answer {} to request {}",
            r.code, m.code
        )));
    }
    Ok(r)
}

/// `probe`, waiting up to `wait` for the answer.
pub(super) fn probe_within(conn: &UnixStream, wait: Duration) -> Result<(), String> {
    let m = Msg::request(code::GET_FEATURES, Vec::new(), Vec::new());
    wire::send(conn, &m).map_err(|e| e.to_string())?;
    let r = recv_by(conn, Instant::now() + wait).map_err(|e| e.to_string())?;
    if !r.is_reply() || r.code != m.code {
        return Err(format!("answer {} to request {}", r.code, m.code));
    }
    Ok(())
}

/// Waits until the serving process has handled everything sent before: its requests
/// are handled in order, and GET_FEATURES is always answered.
pub(super) fn probe(conn: &UnixStream) -> Result<(), String> {
    ask(
        conn,
        &Msg::request(code::GET_FEATURES, Vec::new(), Vec::new()),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Sends recorded requests, taking the answers of those that get one, and waits until
/// all are handled.
pub(super) fn replay(conn: &UnixStream, msgs: io::Result<Vec<Msg>>) -> Result<(), String> {
    for m in msgs.map_err(|e| e.to_string())? {
        if m.expects_reply(false) {
            ask(conn, &m).map_err(|e| e.to_string())?;
        } else {
            wire::send(conn, &m).map_err(|e| e.to_string())?;
        }
    }
    probe(conn)
}
