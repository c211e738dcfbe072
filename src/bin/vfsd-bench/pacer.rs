//! When each of a queue's jobs may send its next request, and from when its operation's
//! latency counts.
//!
//! An operation is one or more requests (steps) a job sends one after the other. The
//! gap, a guest's time between its syscalls, comes once before an operation's first step,
//! never between steps, and never counts in the latency. The latency runs from the moment
//! the operation may go, its gap over, as the worker sees it (its first request's
//! submission, or with guest locking the moment it starts waiting for the inode lock, a
//! wait a guest's syscall also has) to the reply of its last timed step. Steps after the
//! timed ones are the operation's clean-up (a RELEASE and UNLINK after a timed CREATE):
//! sent at once, not timed.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum State {
    /// The next operation may go at this time.
    Gap(Instant),
    /// May go: `step` waits for a free inode lock (or the worker's next look).
    Ready(u8),
    /// `step` is in flight.
    Flight(u8),
}

#[derive(Clone, Copy, Debug)]
struct Job {
    state: State,
    /// Since when the current operation's latency counts.
    start: Instant,
}

pub struct Pacer {
    gap: Duration,
    steps: u8,
    timed: u8,
    locking: bool,
    jobs: Vec<Job>,
}

impl Pacer {
    /// `jobs` jobs, each running operations of `steps` requests of which the first
    /// `timed` are timed, `gap` apart; with `locking`, a request goes only once the
    /// worker's `try_lock` (in `next`) takes the guest's inode lock, which the worker
    /// frees at its completion.
    pub fn new(
        jobs: usize,
        steps: u8,
        timed: u8,
        gap: Duration,
        locking: bool,
        now: Instant,
    ) -> Self {
        assert!(timed >= 1 && timed <= steps);
        let job = Job {
            state: State::Gap(now),
            start: now,
        };
        Pacer {
            gap,
            steps,
            timed,
            locking,
            jobs: vec![job; jobs],
        }
    }

    /// A request to send at `now`, (job, step), or None. Call it until None.
    pub fn next(
        &mut self,
        now: Instant,
        mut try_lock: impl FnMut() -> bool,
    ) -> Option<(usize, u8)> {
        for (i, j) in self.jobs.iter_mut().enumerate() {
            if let State::Gap(at) = j.state {
                if at <= now {
                    j.state = State::Ready(0);
                    j.start = now;
                }
            }
            if let State::Ready(step) = j.state {
                if self.locking && !try_lock() {
                    continue;
                }
                j.state = State::Flight(step);
                return Some((i, step));
            }
        }
        None
    }

    /// When `next` has a request again if nothing completes first: the earliest end of a
    /// gap (None if no job waits on one).
    pub fn wake_at(&self) -> Option<Instant> {
        self.jobs
            .iter()
            .filter_map(|j| match j.state {
                State::Gap(at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// `job`'s request completed at `now`; gives the operation's latency when that was
    /// its last timed step.
    pub fn completed(&mut self, job: usize, now: Instant) -> Option<Duration> {
        let j = &mut self.jobs[job];
        let State::Flight(step) = j.state else {
            panic!("job {job} completed with nothing in flight");
        };
        let next = step + 1;
        j.state = if next < self.steps {
            State::Ready(next)
        } else {
            State::Gap(now + self.gap)
        };
        (next == self.timed).then(|| now - j.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_gap_is_not_counted_in_the_latency() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1, 1, 1, 100 * US, false, t0);
        assert_eq!(p.next(t0, || true), Some((0, 0)));
        assert_eq!(p.completed(0, t0 + 10 * US), Some(10 * US));
        // The next one waits the gap...
        assert_eq!(p.next(t0 + 10 * US, || true), None);
        assert_eq!(p.wake_at(), Some(t0 + 110 * US));
        assert_eq!(p.next(t0 + 100 * US, || true), None);
        // ...and counts from when it went, however late the worker woke.
        assert_eq!(p.next(t0 + 180 * US, || true), Some((0, 0)));
        assert_eq!(p.completed(0, t0 + 190 * US), Some(10 * US));
    }

    #[test]
    fn a_multi_step_operation_waits_the_gap_once_before_its_first_step() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1, 2, 2, 100 * US, false, t0);
        assert_eq!(p.next(t0, || true), Some((0, 0)));
        assert_eq!(p.completed(0, t0 + 10 * US), None);
        // The second step goes at once.
        assert_eq!(p.next(t0 + 10 * US, || true), Some((0, 1)));
        assert_eq!(p.completed(0, t0 + 25 * US), Some(25 * US));
        assert_eq!(p.next(t0 + 30 * US, || true), None);
        assert_eq!(p.next(t0 + 125 * US, || true), Some((0, 0)));
    }

    #[test]
    fn untimed_clean_up_steps_follow_at_once_and_the_gap_after_them() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1, 3, 1, 100 * US, false, t0);
        assert_eq!(p.next(t0, || true), Some((0, 0)));
        assert_eq!(p.completed(0, t0 + 10 * US), Some(10 * US));
        assert_eq!(p.next(t0 + 10 * US, || true), Some((0, 1)));
        assert_eq!(p.completed(0, t0 + 20 * US), None);
        assert_eq!(p.next(t0 + 20 * US, || true), Some((0, 2)));
        assert_eq!(p.completed(0, t0 + 30 * US), None);
        assert_eq!(p.next(t0 + 120 * US, || true), None);
        assert_eq!(p.next(t0 + 130 * US, || true), Some((0, 0)));
    }

    #[test]
    fn with_guest_locking_the_gap_is_waited_and_the_lock_wait_counted() {
        let t0 = Instant::now();
        let held = Cell::new(false);
        let try_lock = || !held.replace(true);
        let mut p = Pacer::new(2, 1, 1, 100 * US, true, t0);
        assert_eq!(p.next(t0, try_lock), Some((0, 0)));
        // Job 1 may go but waits for the lock from now.
        assert_eq!(p.next(t0, try_lock), None);
        held.set(false);
        assert_eq!(p.completed(0, t0 + 10 * US), Some(10 * US));
        assert_eq!(p.next(t0 + 10 * US, try_lock), Some((1, 0)));
        held.set(false);
        assert_eq!(p.completed(1, t0 + 20 * US), Some(20 * US));
        // Job 0's gap runs to 110 µs, lock free or not.
        assert_eq!(p.next(t0 + 20 * US, try_lock), None);
        assert_eq!(p.wake_at(), Some(t0 + 110 * US));
        assert_eq!(p.next(t0 + 110 * US, try_lock), Some((0, 0)));
    }
}
