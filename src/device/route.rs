//! Where each request runs: the one place that decides it.
//!
//! - **On the queue thread, without blocking**: a READ first tries to be answered there
//!   (`FuseServer::try_handle_without_blocking`: the page cache has the data, so no
//!   worker hand-off).
//! - **On the queue thread**: a lone request, when the guest waits for each reply before
//!   it sends the next (`Lone`) and the opcode is short (`Opcode::is_short`), or a READ
//!   that would block in that case, or a COPY_FILE_RANGE of at most `SHORT_COPY` bytes. A
//!   lone OPEN or CREATE too, unless it would wait for a host lease break: then it goes to
//!   the pool (`Opcode::opens_without_waiting`).
//!   Of several large READs in one pop (`SPREAD_READ`), all but one go to the pool, where
//!   workers copy them at once.
//! - **On the queue thread, beside others in flight**: a quick metadata request
//!   (`Opcode::is_quick_metadata`: LOOKUP, GETATTR, STATX, the xattr and directory reads,
//!   READLINK, STATFS, ACCESS) in a small pop (`inline_pop_limit`: at most `SMALL_POP`
//!   requests, or `SMALL_HOST_POP` on a host of at most `SMALL_HOST_CPUS`), when none of
//!   the queue's earlier requests are still with the pool and such requests served there
//!   have mostly been fast (`Inline`). It costs less than the hand-off to a worker.
//! - **On the queue thread, always**: the opcodes without a reply (FORGET, BATCH_FORGET,
//!   INTERRUPT, NOTIFY_REPLY), which do no more than drop nodes or wake a lock waiter
//!   (`Place::NoReply`). A hand-off cost more than they do: `git status` under `--cache
//!   never` sends a FORGET for every fourth request.
//! - **In the worker pool**: everything else, so WRITEs and blocking READs run in
//!   parallel whenever the guest sends several.
//! - **On a lock waiter**: not decided here. A SETLKW that must wait moves from wherever
//!   it runs to a thread of its own (`server::waiters`, answered through a `Deferred`).
//!
//! Opcode and length come from the head of the request's one copy, made when it is popped
//! (`server::Popped`), which is also what it is served from: a guest can't have a request
//! placed as one opcode and served as another.
//!
//! docs/design.md ("Lone requests", "The read fast path") gives the figures behind it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::Chain;
use crate::server::Opcode;

/// Pops in a row that found one request and nothing else in flight before the queue
/// thread serves such requests itself. A guest with parallel work often leaves the queue
/// with one request for a moment (the load generator at 8 in flight: a pop in seven), and
/// serving those on the queue thread cost it 7-13%; 16 in a row is a guest waiting on
/// each reply.
pub const LONE_POPS: u32 = 16;

/// On a host with more than `SMALL_HOST_CPUS` CPUs, pops of at most this many requests
/// have their quick metadata requests served on the queue thread (`Place::Inline`); a
/// larger pop goes to the pool, which serves it in parallel.
pub const SMALL_POP: usize = 4;

/// On a host with at most this many CPUs, a pop of any size has its quick metadata
/// requests served on the queue thread. Workers can't serve them in parallel there: the
/// guest's vCPUs want the same CPUs, and the hand-off costs more than the requests.
/// Measured on 2 CPUs with the load generator's lookup-getattr at 8 in flight, the pool
/// took 3 times the daemon CPU per request of serving on the queue thread, at half the
/// rate; and `git status` in a guest under `--cache never` twice the CPU (docs/design.md,
/// "Quick metadata beside others in flight").
pub const SMALL_HOST_CPUS: usize = 2;

/// The largest pop served inline on a small host: enough for a guest's parallel tree walk
/// (git's preload threads keep up to 20 requests in flight), and a bound on how long a pop
/// holds the queue thread should its requests turn slow.
pub const SMALL_HOST_POP: usize = 32;

/// The largest pop whose quick metadata requests run inline on a host with `cpus` CPUs.
pub fn inline_pop_limit(cpus: usize) -> usize {
    if cpus <= SMALL_HOST_CPUS {
        SMALL_HOST_POP
    } else {
        SMALL_POP
    }
}

/// The largest COPY_FILE_RANGE a lone queue serves itself: the largest WRITE
/// (`max_write`), which it serves too. `cp -a` copies each small file
/// with one, and a hand-off to a worker for each cost more than the copy (4,650 of them
/// in the tree benchmark's `cp -a`). A larger copy may take seconds, and goes to the pool.
pub const SHORT_COPY: u64 = crate::server::init::MAX_PAGES as u64 * 4096;

/// A READ at least this large is mostly the kernel's copy into guest memory (a 1 MiB one
/// about 150 µs here), against a worker hand-off of a few µs: when a pop holds several,
/// all but one go to the pool, so they are copied beside each other rather than one after
/// another on the queue thread.
pub const SPREAD_READ: u32 = 256 * 1024;

/// Whether `chain` is a READ of at least `SPREAD_READ`: with a pool, all but the last of
/// a pop's are copied by workers beside each other.
pub fn is_large_read(chain: &Chain) -> bool {
    chain.read_size().is_some_and(|s| s >= SPREAD_READ)
}

/// When most quick metadata requests served on a queue thread take longer than this (a
/// slow network share), they go to the pool again: the queue would wait on each of them.
pub const SLOW_INLINE: Duration = Duration::from_micros(50);

/// While a queue's inline requests are slow, one small pop in this many still serves its
/// quick metadata requests inline, to see whether they became fast again.
pub const PROBE_POPS: u32 = 32;

/// What the queue thread knows of its queue when it places a pop's requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queue {
    /// The guest waits on one request at a time (`Lone::observe`).
    pub alone: bool,
    /// Quick metadata requests may run inline (`Inline::allowed`).
    pub inline: bool,
}

/// Where a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A READ: tried on the queue thread without blocking, then `if_it_would_block`.
    NoWaitRead {
        if_it_would_block: Fallback,
    },
    /// Served on the queue thread, blocking if it must.
    QueueThread,
    /// A request that may open a file (`Opcode::opens_without_waiting`) served on the
    /// queue thread unless the open would wait for a host lease break; then in the pool
    /// (`FuseServer::handle_unless_it_waits`).
    QueueThreadUnlessItWaits,
    /// A quick metadata request served on the queue thread beside others in flight, timed
    /// for `Inline::took`.
    Inline,
    /// A request without a reply, served on the queue thread.
    NoReply,
    Pool,
}

/// Where a no-wait READ that would block goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    QueueThread,
    Pool,
}

/// Per queue: how many pops in a row found one request and nothing else in flight.
pub struct Lone {
    pops: Vec<AtomicU32>,
}

impl Lone {
    pub fn new(queues: usize) -> Lone {
        Lone {
            pops: (0..queues).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// After a pop of `popped` requests with `in_flight` requests of the queue not yet
    /// answered (these included): whether the guest is waiting on one request at a time.
    /// Any sign of parallel work starts the count again.
    pub fn observe(&self, queue: usize, popped: usize, in_flight: usize) -> bool {
        let pops = &self.pops[queue];
        match popped {
            0 => false, // a wake-up with nothing new says nothing
            1 if in_flight == 1 => pops.fetch_add(1, Ordering::Relaxed) >= LONE_POPS,
            _ => {
                pops.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// The guest sent more while a lone request was served: it has several in flight.
    pub fn busy(&self, queue: usize) {
        self.pops[queue].store(0, Ordering::Relaxed);
    }
}

/// Per queue: the moving share of some events among the last few (each new one weighs an
/// eighth), and a count of chances for a probe while the share says no.
struct Share {
    /// Out of `SHARE_SCALE`.
    share: Vec<AtomicU32>,
    /// Chances since the last probe.
    chances: Vec<AtomicU32>,
}

/// `Share::share` when every recent event counted.
const SHARE_SCALE: u32 = 1 << 16;

impl Share {
    fn new(queues: usize, full: bool) -> Share {
        let start = if full { SHARE_SCALE } else { 0 };
        Share {
            share: (0..queues).map(|_| AtomicU32::new(start)).collect(),
            chances: (0..queues).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Whether the share is at most `num / den` of the events.
    fn at_most(&self, queue: usize, num: u32, den: u32) -> bool {
        self.share[queue].load(Ordering::Relaxed) <= SHARE_SCALE / den * num
    }

    /// Whether the share is at least `num / den` of the events.
    fn at_least(&self, queue: usize, num: u32, den: u32) -> bool {
        self.share[queue].load(Ordering::Relaxed) >= SHARE_SCALE / den * num
    }

    fn record(&self, queue: usize, counted: bool) {
        let sample = if counted { SHARE_SCALE } else { 0 };
        let share = &self.share[queue];
        let old = share.load(Ordering::Relaxed);
        share.store((old - old / 8) + sample / 8, Ordering::Relaxed);
    }

    /// One chance in `PROBE_POPS` is a probe.
    fn probe_due(&self, queue: usize) -> bool {
        self.chances[queue].fetch_add(1, Ordering::Relaxed) % PROBE_POPS == PROBE_POPS - 1
    }
}

/// Per queue: how often the quick metadata requests its thread served inline were slow.
pub struct Inline {
    /// The largest pop served inline (`inline_pop_limit`).
    max_pop: usize,
    /// Inline requests slower than `SLOW_INLINE`; its chances are small pops while most
    /// are slow.
    slow: Share,
}

impl Inline {
    pub fn new(queues: usize, max_pop: usize) -> Inline {
        Inline {
            max_pop,
            slow: Share::new(queues, false),
        }
    }

    /// Whether a pop of `popped` requests, with `in_flight` of the queue not yet answered
    /// (these included), may serve its quick metadata requests inline: a pop of at most
    /// `max_pop`, with none of the queue's earlier requests still with the pool or a lock
    /// waiter, on a queue whose inline requests have mostly been fast (or a probe is
    /// due). Serving a GETATTR inline while workers serve the same guest's CREATEs and
    /// UNLINKs cost the load generator's churn 20-35% at 2 in flight.
    pub fn allowed(&self, queue: usize, popped: usize, in_flight: usize) -> bool {
        if popped > self.max_pop || in_flight > popped {
            return false;
        }
        self.fast(queue) || self.slow.probe_due(queue)
    }

    /// Whether at most half of the queue's recent inline requests were slow.
    pub fn fast(&self, queue: usize) -> bool {
        self.slow.at_most(queue, 1, 2)
    }

    /// Before each quick metadata request of a pop that `allowed`: whether it runs
    /// inline. A pop whose requests turn slow hands the rest to the pool; a probe pop
    /// (`probe`: the pop began while the queue was slow) serves its first such request
    /// inline all the same, or a slow queue would never be timed again and never get
    /// inline service back. (141f174 checked only `fast` here: a `git status` after the
    /// queue had turned slow once in the boot got no request served inline.)
    pub fn serve_next(&self, queue: usize, probe: &mut bool) -> bool {
        self.fast(queue) || std::mem::take(probe)
    }

    /// An inline request on `queue` took `took`. What counts is how many are slow, not
    /// by how much: on a small host a vCPU thread preempts the queue thread now and then
    /// in the middle of a request, and under an average those few long times sent a
    /// tenth of `git status`'s requests to the pool. A slow share makes every request
    /// slow, and six in a row turn inline service off.
    pub fn took(&self, queue: usize, took: Duration) {
        self.slow.record(queue, took > SLOW_INLINE);
    }
}

/// Per queue: whether to watch the ring for the guest's next request after a pop the
/// queue thread served inline (`INLINE_POLL` in `device`). It pays when the guest sends
/// its next request within microseconds, as a load generator on the host does; a TCG
/// guest mostly takes hundreds, and there the spinning only takes CPU its vCPUs want. So
/// a queue polls while most of its polls catch a request, and otherwise polls once in
/// `PROBE_POPS` to see whether they would again.
pub struct RingPoll {
    /// Polls that caught a request (all, at first); its chances are those to poll while
    /// polls mostly miss.
    hits: Share,
}

impl RingPoll {
    pub fn new(queues: usize) -> RingPoll {
        RingPoll {
            hits: Share::new(queues, true),
        }
    }

    /// Whether the queue thread should watch the ring now: three polls in four have
    /// caught a request, or a probe is due.
    pub fn worth(&self, queue: usize) -> bool {
        self.hits.at_least(queue, 3, 4) || self.hits.probe_due(queue)
    }

    /// A poll caught the guest's next request, or didn't.
    pub fn polled(&self, queue: usize, caught: bool) {
        self.hits.record(queue, caught);
    }
}

/// Where `chain` runs, given what its queue thread knows of the queue: decided on the
/// request's one copy, the one it is served from.
pub fn place(chain: &Chain, queue: Queue) -> Place {
    let op = chain.opcode();
    let short_copy = op == Some(Opcode::CopyFileRange)
        && queue.alone
        && chain.copy_len().is_some_and(|len| len <= SHORT_COPY);
    decide(op, short_copy, queue)
}

/// `place`, from the opcode (None: one vfsd doesn't know, or no readable header) and
/// whether it is a COPY_FILE_RANGE of at most `SHORT_COPY` bytes.
pub(super) fn decide(op: Option<Opcode>, short_copy: bool, queue: Queue) -> Place {
    match op {
        Some(Opcode::Read) => Place::NoWaitRead {
            if_it_would_block: if queue.alone {
                Fallback::QueueThread
            } else {
                Fallback::Pool
            },
        },
        Some(op) if op.takes_no_reply() => Place::NoReply,
        // A long copy goes to the pool below, whatever it opens.
        Some(op) if queue.alone && (op.is_short() || short_copy) => {
            if op.opens_without_waiting() {
                Place::QueueThreadUnlessItWaits
            } else {
                Place::QueueThread
            }
        }
        Some(Opcode::Open | Opcode::Create) if queue.alone => Place::QueueThreadUnlessItWaits,
        Some(op) if queue.inline && op.is_quick_metadata() => Place::Inline,
        _ => Place::Pool,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_alone_after_lone_pops_in_a_row_and_not_after_a_sign_of_parallel_work() {
        let lone = Lone::new(2);
        for _ in 0..LONE_POPS {
            assert!(!lone.observe(1, 1, 1));
        }
        assert!(lone.observe(1, 1, 1));
        assert!(!lone.observe(0, 1, 1), "queues count apart");
        assert!(
            !lone.observe(1, 0, 0) && lone.observe(1, 1, 1),
            "an empty wake-up says nothing"
        );
        assert!(!lone.observe(1, 1, 2), "another request in flight");
        assert!(!lone.observe(1, 1, 1), "which starts the count again");
        for _ in 0..LONE_POPS {
            lone.observe(1, 1, 1);
        }
        lone.busy(1);
        assert!(!lone.observe(1, 1, 1), "busy starts it again");
    }

    #[test]
    fn quick_metadata_runs_inline_in_a_small_pop_and_the_data_path_still_goes_to_the_pool() {
        let busy = Queue {
            alone: false,
            inline: true,
        };
        for op in [
            Opcode::Lookup,
            Opcode::Getattr,
            Opcode::Statx,
            Opcode::Readdirplus,
        ] {
            assert_eq!(decide(Some(op), false, busy), Place::Inline, "{op:?}");
        }
        for op in [Opcode::Write, Opcode::Release, Opcode::Open, Opcode::Fsync] {
            assert_eq!(decide(Some(op), false, busy), Place::Pool, "{op:?}");
        }
        assert_eq!(decide(None, false, busy), Place::Pool, "an unknown opcode");
        for op in [Opcode::Forget, Opcode::BatchForget, Opcode::Interrupt] {
            assert_eq!(
                decide(Some(op), false, Queue::default()),
                Place::NoReply,
                "{op:?}"
            );
        }
        assert_eq!(
            decide(Some(Opcode::Read), false, busy),
            Place::NoWaitRead {
                if_it_would_block: Fallback::Pool
            }
        );
        let large_or_slow = Queue::default();
        assert_eq!(
            decide(Some(Opcode::Lookup), false, large_or_slow),
            Place::Pool
        );
        let alone = Queue {
            alone: true,
            inline: false,
        };
        assert_eq!(
            decide(Some(Opcode::Write), false, alone),
            Place::QueueThreadUnlessItWaits
        );
        assert_eq!(
            decide(Some(Opcode::Lookup), false, alone),
            Place::QueueThread
        );
        let copy = Some(Opcode::CopyFileRange);
        assert_eq!(
            decide(copy, true, alone),
            Place::QueueThreadUnlessItWaits,
            "a short copy"
        );
        assert_eq!(decide(copy, false, alone), Place::Pool, "a long copy");
        assert_eq!(
            decide(copy, true, busy),
            Place::Pool,
            "beside others in flight"
        );
    }

    #[test]
    fn inline_is_for_small_pops_alone_with_the_pool_stops_when_slow_and_probes_again() {
        let inline = Inline::new(2, SMALL_POP);
        assert!(inline.allowed(1, 1, 1) && inline.allowed(1, SMALL_POP, SMALL_POP));
        assert!(
            !inline.allowed(1, SMALL_POP + 1, SMALL_POP + 1),
            "a large pop goes to the pool"
        );
        let small_host = Inline::new(2, inline_pop_limit(SMALL_HOST_CPUS));
        assert!(
            small_host.allowed(1, SMALL_HOST_POP, SMALL_HOST_POP),
            "a small host serves a large pop inline"
        );
        assert!(!small_host.allowed(1, 32, 33), "but not beside the pool");
        assert!(!small_host.allowed(1, 33, 33), "nor a pop without bound");
        assert_eq!(inline_pop_limit(SMALL_HOST_CPUS + 1), SMALL_POP);
        assert!(
            !inline.allowed(1, 1, 2),
            "not beside a request the pool still serves"
        );
        inline.took(1, Duration::from_secs(1));
        assert!(inline.allowed(1, 1, 1), "one slow request is an outlier");
        for _ in 0..32 {
            inline.took(1, Duration::from_micros(2));
            inline.took(1, Duration::from_micros(2));
            inline.took(1, Duration::from_secs(1));
        }
        assert!(inline.allowed(1, 1, 1), "so is every third one");
        for _ in 0..6 {
            inline.took(1, SLOW_INLINE * 2);
        }
        assert!(inline.allowed(0, 1, 1), "queues count apart");
        let probes = (0..PROBE_POPS * 2)
            .filter(|_| inline.allowed(1, 1, 1))
            .count();
        assert_eq!(probes, 2, "one small pop in PROBE_POPS probes a slow queue");
        for _ in 0..32 {
            inline.took(1, Duration::from_micros(2));
        }
        assert!(inline.allowed(1, 1, 1), "fast again");
    }

    #[test]
    fn a_probe_pop_times_one_request_inline_and_a_slow_queue_gets_inline_back() {
        let inline = Inline::new(2, SMALL_POP);
        for _ in 0..8 {
            inline.took(1, SLOW_INLINE * 2);
        }
        let mut probe = !inline.fast(1);
        assert!(probe, "slow: the next allowed pop is a probe");
        assert!(
            inline.serve_next(1, &mut probe),
            "its first request runs inline"
        );
        assert!(!inline.serve_next(1, &mut probe), "the rest go to the pool");
        let mut probes = 0;
        while !inline.fast(1) {
            let mut probe = true;
            if inline.serve_next(1, &mut probe) {
                inline.took(1, Duration::from_micros(2));
            }
            probes += 1;
            assert!(
                probes < 16,
                "fast requests in probes bring inline service back"
            );
        }
        let mut fast_pop = false;
        assert!(inline.serve_next(1, &mut fast_pop) && inline.serve_next(1, &mut fast_pop));
    }

    #[test]
    fn a_queue_polls_while_most_polls_catch_a_request_and_probes_otherwise() {
        let poll = RingPoll::new(2);
        assert!(poll.worth(1), "polls at first");
        poll.polled(1, false);
        poll.polled(1, true);
        assert!(poll.worth(1), "a miss now and then leaves it on");
        for _ in 0..3 {
            poll.polled(1, false);
        }
        assert!(
            !poll.worth(1) && poll.worth(0),
            "misses turn it off, per queue"
        );
        let probes = (0..PROBE_POPS * 2).filter(|_| poll.worth(1)).count();
        assert_eq!(probes, 2, "one chance in PROBE_POPS probes");
        for _ in 0..16 {
            poll.polled(1, true);
        }
        assert!(poll.worth(1), "catching again turns it on");
    }
}
