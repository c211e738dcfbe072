//! The vhost-user-fs device: virtqueues, their workers, features and config space.
//!
//! Queue 0 is the high-priority queue (FORGET, INTERRUPT); queues 1..=N carry requests.
//! Each request queue has its own epoll thread, so request queues never wait on each other;
//! the hiprio queue shares the first one's thread, as in virtiofsd (`queue_masks`), so
//! those two wait on each other. With a thread pool, a queue thread only pops descriptor
//! chains and hands them to the pool, so requests queued together on one queue are also
//! served together.
//!
//! - `backend`: the vhost-user backend (features, config, memory, events);
//! - `queue`: a queue thread's pass over its ring, which carries out
//! - `schedule`'s plan for each pop, made from `route`'s rules;
//! - `pool`: the worker pool and `Job`, a popped request's place on its ring;
//! - `busy_poll`: how long a queue thread polls its ring after answering a pop;
//! - `vring`: the ring's requests in flight, stops and the crash record's hooks;
//! - `resume`, `recover`: lock waits taken up after a stop, rings taken over after a
//!   crash; `state`: the device-state transfer; `metrics`: what `--metrics` reads.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;

use virtio_queue::DescriptorChain;
use vm_memory::{GuestMemoryAtomic, GuestMemoryLoadGuard};
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::recovery::record::{Record, RingState};
use crate::server::{GuestMem, Popped};

/// The server the device serves its rings through: FUSE over the host directory.
pub type FuseServer = crate::server::FuseServer<crate::passthrough::PassthroughFs>;

mod backend;
mod busy_poll;
mod metrics;
mod pool;
mod queue;
mod recover;
mod resume;
mod route;
mod schedule;
mod state;
mod vring;
pub use busy_poll::PollMode;
pub use metrics::QueueGauges;
pub use state::{MigrationSnapshot, MigrationStats, MIGRATION_STATES};
pub use vring::{TrackedVring, STOP_WAIT};

use busy_poll::BusyPoll;
use pool::Pool;
use schedule::Scheduler;

/// The largest queue the device accepts (a split virtqueue's maximum).
pub const MAX_QUEUE_SIZE: usize = 32768;
/// Length of the tag field in `struct virtio_fs_config`.
pub const TAG_LEN: usize = 36;

type Mem = GuestMemoryAtomic<GuestMem>;
/// A chain as the queue pops it.
type RawChain = DescriptorChain<GuestMemoryLoadGuard<GuestMem>>;
/// A chain read once (`server::Popped`): where it runs is decided on the copy it serves.
type Chain = Popped<GuestMemoryLoadGuard<GuestMem>>;

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
    /// Whether queue threads poll their rings after answering (`busy_poll`).
    pub poll: PollMode,
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
    /// requests served inline were (`schedule`).
    scheduler: Scheduler,
    /// Per queue: how long its thread polls the ring after answering a pop.
    busy_poll: BusyPoll,
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
        let masks = backend::queue_masks(cfg.request_queues);
        let exit = masks
            .iter()
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        let scheduler = Scheduler::new(cfg.request_queues + 1, cpus, pool.is_some());
        let busy_poll = BusyPoll::new(cfg.request_queues + 1, cfg.poll);
        Ok(FsDevice {
            server,
            busy_poll,
            mem: RwLock::new(None),
            mapped: Default::default(),
            event_idx,
            pool,
            exit,
            scheduler,
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
}
