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

mod record;
mod wire;

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use log::{error, info, warn};

use crate::sandbox::SocketName;
use record::Record;
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
/// The crash test hook's variable (`recovery`): a replacement process never inherits it.
const CRASH_HOOK_VAR: &str = "VFSD_TEST_CRASH";
/// SET_DEVICE_STATE_FD's directions and the phase it is used in.
const SAVE: u32 = 0;
const LOAD: u32 = 1;
const STOPPED: u32 = 0;

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
pub fn run(sup: Supervisor) -> Result<(), String> {
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
    let child = st
        .spawn(None)
        .map_err(|e| format!("cannot start the serving process: {e}"))?;
    st.main_loop(child, None)
}

/// Goes on as the supervisor whose state `fd` holds (`State::reexec`); returns only if
/// that state can't be read.
pub fn resume(fd: RawFd) -> String {
    // SAFETY: the fd is the memfd the previous image of this process left open for it.
    let file = std::fs::File::from(unsafe { wire::adopt(fd) });
    let (image, record): (Image, Record) = match read_image(file) {
        Ok(i) => i,
        Err(e) => return format!("cannot read the supervisor's state: {e}"),
    };
    if image.version != IMAGE_VERSION {
        return format!(
            "the supervisor's state is version {}, this binary reads {IMAGE_VERSION}",
            image.version
        );
    }
    let sigfd = match signal_fd() {
        Ok(f) => f,
        Err(e) => return e,
    };
    // SAFETY (each adopt and import below): the previous image of this process left these
    // fds open for it and holds them nowhere else.
    let known = |n: &str| -> Option<&'static str> {
        ["metrics-fd", "stats-fd"].into_iter().find(|k| *k == n)
    };
    let sup = Supervisor {
        exe: PathBuf::from(OsString::from_vec(image.exe)),
        args: image.args.into_iter().map(OsString::from_vec).collect(),
        listener: UnixListener::from(unsafe { wire::adopt(image.listener) }),
        inherited: (image.inherited.into_iter())
            .filter_map(|(n, fd)| Some((known(&n)?, unsafe { wire::adopt(fd) })))
            .collect(),
        socket: (!image.socket.is_empty()).then(|| unsafe { SocketName::import(image.socket) }),
        keep_listening: image.keep_listening,
    };
    let frontend = image
        .frontend
        .map(|fd| UnixStream::from(unsafe { wire::adopt(fd) }));
    let conn = UnixStream::from(unsafe { wire::adopt(image.child_conn) });
    let pidfd = match open_pidfd(image.child) {
        Ok(p) => p,
        Err(e) => return format!("the serving process {}: {e}", image.child),
    };
    let st = State {
        sup,
        sigfd,
        record,
        acked_reply_ack: image.acked_reply_ack,
        asked_features: image.asked_features,
        awaited_msgs: image.awaited.iter().map(|_| None).collect(),
        awaited: image.awaited.into(),
        dropped: false,
        terminating: image.terminating,
        // A termination signal relayed before the exec: the serving process has as long
        // again to exit.
        kill_at: image.terminating.then(|| Instant::now() + ANSWER_WAIT),
        crashes: Default::default(),
    };
    // As in `run` (exec keeps it; set again in case an older image did not).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    info!("supervisor: now running {}", st.sup.exe.display());
    let keeper = image
        .child_keeper
        .map(|fd| UnixStream::from(unsafe { wire::adopt(fd) }));
    let child = Child {
        pid: image.child,
        pidfd,
        conn,
        keeper,
    };
    st.main_loop(child, frontend)
}

/// The supervisor's state across its exec of a new binary.
#[derive(serde::Serialize, serde::Deserialize)]
struct Image {
    version: u32,
    exe: Vec<u8>,
    args: Vec<Vec<u8>>,
    listener: RawFd,
    inherited: Vec<(String, RawFd)>,
    socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
    keep_listening: bool,
    frontend: Option<RawFd>,
    child: libc::pid_t,
    child_conn: RawFd,
    child_keeper: Option<RawFd>,
    acked_reply_ack: bool,
    asked_features: bool,
    awaited: Vec<(u32, u32)>,
    terminating: bool,
}

/// Bumped when `Image` changes: a binary refuses an image it can't read before it acts.
const IMAGE_VERSION: u32 = 2;
/// The most a supervisor's image can take: far over what the record's bounds allow.
const MAX_IMAGE: u64 = 64 << 20;

fn read_image(file: std::fs::File) -> Result<(Image, Record), String> {
    use std::io::{Read, Seek};
    let mut file = file;
    file.rewind().map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    (&mut file)
        .take(MAX_IMAGE)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    let (version, _) = postcard::take_from_bytes::<u32>(&buf).map_err(|e| e.to_string())?;
    if version == 1 {
        let (old, record): (ImageV1, Record) =
            postcard::from_bytes(&buf).map_err(|e| e.to_string())?;
        return Ok((old.into(), record));
    }
    postcard::from_bytes(&buf).map_err(|e| e.to_string())
}

/// `Image` as version 1 wrote it: its serving process has no keeper.
#[derive(serde::Deserialize)]
struct ImageV1 {
    _version: u32,
    exe: Vec<u8>,
    args: Vec<Vec<u8>>,
    listener: RawFd,
    inherited: Vec<(String, RawFd)>,
    socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
    keep_listening: bool,
    frontend: Option<RawFd>,
    child: libc::pid_t,
    child_conn: RawFd,
    acked_reply_ack: bool,
    asked_features: bool,
    awaited: Vec<(u32, u32)>,
    terminating: bool,
}

impl From<ImageV1> for Image {
    fn from(o: ImageV1) -> Image {
        Image {
            // Read: it is this version's image now.
            version: IMAGE_VERSION,
            exe: o.exe,
            args: o.args,
            listener: o.listener,
            inherited: o.inherited,
            socket: o.socket,
            keep_listening: o.keep_listening,
            frontend: o.frontend,
            child: o.child,
            child_conn: o.child_conn,
            child_keeper: None,
            acked_reply_ack: o.acked_reply_ack,
            asked_features: o.asked_features,
            awaited: o.awaited,
            terminating: o.terminating,
        }
    }
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
                        error!("{e}; the frontend's connection ends");
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

    /// The serving process died (its keeper reported wait status `status`): a new one
    /// takes its guest over, on the same connection, from what it recorded and the fds
    /// its keeper held; the frontend sees nothing. Err: why not, and the session ends.
    fn take_over(&mut self, child: &mut Child, status: libc::c_int) -> Result<(), String> {
        let started = Instant::now();
        log_death(status);
        if self.terminating {
            return Err("it died while vfsd was stopping".into());
        }
        if self.awaited_msgs.iter().any(Option::is_none) {
            return Err(
                "it died with the frontend waiting for an answer to a request not kept".into(),
            );
        }
        if let Some(why) = self.record.busy() {
            return Err(format!("no take-over: {why}"));
        }
        if !self.note_crash() {
            return Err(format!(
                "serving processes died more than {CRASH_LOOP} times within {} s",
                CRASH_WINDOW.as_secs()
            ));
        }
        if child.keeper.is_none() {
            return Err("it was started by an older vfsd, which kept nothing of it".into());
        }
        // A new process may die during its own take-over (a request the dead one held
        // kills it too): its keeper then holds all the first one did, and the next takes
        // over from it, within the crash-loop bound.
        let new = loop {
            let new = self
                .spawn(child.keeper.as_ref())
                .map_err(|e| format!("cannot start a serving process: {e}"))?;
            // It takes the dead one's nodes over before it answers anything: a large
            // session takes longer than a plain answer.
            let set_up = watching_death(&new, || {
                probe_within(&new.conn, TAKE_OVER_WAIT)
                    .and_then(|()| replay(&new.conn, self.record.replay_device()))
                    .and_then(|()| replay(&new.conn, self.record.replay_vrings()))
            });
            match set_up {
                Ok(()) => break new,
                Err(e) if e == DIED => {
                    let status = match read_death(&new) {
                        KeeperSaid::Died(s) => s,
                        _ => return Err(kill(new, "the new serving process died".into())),
                    };
                    log_death(status);
                    if !self.note_crash() {
                        return Err(kill(
                            new,
                            format!(
                                "serving processes died more than {CRASH_LOOP} times within {} s",
                                CRASH_WINDOW.as_secs()
                            ),
                        ));
                    }
                    // The one that died now is the one to take over from.
                    let old = std::mem::replace(child, new);
                    drop(old.conn);
                    drop(old.keeper);
                    reap_within(old.pid, ANSWER_WAIT);
                }
                Err(e) => return Err(kill(new, format!("the new serving process: {e}"))),
            }
        };
        // What the frontend still waits for, asked again: the answers go to it as usual.
        for m in self.awaited_msgs.iter().flatten() {
            let again = m.try_clone().map_err(|e| e.to_string());
            if let Err(e) = again.and_then(|m| wire::send(&new.conn, &m).map_err(|e| e.to_string()))
            {
                return Err(kill(new, format!("the new serving process: {e}")));
            }
        }
        for k in self.record.kicks() {
            // SAFETY: an eventfd write of 8 bytes from a valid buffer.
            unsafe { libc::write(k.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
        }
        info!(
            "a new serving process took the guest over in {} ms",
            started.elapsed().as_millis()
        );
        let old = std::mem::replace(child, new);
        let Child {
            pid, conn, keeper, ..
        } = old;
        drop(conn);
        drop(keeper);
        reap_within(pid, ANSWER_WAIT);
        Ok(())
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

    /// Starts a serving process from the binary now at `exe`, its vhost-user connection
    /// already queued on a listener only it holds.
    /// `recover`: the keeper of a serving process that died, whose guest the new one
    /// takes over.
    fn spawn(&self, recover: Option<&UnixStream>) -> io::Result<Child> {
        let (listener, conn) = private_pair()?;
        conn.set_read_timeout(Some(PART_WAIT))?;
        conn.set_write_timeout(Some(ANSWER_WAIT))?;
        let (keeper, keeper_child) = crate::recovery::keeper::channel()?;
        crate::recovery::keeper::want_senders(&keeper)?;
        let mut cmd = std::process::Command::new(&self.sup.exe);
        cmd.args(&self.sup.args);
        cmd.arg(format!("--serve-fd={}", listener.as_raw_fd()));
        cmd.arg(format!("--keeper-fd={}", keeper_child.as_raw_fd()));
        let mut pass = vec![listener.as_raw_fd(), keeper_child.as_raw_fd()];
        if let Some(r) = recover {
            cmd.arg(format!("--recover-fd={}", r.as_raw_fd()));
            pass.push(r.as_raw_fd());
        }
        // A test hook armed with `:every` goes on to every replacement, as a request
        // that kills each process serving it would.
        let every = std::env::var(CRASH_HOOK_VAR).is_ok_and(|v| v.ends_with(":every"));
        if (recover.is_some() || !self.crashes.is_empty()) && !every {
            cmd.env_remove(CRASH_HOOK_VAR);
        }
        for (opt, fd) in &self.sup.inherited {
            cmd.arg(format!("--{opt}={}", fd.as_raw_fd()));
            pass.push(fd.as_raw_fd());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl on fds this
        // process holds, sigprocmask and prctl.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &pass {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // Only the termination signals stay blocked, across the exec, until the
                // new process's handlers exist (`daemon::run`): one relayed before would
                // kill it half started.
                let mut early: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut early);
                libc::sigaddset(&mut early, libc::SIGTERM);
                libc::sigaddset(&mut early, libc::SIGINT);
                libc::sigprocmask(libc::SIG_SETMASK, &early, std::ptr::null_mut());
                // SIGUSR2 is the supervisor's (`pkill -USR2 vfsd` reaches every vfsd
                // process); ignored from the start, and across exec.
                libc::signal(libc::SIGUSR2, libc::SIG_IGN);
                // The serving process never outlives its supervisor.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        // A file just written may be open for writing a moment longer (in a child of the
        // writer that has not exec'd yet): ETXTBSY, tried again for up to a second.
        let mut tries = 0;
        let child = loop {
            match cmd.spawn() {
                Err(e) if e.kind() == io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => break r?,
            }
        };
        let pid = child.id() as libc::pid_t;
        let pidfd = open_pidfd(pid).inspect_err(|_| {
            // SAFETY: kill and reap our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap_within(pid, ANSWER_WAIT);
        })?;
        drop(keeper_child);
        Ok(Child {
            pid,
            pidfd,
            conn,
            keeper: Some(keeper),
        })
    }

    /// Runs the binary at `exe` as this supervisor, with its state: after an upgrade
    /// every vfsd process runs the new binary, and the VMM's pid stays. Returns only if
    /// the exec failed; this supervisor then goes on.
    fn reexec(&self, frontend: Option<&UnixStream>, child: &Child) {
        let image = Image {
            version: IMAGE_VERSION,
            exe: self.sup.exe.clone().into_os_string().into_vec(),
            args: self.sup.args.iter().map(|a| a.clone().into_vec()).collect(),
            listener: wire::inheritable(self.sup.listener.as_raw_fd()),
            inherited: (self.sup.inherited.iter())
                .map(|(n, fd)| (n.to_string(), wire::inheritable(fd.as_raw_fd())))
                .collect(),
            socket: (self.sup.socket.iter())
                .flat_map(|s| s.export())
                .map(|(fd, n, id)| (wire::inheritable(fd), n, id))
                .collect(),
            keep_listening: self.sup.keep_listening,
            frontend: frontend.map(|f| wire::inheritable(f.as_raw_fd())),
            child: child.pid,
            child_conn: wire::inheritable(child.conn.as_raw_fd()),
            child_keeper: child
                .keeper
                .as_ref()
                .map(|k| wire::inheritable(k.as_raw_fd())),
            acked_reply_ack: self.acked_reply_ack,
            asked_features: self.asked_features,
            awaited: self.awaited.iter().copied().collect(),
            terminating: self.terminating,
        };
        // The record's fds are made inheritable as it is written.
        let r = postcard::to_stdvec(&(&image, &self.record))
            .map_err(io::Error::other)
            .and_then(|bytes| {
                // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
                let fd = unsafe { libc::memfd_create(c"vfsd-supervisor".as_ptr(), 0) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: memfd_create returned a new fd nothing else owns.
                let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                std::io::Write::write_all(&mut f, &bytes)?;
                Ok(f)
            });
        let e = match r {
            Ok(f) => {
                let mut cmd = std::process::Command::new(&self.sup.exe);
                cmd.args(&self.sup.args)
                    .arg(format!("--supervisor-state-fd={}", f.as_raw_fd()));
                // Not Command::exec, which would unblock the signals the signalfd takes:
                // one sent during the exec must wait for the new image.
                exec_keeping_signals(&cmd)
            }
            Err(e) => e,
        };
        error!(
            "supervisor: cannot run {}: {e}; this one goes on",
            self.sup.exe.display()
        );
        for fd in self.inheritable_fds(frontend, child) {
            // SAFETY: plain fcntl on fds this process holds.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }

    /// Every fd `reexec` made inheritable, to close on exec again.
    fn inheritable_fds(&self, frontend: Option<&UnixStream>, child: &Child) -> Vec<RawFd> {
        let mut v = vec![self.sup.listener.as_raw_fd(), child.conn.as_raw_fd()];
        v.extend(child.keeper.as_ref().map(|k| k.as_raw_fd()));
        v.extend(frontend.map(|f| f.as_raw_fd()));
        v.extend(self.sup.inherited.iter().map(|(_, f)| f.as_raw_fd()));
        v.extend(self.sup.socket.iter().flat_map(|s| s.dir_fds()));
        v.extend(self.record.fds());
        v
    }

    /// A second SIGUSR2 during a handover is not a second request: dropped; other
    /// signals that came meanwhile are relayed.
    fn drop_second_requests(&mut self, child: &Child) {
        for s in read_signals(&self.sigfd) {
            if s != libc::SIGUSR2 {
                self.relay(s, child);
            }
        }
    }

    /// SIGUSR2 before any frontend: the serving process is replaced by one of the binary
    /// now at the path; no state to hand over.
    fn replace_idle(&mut self, child: &mut Child) {
        match self.spawn(None) {
            Ok(new) => {
                let old = std::mem::replace(child, new);
                // SAFETY: kill of our own child, not yet reaped.
                unsafe { libc::kill(old.pid, libc::SIGKILL) };
                reap_within(old.pid, ANSWER_WAIT);
                kill_strays(Some(child.pid));
                info!("upgrade: {} now serves", self.sup.exe.display());
                self.drop_second_requests(child);
                self.reexec(None, child);
            }
            Err(e) => error!("upgrade refused: cannot start the new binary: {e}"),
        }
    }

    /// SIGUSR2 with a frontend connected: hands the session over to a serving process
    /// of the binary now at the path, or leaves the old one serving.
    fn upgrade(&mut self, frontend: &UnixStream, child: &mut Child) {
        let started = Instant::now();
        match self.hand_over(frontend, child) {
            Ok(new) => {
                let old = std::mem::replace(child, new);
                let Child { pid, conn, .. } = old;
                // The old process exits once its connection closes; its files and locks
                // are shared with the new one, which keeps them.
                drop(conn);
                reap_within(pid, ANSWER_WAIT);
                kill_strays(Some(child.pid));
                info!(
                    "upgrade: {} now serves (pause {} ms)",
                    self.sup.exe.display(),
                    started.elapsed().as_millis()
                );
                self.drop_second_requests(child);
                self.reexec(Some(frontend), child);
            }
            Err(e) => {
                error!("upgrade refused: {e}; the running binary goes on serving");
                self.drop_second_requests(child);
            }
        }
    }

    fn hand_over(&mut self, frontend: &UnixStream, old: &mut Child) -> Result<Child, String> {
        if let Some(why) = self.record.busy() {
            return Err(why.into());
        }
        if !crate::passthrough::RuntimeDir::path().is_some_and(|p| p.is_dir()) {
            return Err(
                "no runtime directory for the lock handover ($XDG_RUNTIME_DIR/vfsd or /run/vfsd)"
                    .into(),
            );
        }
        // The new process starts and takes the device's set-up while the old one still
        // serves: its start-up is no part of the pause.
        let new = self
            .spawn(None)
            .map_err(|e| format!("cannot start the new binary: {e}"))?;
        if let Err(e) = replay(&new.conn, self.record.replay_device()) {
            return Err(kill(new, format!("new process: {e}")));
        }
        // The frontend waits for nothing from the old process any more.
        let deadline = Instant::now() + ANSWER_WAIT;
        while !self.awaited.is_empty() {
            let m = match recv_by(&old.conn, deadline) {
                Ok(m) => m,
                Err(e) => return Err(kill(new, format!("serving process: {e}"))),
            };
            if self.answered(&m) {
                if let Err(e) = wire::send(frontend, &m) {
                    return Err(kill(new, format!("frontend: {e}")));
                }
            }
        }
        let rings = self.record.started();
        let mut stopped = Vec::new();
        let mut r = Ok(());
        for &i in &rings {
            let m = Msg::request(code::GET_VRING_BASE, wire::vring_state(i, 0), Vec::new());
            match ask(&old.conn, &m).map(|r| r.u32_at(1)) {
                Ok(Some(base)) => {
                    self.record.stopped_at(i, base);
                    stopped.push(i);
                }
                Ok(None) => r = Err("a short GET_VRING_BASE answer".to_string()),
                Err(e) => r = Err(format!("stopping ring {i}: {e}")),
            }
            if r.is_err() {
                break;
            }
        }
        let r = r.and_then(|()| self.move_state(old, &new, &rings));
        match r {
            Ok(()) => Ok(new),
            Err(e) => {
                let e = kill(new, e);
                self.restart_rings(&old.conn, &stopped)
                    .map_err(|r| format!("{e}; and the old process could not go on: {r}"))?;
                Err(e)
            }
        }
    }

    /// Sets the rings `rings` going again, from where they stopped.
    fn restart_rings(&mut self, conn: &UnixStream, rings: &[u32]) -> Result<(), String> {
        self.record.restart(rings);
        replay(conn, self.record.replay_vrings())?;
        for k in self.record.kicks() {
            // SAFETY: an eventfd write of 8 bytes from a valid buffer.
            unsafe { libc::write(k.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
        }
        Ok(())
    }

    /// The old process's device state into the new one, and the new one's rings going.
    fn move_state(&mut self, old: &Child, new: &Child, rings: &[u32]) -> Result<(), String> {
        let (r, w) = crate::sys::pipe().map_err(|e| e.to_string())?;
        transfer(&old.conn, SAVE, w).map_err(|e| format!("saving the state: {e}"))?;
        transfer(&new.conn, LOAD, r).map_err(|e| format!("loading the state: {e}"))?;
        check(&new.conn).map_err(|e| format!("the new binary refused the state: {e}"))?;
        check(&old.conn).map_err(|e| format!("saving the state: {e}"))?;
        self.restart_rings(&new.conn, rings)
            .map_err(|e| format!("new process: {e}"))
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
fn kill(child: Child, e: String) -> String {
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

/// execv of `cmd`'s program and arguments, keeping the signal mask (and so the pending
/// signals) as it is. Returns only on failure.
fn exec_keeping_signals(cmd: &std::process::Command) -> io::Error {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |s: &std::ffi::OsStr| CString::new(s.as_bytes()).map_err(io::Error::other);
    let prog = match c(cmd.get_program()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut argv = vec![prog.clone()];
    for a in cmd.get_args() {
        match c(a) {
            Ok(a) => argv.push(a),
            Err(e) => return e,
        }
    }
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated strings that outlive the call, in a NULL-terminated array.
    unsafe { libc::execv(prog.as_ptr(), ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// A listening socket for a serving process, and the supervisor's connection to it,
/// made in a directory only this user can enter, whose name is gone before the serving
/// process starts: nobody else can ever connect to it.
fn private_pair() -> io::Result<(UnixListener, UnixStream)> {
    let template = std::env::temp_dir().join("vfsd-XXXXXX");
    let mut raw = std::ffi::CString::new(template.into_os_string().into_encoded_bytes())
        .map_err(io::Error::other)?
        .into_bytes_with_nul();
    // SAFETY: mkdtemp rewrites the XXXXXX of a NUL-terminated buffer we own.
    if unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    raw.pop();
    // SAFETY: mkdtemp left valid path bytes (the template's, with letters for the Xs).
    let dir = PathBuf::from(unsafe { OsString::from_encoded_bytes_unchecked(raw) });
    let path = dir.join("s");
    let pair = UnixListener::bind(&path).and_then(|l| Ok((UnixStream::connect(&path)?, l)));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    let (c, l) = pair?;
    Ok((l, c))
}

/// Blocks the signals the supervisor acts on and gives a signalfd for them.
fn signal_fd() -> Result<OwnedFd, String> {
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
            return Err(format!("signalfd: {}", io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The signals that came, in order.
fn read_signals(fd: &OwnedFd) -> Vec<libc::c_int> {
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

/// Which of `fds` are readable (or hung up), waiting at most `timeout`.
fn poll(fds: &[RawFd], timeout: Option<Duration>) -> Vec<bool> {
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

thread_local! {
    /// The keeper channel of a serving process being set up (`watching_death`).
    static WATCHED: std::cell::Cell<RawFd> = const { std::cell::Cell::new(-1) };
}

/// What a set-up step fails with when the process it sets up dies meanwhile (its
/// keeper reported; the report is left for `read_death`).
const DIED: &str = "it died";

/// Runs `f` (a set-up of `child`), ending any wait for its answer as soon as its keeper
/// reports its death: its connection stays open in the keeper, so only the keeper tells.
fn watching_death<T>(child: &Child, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    WATCHED.set(keeper_fd(child));
    let r = f();
    WATCHED.set(-1);
    r
}

/// The next message from the serving process, by `deadline`.
fn recv_by(conn: &UnixStream, deadline: Instant) -> io::Result<Msg> {
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
fn ask(conn: &UnixStream, m: &Msg) -> io::Result<Msg> {
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
fn probe_within(conn: &UnixStream, wait: Duration) -> Result<(), String> {
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
fn probe(conn: &UnixStream) -> Result<(), String> {
    ask(
        conn,
        &Msg::request(code::GET_FEATURES, Vec::new(), Vec::new()),
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Sends recorded requests, taking the answers of those that get one, and waits until
/// all are handled.
fn replay(conn: &UnixStream, msgs: io::Result<Vec<Msg>>) -> Result<(), String> {
    for m in msgs.map_err(|e| e.to_string())? {
        if m.expects_reply(false) {
            ask(conn, &m).map_err(|e| e.to_string())?;
        } else {
            wire::send(conn, &m).map_err(|e| e.to_string())?;
        }
    }
    probe(conn)
}

/// SET_DEVICE_STATE_FD with `pipe`, for a stopped device.
fn transfer(conn: &UnixStream, direction: u32, pipe: OwnedFd) -> Result<(), String> {
    let mut body = direction.to_le_bytes().to_vec();
    body.extend_from_slice(&STOPPED.to_le_bytes());
    let r = ask(
        conn,
        &Msg::request(code::SET_DEVICE_STATE_FD, body, vec![pipe]),
    )
    .map_err(|e| e.to_string())?;
    match r.u64_at(0) {
        Some(v) if v & 0xff == 0 => Ok(()),
        _ => Err("refused".into()),
    }
}

fn check(conn: &UnixStream) -> Result<(), String> {
    let m = Msg::request(code::CHECK_DEVICE_STATE, Vec::new(), Vec::new());
    // A load with many nodes to find takes longer than a plain answer.
    wire::send(conn, &m).map_err(|e| e.to_string())?;
    let r = recv_by(conn, Instant::now() + 6 * ANSWER_WAIT).map_err(|e| e.to_string())?;
    match r.u64_at(0) {
        Some(0) => Ok(()),
        _ => Err("the transfer failed (its log says why)".into()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct WrittenV1 {
        version: u32,
        exe: Vec<u8>,
        args: Vec<Vec<u8>>,
        listener: RawFd,
        inherited: Vec<(String, RawFd)>,
        socket: Vec<(RawFd, Vec<u8>, (u64, u64))>,
        keep_listening: bool,
        frontend: Option<RawFd>,
        child: libc::pid_t,
        child_conn: RawFd,
        acked_reply_ack: bool,
        asked_features: bool,
        awaited: Vec<(u32, u32)>,
        terminating: bool,
    }

    #[test]
    fn an_image_an_older_supervisor_wrote_is_read_without_a_keeper() {
        let old = WrittenV1 {
            version: 1,
            exe: b"/usr/bin/vfsd".to_vec(),
            args: vec![b"--shared-dir".to_vec(), b"/srv".to_vec()],
            listener: 3,
            inherited: vec![],
            socket: vec![],
            keep_listening: true,
            frontend: Some(4),
            child: 77,
            child_conn: 5,
            acked_reply_ack: true,
            asked_features: true,
            awaited: vec![],
            terminating: false,
        };
        let bytes = postcard::to_stdvec(&(&old, &Record::default())).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        let (image, _) = read_image(f).unwrap();
        assert_eq!(image.version, IMAGE_VERSION);
        assert_eq!(
            (image.child, image.child_conn, image.child_keeper),
            (77, 5, None)
        );
        assert_eq!(image.frontend, Some(4));
        assert!(image.keep_listening);
    }
}
