//! An upgrade in place (SIGUSR2): the session goes over to a serving process of the
//! binary now at vfsd's path. The old process stops its rings and saves the device state,
//! as for a migration, straight into the new one; the supervisor then sets the new one's
//! rings up at the indices where the old one stopped.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use log::{error, info};

use super::error::{StepContext, StepError};
use super::requests::{ask, recv_by, replay};
use super::signals::read_signals;
use super::wire::{self, code, Msg};
use super::{kill, kill_strays, reap_within, Child, State, ANSWER_WAIT};
use crate::error::Chain;

/// SET_DEVICE_STATE_FD's directions and the phase it is used in.
const SAVE: u32 = 0;
const LOAD: u32 = 1;
const STOPPED: u32 = 0;

impl State {
    /// A second SIGUSR2 during a handover is not a second request: dropped; other
    /// signals that came meanwhile are relayed.
    pub(super) fn drop_second_requests(&mut self, child: &Child) {
        for s in read_signals(&self.sigfd) {
            if s != libc::SIGUSR2 {
                self.relay(s, child);
            }
        }
    }

    /// SIGUSR2 before any frontend: the serving process is replaced by one of the binary
    /// now at the path; no state to hand over.
    pub(super) fn replace_idle(&mut self, child: &mut Child) {
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
    pub(super) fn upgrade(&mut self, frontend: &UnixStream, child: &mut Child) {
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
                error!(
                    "upgrade refused: {}; the running binary goes on serving",
                    Chain(&e)
                );
                self.drop_second_requests(child);
            }
        }
    }

    pub(super) fn hand_over(
        &mut self,
        frontend: &UnixStream,
        old: &mut Child,
    ) -> Result<Child, StepError> {
        if let Some(why) = self.record.busy() {
            return Err(StepError::cannot(why));
        }
        if !crate::passthrough::RuntimeDir::path().is_some_and(|p| p.is_dir()) {
            return Err(StepError::cannot(
                "no runtime directory for the lock handover ($XDG_RUNTIME_DIR/vfsd or /run/vfsd)",
            ));
        }
        // The new process starts and takes the device's set-up while the old one still
        // serves: its start-up is no part of the pause.
        let new = self
            .spawn(None)
            .step(|| "cannot start the new binary".into())?;
        if let Err(e) = replay(&new.conn, self.record.replay_device()) {
            return Err(kill(new, e.in_step("new process")));
        }
        // The frontend waits for nothing from the old process any more.
        let deadline = Instant::now() + ANSWER_WAIT;
        while !self.awaited.is_empty() {
            let m = match recv_by(&old.conn, deadline) {
                Ok(m) => m,
                Err(e) => return Err(kill(new, e.in_step("serving process"))),
            };
            if self.answered(&m) {
                if let Err(e) = wire::send(frontend, &m) {
                    return Err(kill(new, StepError::from(e).in_step("frontend")));
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
                Ok(None) => r = Err(StepError::ShortBase),
                Err(e) => r = Err(e.in_step(format!("stopping ring {i}"))),
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
                match self.restart_rings(&old.conn, &stopped) {
                    Ok(()) => Err(e),
                    Err(r) => Err(StepError::NotResumed {
                        failed: Box::new(e),
                        source: Box::new(r),
                    }),
                }
            }
        }
    }

    /// Sets the rings `rings` going again, from where they stopped.
    pub(super) fn restart_rings(
        &mut self,
        conn: &UnixStream,
        rings: &[u32],
    ) -> Result<(), StepError> {
        self.record.restart(rings);
        replay(conn, self.record.replay_vrings())?;
        for k in self.record.kicks() {
            // SAFETY: an eventfd write of 8 bytes from a valid buffer.
            unsafe { libc::write(k.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
        }
        Ok(())
    }

    /// The old process's device state into the new one, and the new one's rings going.
    pub(super) fn move_state(
        &mut self,
        old: &Child,
        new: &Child,
        rings: &[u32],
    ) -> Result<(), StepError> {
        let (r, w) = crate::sys::pipe()?;
        transfer(&old.conn, SAVE, w).step(|| "saving the state".into())?;
        transfer(&new.conn, LOAD, r).step(|| "loading the state".into())?;
        check(&new.conn).step(|| "the new binary refused the state".into())?;
        check(&old.conn).step(|| "saving the state".into())?;
        self.restart_rings(&new.conn, rings)
            .step(|| "new process".into())
    }
}

/// SET_DEVICE_STATE_FD with `pipe`, for a stopped device.
fn transfer(conn: &UnixStream, direction: u32, pipe: OwnedFd) -> Result<(), StepError> {
    let mut body = direction.to_le_bytes().to_vec();
    body.extend_from_slice(&STOPPED.to_le_bytes());
    let r = ask(
        conn,
        &Msg::request(code::SET_DEVICE_STATE_FD, body, vec![pipe]),
    )?;
    match r.u64_at(0) {
        Some(v) if v & 0xff == 0 => Ok(()),
        _ => Err(StepError::Refused),
    }
}

/// CHECK_DEVICE_STATE: whether the state went over.
fn check(conn: &UnixStream) -> Result<(), StepError> {
    let m = Msg::request(code::CHECK_DEVICE_STATE, Vec::new(), Vec::new());
    // A load with many nodes to find takes longer than a plain answer.
    wire::send(conn, &m)?;
    let r = recv_by(conn, Instant::now() + 6 * ANSWER_WAIT)?;
    match r.u64_at(0) {
        Some(0) => Ok(()),
        _ => Err(StepError::TransferFailed),
    }
}
