//! A queue thread's pass over its ring: it pops, asks the scheduler for the pop's plan
//! (`schedule`), and carries it out.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use vhost_user_backend::VringT;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryLoadGuard};

use super::busy_poll::PollMode;
use super::pool::Job;
use super::route::{self, Fallback};
use super::schedule::{batch_full, Plan, Step, INLINE_BATCH};
use super::vring::{self, Tickets};
use super::{Chain, FsDevice, RawChain, TrackedVring};
use crate::server::{GuestMem, Placement, Popped};

/// After a pop whose quick metadata requests the queue thread served itself
/// (`Step::Inline`), with none of the queue's requests left to the pool, it watches the
/// ring this long for the guest's next request before it sleeps: a guest with several in
/// flight sends it within microseconds, and so neither kicks nor waits for the queue
/// thread to wake. Not while workers serve the queue's other requests: on a small host the
/// spinning thread would take their CPU; nor while polls miss (`route::RingPoll`).
const INLINE_POLL: Duration = Duration::from_micros(30);

/// The guest memory a pass over the ring serves from.
type Mem<'m> = &'m GuestMemoryLoadGuard<GuestMem>;
/// A request the queue thread serves: its ring borrowed.
type Here<'v> = Job<&'v TrackedVring>;

/// What one pop took from the ring.
struct Pop {
    /// On the stack for a pop of up to `vring::ON_STACK` (at one request in flight, every
    /// pop): no allocation per request for the lists themselves.
    chains: SmallVec<[RawChain; vring::ON_STACK]>,
    tickets: Tickets,
    /// The pop stopped at its room (`TrackedVring::room`) with more in the ring: taken up
    /// at the completion that makes room (`TrackedVring::throttle`)...
    left_for_room: bool,
    /// ...or at once, if one did meanwhile.
    again: bool,
}

impl FsDevice {
    pub(super) fn process_queue(&self, vring: &TrackedVring, queue: usize) -> io::Result<()> {
        let Some(mem) = self.mem.read().unwrap().as_ref().map(|m| m.memory()) else {
            return Ok(());
        };
        if self.any_taken_over.load(Ordering::Acquire) {
            self.take_up(vring, queue, &mem);
        }
        if self.server.any_suspended() {
            self.resume_suspended(vring, queue as u16, &mem);
        }
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let mut woke = true;
        loop {
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            let Some(pop) = pop_or_rest(vring, &mem)? else {
                return Ok(());
            };
            let n = pop.chains.len();
            // A wake-up that finds nothing (a kick the guest sent before it saw it needn't)
            // says nothing of when its next request came.
            if std::mem::take(&mut woke) && n > 0 {
                self.busy_poll.woke(queue);
            }
            let mut plan = self.scheduler.plan(queue, n, || vring.in_flight());
            let mut reads = Vec::new();
            for (chain, ticket) in pop.chains.into_iter().zip(pop.tickets) {
                let (head, queue) = (chain.head_index(), queue as u16);
                let job = Job {
                    vring,
                    ticket,
                    head,
                    queue,
                };
                if !job.stopped() {
                    let chain = Popped::new(&mem, chain);
                    self.carry_out(&mem, &mut plan, chain, job, &mut reads);
                }
            }
            self.try_reads(&mem, &mut plan, reads);
            let answered = plan.answered();
            let served_inline = plan.finish();
            if pop.left_for_room {
                return Ok(());
            }
            if pop.again {
                continue;
            }
            if !self.watch_or_sleep(vring, &mem, queue, answered, served_inline)? {
                return Ok(());
            }
        }
    }

    /// After a pass that left nothing to pop: watches the ring for a while (`--poll`, or
    /// the brief watch after inline service), then lets the guest kick again. Whether a
    /// request came meanwhile, for the queue thread to go on with.
    fn watch_or_sleep(
        &self,
        vring: &TrackedVring,
        mem: &GuestMem,
        queue: usize,
        answered: bool,
        served_inline: bool,
    ) -> io::Result<bool> {
        match self.poll_window(queue, answered, vring) {
            Some(window) => {
                // The guest needn't kick while the thread watches.
                vring.quiet().map_err(io::Error::other)?;
                match vring.watch(mem, window) {
                    Some(after) => {
                        self.busy_poll.caught(queue, after);
                        return Ok(true);
                    }
                    None => self.busy_poll.missed(queue, Instant::now()),
                }
            }
            None if self
                .scheduler
                .poll_now(queue, served_inline, || vring.in_flight()) =>
            {
                let caught = poll_briefly(vring, mem);
                self.scheduler.polled(queue, caught);
                if caught {
                    return Ok(true);
                }
            }
            None => {}
        }
        // Before sleeping the guest may kick again, and a request it made available
        // before it could see that is served now (with EVENT_IDX, or after `quiet`).
        if !vring.notify_again().map_err(io::Error::other)? {
            return Ok(false);
        }
        // One came as the poll gave up: a wake-up at once, for the window.
        self.busy_poll.woke(queue);
        Ok(true)
    }

    /// How long `queue`'s thread polls its ring after a pop (`busy_poll`): only a request
    /// queue's (the hiprio queue's FORGETs get no reply, so none waits on them), after a
    /// pop it answered some of, with nothing of the queue left to the pool or a lock
    /// waiter (the pool's workers need the CPU; their replies come by the call eventfd).
    fn poll_window(&self, queue: usize, answered: bool, vring: &TrackedVring) -> Option<Duration> {
        if queue == 0 || !answered || self.busy_poll.mode() == PollMode::Off {
            return None;
        }
        if vring.in_flight() != 0 {
            return None;
        }
        self.busy_poll.window(queue)
    }

    /// Carries out `plan`'s step for one request; a READ is kept in `reads` for
    /// `try_reads`, so workers start on the pop's other requests first.
    fn carry_out<'v>(
        &self,
        mem: Mem,
        plan: &mut Plan,
        mut chain: Chain,
        job: Here<'v>,
        reads: &mut Vec<(Chain, Here<'v>, Fallback)>,
    ) {
        match plan.step(&chain) {
            Step::Here => {
                job.complete(self.server.handle(mem, chain, &mut || job.later()));
                plan.answered_here();
            }
            Step::Read {
                park,
                if_it_would_block,
            } => {
                if park {
                    chain.park();
                }
                reads.push((chain, job, if_it_would_block))
            }
            Step::Alone => plan.served_alone(self.serve_alone(mem, chain, &job)),
            Step::AloneUnlessItWaits => {
                if let Some(busy) = self.serve_alone_unless_it_waits(mem, chain, &job) {
                    plan.served_alone(busy)
                }
            }
            Step::Inline => {
                let start = Instant::now();
                self.serve_as(mem, chain, &job, Placement::ServedInline);
                plan.took(start.elapsed());
            }
            Step::NoReply => self.serve_as(mem, chain, &job, Placement::NoReplyOnQueueThread),
            Step::Pool => self.hand_off(chain, &job),
        }
    }

    /// Tries a pop's READs without blocking, and sends on those that would block.
    fn try_reads(&self, mem: Mem, plan: &mut Plan, reads: Vec<(Chain, Here, Fallback)>) {
        let mut done = Vec::with_capacity(reads.len().min(INLINE_BATCH));
        let mut bytes = 0usize;
        let Some(vring) = reads.first().map(|(_, job, _)| job.vring) else {
            return;
        };
        // Large READs still to come in this pop, counted only where there is a pool.
        let mut large = match self.pool {
            Some(_) => reads
                .iter()
                .filter(|(c, ..)| route::is_large_read(c))
                .count(),
            None => 0,
        };
        for (mut chain, job, fallback) in reads {
            let is_large = large > 0 && route::is_large_read(&chain);
            large -= usize::from(is_large);
            if job.stopped() {
                continue;
            }
            // All but the pop's last large READ.
            if is_large && large > 0 {
                self.server.count_placement(Placement::ReadHandedOff);
                self.hand_off(chain, &job);
                continue;
            }
            match self.server.try_handle_without_blocking(mem, &mut chain) {
                Some(len) => {
                    done.push((job.ticket, job.head, len));
                    bytes += len as usize;
                    plan.answered_here();
                }
                None if fallback == Fallback::QueueThread => {
                    self.server.count_placement(Placement::ReadServedAlone);
                    // Under --no-open the node's first fd may wait on a lease.
                    if let Some(busy) = self.serve_alone_unless_it_waits(mem, chain, &job) {
                        plan.served_alone(busy)
                    }
                }
                None => {
                    self.server.count_placement(Placement::ReadHandedOff);
                    self.hand_off(chain, &job)
                }
            }
            // Don't hold finished replies back behind a long run of copies.
            if batch_full(done.len(), bytes) {
                vring.complete(&done);
                done.clear();
                bytes = 0;
            }
        }
        vring.complete(&done);
    }

    /// Hands a request to the worker pool (there is one whenever a plan says so).
    fn hand_off(&self, chain: Chain, job: &Here) {
        match &self.pool {
            Some(pool) => pool.send(chain, job),
            None => {
                let mem = chain.memory().clone();
                job.complete(self.server.handle(&mem, chain, &mut || job.later()))
            }
        }
    }

    /// Serves one request on the queue thread, blocking if it must (`Step::Alone`).
    /// Returns whether the guest sent more while it was served, before seeing its reply:
    /// then it has more than one request in flight at a time.
    fn serve_alone(&self, mem: Mem, chain: Chain, job: &Here) -> bool {
        let busy = || job.vring.more_available(mem);
        self.serve_here(mem, chain, job, Placement::ServedAlone, busy)
    }

    /// `serve_alone` for a request that may open a file, unless it would wait for a host
    /// lease break: then it goes to the pool unanswered, and None.
    fn serve_alone_unless_it_waits(&self, mem: Mem, chain: Chain, job: &Here) -> Option<bool> {
        let len = match self
            .server
            .handle_unless_it_waits(mem, chain, &mut || job.later())
        {
            Ok(len) => len,
            Err(chain) => {
                self.hand_off(chain, job);
                return None;
            }
        };
        self.server.count_placement(Placement::ServedAlone);
        let busy = job.vring.more_available(mem);
        job.complete(len);
        Some(busy)
    }

    /// Serves a request on the queue thread without watching the ring meanwhile, counted
    /// as `placement`: a quick metadata request beside others in flight (`Step::Inline`)
    /// or one without a reply (`Step::NoReply`).
    fn serve_as(&self, mem: Mem, chain: Chain, job: &Here, placement: Placement) {
        self.serve_here(mem, chain, job, placement, || ())
    }

    /// Serves one request on the queue thread, counted as `placement`; `before_reply`
    /// runs after the handler and before the reply goes on the used ring.
    fn serve_here<T>(
        &self,
        mem: Mem,
        chain: Chain,
        job: &Here,
        placement: Placement,
        before_reply: impl FnOnce() -> T,
    ) -> T {
        self.server.count_placement(placement);
        let len = self.server.handle(mem, chain, &mut || job.later());
        let out = before_reply();
        job.complete(len);
        out
    }
}

/// Pops what the ring has, up to its room; None when the ring stopped or was disabled
/// since the kick.
fn pop(vring: &TrackedVring, mem: &GuestMemoryLoadGuard<GuestMem>) -> io::Result<Option<Pop>> {
    let mut state = vring.get_mut();
    if !state.is_enabled() {
        // Disabled (SET_VRING_ENABLE 0) since the kick: pop nothing more.
        return Ok(None);
    }
    let q = state.get_queue_mut();
    let first = q.next_avail();
    let size = q.size();
    // Never more in flight than the ring holds (`TrackedVring::room`).
    let room = vring.room(size);
    let chains: SmallVec<[RawChain; vring::ON_STACK]> = match q.iter(mem.clone()) {
        Ok(it) => it.take(room).collect(),
        // Stopped (GET_VRING_BASE, reset) since the kick: nothing to do.
        Err(virtio_queue::Error::QueueNotReady) => return Ok(None),
        Err(e) => return Err(io::Error::other(e)),
    };
    let more = chains.len() == room
        && q.avail_idx(&**mem, Ordering::Acquire)
            .is_ok_and(|i| i.0 != q.next_avail());
    // Under the ring's lock, which completions take first: none is missed.
    let left_for_room = more && vring.throttle(size);
    // Registered under the ring's lock, so a stop sees them.
    let tickets = vring.popped(first, chains.len());
    vring.record_popped(
        size,
        first,
        q.next_avail(),
        q.next_used(),
        chains.iter().map(|c| c.head_index()),
    );
    Ok(Some(Pop {
        chains,
        tickets,
        left_for_room,
        again: more && !left_for_room,
    }))
}

/// Whether the guest made a request available within `INLINE_POLL` (`process_queue`).
/// The next pop; None once the ring is empty and the guest free to kick again (after a
/// watch, `quiet` may have told it not to). A request that came meanwhile is popped.
fn pop_or_rest(
    vring: &TrackedVring,
    mem: &GuestMemoryLoadGuard<GuestMem>,
) -> io::Result<Option<Pop>> {
    loop {
        match pop(vring, mem) {
            Ok(Some(pop)) => return Ok(Some(pop)),
            Ok(None) if vring.notify_again().map_err(io::Error::other)? => continue,
            Ok(None) => return Ok(None),
            Err(e) => {
                // A ring in error still lets the guest kick.
                let _ = vring.notify_again();
                return Err(e);
            }
        }
    }
}

fn poll_briefly(vring: &TrackedVring, mem: &GuestMem) -> bool {
    let deadline = Instant::now() + INLINE_POLL;
    loop {
        if vring.more_available(mem) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}
