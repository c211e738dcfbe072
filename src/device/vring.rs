//! A vring that knows which requests it has handed out and not yet answered.
//!
//! Stopping a ring (GET_VRING_BASE, SET_VRING_ENABLE 0, a device reset) must not let a
//! request still running (a slow FSYNC, a read stuck on a network filesystem) put a used
//! entry into a ring the guest may since have freed, say after a reboot. So each ring has
//! a generation, and each request remembers the one it was popped in. Stopping waits, up
//! to `STOP_WAIT`, for the requests in flight; then it moves to the next generation under
//! the ring's lock, and the completions that come later are dropped. The ring's
//! `next_avail` is moved back to the oldest request dropped that way, so the base the
//! frontend reads counts only requests that completed.
//!
//! Requests still queued for a worker when the wait ends are never started. What this
//! can't undo: a request already running past the wait still writes its reply data into
//! the buffers its descriptors named when it finishes (never its used entry). A lock
//! wait, which can last long, writes its reply only through `complete_with`, under the
//! generation check; a stop suspends it (`on_stop`, `forget`), and the device takes it up
//! again when the ring runs again (`server::waiters`).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use log::warn;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use vhost_user_backend::{VringRwLock, VringState, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::Error as VirtQueError;
use virtio_queue::QueueT;
use vm_memory::{Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic};

use crate::recovery::record::Record;
use crate::server::GuestMem;
type Mem = GuestMemoryAtomic<GuestMem>;

/// Requests one pop or one completion handles without a heap allocation: at one request
/// in flight that is one, and a burst of a few more stays on the stack too.
pub const ON_STACK: usize = 8;
pub type Tickets = SmallVec<[Ticket; ON_STACK]>;

/// How long stopping a ring waits for its requests in flight.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// Where a request came from: its ring generation and its avail-ring position, and the
/// number of its pop among all of the ring's, which tells it apart from every other
/// request in flight (positions repeat every 65,536 requests).
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    generation: u64,
    position: u16,
    seq: u64,
}

impl Ticket {
    pub fn position(&self) -> u16 {
        self.position
    }

    fn key(&self) -> Key {
        (self.generation, self.seq)
    }
}

/// A request in flight: its generation and pop number (`Ticket`).
type Key = (u64, u64);

/// A reply already in the guest's buffers, or the function that writes it.
enum Reply<'w> {
    Written(u32),
    /// Writes through the memory map current when it runs (`TrackedVring::mem`).
    Write(&'w mut dyn FnMut(&GuestMem) -> u32),
}

#[derive(Default)]
struct Track {
    generation: AtomicU64,
    /// The requests popped and not yet completed, with their avail-ring positions. The
    /// keys are vfsd's own counters (`Key`), at most a queue's size of them (`room`), so a
    /// fast unseeded hash is safe in these maps.
    pending: Mutex<FxHashMap<Key, u16>>,
    /// The number the next pop gets (`Ticket::seq`); changed under `pending`'s lock.
    next_seq: AtomicU64,
    /// A pop left requests in the ring for want of room (`throttle`): the next completion
    /// kicks the ring. Set and cleared under `pending`'s lock.
    throttled: AtomicBool,
    idle: Condvar,
    /// Completions dropped because their ring had been stopped.
    dropped: AtomicU64,
    /// What ends a deferred request's wait when the ring stops (`on_stop`), by ticket,
    /// and whether a stop is under way (then a canceller runs at once).
    cancellers: Mutex<(Cancellers, bool)>,
    /// Cancellers registered (so a completion looks at them only when there are some).
    waits: AtomicUsize,
    /// A stop is waiting on `idle` (set and read under `pending`'s lock).
    stopping: AtomicBool,
    /// Requests suspended (`forget`) in the generation a stop is ending: neither late nor
    /// completed, for the stop's count of what it may pop again, with their positions.
    forgotten: Mutex<FxHashMap<Key, u16>>,
    /// The ring's size as the frontend set it (SET_VRING_NUM), for `wait_place`.
    size: AtomicU16,
    /// The guest address of its descriptor table (SET_VRING_ADDR), for `wait_place`.
    desc_table: AtomicU64,
    /// Descriptors of the ring that lock waits hold (`WaitPlace`).
    lock_waits: AtomicUsize,
    /// The crash record and this ring's index in it (`recovery`), and the generation it
    /// describes (u64::MAX: none yet). Written under the ring's lock.
    record: std::sync::OnceLock<(Arc<Record>, usize)>,
    recorded: AtomicU64,
    /// The queue thread set VRING_USED_F_NO_NOTIFY for a poll (`quiet`) and has not
    /// cleared it yet; a stop clears it. Set and cleared under the ring's lock.
    quiet: AtomicBool,
}

/// The share of a ring's descriptors that lock waits may hold: half. A forwarded lock
/// wait stays in flight until its lock is granted, and the guest can't take it back
/// (virtio-fs sends no FUSE_INTERRUPT); past the share a wait is refused (ENOLCK), so the
/// other half of the ring always serves everything else. The Linux guest puts each
/// request behind one descriptor when the device offers indirect descriptors, as vfsd
/// does, and behind one per buffer when it does not get an indirect table.
pub fn lock_wait_share(size: u16) -> usize {
    usize::from(size) / 2
}

/// One lock wait's descriptors in its ring's share (`lock_wait_share`), given back on
/// drop.
pub struct WaitPlace {
    track: Arc<Track>,
    descs: usize,
}

impl Drop for WaitPlace {
    fn drop(&mut self) {
        self.track
            .lock_waits
            .fetch_sub(self.descs, Ordering::AcqRel);
    }
}

type Canceller = Box<dyn Fn() + Send + Sync>;
type Cancellers = FxHashMap<Key, Canceller>;

#[derive(Clone)]
pub struct TrackedVring {
    inner: VringRwLock<Mem>,
    track: Arc<Track>,
    /// The device's guest memory, which the backend updates in place: a reply written
    /// long after its request came (a lock wait) goes through the map (and the dirty log)
    /// of when it is written.
    mem: Mem,
}

impl TrackedVring {
    /// Registers `n` requests just popped, the first at avail position `first`. Called
    /// under the ring's lock (`get_mut`), which orders it against `stop`.
    pub fn popped(&self, first: u16, n: usize) -> Tickets {
        let generation = self.track.generation.load(Ordering::Acquire);
        let mut pending = self.track.pending.lock().unwrap();
        let seq = self.track.next_seq.fetch_add(n as u64, Ordering::Relaxed);
        (0..n)
            .map(|i| {
                let t = Ticket {
                    generation,
                    position: first.wrapping_add(i as u16),
                    seq: seq + i as u64,
                };
                pending.insert(t.key(), t.position);
                t
            })
            .collect()
    }

    /// Records this ring, as ring `queue`, in `record` from its next pop on.
    pub fn attach_record(&self, record: &Arc<Record>, queue: usize) {
        let _ = self.track.record.set((record.clone(), queue));
    }

    /// Notes in the crash record heads just popped (or taken up again), under the ring's
    /// lock. `before`/`after`: the ring's next avail index before and after; `next_used`
    /// its used index. The first in a generation starts the ring's record afresh.
    pub fn record_popped(
        &self,
        size: u16,
        before: u16,
        after: u16,
        next_used: u16,
        heads: impl Iterator<Item = u16>,
    ) {
        if let Some((rec, q)) = self.record_running(size, before, next_used) {
            rec.popped(q, heads, after);
        }
    }

    /// `record_popped` for heads a dead process held, served again here (`recover`).
    pub fn record_popped_again(
        &self,
        size: u16,
        next_avail: u16,
        next_used: u16,
        heads: impl Iterator<Item = u16>,
    ) {
        if let Some((rec, q)) = self.record_running(size, next_avail, next_used) {
            rec.popped_again(q, heads, next_avail);
        }
    }

    /// The record and this ring's index in it, the ring's record started afresh if this
    /// generation has not been recorded yet.
    fn record_running(
        &self,
        size: u16,
        next_avail: u16,
        next_used: u16,
    ) -> Option<(&Record, usize)> {
        let (rec, q) = self.track.record.get()?;
        let generation = self.track.generation.load(Ordering::Acquire);
        if self.track.recorded.swap(generation, Ordering::AcqRel) != generation {
            rec.ring_started(*q, size, next_avail, next_used);
        }
        Some((rec, *q))
    }

    /// How many more requests a pop may take from a ring of `size` entries. A guest can't
    /// have more in flight than that (each holds a head it may not reuse until answered),
    /// but nothing in the avail ring stops it naming one head in every slot and raising
    /// its index again as soon as the device catches up: popped regardless, every such
    /// request would wait for a worker, holding memory, without bound.
    pub fn room(&self, size: u16) -> usize {
        let pending = self.track.pending.lock().unwrap();
        (size as usize).saturating_sub(pending.len())
    }

    /// A place for the lock wait of the chain at `head`, or None when it would take lock
    /// waits past their share of the ring's descriptors (`lock_wait_share`).
    pub fn wait_place(&self, head: u16) -> Option<WaitPlace> {
        let size = self.track.size.load(Ordering::Relaxed);
        let share = lock_wait_share(size);
        let descs = self.ring_descs(head, size);
        let mut held = self.track.lock_waits.load(Ordering::Acquire);
        loop {
            if held + descs > share {
                return None;
            }
            match self.track.lock_waits.compare_exchange_weak(
                held,
                held + descs,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(WaitPlace {
                        track: self.track.clone(),
                        descs,
                    })
                }
                Err(now) => held = now,
            }
        }
    }

    /// How many of the ring's descriptors the chain at `head` holds: one behind an
    /// indirect table, else one per link, read from the guest's table as it is now (a
    /// guest that rewrites it meanwhile only changes its own count). A table that can't
    /// be read counts as the whole ring, so the wait is refused.
    fn ring_descs(&self, head: u16, size: u16) -> usize {
        use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
        use vm_memory::{Bytes, GuestAddress};
        let mem = self.mem.memory();
        let table = self.track.desc_table.load(Ordering::Acquire);
        let (mut i, mut n) = (head, 0usize);
        while n < usize::from(size) {
            // struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }
            let at = table.wrapping_add(16 * u64::from(i));
            let Ok(d) = mem.read_obj::<[u8; 16]>(GuestAddress(at)) else {
                return usize::from(size).max(1);
            };
            n += 1;
            let flags = u32::from(u16::from_le_bytes([d[12], d[13]]));
            if flags & VRING_DESC_F_INDIRECT != 0 || flags & VRING_DESC_F_NEXT == 0 {
                return n;
            }
            i = u16::from_le_bytes([d[14], d[15]]);
            if i >= size {
                return n;
            }
        }
        n.max(1)
    }

    /// A pop stopped at `room` with more in the ring: unless a completion made room
    /// meanwhile (then false, and the caller pops again), the next completion kicks the
    /// ring, and until then the queue thread leaves it.
    pub fn throttle(&self, size: u16) -> bool {
        let pending = self.track.pending.lock().unwrap();
        if pending.len() < size as usize {
            return false;
        }
        self.track.throttled.store(true, Ordering::Release);
        true
    }

    /// Puts finished requests on the used ring, except those of a stopped generation, and
    /// notifies the guest once if it wants to be told.
    pub fn complete(&self, done: &[(Ticket, u16, u32)]) {
        let mut replies: SmallVec<[_; ON_STACK]> = done
            .iter()
            .map(|&(t, head, len)| (t, head, Reply::Written(len)))
            .collect();
        self.complete_each(&mut replies);
    }

    /// Completes one request whose reply `write` writes (and gives the length of) only if
    /// its ring is still the one it came from: a reply that comes long after (a lock wait)
    /// must not touch memory the guest may have reused since a stop.
    pub fn complete_with(&self, t: Ticket, head: u16, write: &mut dyn FnMut(&GuestMem) -> u32) {
        self.complete_each(&mut [(t, head, Reply::Write(write))]);
    }

    /// Registers `cancel`, run when the ring stops while request `t` still waits (a
    /// SETLKW on its waiter thread), so it is suspended (`forget`) or answered before the
    /// stop ends.
    pub fn on_stop(&self, t: Ticket, cancel: Canceller) -> bool {
        let key = t.key();
        // A stop that ended since the request came leaves it in `pending` (its late
        // reply is dropped): a canceller kept for it would run only at the next stop.
        if !self.is_current(t) || !self.track.pending.lock().unwrap().contains_key(&key) {
            return false;
        }
        let mut c = self.track.cancellers.lock().unwrap();
        if c.1 {
            // Registered while a stop waits: end the wait now, so the stop sees it.
            drop(c);
            cancel();
        } else if c.0.insert(key, cancel).is_none() {
            self.track.waits.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// A kick of the ring's own: its queue thread runs once the ring is watched. With
    /// nothing new there, the thread finds the ring as the guest left it.
    fn kick_self(&self) {
        if let Some(kick) = self.inner.get_ref().get_kick() {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live array to the kick eventfd the ring owns
            // (held through the guard); an eventfd's write only adds to its counter.
            let _ = unsafe { libc::write(kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Stops tracking request `t` without a used entry: it stays in flight for the guest,
    /// suspended (a lock wait the device takes up again when the ring runs).
    pub fn forget(&self, t: Ticket) {
        if self.untrack(std::iter::once(t), true) {
            self.kick_self();
        }
    }

    /// Takes requests off the in-flight set (and their cancellers with them), noting the
    /// `suspended` ones for the stop under way, and wakes a stop once none is left.
    /// Returns whether a throttled ring now has room: the caller kicks it, once it no
    /// longer holds the ring's lock (`kick_self`).
    #[must_use]
    fn untrack(&self, done: impl Iterator<Item = Ticket> + Clone, suspended: bool) -> bool {
        let mut pending = self.track.pending.lock().unwrap();
        let mut removed = false;
        for t in done.clone() {
            let key = t.key();
            if let Some(position) = pending.remove(&key) {
                removed = true;
                if suspended {
                    self.track.forgotten.lock().unwrap().insert(key, position);
                }
            }
        }
        if self.track.waits.load(Ordering::Acquire) > 0 {
            let mut c = self.track.cancellers.lock().unwrap();
            for t in done {
                if c.0.remove(&t.key()).is_some() {
                    self.track.waits.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        // Only a stop waits on `idle`, and it sets `stopping` under this lock: no
        // wake-up (a futex call each) for every completion otherwise.
        if pending.is_empty() && self.track.stopping.load(Ordering::Acquire) {
            self.track.idle.notify_all();
        }
        // Only a request that leaves makes room: an empty completion, or a late one of a
        // stopped generation, must not wake a ring that would find none and stop again.
        removed && self.track.throttled.swap(false, Ordering::AcqRel)
    }

    fn complete_each(&self, done: &mut [(Ticket, u16, Reply<'_>)]) {
        if done.is_empty() {
            return;
        }
        let (notify, room_again) = {
            let mut state = self.inner.get_mut();
            // Forgotten before the used entries appear, so a guest that sends its next
            // request on seeing this reply finds the queue with nothing in flight
            // (`in_flight`). Under the ring's lock, so a stop still sees them in order.
            let room_again = self.untrack(done.iter().map(|(t, _, _)| *t), false);
            // Read under the ring's lock: a stop moves the generation under it too.
            let current = self.track.generation.load(Ordering::Acquire);
            let mut added = false;
            for (t, head, reply) in done.iter_mut() {
                if t.generation != current {
                    self.track.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let len = match reply {
                    Reply::Written(len) => *len,
                    Reply::Write(w) => w(&self.mem.memory()),
                };
                let rec = (self.track.record.get())
                    .filter(|_| self.track.recorded.load(Ordering::Acquire) == current);
                if let Some((rec, q)) = rec {
                    rec.completing(*q, *head);
                }
                match state.add_used(*head, len) {
                    Ok(()) => added = true,
                    Err(e) => warn!("could not return descriptor {head}: {e}"),
                }
                if let Some((rec, q)) = rec {
                    rec.completed(*q, *head, state.get_queue().next_used());
                }
            }
            (added.then(|| state.needs_notification()), room_again)
        };
        match notify {
            Some(Ok(true)) => {
                if let Err(e) = self.inner.signal_used_queue() {
                    warn!("could not notify the guest: {e}");
                }
            }
            Some(Err(e)) => warn!("used ring: {e}"),
            _ => {}
        }
        if room_again {
            self.kick_self();
        }
    }

    /// Asks the guest not to kick while the queue thread polls the ring. Without
    /// EVENT_IDX that sets VRING_USED_F_NO_NOTIFY; with it avail_event already stays
    /// behind until `notify_again`. Not on a stopped or disabled ring: its rings are no
    /// longer the device's to write.
    pub fn quiet(&self) -> Result<(), VirtQueError> {
        let mut state = self.inner.get_mut();
        let q = state.get_queue();
        if q.event_idx_enabled() || !q.ready() || !state.is_enabled() {
            return Ok(());
        }
        state.disable_notification()?;
        self.track.quiet.store(true, Ordering::Release);
        Ok(())
    }

    /// Lets the guest kick again before the queue thread sleeps, then looks at the ring
    /// once more: true, a request came before the guest could see it may kick (the
    /// thread serves it rather than sleep through it). Without EVENT_IDX and no `quiet`
    /// since (or a stop since, which let it kick), there is nothing to undo and no
    /// request unseen: false.
    pub fn notify_again(&self) -> Result<bool, VirtQueError> {
        let mut state = self.inner.get_mut();
        if !state.get_queue().event_idx_enabled() && !self.track.quiet.swap(false, Ordering::AcqRel)
        {
            return Ok(false);
        }
        // A stopped ring is no longer the device's to write; one that starts again kicks
        // itself.
        if !state.get_queue().ready() || !state.is_enabled() {
            return Ok(false);
        }
        state.enable_notification()
    }

    /// Watches the avail index for up to `window` (no lock, no syscall): Some(after it
    /// began) when the guest made a request available, None when none came or the ring
    /// stopped meanwhile.
    pub fn watch(&self, mem: &GuestMem, window: Duration) -> Option<Duration> {
        let (idx, next, generation) = {
            let state = self.inner.get_ref();
            let q = state.get_queue();
            let at = GuestAddress(q.avail_ring()).checked_add(2)?;
            let idx = mem.get_slice(at, 2).ok()?;
            (
                idx,
                q.next_avail(),
                self.track.generation.load(Ordering::Acquire),
            )
        };
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if idx.load::<u16>(0, Ordering::Acquire).ok()? != next {
                    return Some(start.elapsed());
                }
                std::hint::spin_loop();
            }
            if self.track.generation.load(Ordering::Acquire) != generation
                || start.elapsed() >= window
            {
                return None;
            }
        }
    }

    /// Whether the guest has made requests available that were not popped yet.
    pub fn more_available(&self, mem: &GuestMem) -> bool {
        let state = self.inner.get_ref();
        let q = state.get_queue();
        q.avail_idx(mem, Ordering::Acquire)
            .map_or(true, |i| i.0 != q.next_avail())
    }

    /// Requests popped from this ring and not yet completed (lock waits included).
    pub fn in_flight(&self) -> usize {
        self.track.pending.lock().unwrap().len()
    }

    /// Whether `t` still belongs to the running ring: a job popped before a stop must not
    /// run after it (it would act on the host and write into guest memory).
    pub fn is_current(&self, t: Ticket) -> bool {
        self.track.generation.load(Ordering::Acquire) == t.generation
    }

    /// Completions dropped because their ring was stopped first.
    pub fn dropped(&self) -> u64 {
        self.track.dropped.load(Ordering::Relaxed)
    }

    /// Waits (bounded) for the requests in flight, then starts a new generation so later
    /// completions are dropped, and moves `next_avail` back to the oldest of those.
    fn stop(&self) {
        // Waits that would outlast any stop (lock waits) are suspended now; one that
        // registers while the stop waits is suspended at once (`on_stop`).
        let cancel: Vec<Canceller> = {
            let mut c = self.track.cancellers.lock().unwrap();
            c.1 = true;
            self.track.waits.store(0, Ordering::Release);
            c.0.drain().map(|(_, c)| c).collect()
        };
        for c in cancel {
            c();
        }
        let deadline = Instant::now() + STOP_WAIT;
        {
            let mut pending = self.track.pending.lock().unwrap();
            self.track.stopping.store(true, Ordering::Release);
            while !pending.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                pending = self.track.idle.wait_timeout(pending, left).unwrap().0;
            }
            self.track.stopping.store(false, Ordering::Release);
        }
        // The ring's lock, then the pending set: the order `popped` takes them in.
        let mut state = self.inner.get_mut();
        let old = self.track.generation.fetch_add(1, Ordering::AcqRel);
        // The guest may kick again: a poll's NO_NOTIFY left behind would keep a ring that
        // runs again (here, or in a migration's destination) from hearing the guest.
        if self.track.quiet.swap(false, Ordering::AcqRel) {
            if let Err(e) = state.enable_notification() {
                warn!("ring stopped: could not let the guest kick again: {e}");
            }
        }
        // Stopped: what it held is the device state's now, not a crash's to take up.
        if let Some((rec, q)) = self.track.record.get() {
            rec.ring_stopped(*q);
            self.track.recorded.store(u64::MAX, Ordering::Release);
        }
        self.track.cancellers.lock().unwrap().1 = false;
        let mut pending = self.track.pending.lock().unwrap();
        let late: Vec<u16> = pending
            .iter()
            .filter(|((g, _), _)| *g == old)
            .map(|(_, &p)| p)
            .collect();
        let suspended: Vec<u16> = {
            let mut f = self.track.forgotten.lock().unwrap();
            let mine = f
                .iter()
                .filter(|((g, _), _)| *g == old)
                .map(|(_, &p)| p)
                .collect();
            f.retain(|(g, _), _| *g > old);
            mine
        };
        if late.is_empty() {
            return;
        }
        let next = state.get_queue().next_avail();
        let oldest = late
            .iter()
            .copied()
            .max_by_key(|&p| next.wrapping_sub(p))
            .unwrap_or(next);
        // Move the base back only over requests none of which completed: a request after
        // the oldest late one that did complete must not run (and be answered) twice. A
        // suspended lock wait did not complete either: popped again, it waits anew (its
        // carried copy is dropped then, `FsDevice::resume_suspended`).
        let span = next.wrapping_sub(oldest) as usize;
        let suspended_in_span = suspended
            .iter()
            .filter(|&&p| (next.wrapping_sub(p) as usize) <= span)
            .count();
        let rewind = span == late.len() + suspended_in_span;
        if rewind {
            state.get_queue_mut().set_next_avail(oldest);
        }
        warn!(
            "ring stopped with {} request(s) still running; their replies are dropped{}",
            late.len(),
            if rewind {
                ""
            } else {
                " and the base stays (later requests completed)"
            }
        );
        pending.retain(|(g, _), _| *g != old);
    }
}

impl<'a> VringStateGuard<'a, Mem> for TrackedVring {
    type G = RwLockReadGuard<'a, VringState<Mem>>;
}

impl<'a> VringStateMutGuard<'a, Mem> for TrackedVring {
    type G = RwLockWriteGuard<'a, VringState<Mem>>;
}

impl VringT<Mem> for TrackedVring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        let track = Track::default();
        track.size.store(max_queue_size, Ordering::Relaxed);
        track.recorded.store(u64::MAX, Ordering::Relaxed);
        Ok(TrackedVring {
            inner: VringRwLock::new(mem.clone(), max_queue_size)?,
            track: Arc::new(track),
            mem,
        })
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, Mem>>::G {
        self.inner.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, Mem>>::G {
        self.inner.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.inner.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.inner.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.inner.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.inner.set_enabled(enabled);
        if !enabled {
            self.stop();
        } else {
            // So the queue thread runs once the ring is registered and takes up what a
            // stop suspended (a guest waiting on a lock may send nothing else).
            self.kick_self();
        }
    }

    fn set_queue_info(&self, desc: u64, avail: u64, used: u64) -> Result<(), VirtQueError> {
        self.track.desc_table.store(desc, Ordering::Release);
        self.inner.set_queue_info(desc, avail, used)
    }

    fn queue_next_avail(&self) -> u16 {
        self.inner.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.inner.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.inner.set_queue_next_used(idx)
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.inner.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.track.size.store(num, Ordering::Relaxed);
        self.inner.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.inner.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        self.inner.set_queue_ready(ready);
        if !ready {
            // GET_VRING_BASE: the frontend reads next_avail right after this.
            self.stop();
        } else {
            self.kick_self();
        }
    }

    fn set_kick(&self, file: Option<File>) {
        let running = file.is_some() && self.inner.get_ref().get_queue().ready();
        if running {
            // A new kick fd for a running ring: vhost-user-backend watches a kick fd only
            // when a ring becomes ready (or enabled), so the new one would never be
            // watched and the guest's kicks on it never heard (a guest hung on a FLUSH
            // after a migration). Not ready for a moment, the handler starts it again
            // and registers the new fd; `set_queue_ready` kicks once for what came meanwhile.
            log::info!("a running ring got a new kick fd; watching it");
            self.inner.set_queue_ready(false);
        }
        self.inner.set_kick(file)
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.inner.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        self.inner.set_call(file)
    }

    fn set_err(&self, file: Option<File>) {
        self.inner.set_err(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    /// A running ring of 16 entries without EVENT_IDX, and its memory.
    fn ring() -> (TrackedVring, GuestMemoryAtomic<GuestMem>) {
        let map = GuestMem::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mem = GuestMemoryAtomic::new(map);
        let v = <TrackedVring as VringT<Mem>>::new(mem.clone(), 16).unwrap();
        v.set_queue_size(16);
        v.set_queue_info(0, AVAIL, USED).unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
        (v, mem)
    }

    fn used_flags(mem: &GuestMemoryAtomic<GuestMem>) -> u16 {
        mem.memory()
            .load(GuestAddress(USED), Ordering::Acquire)
            .unwrap()
    }

    fn make_available(mem: &GuestMemoryAtomic<GuestMem>, idx: u16) {
        mem.memory()
            .store(idx, GuestAddress(AVAIL + 2), Ordering::Release)
            .unwrap();
    }

    #[test]
    fn no_notify_is_set_for_a_poll_cleared_before_sleeping_and_by_a_stop() {
        let (v, mem) = ring();
        v.quiet().unwrap();
        assert_eq!(used_flags(&mem), 1, "the guest is asked not to kick");
        assert!(!v.notify_again().unwrap(), "nothing came");
        assert_eq!(used_flags(&mem), 0, "it may kick again");
        assert!(
            !v.notify_again().unwrap(),
            "without a poll, nothing to undo"
        );

        v.quiet().unwrap();
        make_available(&mem, 1);
        assert!(
            v.notify_again().unwrap(),
            "a request made available before the guest could kick is seen"
        );
        assert_eq!(used_flags(&mem), 0);

        v.quiet().unwrap();
        v.set_queue_ready(false);
        assert_eq!(used_flags(&mem), 0, "the stop let the guest kick again");
        // The device no longer writes the stopped ring.
        mem.memory()
            .store(1u16, GuestAddress(USED), Ordering::Release)
            .unwrap();
        assert!(!v.notify_again().unwrap());
        assert_eq!(used_flags(&mem), 1, "not written after the stop");
        mem.memory()
            .store(0u16, GuestAddress(USED), Ordering::Release)
            .unwrap();
        v.quiet().unwrap();
        assert_eq!(used_flags(&mem), 0, "nor asked quiet");
    }

    #[test]
    fn a_watch_sees_a_request_made_available_and_gives_up_after_its_window() {
        let (v, mem) = ring();
        let window = Duration::from_millis(2);
        let start = Instant::now();
        assert_eq!(v.watch(&mem.memory(), window), None);
        assert!(start.elapsed() >= window);
        make_available(&mem, 1);
        let after = v.watch(&mem.memory(), Duration::from_secs(10));
        assert!(
            after.is_some_and(|a| a < Duration::from_secs(1)),
            "{after:?}"
        );
    }
}
