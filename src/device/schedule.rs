//! The scheduler: turns each pop into a plan, the steps its queue thread carries out
//! (`FsDevice::process_queue`). Where each request runs is `route::place`; the plan adds
//! what a pop decides as a whole: whether the guest waits on one request at a time
//! (`Lone`), whether quick metadata may run inline and stops when it turns slow
//! (`Inline`), which READs keep their descriptor lists while they wait (`READS_HEAP`),
//! and whether the queue thread watches the ring after the pop (`RingPoll`).

use std::time::Duration;

use super::route::{self, Fallback, Inline, Lone, Place, Queue, RingPoll};
use super::Chain;

/// The heap a pop's READs may keep in descriptor lists while they wait behind its other
/// requests (a 1 MiB READ's list takes 4-8 KiB); past it they are parked and read again
/// when tried (`Popped::park`).
pub const READS_HEAP: usize = 256 * 1024;

/// READs answered on a queue thread are put on the used ring in groups of at most this
/// many requests or bytes: one lock and one notification per group, without making the
/// first reply wait for a long batch.
pub const INLINE_BATCH: usize = 16;
pub const INLINE_BATCH_BYTES: usize = 1 << 20;

/// Whether a group of READ replies of `bytes` in all goes on the used ring now.
pub fn batch_full(replies: usize, bytes: usize) -> bool {
    replies >= INLINE_BATCH || bytes >= INLINE_BATCH_BYTES
}

/// What the queue thread does with one request of a pop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No worker pool: served on the queue thread as it comes, not counted as a placement.
    Here,
    /// Served on the queue thread, blocking if it must, watching the ring meanwhile
    /// (`Placement::ServedAlone`, `Plan::served_alone`).
    Alone,
    /// `Alone`, unless it would wait for a host lease break: then to the pool.
    AloneUnlessItWaits,
    /// A quick metadata request served beside others in flight, timed (`Plan::took`).
    Inline,
    /// A request without a reply, served on the queue thread.
    NoReply,
    Pool,
    /// A READ, tried without blocking once the pop's other requests are placed, then
    /// `if_it_would_block`. `park`: its descriptor list is dropped while it waits.
    Read {
        park: bool,
        if_it_would_block: Fallback,
    },
}

/// Per queue, what the device learns of the guest's pops over time.
pub struct Scheduler {
    pool: bool,
    lone: Lone,
    inline: Inline,
    poll: RingPoll,
}

impl Scheduler {
    /// For `queues` queues on a host with `cpus` CPUs; `pool`: there is a worker pool.
    pub fn new(queues: usize, cpus: usize, pool: bool) -> Scheduler {
        Scheduler {
            pool,
            lone: Lone::new(queues),
            inline: Inline::new(queues, route::inline_pop_limit(cpus)),
            poll: RingPoll::new(queues),
        }
    }

    /// The plan for a pop of `popped` requests from `queue`, with `in_flight` the queue's
    /// requests not yet answered (these included; only asked with a pool).
    pub fn plan(&self, queue: usize, popped: usize, in_flight: impl FnOnce() -> usize) -> Plan<'_> {
        let here = if self.pool {
            let in_flight = in_flight();
            Some(Queue {
                alone: self.lone.observe(queue, popped, in_flight),
                inline: self.inline.allowed(queue, popped, in_flight),
            })
        } else {
            None
        };
        Plan {
            sched: self,
            queue,
            // A pop allowed inline while the queue is slow probes it.
            probe: here.is_some_and(|q| q.inline && !self.inline.fast(queue)),
            here,
            reads_heap: 0,
            busy_meanwhile: false,
            served_inline: false,
            answered: false,
        }
    }

    /// After a pop: whether the queue thread watches the ring for the guest's next
    /// request (`INLINE_POLL`). Only after one that served quick metadata inline, with
    /// nothing of this queue left to the pool (`in_flight`): its workers need the CPU.
    pub fn poll_now(
        &self,
        queue: usize,
        served_inline: bool,
        in_flight: impl FnOnce() -> usize,
    ) -> bool {
        served_inline && in_flight() == 0 && self.poll.worth(queue)
    }

    /// A poll caught the guest's next request, or didn't.
    pub fn polled(&self, queue: usize, caught: bool) {
        self.poll.polled(queue, caught);
    }
}

/// One pop's plan, made a request at a time as the queue thread comes to it (what runs
/// inline depends on how fast the pop's earlier inline requests were).
pub struct Plan<'s> {
    sched: &'s Scheduler,
    queue: usize,
    /// What the queue thread knows of the queue; None without a pool.
    here: Option<Queue>,
    probe: bool,
    reads_heap: usize,
    busy_meanwhile: bool,
    served_inline: bool,
    /// The queue thread answered one of the pop's requests itself (`busy_poll`).
    answered: bool,
}

impl Plan<'_> {
    /// The step for `chain`, decided on the request's one copy (`route::place`).
    pub fn step(&mut self, chain: &Chain) -> Step {
        match self.here {
            None => Step::Here,
            Some(here) => self.step_at(route::place(chain, here), || chain.heap_bytes()),
        }
    }

    /// The step for a request `route` places at `place`; `heap`: a READ's descriptor
    /// lists' heap.
    fn step_at(&mut self, place: Place, heap: impl FnOnce() -> usize) -> Step {
        match place {
            Place::NoWaitRead { if_it_would_block } => {
                // Behind the pop's other requests: their descriptor lists stay, up to a
                // budget (`Popped::park`).
                let heap = heap();
                let park = self.reads_heap + heap > READS_HEAP;
                if !park {
                    self.reads_heap += heap;
                }
                Step::Read {
                    park,
                    if_it_would_block,
                }
            }
            Place::QueueThread => Step::Alone,
            Place::QueueThreadUnlessItWaits => Step::AloneUnlessItWaits,
            // Its requests turned slow earlier in this pop.
            Place::Inline if !self.sched.inline.serve_next(self.queue, &mut self.probe) => {
                Step::Pool
            }
            Place::Inline => Step::Inline,
            Place::NoReply => Step::NoReply,
            Place::Pool => Step::Pool,
        }
    }

    /// An `Inline` step's request took `took`.
    pub fn took(&mut self, took: Duration) {
        self.sched.inline.took(self.queue, took);
        self.served_inline = true;
        self.answered = true;
    }

    /// A request served alone: `busy`, the guest sent more meanwhile. The last one
    /// served in the pop tells.
    pub fn served_alone(&mut self, busy: bool) {
        self.busy_meanwhile = busy;
        self.answered = true;
    }

    /// The queue thread answered a request of the pop otherwise (a READ it tried without
    /// blocking, or any request without a pool).
    pub fn answered_here(&mut self) {
        self.answered = true;
    }

    /// Whether the queue thread answered any of the pop's requests itself: then the
    /// guest may be waiting on that reply to send its next request.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// The pop is carried out: returns whether it served quick metadata inline.
    pub fn finish(self) -> bool {
        if self.busy_meanwhile {
            self.sched.lone.busy(self.queue);
        }
        self.served_inline
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Opcode;
    use route::{LONE_POPS, PROBE_POPS, SLOW_INLINE, SMALL_HOST_CPUS, SMALL_POP};

    const BIG_HOST: usize = SMALL_HOST_CPUS + 2;

    /// The steps of a pop of `ops` from queue 1, each READ's lists taking `heap` bytes.
    fn steps(s: &Scheduler, ops: &[Opcode], in_flight: usize, heap: usize) -> Vec<Step> {
        let mut plan = s.plan(1, ops.len(), || in_flight);
        let here = plan.here;
        let steps = ops
            .iter()
            .map(|&op| match here {
                None => Step::Here,
                Some(q) => plan.step_at(route::decide(Some(op), false, q), || heap),
            })
            .collect();
        plan.finish();
        steps
    }

    fn lone_pops(s: &Scheduler) {
        for _ in 0..LONE_POPS {
            steps(s, &[Opcode::Lookup], 1, 0);
        }
    }

    #[test]
    fn without_a_pool_every_request_is_served_where_it_comes() {
        let s = Scheduler::new(2, BIG_HOST, false);
        let ops = [Opcode::Read, Opcode::Lookup, Opcode::Forget, Opcode::Write];
        assert_eq!(steps(&s, &ops, 4, 0), [Step::Here; 4]);
        let mut asked = false;
        s.plan(1, 1, || {
            asked = true;
            1
        });
        assert!(!asked, "in flight is not counted for nothing");
    }

    #[test]
    fn a_lone_request_is_served_alone_once_the_guest_waits_on_each_reply() {
        let s = Scheduler::new(2, BIG_HOST, true);
        assert_eq!(
            steps(&s, &[Opcode::Write], 1, 0),
            [Step::Pool],
            "one pop alone is not yet a guest that waits"
        );
        lone_pops(&s);
        assert_eq!(steps(&s, &[Opcode::Lookup], 1, 0), [Step::Alone]);
        assert_eq!(
            steps(&s, &[Opcode::Write], 1, 0),
            [Step::AloneUnlessItWaits]
        );
        assert_eq!(steps(&s, &[Opcode::Open], 1, 0), [Step::AloneUnlessItWaits]);
        assert_eq!(
            steps(&s, &[Opcode::Read], 1, 0),
            [Step::Read {
                park: false,
                if_it_would_block: Fallback::QueueThread
            }]
        );
        assert_eq!(
            steps(&s, &[Opcode::Write], 2, 0),
            [Step::Pool],
            "beside another in flight"
        );
    }

    #[test]
    fn the_guest_sending_more_while_one_is_served_alone_ends_lone_service() {
        let s = Scheduler::new(2, BIG_HOST, true);
        lone_pops(&s);
        let mut plan = s.plan(1, 1, || 1);
        assert_eq!(
            plan.step_at(
                route::decide(Some(Opcode::Write), false, plan.here.unwrap()),
                || 0
            ),
            Step::AloneUnlessItWaits
        );
        plan.served_alone(false);
        plan.served_alone(true);
        assert!(!plan.finish(), "nothing was served inline");
        assert_eq!(steps(&s, &[Opcode::Write], 1, 0), [Step::Pool]);
        lone_pops(&s);
        let mut plan = s.plan(1, 1, || 1);
        plan.served_alone(true);
        plan.served_alone(false);
        plan.finish();
        assert_eq!(
            steps(&s, &[Opcode::Lookup], 1, 0),
            [Step::Alone],
            "the last one served alone tells"
        );
    }

    #[test]
    fn quick_metadata_beside_others_in_flight_runs_inline_and_the_rest_goes_to_the_pool() {
        let s = Scheduler::new(2, BIG_HOST, true);
        let ops = [
            Opcode::Getattr,
            Opcode::Write,
            Opcode::Lookup,
            Opcode::Forget,
        ];
        assert_eq!(
            steps(&s, &ops, 4, 0),
            [Step::Inline, Step::Pool, Step::Inline, Step::NoReply]
        );
        assert_eq!(
            steps(&s, &[Opcode::Getattr, Opcode::Lookup], 3, 0),
            [Step::Pool, Step::Pool],
            "not beside a request the pool still serves"
        );
        let big = [Opcode::Getattr; SMALL_POP + 1];
        assert_eq!(
            steps(&s, &big, SMALL_POP + 1, 0),
            [Step::Pool; SMALL_POP + 1],
            "a large pop goes to the pool"
        );
        let small_host = Scheduler::new(2, SMALL_HOST_CPUS, true);
        assert_eq!(
            steps(&small_host, &big, SMALL_POP + 1, 0),
            [Step::Inline; SMALL_POP + 1],
            "but runs inline on a small host"
        );
    }

    #[test]
    fn a_read_that_would_block_goes_to_the_pool_beside_others_and_lists_past_the_budget_park() {
        let s = Scheduler::new(2, BIG_HOST, true);
        let heap = READS_HEAP / 2;
        let reads = [Opcode::Read; 3];
        let to_pool = |park| Step::Read {
            park,
            if_it_would_block: Fallback::Pool,
        };
        assert_eq!(
            steps(&s, &reads, 3, heap),
            [to_pool(false), to_pool(false), to_pool(true)]
        );
        assert_eq!(
            steps(&s, &reads, 3, READS_HEAP + 1),
            [to_pool(true); 3],
            "each pop has a budget of its own, and one list may be past it"
        );
    }

    #[test]
    fn a_pop_whose_inline_requests_turn_slow_hands_the_rest_to_the_pool_and_probes_later() {
        let s = Scheduler::new(2, BIG_HOST, true);
        let mut plan = s.plan(1, 4, || 4);
        let here = plan.here.unwrap();
        let step =
            |plan: &mut Plan| plan.step_at(route::decide(Some(Opcode::Lookup), false, here), || 0);
        for _ in 0..6 {
            assert_eq!(step(&mut plan), Step::Inline);
            plan.took(SLOW_INLINE * 2);
        }
        assert_eq!(step(&mut plan), Step::Pool, "slow now");
        assert!(plan.finish(), "it served inline");
        let probes = (0..PROBE_POPS * 2)
            .filter(|_| steps(&s, &[Opcode::Lookup, Opcode::Getattr], 2, 0)[0] == Step::Inline)
            .count();
        assert_eq!(probes, 2, "one small pop in PROBE_POPS probes");
        let mut plan = loop {
            let plan = s.plan(1, 2, || 2);
            if plan.probe {
                break plan;
            }
        };
        let step =
            |plan: &mut Plan| plan.step_at(route::decide(Some(Opcode::Lookup), false, here), || 0);
        assert_eq!(step(&mut plan), Step::Inline, "a probe's first");
        assert_eq!(step(&mut plan), Step::Pool, "and not its second");
    }

    #[test]
    fn the_ring_is_watched_only_after_inline_service_with_nothing_left_to_the_pool() {
        let s = Scheduler::new(2, BIG_HOST, true);
        assert!(!s.poll_now(1, false, || 0), "nothing served inline");
        assert!(!s.poll_now(1, true, || 1), "the pool still has some");
        assert!(s.poll_now(1, true, || 0));
        for _ in 0..4 {
            s.polled(1, false);
        }
        assert!(!s.poll_now(1, true, || 0), "polls that miss turn it off");
    }

    #[test]
    fn read_replies_go_out_in_groups() {
        assert!(!batch_full(INLINE_BATCH - 1, INLINE_BATCH_BYTES - 1));
        assert!(batch_full(INLINE_BATCH, 0));
        assert!(batch_full(1, INLINE_BATCH_BYTES));
    }
}
