//! The vhost-user-fs device: virtqueues, their workers, features and config space.
//!
//! Queue 0 is the high-priority queue (FORGET, INTERRUPT); queues 1..=N carry requests.
//! Each request queue has its own epoll thread, so request queues never wait on each other;
//! the hiprio queue shares the first one's thread, as in virtiofsd (`queue_masks`), so
//! those two wait on each other. With a thread pool, a queue thread only pops descriptor
//! chains and hands them to the pool, so requests queued together on one queue are also
//! served together.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use smallvec::SmallVec;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::recovery::record::{Record, RingState};
use crate::server::{Deferred, FuseServer, GuestMem, Opcode, Placement, Popped, Slot};

mod recover;
mod route;
mod state;
pub use state::{MigrationSnapshot, MigrationStats, MIGRATION_STATES};
mod vring;
use route::{Fallback, Inline, Lone, Place, RingPoll};
use vring::Ticket;
pub use vring::{TrackedVring, STOP_WAIT};

/// The largest queue the device accepts (a split virtqueue's maximum).
pub const MAX_QUEUE_SIZE: usize = 32768;
/// Length of the tag field in `struct virtio_fs_config`.
pub const TAG_LEN: usize = 36;

/// READs answered on a queue thread are put on the used ring in groups of at most this
/// many requests or bytes: one lock and one notification per group, without making the
/// first reply wait for a long batch.
const INLINE_BATCH: usize = 16;
const INLINE_BATCH_BYTES: usize = 1 << 20;

/// After a pop whose quick metadata requests the queue thread served itself
/// (`Place::Inline`), with none of the queue's requests left to the pool, it watches the
/// ring this long for the guest's next request before it sleeps: a guest with several in
/// flight sends it within microseconds, and so neither kicks nor waits for the queue
/// thread to wake. Not while workers serve the queue's other requests: on a small host the
/// spinning thread would take their CPU; nor while polls miss (`route::RingPoll`).
const INLINE_POLL: Duration = Duration::from_micros(30);

/// The heap a pop's READs may keep in descriptor lists while they wait behind its other
/// requests (a 1 MiB READ's list takes 4-8 KiB); past it they are parked and read again
/// when tried (`Popped::park`).
const READS_HEAP: usize = 256 * 1024;

type Mem = GuestMemoryAtomic<GuestMem>;
/// A chain as the queue pops it.
type RawChain = DescriptorChain<GuestMemoryLoadGuard<GuestMem>>;
/// A chain read once (`server::Popped`): where it runs is decided on the copy it serves.
type Chain = Popped<GuestMemoryLoadGuard<GuestMem>>;

struct Job {
    chain: Chain,
    ticket: Ticket,
    vring: TrackedVring,
    queue: u16,
}

/// A request answered after its worker moved on (`server::Deferred`): a lock wait,
/// holding a place of its ring's share for lock waits until it is answered or suspended.
struct Later {
    vring: TrackedVring,
    ticket: Ticket,
    head: u16,
    queue: u16,
    place: vring::WaitPlace,
}

impl Later {
    /// None when lock waits hold their share of the ring already (`vring::wait_place`).
    fn boxed(
        vring: &TrackedVring,
        ticket: Ticket,
        head: u16,
        queue: u16,
    ) -> Option<Box<dyn Deferred>> {
        let place = vring.wait_place(head)?;
        Some(Box::new(Later {
            vring: vring.clone(),
            ticket,
            head,
            queue,
            place,
        }))
    }
}

impl Deferred for Later {
    fn finish(self: Box<Self>, write: &mut dyn FnMut(&GuestMem) -> u32) {
        let Later {
            vring,
            ticket,
            head,
            place,
            ..
        } = *self;
        // Given back before the reply shows: a guest that sends its next wait on seeing
        // this one answered finds the place free.
        drop(place);
        vring.complete_with(ticket, head, write);
    }

    fn on_stop(&self, suspend: Box<dyn Fn() + Send + Sync>) -> bool {
        self.vring.on_stop(self.ticket, suspend)
    }

    fn slot(&self) -> Slot {
        Slot {
            queue: self.queue,
            head: self.head,
            position: self.ticket.position(),
        }
    }

    fn suspend(self: Box<Self>) {
        let Later {
            vring,
            ticket,
            place,
            ..
        } = *self;
        // Given back before the ring hears of it, as in `finish`: the wait is taken up
        // again, with a place of its own, when the ring runs again.
        drop(place);
        vring.forget(ticket);
    }
}

/// Worker threads shared by all request queues.
struct Pool {
    tx: crossbeam_channel::Sender<Job>,
}

impl Pool {
    fn new(size: usize, server: Arc<FuseServer>) -> io::Result<Pool> {
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..size {
            let rx = rx.clone();
            let server = server.clone();
            thread::Builder::new()
                .name(format!("vfsd-worker-{i}"))
                .spawn(move || {
                    for job in rx {
                        if stopped_since_popped(&job.vring, job.chain.head_index(), job.ticket) {
                            continue;
                        }
                        let head = job.chain.head_index();
                        let mem = job.chain.memory().clone();
                        let (vring, ticket) = (&job.vring, job.ticket);
                        let mut later = || Later::boxed(vring, ticket, head, job.queue);
                        if let Some(len) = server.handle(&mem, job.chain, &mut later) {
                            job.vring.complete(&[(job.ticket, head, len)]);
                        }
                    }
                })?;
        }
        Ok(Pool { tx })
    }
}

impl Pool {
    fn send(&self, mut chain: Chain, ticket: Ticket, vring: &TrackedVring, queue: u16) {
        // What waits for a worker stays small (`Popped::park`).
        chain.park();
        let job = Job {
            chain,
            ticket,
            vring: vring.clone(),
            queue,
        };
        if self.tx.send(job).is_err() {
            error!("worker pool is gone");
        }
    }
}

/// What `update_memory` hands on to a new memory map.
#[derive(Default)]
struct Mapped {
    map: Option<Arc<GuestMem>>,
    /// The dirty log while the VMM logs (none after SET_FEATURES without LOG_ALL).
    log: Option<Arc<vhost_user_backend::bitmap::MmapLogReg>>,
}

pub struct DeviceConfig {
    pub request_queues: usize,
    pub tag: Option<String>,
    pub thread_pool_size: usize,
}

pub struct FsDevice {
    server: Arc<FuseServer>,
    cfg: DeviceConfig,
    mem: RwLock<Option<Mem>>,
    /// The memory map of the last `update_memory` and the dirty log it had (`dirty_log`).
    mapped: Mutex<Mapped>,
    event_idx: Arc<AtomicBool>,
    pool: Option<Pool>,
    exit: Vec<(EventConsumer, EventNotifier)>,
    /// Per queue: whether the guest waits on one request at a time, and how fast the
    /// requests served inline were (`route`).
    lone: Lone,
    inline: Inline,
    poll: RingPoll,
    /// The device-state transfer under way (SET_DEVICE_STATE_FD), for CHECK_DEVICE_STATE.
    transfer: state::Transfer,
    /// Each queue thread's queues (`queue_masks`), kept for mapping its events.
    masks: Vec<u64>,
    /// Rings that failed to serve a kick (a guest's bad avail index, say), for the log.
    queue_errors: AtomicU64,
    /// Each queue's ring, kept at its first event so `--metrics` can read its requests in
    /// flight; `rings_seen` has a bit per queue kept, so the usual event costs one load.
    rings: Mutex<Vec<Option<TrackedVring>>>,
    rings_seen: AtomicU64,
    /// Where rings are recorded should this process die (`recovery`).
    record: Option<Arc<Record>>,
    /// Per ring, what a serving process that died left of it, until the ring runs here.
    taken_over: Mutex<Vec<Option<RingState>>>,
    any_taken_over: AtomicBool,
}

/// The device's queues, as read at one moment (`FsDevice::queue_gauges`).
pub struct QueueGauges {
    /// Per queue that has served a kick (0 is hiprio): requests popped and not yet
    /// answered, lock waits included.
    pub in_flight: Vec<(usize, usize)>,
    /// Requests handed to the worker pool that no worker has taken yet.
    pub pool_queued: usize,
    pub pool_threads: usize,
}

impl FsDevice {
    pub fn new(server: Arc<FuseServer>, cfg: DeviceConfig) -> io::Result<Self> {
        if cfg.request_queues == 0 || cfg.request_queues > 63 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--request-queues must be between 1 and 63",
            ));
        }
        if let Some(tag) = &cfg.tag {
            if tag.is_empty() || tag.len() > TAG_LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("--tag must be 1 to {TAG_LEN} bytes long"),
                ));
            }
        }
        let event_idx = Arc::new(AtomicBool::new(false));
        let pool = match cfg.thread_pool_size {
            0 => None,
            n => Some(Pool::new(n, server.clone())?),
        };
        let masks = queue_masks(cfg.request_queues);
        let exit = masks
            .iter()
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let lone = Lone::new(cfg.request_queues + 1);
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        let inline = Inline::new(cfg.request_queues + 1, route::inline_pop_limit(cpus));
        let poll = RingPoll::new(cfg.request_queues + 1);
        Ok(FsDevice {
            server,
            mem: RwLock::new(None),
            mapped: Default::default(),
            event_idx,
            pool,
            exit,
            lone,
            inline,
            poll,
            transfer: Default::default(),
            masks,
            queue_errors: AtomicU64::new(0),
            rings: Mutex::new(vec![None; cfg.request_queues + 1]),
            rings_seen: AtomicU64::new(0),
            record: None,
            taken_over: Mutex::new(Vec::new()),
            any_taken_over: AtomicBool::new(false),
            cfg,
        })
    }

    /// Records the rings in `record` from now on (`recovery`); none: not recorded.
    pub fn with_record_opt(mut self, record: Option<Arc<Record>>) -> Self {
        self.record = record;
        self
    }

    /// Where a serving process that died left each ring: each ring goes on from there
    /// when it runs, and answers the requests that one held (`recover`).
    pub fn take_over_rings(&self, rings: Vec<Option<RingState>>) {
        let any = rings.iter().any(Option::is_some);
        // In this process's record at once: should it die before a ring runs, the next
        // one finds the ring as the first death left it.
        if let Some(r) = &self.record {
            for (q, st) in rings.iter().enumerate() {
                if let Some(st) = st {
                    r.inherit_ring(q, st);
                }
            }
        }
        *self.taken_over.lock().unwrap() = rings;
        self.any_taken_over.store(any, Ordering::Release);
    }

    pub fn server(&self) -> &Arc<FuseServer> {
        &self.server
    }

    /// Requests in flight per queue and the pool's backlog, for `--metrics`.
    pub fn queue_gauges(&self) -> QueueGauges {
        let rings = self.rings.lock().unwrap();
        QueueGauges {
            in_flight: (rings.iter().enumerate())
                .filter_map(|(q, r)| Some((q, r.as_ref()?.in_flight())))
                .collect(),
            pool_queued: self.pool.as_ref().map_or(0, |p| p.tx.len()),
            pool_threads: self.cfg.thread_pool_size,
        }
    }

    /// The device-state transfers (migration), for `--metrics`.
    pub fn migration_stats(&self) -> &state::MigrationStats {
        self.transfer.stats()
    }

    fn keep_ring(&self, vring: &TrackedVring, queue: usize) {
        let bit = 1u64 << queue;
        if self.rings_seen.load(Ordering::Relaxed) & bit == 0 {
            if let Some(r) = &self.record {
                vring.attach_record(r, queue);
            }
            if let Some(slot) = self.rings.lock().unwrap().get_mut(queue) {
                *slot = Some(vring.clone());
            }
            self.rings_seen.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// `struct virtio_fs_config`: the tag, NUL-padded, then le32 num_request_queues.
    fn config_space(&self) -> Vec<u8> {
        let mut c = vec![0u8; TAG_LEN + 4];
        if let Some(tag) = &self.cfg.tag {
            c[..tag.len()].copy_from_slice(tag.as_bytes());
        }
        c[TAG_LEN..].copy_from_slice(&(self.cfg.request_queues as u32).to_le_bytes());
        c
    }

    fn process_queue(&self, vring: &TrackedVring, queue: usize) -> io::Result<()> {
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
        loop {
            let mut served_inline = false;
            // What a pop stopped at its room left in the ring: taken up at the completion
            // that makes room (`TrackedVring::throttle`), or at once if one did meanwhile.
            let (left_for_room, pop_again);
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            // On the stack for a pop of up to `vring::ON_STACK` (at one request in flight,
            // every pop): no allocation per request for the lists themselves.
            let (popped, tickets) = {
                let mut state = vring.get_mut();
                if !state.is_enabled() {
                    // Disabled (SET_VRING_ENABLE 0) since the kick: pop nothing more.
                    return Ok(());
                }
                let q = state.get_queue_mut();
                let first = q.next_avail();
                let size = q.size();
                // Never more in flight than the ring holds (`TrackedVring::room`).
                let room = vring.room(size);
                let popped: SmallVec<[RawChain; vring::ON_STACK]> = match q.iter(mem.clone()) {
                    Ok(it) => it.take(room).collect(),
                    // Stopped (GET_VRING_BASE, reset) since the kick: nothing to do.
                    Err(virtio_queue::Error::QueueNotReady) => return Ok(()),
                    Err(e) => return Err(io::Error::other(e)),
                };
                let more = popped.len() == room
                    && q.avail_idx(&*mem, Ordering::Acquire)
                        .is_ok_and(|i| i.0 != q.next_avail());
                // Under the ring's lock, which completions take first: none is missed.
                left_for_room = more && vring.throttle(size);
                pop_again = more && !left_for_room;
                // Registered under the ring's lock, so a stop sees them.
                let tickets = vring.popped(first, popped.len());
                vring.record_popped(
                    size,
                    first,
                    q.next_avail(),
                    q.next_used(),
                    popped.iter().map(|c| c.head_index()),
                );
                (popped, tickets)
            };
            let n = popped.len();
            let chains = popped.into_iter().zip(tickets);
            match &self.pool {
                Some(pool) => {
                    let in_flight = vring.in_flight();
                    let here = route::Queue {
                        alone: self.lone.observe(queue, n, in_flight),
                        inline: self.inline.allowed(queue, n, in_flight),
                    };
                    let mut busy_meanwhile = false;
                    // A pop allowed inline while the queue is slow probes it.
                    let mut probe = here.inline && !self.inline.fast(queue);
                    // Everything but READ goes where it runs at once, so workers start on
                    // it while this thread tries the reads (below).
                    let mut reads = Vec::new();
                    let mut reads_heap = 0usize;
                    for (chain, t) in chains {
                        if stopped_since_popped(vring, chain.head_index(), t) {
                            continue;
                        }
                        let mut chain = Popped::new(&mem, chain);
                        match route::place(&chain, here) {
                            Place::NoWaitRead { if_it_would_block } => {
                                // Behind the pop's other requests: their descriptor lists
                                // stay, up to a budget (`Popped::park`).
                                let heap = chain.heap_bytes();
                                if reads_heap + heap > READS_HEAP {
                                    chain.park();
                                } else {
                                    reads_heap += heap;
                                }
                                reads.push((chain, t, if_it_would_block))
                            }
                            Place::QueueThread => {
                                busy_meanwhile =
                                    self.serve_alone(&mem, vring, queue as u16, chain, t)
                            }
                            Place::QueueThreadUnlessItWaits => {
                                if let Some(busy) = self.serve_alone_unless_it_waits(
                                    &mem,
                                    vring,
                                    queue as u16,
                                    chain,
                                    t,
                                    pool,
                                ) {
                                    busy_meanwhile = busy
                                }
                            }
                            // Its requests turned slow earlier in this pop.
                            Place::Inline if !self.inline.serve_next(queue, &mut probe) => {
                                pool.send(chain, t, vring, queue as u16)
                            }
                            Place::Inline => {
                                let start = Instant::now();
                                let inline = Placement::ServedInline;
                                self.serve_as(&mem, vring, queue as u16, chain, t, inline);
                                self.inline.took(queue, start.elapsed());
                                served_inline = true;
                            }
                            Place::NoReply => {
                                let no_reply = Placement::NoReplyOnQueueThread;
                                self.serve_as(&mem, vring, queue as u16, chain, t, no_reply)
                            }
                            Place::Pool => pool.send(chain, t, vring, queue as u16),
                        }
                    }
                    let mut done = Vec::with_capacity(reads.len().min(INLINE_BATCH));
                    let mut bytes = 0usize;
                    for (mut chain, t, fallback) in reads {
                        if stopped_since_popped(vring, chain.head_index(), t) {
                            continue;
                        }
                        match self.server.try_handle_without_blocking(&mem, &mut chain) {
                            Some(len) => {
                                done.push((t, chain.head_index(), len));
                                bytes += len as usize;
                            }
                            None if fallback == Fallback::QueueThread => {
                                self.server.count_placement(Placement::ReadServedAlone);
                                // Under --no-open the node's first fd may wait on a lease.
                                if let Some(busy) = self.serve_alone_unless_it_waits(
                                    &mem,
                                    vring,
                                    queue as u16,
                                    chain,
                                    t,
                                    pool,
                                ) {
                                    busy_meanwhile = busy
                                }
                            }
                            None => {
                                self.server.count_placement(Placement::ReadHandedOff);
                                pool.send(chain, t, vring, queue as u16)
                            }
                        }
                        // Don't hold finished replies back behind a long run of copies.
                        if done.len() >= INLINE_BATCH || bytes >= INLINE_BATCH_BYTES {
                            vring.complete(&done);
                            done.clear();
                            bytes = 0;
                        }
                    }
                    vring.complete(&done);
                    if busy_meanwhile {
                        self.lone.busy(queue);
                    }
                }
                None => {
                    for (chain, t) in chains {
                        if stopped_since_popped(vring, chain.head_index(), t) {
                            continue;
                        }
                        let chain = Popped::new(&mem, chain);
                        let head = chain.head_index();
                        let mut later = || Later::boxed(vring, t, head, queue as u16);
                        if let Some(len) = self.server.handle(&mem, chain, &mut later) {
                            vring.complete(&[(t, head, len)]);
                        }
                    }
                }
            }
            if left_for_room {
                return Ok(());
            }
            if pop_again {
                continue;
            }
            // Only with nothing of this queue left to the pool: its workers need the CPU.
            if served_inline && vring.in_flight() == 0 && self.poll.worth(queue) {
                let caught = poll_briefly(vring, &mem);
                self.poll.polled(queue, caught);
                if caught {
                    continue;
                }
            }
            // With EVENT_IDX, re-enabling notifications tells whether more arrived meanwhile.
            if !event_idx || !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
        }
    }

    /// Takes up the requests a stop of this ring suspended (`server::locks`): after a VM
    /// stop and go, a failed migration, or on a migration's destination. Only while the
    /// guest still waits for exactly them: its ring then has as many requests in flight
    /// (next avail minus next used) as were suspended. A guest that reset its queue
    /// meanwhile does not, and they are dropped rather than answered into its new ring.
    fn resume_suspended(
        &self,
        vring: &TrackedVring,
        queue: u16,
        mem: &GuestMemoryLoadGuard<GuestMem>,
    ) {
        let (list, tickets) = {
            let state = vring.get_mut();
            let q = state.get_queue();
            if !state.is_enabled() || !q.ready() {
                // Not running yet: left for the kick that starts it (`set_enabled`).
                return;
            }
            let list = self.server.take_suspended(queue);
            if list.is_empty() {
                return;
            }
            let next = q.next_avail();
            // One the stop moved the base back over is popped again and waits anew: its
            // position lies between the base and the guest's avail index, and its avail
            // slot still names its chain (positions wrap at 65,536: a wait popped long
            // ago, with more than 65,536 minus the ring's size requests since, can alias
            // that window, but its slot names another chain, as the guest can't reuse a
            // head it still waits on).
            let avail = q
                .avail_idx(&**mem, Ordering::Acquire)
                .map(|w| w.0)
                .unwrap_or(next);
            let (list, popped_again): (Vec<_>, Vec<_>) = list.into_iter().partition(|r| {
                let unpopped = r.position.wrapping_sub(next) < avail.wrapping_sub(next);
                !(unpopped && avail_slot(mem, q, r.position) == Some(r.head))
            });
            if !popped_again.is_empty() {
                info!(
                    "queue {queue}: {} suspended lock wait(s) will be popped again",
                    popped_again.len()
                );
            }
            let in_flight = next.wrapping_sub(q.next_used()) as usize;
            let mut heads = std::collections::HashSet::new();
            let mut positions = std::collections::HashSet::new();
            let sound = list.iter().all(|r| {
                r.head < q.size()
                    && heads.insert(r.head)
                    && positions.insert(r.position)
                    && self.server.resumable(r)
                    && reply_buffer(mem, q, r.head) == Some(r.reply_at)
            });
            if list.is_empty() {
                return;
            }
            if in_flight != list.len() || !sound {
                warn!(
                    "queue {queue}: {} suspended lock wait(s) dropped: the ring has {in_flight} request(s) in flight (reset since?){}",
                    list.len(),
                    if sound { "" } else { ", or they are not sound" }
                );
                return;
            }
            // Under the ring's lock, as `popped` wants.
            let tickets: Vec<Ticket> = list
                .iter()
                .map(|r| vring.popped(r.position, 1)[0])
                .collect();
            vring.record_popped(
                q.size(),
                next,
                next,
                q.next_used(),
                list.iter().map(|r| r.head),
            );
            (list, tickets)
        };
        info!(
            "queue {queue}: {} suspended lock wait(s) resumed",
            list.len()
        );
        for (r, t) in list.iter().zip(tickets) {
            let mut later = || Later::boxed(vring, t, r.head, queue);
            if let Some(len) = self.server.resume(mem, r, &mut later) {
                vring.complete(&[(t, r.head, len)]);
            }
        }
    }

    /// The first time ring `queue` runs after its serving process died: it goes on from
    /// where that one left it, and the requests it held are served again, or answered
    /// as `FuseServer::serve_again` says.
    fn take_up(&self, vring: &TrackedVring, queue: usize, mem: &GuestMemoryLoadGuard<GuestMem>) {
        let (taken, table, size, tickets) = {
            let mut state = vring.get_mut();
            if !state.is_enabled() || !state.get_queue().ready() {
                return;
            }
            let Some(st) = self
                .taken_over
                .lock()
                .unwrap()
                .get_mut(queue)
                .and_then(Option::take)
            else {
                return;
            };
            let q = state.get_queue_mut();
            let size = q.size();
            let (Ok(used), Ok(avail)) = (
                q.used_idx(&**mem, Ordering::Acquire),
                q.avail_idx(&**mem, Ordering::Acquire),
            ) else {
                warn!(
                    "queue {queue}: its rings can't be read; what the dead process held is dropped"
                );
                return;
            };
            let t = recover::take_over(&st, size, used.0, avail.0, |p| avail_slot(mem, q, p));
            q.set_next_avail(t.next_avail);
            q.set_next_used(t.next_used);
            // All at the ring's next index: a stop while one still runs then finds no span
            // of positions to move the base back over (those entries were answered).
            let tickets: Vec<Ticket> = (t.heads.iter())
                .map(|_| vring.popped(t.next_avail, 1)[0])
                .collect();
            vring.record_popped_again(size, t.next_avail, t.next_used, t.heads.iter().copied());
            (t, q.desc_table(), size, tickets)
        };
        // A death between a used entry and its interrupt would leave the guest unaware of
        // an answer: it hears once now, whatever follows (a spare interrupt is harmless).
        let _ = vring.signal_used_queue();
        info!(
            "queue {queue}: taken over at avail {} used {}, {} request(s) the dead process held, {} of them in flight at the death before too",
            taken.next_avail,
            taken.next_used,
            taken.heads.len(),
            taken.twice.len()
        );
        if taken.heads.is_empty() {
            return;
        }
        let (with, mut q) = match recover::scratch_queue(mem, table, size, &taken.heads) {
            Ok(x) => x,
            Err(e) => {
                warn!("queue {queue}: {e}; the requests the dead process held get no answer");
                return;
            }
        };
        let chains = recover::pop_all(&mut q, &with);
        let mut done = Vec::new();
        for (chain, t) in chains.into_iter().zip(tickets) {
            let head = chain.head_index();
            let popped = Popped::new(&with, chain);
            let twice = taken.twice.contains(&head);
            // An OPEN or CREATE may wait for a host lease's break (up to the host's
            // lease-break-time): on a thread of its own, as the pool would take it, so the
            // others and the ring's new requests go on meanwhile.
            if matches!(popped.opcode(), Some(Opcode::Open | Opcode::Create)) {
                let (server, vring, with) = (self.server.clone(), vring.clone(), with.clone());
                let spawned =
                    thread::Builder::new()
                        .name("vfsd-taken-over".into())
                        .spawn(move || {
                            let mut later = || Later::boxed(&vring, t, head, queue as u16);
                            if let Some(len) = server.serve_again(&with, popped, twice, &mut later)
                            {
                                vring.complete(&[(t, head, len)]);
                            }
                        });
                if let Err(e) = spawned {
                    warn!("queue {queue}: a request the dead process held gets no answer: {e}");
                }
                continue;
            }
            let mut later = || Later::boxed(vring, t, head, queue as u16);
            if let Some(len) = self.server.serve_again(&with, popped, twice, &mut later) {
                done.push((t, head, len));
            }
        }
        vring.complete(&done);
        // The guest learns of the answers even if it asked not to be told of each.
        let _ = vring.signal_used_queue();
    }

    /// Serves one request on the queue thread, blocking if it must (`process_queue`).
    /// Returns whether the guest sent more while it was served, before seeing its reply:
    /// then it has more than one request in flight at a time.
    fn serve_alone(
        &self,
        mem: &GuestMemoryLoadGuard<GuestMem>,
        vring: &TrackedVring,
        queue: u16,
        chain: Chain,
        t: Ticket,
    ) -> bool {
        let busy = || vring.more_available(mem);
        self.serve_here(mem, vring, queue, chain, t, Placement::ServedAlone, busy)
    }

    /// `serve_alone` for a request that may open a file, unless it would wait for a host
    /// lease break: then it goes to `pool` unanswered, and None.
    #[allow(clippy::too_many_arguments)]
    fn serve_alone_unless_it_waits(
        &self,
        mem: &GuestMemoryLoadGuard<GuestMem>,
        vring: &TrackedVring,
        queue: u16,
        chain: Chain,
        t: Ticket,
        pool: &Pool,
    ) -> Option<bool> {
        let head = chain.head_index();
        let mut later = || Later::boxed(vring, t, head, queue);
        let len = match self.server.handle_unless_it_waits(mem, chain, &mut later) {
            Ok(len) => len,
            Err(chain) => {
                pool.send(chain, t, vring, queue);
                return None;
            }
        };
        self.server.count_placement(Placement::ServedAlone);
        let busy = vring.more_available(mem);
        if let Some(len) = len {
            vring.complete(&[(t, head, len)]);
        }
        Some(busy)
    }

    /// Serves a request on the queue thread without watching the ring meanwhile, counted
    /// as `placement`: a quick metadata request beside others in flight (`Place::Inline`)
    /// or one without a reply (`Place::NoReply`).
    fn serve_as(
        &self,
        mem: &GuestMemoryLoadGuard<GuestMem>,
        vring: &TrackedVring,
        queue: u16,
        chain: Chain,
        t: Ticket,
        placement: Placement,
    ) {
        self.serve_here(mem, vring, queue, chain, t, placement, || ())
    }

    /// Serves one request on the queue thread, counted as `placement`; `before_reply`
    /// runs after the handler and before the reply goes on the used ring.
    #[allow(clippy::too_many_arguments)]
    fn serve_here<T>(
        &self,
        mem: &GuestMemoryLoadGuard<GuestMem>,
        vring: &TrackedVring,
        queue: u16,
        chain: Chain,
        t: Ticket,
        placement: Placement,
        before_reply: impl FnOnce() -> T,
    ) -> T {
        let head = chain.head_index();
        self.server.count_placement(placement);
        let mut later = || Later::boxed(vring, t, head, queue);
        let len = self.server.handle(mem, chain, &mut later);
        let out = before_reply();
        if let Some(len) = len {
            vring.complete(&[(t, head, len)]);
        }
        out
    }
}

/// Whether the ring stopped (GET_VRING_BASE, a reset) after `chain` was popped, while
/// the queue thread served the requests before it or the job waited for a worker: then
/// it is dropped unserved (`complete` drops it). Served anyway, it would act on the host after the
/// stop and write its reply into memory the guest may have reused, and after a resume
/// it is popped again and would run twice (a FORGET applied twice).
fn stopped_since_popped(vring: &TrackedVring, head: u16, t: Ticket) -> bool {
    if vring.is_current(t) {
        return false;
    }
    vring.complete(&[(t, head, 0)]);
    true
}

/// Whether the guest made a request available within `INLINE_POLL` (`process_queue`).
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

/// The queues each queue thread serves, as bit masks: the hiprio queue (0) with the first
/// request queue, as virtiofsd serves them, and every further request queue on a thread of
/// its own. A FORGET that the guest sends while that thread serves a request is then
/// taken up when the request is done, by a thread already awake rather than by waking a
/// thread of its own: under `--cache never` a fifth of a tree walk's requests are FORGETs.
/// Nothing served on a queue thread waits for a FORGET or INTERRUPT (a waiting SETLKW moves
/// to a thread of its own).
fn queue_masks(request_queues: usize) -> Vec<u64> {
    std::iter::once(0b11)
        .chain((2..=request_queues).map(|q| 1u64 << q))
        .collect()
}

/// The queue index of the `nth` queue in `mask` (the vring a thread's event names).
fn nth_queue(mask: u64, nth: usize) -> Option<usize> {
    (0..64).filter(|q| mask & (1u64 << q) != 0).nth(nth)
}

/// The chain head in the avail ring's slot for avail position `position`.
fn avail_slot(mem: &GuestMem, q: &impl QueueT, position: u16) -> Option<u16> {
    let size = q.size();
    if size == 0 {
        return None;
    }
    // struct virtq_avail { le16 flags; le16 idx; le16 ring[size]; ... }
    let at = q
        .avail_ring()
        .checked_add(4 + 2 * u64::from(position % size))?;
    mem.read_obj::<u16>(GuestAddress(at)).ok().map(u16::from_le)
}

/// Where a request on the chain at `head` of `q`'s descriptor table gets its reply, as
/// the request path takes it: the first device-writable buffer, if it holds a reply
/// header. Read from the guest's table as it is now, so a resumed wait answers only into
/// its own chain's buffer, not where a device state says.
fn reply_buffer(mem: &GuestMem, q: &impl QueueT, head: u16) -> Option<u64> {
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    // struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }
    let desc = |table: u64, i: u16| -> Option<(u64, u32, u16, u16)> {
        let at = table.checked_add(16 * u64::from(i))?;
        let mut b = [0u8; 16];
        mem.read_slice(&mut b, GuestAddress(at)).ok()?;
        Some((
            u64::from_le_bytes(b[..8].try_into().unwrap()),
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            u16::from_le_bytes(b[12..14].try_into().unwrap()),
            u16::from_le_bytes(b[14..16].try_into().unwrap()),
        ))
    };
    let (mut table, mut count, mut i) = (q.desc_table(), u32::from(q.size()), head);
    let mut indirect = false;
    for _ in 0..crate::server::MAX_DESCS {
        if u32::from(i) >= count {
            return None;
        }
        let (addr, len, flags, next) = desc(table, i)?;
        let flags = u32::from(flags);
        if flags & VRING_DESC_F_INDIRECT != 0 {
            // One indirect table, at the chain's top level, as the queue's iterator takes it.
            if indirect || len == 0 || len % 16 != 0 {
                return None;
            }
            (indirect, table, count, i) = (true, addr, len / 16, 0);
            continue;
        }
        if flags & VRING_DESC_F_WRITE != 0 {
            let room =
                len as usize >= std::mem::size_of::<fuse_backend_rs::abi::fuse_abi::OutHeader>();
            return room.then_some(addr);
        }
        if flags & VRING_DESC_F_NEXT == 0 {
            return None;
        }
        i = next;
    }
    None
}

impl VhostUserBackend for FsDevice {
    type Bitmap = crate::dirty_log::DirtyBitmap;
    type Vring = TrackedVring;

    fn num_queues(&self) -> usize {
        1 + self.cfg.request_queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Dirty-page logging for migration: guest memory writes go to the log the
            // VMM hands over with SET_LOG_BASE (`server::GuestMem`).
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::DEVICE_STATE;
        if self.cfg.tag.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        f
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = self.config_space();
        let start = (offset as usize).min(c.len());
        let end = start.saturating_add(size as usize).min(c.len());
        c[start..end].to_vec()
    }

    fn acked_features(&self, features: u64) {
        if features & VhostUserVirtioFeatures::LOG_ALL.bits() == 0 {
            // Logging ended (or never began): no page needs marking any more.
            self.mapped.lock().unwrap().log = None;
            if let Some(mem) = self.mem.read().unwrap().as_ref() {
                for r in mem.memory().iter() {
                    r.bitmap().stop();
                }
            }
        }
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        // A memory map that changes while the VMM logs: its new regions log to the same
        // map as the regions they replace. (A write that lands in a new region before
        // this runs, microseconds after the map changed, is not logged.)
        // The log is kept apart from the map as well: QEMU with CONFIGURE_MEM_SLOTS may
        // remove every region (REM_MEM_REG) before it adds the new ones.
        let mut prev = self.mapped.lock().unwrap();
        let new = mem.memory().into_inner();
        let log = prev
            .map
            .as_ref()
            .and_then(|m| m.iter().find_map(|r| r.bitmap().log()))
            .or_else(|| prev.log.clone());
        if let Some(log) = &log {
            for r in new.iter() {
                r.bitmap().inherit(r, log.clone())?;
            }
        }
        *prev = Mapped {
            map: Some(new),
            log,
        };
        *self.mem.write().unwrap() = Some(mem);
        Ok(())
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: std::fs::File,
    ) -> io::Result<Option<std::fs::File>> {
        self.transfer.start(
            self.server.clone(),
            self.num_queues(),
            direction,
            phase,
            file,
        )?;
        Ok(None)
    }

    fn reset_device(&self) {
        // A reset guest waits for nothing it sent before.
        self.server.set_suspended(Vec::new());
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.transfer.check()
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.masks.clone()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.exit.get(thread_index)?;
        Some((c.try_clone().ok()?, n.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        // `device_event` counts among this thread's queues (`queue_masks`).
        let (Some(vring), Some(queue)) = (
            vrings.get(device_event as usize),
            self.masks
                .get(thread_id)
                .and_then(|&mask| nth_queue(mask, device_event as usize)),
        ) else {
            return Err(io::Error::other(format!(
                "event {device_event} for unknown queue of thread {thread_id}"
            )));
        };
        // An error ends the thread's event loop, and the thread serves other queues too
        // (hiprio beside the first request queue): a ring the guest broke stays broken
        // until it is set up again, and the others go on. Logged at powers of two, since
        // the guest kicks as often as it likes.
        self.keep_ring(vring, queue);
        if let Err(e) = self.process_queue(vring, queue) {
            let n = self.queue_errors.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                warn!("queue {queue}: {e} (ring errors so far: {n})");
            }
        }
        Ok(())
    }
}
