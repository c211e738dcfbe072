//! The process the VMM starts: it holds the frontend's vhost-user connection and nothing a
//! guest can reach, and runs the serving process (a fresh `vfsd --serve-fd`) behind it.
//!
//! It relays the frontend's control messages to the serving process over a private
//! socket, byte for byte, and records the set-up among them (`record`). The data path
//! (guest memory, the rings' eventfds) goes to the serving process directly, as the fds
//! the frontend sent. On SIGUSR2 it hands the connection over to the binary now at its
//! own path (`upgrade`): the old process stops its rings and saves the device state, as
//! for a migration, straight into the new one, which takes the open files and locks over
//! through the lock handover; the supervisor then sets the new one's rings up at the
//! indices where the old one stopped. The frontend sees no new connection and no message.

mod error;
mod image;
mod record;
mod requests;
mod signals;
mod spawn;
mod takeover;
mod upgrade;
mod wire;

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use log::{error, warn};

use crate::error::Chain;
use crate::sandbox::SocketName;
use error::StepError;
pub use error::{ImageError, SupervisorError};
pub use image::resume;
use record::Record;
use requests::poll;
use signals::{read_signals, signal_fd};
use wire::{code, Msg};

/// How long the supervisor waits for a serving process to answer during a handover, and
/// for one that lost its frontend to exit.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How long the rest of a message may take once its first bytes came: both peers write
/// whole messages, so a longer wait is a peer that stopped half-way.
const PART_WAIT: Duration = Duration::from_secs(2);
/// The least time between two starts of a serving process after one was killed: a
/// daemon killed on every start starts once a second, not in a busy loop.
const RESPAWN_AFTER_KILL: Duration = Duration::from_secs(1);
/// A serving process that dies is replaced at most this many times within `CRASH_WINDOW`:
/// one that dies at once every time ends the frontend's connection, as without a
/// supervisor, rather than loop.
const CRASH_LOOP: usize = 10;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How long a process taking over from a dead one may take to load its state before it
/// answers (about 1.5 s per 100,000 nodes; docs/benchmarks.md).
const TAKE_OVER_WAIT: Duration = Duration::from_secs(120);

/// What the supervisor starts with, all set up by `daemon::run` before any sandbox.
pub struct Supervisor {
    /// The binary to start: vfsd's own path, resolved at start-up, so an upgrade starts
    /// whatever file is there now.
    pub exe: PathBuf,
    /// vfsd's arguments as given; the serving process gets them too.
    pub args: Vec<OsString>,
    pub listener: UnixListener,
    /// Sockets and files the serving process uses but must not open again (a second
    /// bind of the metrics socket would find it in use): option name and fd.
    pub inherited: Vec<(&'static str, OwnedFd)>,
    pub socket: Option<SocketName>,
    pub keep_listening: bool,
}

struct Child {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// The supervisor's end of the serving process's vhost-user connection.
    conn: UnixStream,
    /// The supervisor's end of the channel to the process that keeps the serving
    /// process's fds should it die (`recovery::keeper`); none for one an older
    /// supervisor started, which has no keeper.
    keeper: Option<UnixStream>,
}

/// How a frontend's session ended.
enum Ended {
    /// The frontend closed its connection.
    FrontendGone,
    /// The serving process died; its wait status.
    ChildDied(libc::c_int),
    /// A termination signal, relayed to the serving process, which then exited.
    Terminated(libc::c_int),
}

/// The supervisor's own state while it serves.
struct State {
    sup: Supervisor,
    sigfd: OwnedFd,
    record: Record,
    /// The frontend acked REPLY_ACK, and asked for the features: vhost-user-backend
    /// acks only then (it offers VHOST_USER_F_PROTOCOL_FEATURES in GET_FEATURES's
    /// answer, and vfsd always does).
    acked_reply_ack: bool,
    asked_features: bool,
    /// The frontend's requests the serving process will answer, oldest first: their codes
    /// and vring indices.
    awaited: std::collections::VecDeque<(u32, u32)>,
    /// The requests themselves, where kept (as long as `awaited`, in step; None for one
    /// an earlier image of this process relayed): a process taking over from a dead one
    /// gets them again, so the frontend's wait ends with its answer.
    awaited_msgs: std::collections::VecDeque<Option<Msg>>,
    /// Messages from the serving process nobody asked for were dropped this session.
    dropped: bool,
    terminating: bool,
    /// When a serving process that did not exit on a termination signal is killed.
    kill_at: Option<Instant>,
    /// When serving processes died and were replaced, newest last (`CRASH_LOOP`).
    crashes: std::collections::VecDeque<Instant>,
}

/// Runs the supervisor; returns only on a start-up error (otherwise it exits).
pub fn run(sup: Supervisor) -> Result<(), SupervisorError> {
    let sigfd = signal_fd()?;
    let st = State {
        sup,
        sigfd,
        record: Record::default(),
        acked_reply_ack: false,
        asked_features: false,
        awaited: Default::default(),
        awaited_msgs: Default::default(),
        dropped: false,
        terminating: crate::sandbox::early_signal().is_some(),
        kill_at: None,
        crashes: Default::default(),
    };
    // Processes a serving process leaves behind (the sandbox's, one a guest took over
    // that ignores its parent's death) become the supervisor's, which ends them.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    if st.terminating {
        st.exit(0);
    }
    let child = st.spawn(None).map_err(SupervisorError::Spawn)?;
    st.main_loop(child, None)
}

impl State {
    /// Serves frontends, one after another, through `child`; `frontend` is one already
    /// connected. Never returns: the supervisor exits from here.
    fn main_loop(mut self, mut child: Child, mut frontend: Option<UnixStream>) -> ! {
        loop {
            let next = match frontend.take() {
                Some(f) => Some(f),
                None => self.wait_for_frontend(&mut child),
            };
            let Some(frontend) = next else {
                // The serving process ended before a frontend came: a start-up error it
                // reported itself, or a termination signal.
                let status = reap_within(child.pid, ANSWER_WAIT);
                if !libc::WIFEXITED(status) {
                    log_death(status);
                }
                self.exit(exit_code(status));
            };
            let ended = self.serve(&frontend, &mut child);
            drop(frontend);
            self.record = Record::default();
            self.awaited.clear();
            self.awaited_msgs.clear();
            self.dropped = false;
            self.acked_reply_ack = false;
            self.asked_features = false;
            let status = match ended {
                Ended::FrontendGone => {
                    // The serving process exits once its connection closes.
                    let Child { pid, conn, .. } = child;
                    drop(conn);
                    let s = reap_within(pid, ANSWER_WAIT);
                    log::debug!("frontend gone");
                    s
                }
                Ended::ChildDied(s) => {
                    log_death(s);
                    s
                }
                Ended::Terminated(s) => self.exit(exit_code(s)),
            };
            if !self.sup.keep_listening || self.terminating {
                self.exit(exit_code(status));
            }
            kill_strays(None);
            if libc::WIFSIGNALED(status) {
                std::thread::sleep(RESPAWN_AFTER_KILL);
            }
            child = match self.spawn(None) {
                Ok(c) => c,
                Err(e) => {
                    error!("cannot start the serving process: {e}");
                    self.exit(1)
                }
            };
        }
    }

    /// Waits for the next frontend while the serving process starts up. `None`: the
    /// serving process exited meanwhile.
    fn wait_for_frontend(&mut self, child: &mut Child) -> Option<UnixStream> {
        loop {
            let fds = [
                self.sup.listener.as_raw_fd(),
                child.pidfd.as_raw_fd(),
                self.sigfd.as_raw_fd(),
                keeper_fd(child),
            ];
            let ready = poll(&fds, self.until_kill());
            self.kill_if_due(child);
            if ready[3] {
                // It died before any frontend came: nothing to take over. A new one
                // waits for the frontend instead (within the crash-loop bound).
                let status = match read_death(child) {
                    KeeperSaid::Died(s) => s,
                    KeeperSaid::Forged => continue,
                    KeeperSaid::Gone => return None,
                };
                log_death(status);
                if self.terminating || !self.note_crash() {
                    return None;
                }
                match self.spawn(None) {
                    Ok(new) => {
                        let old = std::mem::replace(child, new);
                        drop(old.keeper);
                        reap_within(old.pid, ANSWER_WAIT);
                        continue;
                    }
                    Err(e) => {
                        error!("cannot start the serving process again: {e}");
                        return None;
                    }
                }
            }
            if ready[1] {
                return None;
            }
            if ready[2] {
                for sig in read_signals(&self.sigfd) {
                    if sig == libc::SIGUSR2 {
                        self.replace_idle(child);
                    } else {
                        self.relay(sig, child);
                    }
                }
                continue;
            }
            if ready[0] {
                let accepted = self.sup.listener.accept().and_then(|(s, _)| {
                    s.set_read_timeout(Some(PART_WAIT))?;
                    s.set_write_timeout(Some(ANSWER_WAIT))?;
                    Ok(s)
                });
                match accepted {
                    Ok(s) => return Some(s),
                    Err(e) => warn!("accepting a frontend: {e}"),
                }
            }
        }
    }

    /// Relays the session between `frontend` and the serving process until one ends.
    fn serve(&mut self, frontend: &UnixStream, child: &mut Child) -> Ended {
        log::debug!("frontend connected");
        loop {
            let fds = [
                frontend.as_raw_fd(),
                child.conn.as_raw_fd(),
                child.pidfd.as_raw_fd(),
                self.sigfd.as_raw_fd(),
                keeper_fd(child),
            ];
            let ready = poll(&fds, self.until_kill());
            self.kill_if_due(child);
            if ready[4] {
                let status = match read_death(child) {
                    KeeperSaid::Died(s) => s,
                    KeeperSaid::Forged => continue,
                    KeeperSaid::Gone => return self.child_gone(child),
                };
                match self.take_over(child, status) {
                    Ok(()) => continue,
                    Err(e) => {
                        error!("{}; the frontend's connection ends", Chain(&e));
                        if let Some(k) = &child.keeper {
                            let _ = k.shutdown(std::net::Shutdown::Both);
                        }
                        return self.child_gone(child);
                    }
                }
            }
            if ready[3] {
                for sig in read_signals(&self.sigfd) {
                    if sig == libc::SIGUSR2 {
                        self.upgrade(frontend, child);
                    } else {
                        self.relay(sig, child);
                    }
                }
                continue;
            }
            if ready[1] {
                match wire::recv(&child.conn) {
                    Ok(Some(m)) => {
                        if self.answered(&m) && wire::send(frontend, &m).is_err() {
                            return Ended::FrontendGone;
                        }
                        continue;
                    }
                    Ok(None) => return self.child_gone(child),
                    Err(e) => {
                        error!("the serving process sent a broken message ({e}); stopping it");
                        // SAFETY: kill of our own child, not yet reaped.
                        unsafe { libc::kill(child.pid, libc::SIGKILL) };
                        return self.child_gone(child);
                    }
                }
            }
            if ready[2] {
                return self.child_gone(child);
            }
            if ready[0] {
                let m = match wire::recv(frontend) {
                    Ok(Some(m)) => m,
                    Ok(None) => return Ended::FrontendGone,
                    Err(e) => {
                        warn!("frontend: {e}; closing its connection");
                        return Ended::FrontendGone;
                    }
                };
                if let Err(e) = self.record.note(&m) {
                    warn!("recording the frontend's {}: {e}", m.code);
                }
                if m.code == code::SET_PROTOCOL_FEATURES {
                    self.acked_reply_ack = m.u64_at(0).unwrap_or(0) & wire::PROTOCOL_REPLY_ACK != 0;
                }
                if m.expects_reply(self.acked_reply_ack && self.asked_features) {
                    let vring = wire::vring_index(&m).unwrap_or(0) as u32;
                    self.awaited.push_back((m.code, vring));
                    self.awaited_msgs.push_back(m.try_clone().ok());
                }
                self.asked_features |= m.code == code::GET_FEATURES;
                if wire::send(&child.conn, &m).is_err() {
                    return self.child_gone(child);
                }
            }
        }
    }

    /// Whether `m`, from the serving process, answers a request the frontend waits for,
    /// and so goes on to it; notes a stopped ring's base. Anything else is dropped: what
    /// the supervisor writes to the frontend is bounded by what the frontend asked, so a
    /// serving process can't fill the frontend's socket and block the supervisor.
    fn answered(&mut self, m: &Msg) -> bool {
        let at = (m.is_reply())
            .then(|| self.awaited.iter().position(|&(c, _)| c == m.code))
            .flatten();
        let Some(at) = at else {
            if !std::mem::replace(&mut self.dropped, true) {
                warn!(
                    "the serving process sent a message nobody asked for (request {}); dropped",
                    m.code
                );
            }
            return false;
        };
        // Answers come in order: the requests before this one got none.
        self.awaited.drain(..at);
        self.awaited_msgs.drain(..at);
        self.awaited_msgs.pop_front();
        if let Some((c, vring)) = self.awaited.pop_front() {
            if c == code::GET_VRING_BASE {
                if let Some(base) = m.u32_at(1) {
                    self.record.stopped_at(vring, base);
                }
            }
        }
        true
    }

    /// Counts a death against the crash-loop bound: false if it is past it.
    fn note_crash(&mut self) -> bool {
        let now = Instant::now();
        while self
            .crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW)
        {
            self.crashes.pop_front();
        }
        if self.crashes.len() >= CRASH_LOOP {
            return false;
        }
        self.crashes.push_back(now);
        true
    }

    /// How long until a serving process that ignored a termination signal is killed.
    fn until_kill(&self) -> Option<Duration> {
        self.kill_at
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    fn kill_if_due(&mut self, child: &Child) {
        if self.kill_at.is_some_and(|t| Instant::now() >= t) {
            self.kill_at = None;
            warn!("the serving process did not exit on a termination signal; killing it");
            // SAFETY: kill of our own child, not yet reaped.
            unsafe { libc::kill(child.pid, libc::SIGKILL) };
        }
    }

    fn child_gone(&mut self, child: &mut Child) -> Ended {
        let status = reap_within(child.pid, ANSWER_WAIT);
        if self.terminating {
            return Ended::Terminated(status);
        }
        Ended::ChildDied(status)
    }

    fn relay(&mut self, sig: libc::c_int, child: &Child) {
        if matches!(sig, libc::SIGTERM | libc::SIGINT | libc::SIGHUP) {
            self.terminating = true;
            self.kill_at.get_or_insert(Instant::now() + ANSWER_WAIT);
        }
        if sig != libc::SIGCHLD {
            // SAFETY: kill of our own child, which we have not reaped yet.
            unsafe { libc::kill(child.pid, sig) };
        }
    }

    /// Removes the sockets' names and exits.
    fn exit(&self, code: i32) -> ! {
        kill_strays(None);
        if let Some(s) = &self.sup.socket {
            s.remove();
        }
        std::process::exit(code)
    }
}

/// The keeper channel's fd for poll (-1, which poll skips, when there is none).
fn keeper_fd(child: &Child) -> RawFd {
    child.keeper.as_ref().map_or(-1, |k| k.as_raw_fd())
}

/// The wait status a keeper reports for its dead serving process; None if the channel
/// closed or says something else.
fn read_death(child: &Child) -> KeeperSaid {
    let mut buf = [0u8; 16];
    let Some(k) = child.keeper.as_ref() else {
        return KeeperSaid::Gone;
    };
    let (n, sender) = match crate::recovery::keeper::recv_from(k, &mut buf) {
        Ok((n, sender)) if n > 0 => (n, sender),
        _ => return KeeperSaid::Gone,
    };
    // The serving process shares its keeper's fd table, channel included: only the
    // keeper itself (the supervisor's child) may report a death.
    if sender != child.pid {
        warn!(
            "a death report from process {sender}, not the keeper {}; ignored",
            child.pid
        );
        return KeeperSaid::Forged;
    }
    match crate::recovery::keeper::death_report(&buf[..n]) {
        Some(status) => KeeperSaid::Died(status),
        None => KeeperSaid::Gone,
    }
}

/// What a serving process's keeper channel said.
enum KeeperSaid {
    /// The serving process died with this wait status.
    Died(libc::c_int),
    /// A message from another process than the keeper: ignored.
    Forged,
    /// The channel closed, or the keeper said something else.
    Gone,
}

/// Kills and reaps a serving process that will not serve; gives back `e`.
fn kill(child: Child, e: StepError) -> StepError {
    // SAFETY: kill of our own child, not yet reaped.
    unsafe { libc::kill(child.pid, libc::SIGKILL) };
    reap_within(child.pid, ANSWER_WAIT);
    e
}

fn open_pidfd(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open of our own child, not yet reaped.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits for `pid` up to `wait`, then kills it; its wait status.
fn reap_within(pid: libc::pid_t, wait: Duration) -> libc::c_int {
    let deadline = Instant::now() + wait;
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid || (r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD)) {
            return status;
        }
        if Instant::now() > deadline {
            warn!("the serving process {pid} did not exit; killing it");
            // SAFETY: kill of our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above, now blocking: SIGKILL can't be ignored.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return status;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills and reaps every child but `keep`: processes a serving process left behind.
fn kill_strays(keep: Option<libc::pid_t>) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let Ok(list) = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) else {
        return;
    };
    for pid in list.split_whitespace().filter_map(|p| p.parse().ok()) {
        if Some(pid) != keep {
            warn!("process {pid}, left behind by a serving process, is killed");
            // SAFETY: kill and reap a child of ours (a subreaper's orphan).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap_within(pid, ANSWER_WAIT);
        }
    }
}

/// The exit code that tells a wait `status`: the child's own, or 128 + its signal.
fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

fn log_death(status: libc::c_int) {
    if libc::WIFSIGNALED(status) {
        error!(
            "the daemon serving a frontend was killed by {}",
            crate::sandbox::signal_name(libc::WTERMSIG(status))
        );
    }
}
