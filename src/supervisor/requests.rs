//! The requests the supervisor itself sends a serving process, and the waits for their
//! answers.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::error::StepError;
use super::takeover::WATCHED;
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
pub(super) fn recv_by(conn: &UnixStream, deadline: Instant) -> Result<Msg, StepError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let ready = poll(&[conn.as_raw_fd(), WATCHED.get()], Some(left));
    if ready[1] && !ready[0] {
        return Err(StepError::Died);
    }
    if !ready[0] {
        return Err(StepError::NoAnswer);
    }
    wire::recv(conn)?.ok_or(StepError::Exited)
}

/// Whether `r` answers `m`.
fn answers(r: &Msg, m: &Msg) -> Result<(), StepError> {
    if !r.is_reply() || r.code != m.code {
        return Err(StepError::WrongAnswer {
            got: r.code,
            asked: m.code,
        });
    }
    Ok(())
}

/// Sends a request that is always answered and waits for the answer.
pub(super) fn ask(conn: &UnixStream, m: &Msg) -> Result<Msg, StepError> {
    wire::send(conn, m)?;
    let r = recv_by(conn, Instant::now() + ANSWER_WAIT)?;
    answers(&r, m)?;
    Ok(r)
}

/// `probe`, waiting up to `wait` for the answer.
pub(super) fn probe_within(conn: &UnixStream, wait: Duration) -> Result<(), StepError> {
    let m = Msg::request(code::GET_FEATURES, Vec::new(), Vec::new());
    wire::send(conn, &m)?;
    let r = recv_by(conn, Instant::now() + wait)?;
    answers(&r, &m)
}

/// Waits until the serving process has handled everything sent before: its requests
/// are handled in order, and GET_FEATURES is always answered.
pub(super) fn probe(conn: &UnixStream) -> Result<(), StepError> {
    let m = Msg::request(code::GET_FEATURES, Vec::new(), Vec::new());
    ask(conn, &m).map(drop)
}

/// Sends recorded requests, taking the answers of those that get one, and waits until
/// all are handled.
pub(super) fn replay(conn: &UnixStream, msgs: io::Result<Vec<Msg>>) -> Result<(), StepError> {
    for m in msgs? {
        if m.expects_reply(false) {
            ask(conn, &m)?;
        } else {
            wire::send(conn, &m)?;
        }
    }
    probe(conn)
}
