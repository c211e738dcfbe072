//! The stall rule (`--lock-stall-timeout`, module doc of `filelocks`): when each guest
//! lock owner and guest thread last asked anything, and the watchdog thread that answers
//! EDEADLK to a wait whose holders in this table have all been idle for the timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::deadlock::DEADLOCK_STEPS;
use super::range_set::Range;
use super::table::{FileLocks, Owners};
use crate::filesystem::wake::{cancel_all, Blocker};

/// Slots of the stall rule's table of guest callers (`FileLocks::note_caller`): 16 KiB.
const CALLER_SLOTS: usize = 4096;

/// Owners, ranges and waits the stall watchdog may look at in one tick, in all: it runs
/// under the table's mutex. The waits it did not reach are looked at first next time.
const STALL_STEPS: usize = 16 * DEADLOCK_STEPS;

/// When each guest lock owner last sent a lock request (SETLK, SETLKW, GETLK) or a FLUSH,
/// in milliseconds of `FileLocks::now_ms`, for the stall rule (`FileLocks::stalled_waits`).
/// An entry older than the timeout means what no entry means, so such entries are pruned
/// as the map grows. Nothing is recorded while the rule is off.
#[derive(Default)]
pub(super) struct Activity {
    /// `--lock-stall-timeout` in milliseconds; 0: off.
    pub(super) timeout_ms: u64,
    pub(super) last: HashMap<u64, u64>,
    prune_at: usize,
}

impl Activity {
    pub(super) fn touch(&mut self, owner: u64, now: u64) {
        if self.timeout_ms == 0 {
            return;
        }
        self.last.insert(owner, now);
        if self.last.len() > self.prune_at {
            let t = self.timeout_ms;
            self.last.retain(|_, at| now.saturating_sub(*at) < t);
            self.prune_at = (2 * self.last.len()).max(1024);
        }
    }

    /// Whether `owner` has asked nothing for the whole timeout.
    fn idle(&self, owner: u64, now: u64) -> bool {
        self.last
            .get(&owner)
            .is_none_or(|&at| now.saturating_sub(at) >= self.timeout_ms)
    }
}

/// What wakes the stall watchdog, shared with it so that it sleeps without holding the
/// table: a count of wakes.
#[derive(Default)]
pub(super) struct WatchdogWake {
    count: Mutex<u64>,
    cv: Condvar,
}

impl WatchdogWake {
    fn count(&self) -> u64 {
        *self.count.lock().unwrap()
    }

    pub(super) fn wake(&self) {
        *self.count.lock().unwrap() += 1;
        self.cv.notify_all();
    }

    /// Sleeps until a wake after the count `seen`, or for `timeout`.
    fn sleep(&self, seen: u64, timeout: Duration) {
        let c = self.count.lock().unwrap();
        drop(
            self.cv
                .wait_timeout_while(c, timeout, |c| *c == seen)
                .unwrap(),
        );
    }
}

impl Owners {
    /// The stall rule's test for a wait of `me` for `range` of `node`: some other owner
    /// of this table holds a conflicting range, and every one that does is idle for the
    /// timeout (`Activity`) and waits for nothing itself. Each owner and range looked at
    /// costs one of `budget`; none left: false.
    fn holders_stalled(
        &self,
        me: u64,
        node: u64,
        range: Range,
        now: u64,
        budget: &mut usize,
        caller_idle: &dyn Fn(u32) -> bool,
    ) -> bool {
        let Some(owners) = self.by_node.get(&node) else {
            return false;
        };
        let mut any = false;
        for (&k, e) in owners {
            if k == me {
                continue;
            }
            if *budget == 0 {
                return false;
            }
            *budget -= 1;
            let conflicts = e
                .owner
                .state
                .lock()
                .unwrap()
                .ranges
                .conflicts(&range, budget);
            if *budget == 0 {
                // A conflicting range may be among those not looked at.
                return false;
            }
            if !conflicts {
                continue;
            }
            if !self.active.idle(k, now)
                || self.waits.by_owner.contains_key(&k)
                || !caller_idle(e.owner.pid.load(Ordering::Relaxed))
            {
                return false;
            }
            any = true;
        }
        any
    }
}

impl FileLocks {
    /// Turns the stall rule on (`--lock-stall-timeout`; zero leaves it off): a POSIX or
    /// OFD wait that has waited `t`, for guest owners that have all been idle for `t`, is
    /// answered EDEADLK (see the module doc).
    pub fn with_stall_timeout(mut self, t: Duration) -> Self {
        self.stall_ms = t.as_millis().min(u64::MAX as u128) as u64;
        self.owners.get_mut().unwrap().active.timeout_ms = self.stall_ms;
        if self.stall_ms > 0 {
            self.tick_ms = (self.stall_ms / 4).clamp(100, 1000);
            self.callers = (0..CALLER_SLOTS).map(|_| AtomicU32::new(0)).collect();
        }
        self
    }

    /// A request of guest thread `pid` came (any opcode): its slot takes the current
    /// tick. One load, and a store only when the tick moved on.
    pub fn note_caller(&self, pid: u32) {
        if let Some(slot) = self.callers.get(pid as usize % CALLER_SLOTS) {
            let t = self.ticks.load(Ordering::Relaxed);
            if slot.load(Ordering::Relaxed) != t {
                slot.store(t, Ordering::Relaxed);
            }
        }
    }

    /// Whether guest pid `pid` has sent nothing for the stall timeout, as the watchdog's
    /// ticks count it.
    fn caller_idle(&self, pid: u32) -> bool {
        let Some(slot) = self.callers.get(pid as usize % CALLER_SLOTS) else {
            return true;
        };
        let quiet = self
            .ticks
            .load(Ordering::Relaxed)
            .wrapping_sub(slot.load(Ordering::Relaxed));
        u64::from(quiet) * self.tick_ms >= self.stall_ms
    }

    /// Starts the stall watchdog on the first wait. It ticks every quarter of the timeout
    /// (100 ms to 1 s) while waits exist, sleeps while none do, and ends with the table.
    pub(super) fn start_watchdog(self: &Arc<Self>) {
        if self.stall_ms == 0 || self.watchdog_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.watchdog.clone();
        let tick = Duration::from_millis(self.tick_ms);
        let spawned = std::thread::Builder::new()
            .name("vfsd-lock-stall".into())
            .stack_size(256 * 1024)
            .spawn(move || watchdog(weak, wake, tick));
        if let Err(e) = spawned {
            log::warn!("no lock stall watchdog thread (tried again at the next wait): {e}");
            self.watchdog_started.store(false, Ordering::Release);
        }
    }

    /// The waits the stall rule ends now (module doc), marked as stalled: each has waited
    /// the timeout, and every guest owner holding a range in its way has been idle that
    /// long and waits for nothing itself. Gives what calls their threads off.
    fn stalled_waits(&self, cursor: &mut u64) -> Vec<Arc<Blocker>> {
        let now = self.now_ms();
        let mut m = self.owners.lock().unwrap();
        let mut due: Vec<(u64, u64, u64, Range)> = m
            .waits
            .by_owner
            .iter()
            .flat_map(|(&k, v)| {
                v.iter()
                    .filter(|w| {
                        !w.stalled
                            && w.stall.is_some()
                            && now.saturating_sub(w.started) >= self.stall_ms
                    })
                    .map(move |w| (w.id, k, w.node, w.range))
            })
            .collect();
        due.sort_unstable_by_key(|w| w.0);
        // Those after the last one looked at first: a spent budget starves none.
        let after = due.partition_point(|w| w.0 <= *cursor);
        due.rotate_left(after);
        let mut budget = STALL_STEPS.saturating_sub(due.len());
        let mut hit = Vec::new();
        for (id, k, node, range) in due {
            if budget == 0 {
                break;
            }
            *cursor = id;
            if m.holders_stalled(k, node, range, now, &mut budget, &|pid| {
                self.caller_idle(pid)
            }) {
                if let Some(w) = m.waits.get_mut(k, id) {
                    w.stalled = true;
                    hit.extend(w.stall.clone());
                }
            }
        }
        hit
    }
}

/// The stall watchdog of a `FileLocks` (`FileLocks::start_watchdog`): ends the waits the
/// stall rule finds, every `tick` while any wait exists. It holds the table only while it
/// looks at it, so the table (its owners' descriptions, and their host locks) ends with
/// the filesystem; `wake` then ends the thread.
fn watchdog(table: Weak<FileLocks>, wake: Arc<WatchdogWake>, tick: Duration) {
    let mut cursor = 0;
    loop {
        // Read before the look: a wait that begins after it wakes the sleep below.
        let seen = wake.count();
        let Some(locks) = table.upgrade() else {
            return;
        };
        let idle = locks.owners.lock().unwrap().waits.by_owner.is_empty();
        drop(locks);
        if idle {
            // Woken by the next wait or the table's end; now and then anyway.
            wake.sleep(seen, Duration::from_secs(10));
            continue;
        }
        std::thread::sleep(tick);
        let Some(locks) = table.upgrade() else {
            return;
        };
        locks.ticks.fetch_add(1, Ordering::Relaxed);
        let stalled = locks.stalled_waits(&mut cursor);
        drop(locks);
        // Outside the table's lock: each thread takes it as its wait ends.
        cancel_all(&stalled);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_stall_rules_activity_is_kept_only_for_owners_in_the_table() {
        let locks = FileLocks::new(true, true, 1000, 100, 16, false)
            .with_stall_timeout(std::time::Duration::from_secs(86400));
        // FLUSHes (and unlocks) of owners that never locked: a hostile guest's stream.
        for owner in 0..100_000u64 {
            locks.release_owner(owner % 7, owner);
        }
        let m = locks.owners.lock().unwrap();
        assert_eq!(m.active.last.len(), 0);
        assert!(m.keys.is_empty());
    }

    /// The stall watchdog sleeps without holding its table while nothing waits: the
    /// table, with its owners' open descriptions and their host locks, ends with the
    /// filesystem, not up to 10 s later on the watchdog's thread.
    #[test]
    fn an_idle_stall_watchdog_lets_its_table_end() {
        let locks = Arc::new(
            FileLocks::new(true, true, 1000, 100, 16, false)
                .with_stall_timeout(Duration::from_millis(400)),
        );
        locks.start_watchdog();
        // Its first look finds no wait: it sleeps until one begins.
        std::thread::sleep(Duration::from_millis(200));
        let table = Arc::downgrade(&locks);
        drop(locks);
        let t = Instant::now();
        while table.strong_count() > 0 && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            table.strong_count(),
            0,
            "the idle watchdog still holds the table"
        );
    }
}
