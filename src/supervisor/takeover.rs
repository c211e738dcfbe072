//! A serving process that dies: a new one takes its guest over, on the same connection,
//! from what the supervisor recorded and the fds the dead one's keeper held.

use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use log::info;

use super::error::{StepContext, StepError};
use super::requests::{probe_within, replay};
use super::{
    keeper_fd, kill, log_death, read_death, reap_within, wire, Child, KeeperSaid, State,
    ANSWER_WAIT, CRASH_LOOP, CRASH_WINDOW, TAKE_OVER_WAIT,
};

impl State {
    /// The serving process died (its keeper reported wait status `status`): a new one
    /// takes its guest over, on the same connection, from what it recorded and the fds
    /// its keeper held; the frontend sees nothing. Err: why not, and the session ends.
    pub(super) fn take_over(
        &mut self,
        child: &mut Child,
        status: libc::c_int,
    ) -> Result<(), StepError> {
        let started = Instant::now();
        log_death(status);
        if self.terminating {
            return Err(StepError::cannot("it died while vfsd was stopping"));
        }
        if self.awaited_msgs.iter().any(Option::is_none) {
            return Err(StepError::cannot(
                "it died with the frontend waiting for an answer to a request not kept",
            ));
        }
        if let Some(why) = self.record.busy() {
            return Err(StepError::cannot(format!("no take-over: {why}")));
        }
        if !self.note_crash() {
            return Err(crash_loop());
        }
        if child.keeper.is_none() {
            return Err(StepError::cannot(
                "it was started by an older vfsd, which kept nothing of it",
            ));
        }
        // A new process may die during its own take-over (a request the dead one held
        // kills it too): its keeper then holds all the first one did, and the next takes
        // over from it, within the crash-loop bound.
        let new = loop {
            let new = self
                .spawn(child.keeper.as_ref())
                .step(|| "cannot start a serving process".into())?;
            // It takes the dead one's nodes over before it answers anything: a large
            // session takes longer than a plain answer.
            let set_up = watching_death(&new, || {
                probe_within(&new.conn, TAKE_OVER_WAIT)
                    .and_then(|()| replay(&new.conn, self.record.replay_device()))
                    .and_then(|()| replay(&new.conn, self.record.replay_vrings()))
            });
            match set_up {
                Ok(()) => break new,
                Err(StepError::Died) => {
                    let status = match read_death(&new) {
                        KeeperSaid::Died(s) => s,
                        _ => {
                            let e = StepError::cannot("the new serving process died");
                            return Err(kill(new, e));
                        }
                    };
                    log_death(status);
                    if !self.note_crash() {
                        return Err(kill(new, crash_loop()));
                    }
                    // The one that died now is the one to take over from.
                    let old = std::mem::replace(child, new);
                    drop(old.conn);
                    drop(old.keeper);
                    reap_within(old.pid, ANSWER_WAIT);
                }
                Err(e) => return Err(kill(new, e.in_step("the new serving process"))),
            }
        };
        // What the frontend still waits for, asked again: the answers go to it as usual.
        for m in self.awaited_msgs.iter().flatten() {
            let again = m.try_clone().and_then(|m| wire::send(&new.conn, &m));
            if let Err(e) = again.step(|| "the new serving process".into()) {
                return Err(kill(new, e));
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
}

thread_local! {
    /// The keeper channel of a serving process being set up (`watching_death`).
    pub(super) static WATCHED: std::cell::Cell<RawFd> = const { std::cell::Cell::new(-1) };
}

/// Too many serving processes died too soon: no more are started.
fn crash_loop() -> StepError {
    StepError::cannot(format!(
        "serving processes died more than {CRASH_LOOP} times within {} s",
        CRASH_WINDOW.as_secs()
    ))
}

/// Runs `f` (a set-up of `child`), ending any wait for its answer as soon as its keeper
/// reports its death (`StepError::Died`): its connection stays open in the keeper, so
/// only the keeper tells.
pub(super) fn watching_death<T>(
    child: &Child,
    f: impl FnOnce() -> Result<T, StepError>,
) -> Result<T, StepError> {
    WATCHED.set(keeper_fd(child));
    let r = f();
    WATCHED.set(-1);
    r
}
