//! Busy-polling a request ring after the queue thread answered a pop, before it sleeps on
//! the kick eventfd (`FsDevice::process_queue`): a guest that sends its next request
//! within the window neither kicks nor waits for the thread to wake (a wake-up after
//! 100 µs idle costs several µs, after 1 ms tens). The window is per queue and, under
//! `PollMode::Adaptive`, follows the guest:
//!
//! - a poll that catches a request keeps the window, and widens it when the catch came
//!   late in it (`caught`);
//! - a poll that misses is judged at the next wake-up (`woke`): a request that came
//!   within `MAX_WINDOW` of the reply would have been caught by a wider window, which it
//!   gets; one that came later halves the window, and `MISSES_TO_REST` such misses in a
//!   row stop polling for `REST_POPS` pops, after which one poll probes again. An idle
//!   guest so costs one poll per `REST_POPS` requests.
//!
//! Whatever the guest does, adaptive polling spins at most `BUDGET` of each `PERIOD` per
//! queue: a guest pacing its requests to be caught late in the widest window would
//! otherwise have a queue thread spin nearly all the time for few requests.
//!
//! docs/design.md ("Polling the ring") gives the figures behind the default.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether the queue thread polls its ring after answering a pop (`--poll`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// Never after a reply (the brief watch after quick metadata served inline stays:
    /// `route::RingPoll`).
    #[default]
    Off,
    /// A window that follows the guest, resting while polls keep missing.
    Adaptive,
    /// `MAX_WINDOW` after every pop the queue thread answered.
    On,
}

/// `--poll=auto` polls adaptively on a host with at least this many CPUs. On 2 CPUs the
/// guest's (or load generator's) thread mostly runs on the CPU the queue thread spins
/// on, and waits for the poll to end: measured, polling there doubled the round trip at
/// a 20-100 µs gap and took 10-30 times the CPU per request. With a CPU to itself it
/// cut the round trip 2.5-3 times (docs/design.md, "Polling the ring").
pub const AUTO_MIN_CPUS: usize = 4;

impl PollMode {
    /// `--poll=auto` on a host with `cpus` CPUs.
    pub fn for_host(cpus: usize) -> PollMode {
        if cpus >= AUTO_MIN_CPUS {
            PollMode::Adaptive
        } else {
            PollMode::Off
        }
    }
}

/// The widest window: a reply, the guest's next syscall and its request well within it,
/// and still a small share of a CPU when most polls miss.
pub const MAX_WINDOW: Duration = Duration::from_micros(200);
/// The narrowest window an adaptive queue polls with.
pub const MIN_WINDOW: Duration = Duration::from_micros(10);
/// A queue's first window.
pub const START_WINDOW: Duration = Duration::from_micros(50);
/// Misses beyond `MAX_WINDOW` in a row before an adaptive queue stops polling...
pub const MISSES_TO_REST: u32 = 4;
/// ...for this many pops.
pub const REST_POPS: u32 = 64;
/// Adaptive polling spins at most `BUDGET` of each `PERIOD`, per queue.
pub const PERIOD: Duration = Duration::from_millis(100);
pub const BUDGET: Duration = Duration::from_millis(25);

/// Per queue: what its thread learns of how soon the guest sends its next request.
pub struct BusyPoll {
    mode: PollMode,
    /// Each queue's window, in ns.
    window: Vec<AtomicU32>,
    /// Misses beyond reach in a row.
    misses: Vec<AtomicU32>,
    /// Pops left before polling again.
    rest: Vec<AtomicU32>,
    /// When the last poll gave up, in ns since `epoch` plus one (0: it did not).
    gave_up: Vec<AtomicU64>,
    /// The current period's start (ns since `epoch`) and the time spun in it.
    period: Vec<AtomicU64>,
    spun: Vec<AtomicU64>,
    epoch: Instant,
}

fn ns(d: Duration) -> u32 {
    d.as_nanos().min(u32::MAX as u128) as u32
}

impl BusyPoll {
    pub fn new(queues: usize, mode: PollMode) -> BusyPoll {
        let each = |v: u32| (0..queues).map(|_| AtomicU32::new(v)).collect();
        BusyPoll {
            mode,
            window: each(ns(START_WINDOW)),
            misses: each(0),
            rest: each(0),
            gave_up: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            period: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            spun: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
    }

    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// How long to poll `queue` after a pop its thread answered; None: sleep now.
    pub fn window(&self, queue: usize) -> Option<Duration> {
        match self.mode {
            PollMode::Off => None,
            PollMode::On => Some(MAX_WINDOW),
            PollMode::Adaptive if self.over_budget(queue, Instant::now()) => None,
            PollMode::Adaptive => {
                let rest = &self.rest[queue];
                match rest.load(Ordering::Relaxed) {
                    0 => Some(Duration::from_nanos(
                        self.window[queue].load(Ordering::Relaxed).into(),
                    )),
                    n => {
                        rest.store(n - 1, Ordering::Relaxed);
                        None
                    }
                }
            }
        }
    }

    /// A poll of `queue` caught a request `after` it began.
    pub fn caught(&self, queue: usize, after: Duration) {
        self.charge(queue, after, Instant::now());
        self.misses[queue].store(0, Ordering::Relaxed);
        let w = &self.window[queue];
        let want = ns(after + after / 2).clamp(ns(MIN_WINDOW), ns(MAX_WINDOW));
        if want > w.load(Ordering::Relaxed) {
            w.store(want, Ordering::Relaxed);
        }
    }

    /// A poll of `queue` gave up at `at`.
    pub fn missed(&self, queue: usize, at: Instant) {
        let window = Duration::from_nanos(self.window[queue].load(Ordering::Relaxed).into());
        self.charge(queue, window, at);
        let since = self.since_epoch(at);
        self.gave_up[queue].store(since + 1, Ordering::Relaxed);
    }

    /// `queue`'s thread woke to serve it: after a poll that missed, how long the guest
    /// took tells how the window should change.
    fn since_epoch(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Counts `d` spun on `queue` at `at` against the period's budget.
    fn charge(&self, queue: usize, d: Duration, at: Instant) {
        let now = self.since_epoch(at);
        if now.saturating_sub(self.period[queue].load(Ordering::Relaxed))
            >= PERIOD.as_nanos() as u64
        {
            self.period[queue].store(now, Ordering::Relaxed);
            self.spun[queue].store(0, Ordering::Relaxed);
        }
        self.spun[queue].fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Whether `queue` spun its budget in the period `at` falls in.
    fn over_budget(&self, queue: usize, at: Instant) -> bool {
        let now = self.since_epoch(at);
        now.saturating_sub(self.period[queue].load(Ordering::Relaxed)) < PERIOD.as_nanos() as u64
            && self.spun[queue].load(Ordering::Relaxed) >= BUDGET.as_nanos() as u64
    }

    pub fn woke(&self, queue: usize) {
        if self.mode == PollMode::Adaptive && self.gave_up[queue].load(Ordering::Relaxed) != 0 {
            self.woke_at(queue, Instant::now());
        }
    }

    /// `woke`, at `at`.
    fn woke_at(&self, queue: usize, at: Instant) {
        if self.mode != PollMode::Adaptive {
            return;
        }
        let gave_up = self.gave_up[queue].swap(0, Ordering::Relaxed);
        if gave_up == 0 {
            return;
        }
        let slept = self.since_epoch(at).saturating_sub(gave_up - 1);
        let w = &self.window[queue];
        let window = w.load(Ordering::Relaxed);
        let gap = u64::from(window) + slept;
        if gap <= u64::from(ns(MAX_WINDOW)) {
            // A wider window would have caught it.
            self.misses[queue].store(0, Ordering::Relaxed);
            let want = (gap + gap / 4).min(u64::from(ns(MAX_WINDOW))) as u32;
            w.store(want.max(ns(MIN_WINDOW)), Ordering::Relaxed);
            return;
        }
        w.store((window / 2).max(ns(MIN_WINDOW)), Ordering::Relaxed);
        let misses = self.misses[queue].load(Ordering::Relaxed) + 1;
        if misses >= MISSES_TO_REST {
            self.rest[queue].store(REST_POPS, Ordering::Relaxed);
            // After the rest one more such miss rests again.
            self.misses[queue].store(MISSES_TO_REST - 1, Ordering::Relaxed);
        } else {
            self.misses[queue].store(misses, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A poll of queue 1 that missed, and the guest's next request `slept` after.
    fn miss(p: &BusyPoll, slept: Duration) {
        let t = Instant::now();
        p.missed(1, t);
        p.woke_at(1, t + slept);
    }

    fn window(p: &BusyPoll) -> Duration {
        p.window(1).expect("polls")
    }

    #[test]
    fn off_never_polls_and_on_always_polls_the_widest_window() {
        let off = BusyPoll::new(2, PollMode::Off);
        assert_eq!(off.window(1), None);
        let on = BusyPoll::new(2, PollMode::On);
        for _ in 0..MISSES_TO_REST * 4 {
            miss(&on, Duration::from_secs(1));
            assert_eq!(on.window(1), Some(MAX_WINDOW), "misses don't change it");
        }
    }

    #[test]
    fn a_catch_late_in_the_window_widens_it_and_an_early_one_keeps_it() {
        let p = BusyPoll::new(2, PollMode::Adaptive);
        assert_eq!(window(&p), START_WINDOW);
        p.caught(1, us(5));
        assert_eq!(window(&p), START_WINDOW, "an early catch keeps it");
        p.caught(1, us(40));
        assert_eq!(window(&p), us(60), "a late one widens it by half the wait");
        for _ in 0..16 {
            let w = window(&p);
            p.caught(1, w);
        }
        assert_eq!(window(&p), MAX_WINDOW, "up to the widest");
        assert_eq!(p.window(0), Some(START_WINDOW), "queues learn apart");
    }

    #[test]
    fn a_miss_that_a_wider_window_would_have_caught_widens_it() {
        let p = BusyPoll::new(2, PollMode::Adaptive);
        // 50 µs polled, the request 30 µs after: 80 µs, and a quarter more.
        miss(&p, us(30));
        assert_eq!(window(&p), us(100));
        miss(&p, us(100));
        assert_eq!(window(&p), MAX_WINDOW, "never past the widest");
        for _ in 0..MISSES_TO_REST * 4 {
            miss(&p, us(0));
            assert!(p.window(1).is_some(), "near misses never rest it");
        }
    }

    #[test]
    fn misses_beyond_reach_narrow_the_window_then_rest_and_one_probe_tells() {
        let p = BusyPoll::new(2, PollMode::Adaptive);
        let far = us(1000);
        miss(&p, far);
        assert_eq!(window(&p), START_WINDOW / 2, "halved");
        for _ in 0..8 {
            let w = window(&p);
            p.caught(1, w / 3);
        }
        assert_eq!(window(&p), START_WINDOW / 2, "early catches keep it");
        miss(&p, far);
        miss(&p, far);
        assert_eq!(window(&p), MIN_WINDOW, "never under the narrowest");
        miss(&p, far);
        p.caught(1, us(1));
        for _ in 0..MISSES_TO_REST - 1 {
            miss(&p, far);
        }
        assert!(p.window(1).is_some(), "a catch started the count again");
        miss(&p, far);
        let rested = (0..REST_POPS).filter(|_| p.window(1).is_none()).count();
        assert_eq!(rested, REST_POPS as usize, "rests after misses in a row");
        assert!(p.window(1).is_some(), "then probes");
        miss(&p, far);
        assert_eq!(p.window(1), None, "and one more miss rests it again");
        assert!(p.window(0).is_some(), "per queue");
        for _ in 0..REST_POPS {
            p.window(1);
        }
        let w = window(&p);
        p.caught(1, w);
        for _ in 0..MISSES_TO_REST - 1 {
            miss(&p, far);
        }
        assert!(p.window(1).is_some(), "a probe that catches ends the rest");
    }

    #[test]
    fn adaptive_polling_spins_at_most_its_budget_of_a_period() {
        let p = BusyPoll::new(2, PollMode::Adaptive);
        let start = Instant::now();
        // A guest whose every request comes late in the widest window.
        let mut spun = Duration::ZERO;
        while p.window(1).is_some() {
            p.charge(1, MAX_WINDOW, start);
            spun += MAX_WINDOW;
            assert!(spun <= BUDGET, "polled past the budget");
        }
        assert_eq!(spun, BUDGET, "polls until the budget is spent");
        assert!(
            p.over_budget(1, start + PERIOD / 2),
            "for the rest of the period"
        );
        assert!(!p.over_budget(0, start), "per queue");
        assert!(
            !p.over_budget(1, start + PERIOD),
            "a new period starts afresh"
        );
        let on = BusyPoll::new(2, PollMode::On);
        on.charge(1, BUDGET * 2, start);
        assert_eq!(on.window(1), Some(MAX_WINDOW), "--poll=on has no budget");
    }

    #[test]
    fn a_wake_up_without_a_missed_poll_says_nothing() {
        let p = BusyPoll::new(2, PollMode::Adaptive);
        p.woke_at(1, Instant::now() + Duration::from_secs(1));
        assert_eq!(window(&p), START_WINDOW);
        miss(&p, Duration::from_secs(1));
        p.woke_at(1, Instant::now() + us(1));
        assert_eq!(
            window(&p),
            START_WINDOW / 2,
            "only the first wake-up counts"
        );
    }
}
