//! The bounded lock table (`FileLocks`): each guest lock owner's host description and
//! ranges by node, the bounds (`--max-locks`, `--max-locks-per-file`,
//! `--max-lock-waiters`), and the lock requests and releases the guest sends.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::deadlock::{Flocks, Holder, Waits};
use super::host::{ofd_getlk, ofd_lock, ofd_unlock_all};
use super::range_set::{Plan, Range, RangeSet};
use super::stall::{Activity, WatchdogWake};
use super::wait::Wait;
use crate::filesystem::Blocker;
use crate::passthrough::handle::Handle;
use crate::recovery::record::{OwnerSlot, OwnerState as RecordedOwner, Record};
use crate::sys::errno;

/// One guest lock owner's POSIX locks on one node.
pub struct Owner {
    /// The node it locks (for the count per file).
    pub(super) node: u64,
    /// Its slot in the crash record (`recovery`): dropped before `fd` closes.
    pub(super) slot: Option<OwnerSlot>,
    /// Its own host open file description, carrying its OFD locks.
    pub(super) fd: OwnedFd,
    pub(super) state: Mutex<OwnerState>,
    /// The guest pid of its last lock request (GETLK reports it).
    pub(super) pid: AtomicU32,
}

/// What an owner's mutex guards. Lock order: the owners table first, then an owner's
/// state; nothing takes the table while it holds an owner's state.
#[derive(Default)]
pub(super) struct OwnerState {
    pub(super) ranges: RangeSet,
    /// Left the table (released, or dropped once empty): a lock it is granted now is
    /// undone, and a request that finds it dead takes a fresh owner.
    pub(super) dead: bool,
    /// SETLKWs of this owner waiting on their threads: an owner with waits is kept.
    pub(super) waiting: usize,
}

/// An owner in the table, with the guest handles it locked through: an OFD lock's owner
/// is its open file, so the RELEASE of the last such handle ends it.
pub(super) struct Entry {
    pub(super) owner: Arc<Owner>,
    pub(super) handles: Vec<u64>,
}

#[derive(Default)]
pub(super) struct Owners {
    /// node -> guest lock owner -> entry.
    pub(super) by_node: HashMap<u64, HashMap<u64, Entry>>,
    pub(super) count: usize,
    /// The POSIX waits, for the deadlock check. Under the table's mutex: a wait is
    /// checked and registered in one critical section, so of two waits that close a
    /// cycle together the second sees the first, and the lock order stays the table,
    /// then an owner's state.
    pub(super) waits: Waits,
    /// When each guest lock owner last asked anything of the table (the stall rule).
    pub(super) active: Activity,
    /// The entries of each guest lock owner id in `by_node`: activity is kept only for
    /// ids with one, so what `active` holds is bounded as the entries are.
    pub(super) keys: HashMap<u64, usize>,
}

impl Owners {
    /// Notes that guest lock owner `owner` asked something now, if it has an entry.
    pub(super) fn touch(&mut self, owner: u64, now: u64) {
        if self.keys.contains_key(&owner) {
            self.active.touch(owner, now);
        }
    }

    /// Inserts `owner`'s entry for `node`, counted in `keys`.
    pub(super) fn insert(&mut self, node: u64, owner: u64, e: Entry) {
        if self
            .by_node
            .entry(node)
            .or_default()
            .insert(owner, e)
            .is_none()
        {
            *self.keys.entry(owner).or_default() += 1;
            self.count += 1;
        }
    }

    pub(super) fn get(&self, node: u64, owner: u64) -> Option<&Entry> {
        self.by_node.get(&node)?.get(&owner)
    }

    pub(super) fn remove(&mut self, node: u64, owner: u64) -> Option<Arc<Owner>> {
        let m = self.by_node.get_mut(&node)?;
        let e = m.remove(&owner)?;
        if m.is_empty() {
            self.by_node.remove(&node);
        }
        self.count -= 1;
        if let Some(n) = self.keys.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&owner);
                self.active.last.remove(&owner);
            }
        }
        Some(e.owner)
    }
}

impl Holder for Entry {
    fn conflicts(&self, range: &Range, budget: &mut usize) -> bool {
        self.owner
            .state
            .lock()
            .unwrap()
            .ranges
            .conflicts(range, budget)
    }
}

/// Counters for the statistics.
#[derive(Default)]
pub struct LockCounters {
    pub held: AtomicUsize,
    pub waiters: AtomicUsize,
    pub enolck: AtomicU64,
    /// SETLKWs answered EDEADLK (they would have closed a cycle of waits).
    pub edeadlk: AtomicU64,
    /// Owners in the table, each with a host open file description.
    pub owners: AtomicUsize,
    /// SETLKWs answered EDEADLK because every guest holder in their way was stalled
    /// (`--lock-stall-timeout`).
    pub stalled: AtomicU64,
}

pub struct FileLocks {
    pub posix: bool,
    pub flock: bool,
    pub(super) max_locks: usize,
    /// Byte ranges all owners together may hold on one file (`--max-locks-per-file`):
    /// the host walks every lock of the file at each lock call, so a file's locks cost
    /// each call on it, and a migration's load of n of them n²/2 steps.
    pub(super) max_per_file: usize,
    /// Byte ranges held per node (a leaf lock: taken under an owner's state, takes
    /// nothing itself).
    pub(super) per_file: Mutex<HashMap<u64, usize>>,
    pub(super) max_waiters: usize,
    /// Host descriptions for owners are opened read-only (`--readonly`).
    pub(super) readonly: bool,
    /// Owners a migration left to take again (`migration`), each with the thread that
    /// waits for the host to grant them: a guest lock call of the owner calls it off and
    /// decides instead.
    pub(super) pending: Mutex<HashMap<(u64, u64), Arc<Blocker>>>,
    /// Whether `pending` ever had any (a migration's load), so the hot paths skip its lock.
    pub(super) any_pending: AtomicBool,
    /// The descriptions are shared with another daemon (a migration's lock handover):
    /// a reset closes them without unlocking, the other daemon's copy holds the locks.
    pub shared: AtomicBool,
    pub(super) owners: Mutex<Owners>,
    /// flock holders and waits, for the deadlock check of flock waits.
    pub(super) flocks: Mutex<Flocks<Handle>>,
    /// `--lock-stall-timeout` in milliseconds; 0: the stall rule is off.
    pub(super) stall_ms: u64,
    /// The stall watchdog's period, and its ticks so far (it ticks only while waits
    /// exist): the clock `callers` is kept in, which a request reads without a syscall.
    pub(super) tick_ms: u64,
    pub(super) ticks: AtomicU32,
    /// The tick of the last request of each guest thread id, hashed into a fixed table
    /// (empty while the stall rule is off): a holder whose pid sent anything (I/O on the
    /// share included) is not stalled. Two ids in one slot only make a holder look busy.
    pub(super) callers: Box<[AtomicU32]>,
    /// What `now_ms` counts from.
    pub(super) epoch: Instant,
    /// Wakes the stall watchdog when a wait begins (it sleeps while nothing waits), and
    /// when the table ends.
    pub(super) watchdog: Arc<WatchdogWake>,
    pub(super) watchdog_started: AtomicBool,
    pub counters: LockCounters,
    /// Where owners are recorded for the serving process that takes over should this
    /// one die (`recovery`).
    pub(super) record: Option<Arc<Record>>,
}

impl Drop for FileLocks {
    fn drop(&mut self) {
        // The watchdog, if it sleeps, finds the table gone and ends.
        self.watchdog.wake();
    }
}

impl FileLocks {
    pub fn new(
        posix: bool,
        flock: bool,
        max_locks: usize,
        max_per_file: usize,
        max_waiters: usize,
        readonly: bool,
    ) -> Self {
        FileLocks {
            posix,
            flock,
            max_locks,
            max_per_file,
            per_file: Default::default(),
            max_waiters,
            readonly,
            shared: Default::default(),
            pending: Default::default(),
            any_pending: Default::default(),
            owners: Mutex::new(Owners::default()),
            flocks: Default::default(),
            stall_ms: 0,
            tick_ms: 0,
            ticks: AtomicU32::new(0),
            callers: Box::default(),
            epoch: Instant::now(),
            watchdog: Arc::default(),
            watchdog_started: AtomicBool::new(false),
            counters: LockCounters::default(),
            record: None,
        }
    }

    /// Records lock owners in `record` (`recovery`): their descriptions then outlive this
    /// process, and the next one takes them over with their locks.
    pub fn with_record(mut self, record: Option<Arc<Record>>) -> Self {
        self.record = record;
        self
    }

    pub(super) fn record_owner(
        &self,
        node: u64,
        owner: u64,
        pid: u32,
        fd: &OwnedFd,
    ) -> Option<OwnerSlot> {
        self.record.as_ref()?.new_owner(&RecordedOwner {
            owner,
            node,
            pid,
            fd: fd.as_raw_fd(),
        })
    }

    /// Milliseconds since this table was made: the stall rule's clock.
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn enolck(&self) -> io::Error {
        self.counters.enolck.fetch_add(1, Ordering::Relaxed);
        errno(libc::ENOLCK)
    }

    /// The owner `key` of `node`, made on first use with `open` (a new host description of
    /// the node's file), noting handle `fh` as one it locks through. The host open runs
    /// outside the table's lock: an open can be slow on a network file system. Owners are
    /// bounded by `--max-locks` (each holds a host fd and at least one range).
    /// `fh_open` says whether the handle is still open; asked under the table's lock, so
    /// a RELEASE racing this request either finds the handle noted here or makes it fail
    /// (EBADF): no owner outlives its handle unnoticed.
    fn owner(
        &self,
        node: u64,
        key: u64,
        fh: u64,
        open: &impl Fn(bool) -> io::Result<OwnedFd>,
        fh_open: &impl Fn() -> bool,
    ) -> io::Result<Arc<Owner>> {
        let now = self.now_ms();
        let found = |m: &mut Owners| -> io::Result<Option<Arc<Owner>>> {
            m.touch(key, now);
            let Some(e) = m.by_node.get_mut(&node).and_then(|o| o.get_mut(&key)) else {
                return Ok(None);
            };
            if !e.handles.contains(&fh) {
                if !fh_open() {
                    return Err(errno(libc::EBADF));
                }
                e.handles.push(fh);
            }
            Ok(Some(e.owner.clone()))
        };
        if let Some(o) = found(&mut self.owners.lock().unwrap())? {
            return Ok(o);
        }
        if self.owners.lock().unwrap().count >= self.max_locks {
            return Err(self.enolck());
        }
        let fd = open(self.readonly)?;
        let mut m = self.owners.lock().unwrap();
        if let Some(o) = found(&mut m)? {
            return Ok(o);
        }
        if m.count >= self.max_locks {
            return Err(self.enolck());
        }
        if !fh_open() {
            return Err(errno(libc::EBADF));
        }
        let o = Arc::new(Owner {
            node,
            slot: self.record_owner(node, key, 0, &fd),
            fd,
            state: Mutex::new(OwnerState::default()),
            pid: AtomicU32::new(0),
        });
        m.insert(
            node,
            key,
            Entry {
                owner: o.clone(),
                handles: vec![fh],
            },
        );
        m.touch(key, now);
        self.counters.owners.store(m.count, Ordering::Relaxed);
        Ok(o)
    }

    /// Drops owner `key` of `node` from the table if it is `o` and holds no range and no
    /// wait: its host description closes, so owners that come and go pin no fds.
    pub(super) fn drop_if_unused(&self, node: u64, key: u64, o: &Arc<Owner>) {
        let mut m = self.owners.lock().unwrap();
        if !m.get(node, key).is_some_and(|e| Arc::ptr_eq(&e.owner, o)) {
            return;
        }
        let mut st = o.state.lock().unwrap();
        if st.ranges.is_empty() && st.waiting == 0 && !st.dead {
            st.dead = true;
            drop(st);
            m.remove(node, key);
            self.counters.owners.store(m.count, Ordering::Relaxed);
        }
    }

    /// Takes the room an owner's ranges on `node` going from `old` to `new` in number
    /// need under `--max-locks` and `--max-locks-per-file`, in the same step as the check
    /// (the count first, then its test), so owners racing for the last room can't pass
    /// a bound together. Gives the ranges reserved, which `commit` settles, or
    /// `uncount` gives back.
    fn reserve(&self, node: u64, old: usize, new: usize) -> io::Result<usize> {
        if new <= old {
            return Ok(0);
        }
        let more = new - old;
        let before = self.counters.held.fetch_add(more, Ordering::AcqRel);
        if before + more > self.max_locks {
            self.counters.held.fetch_sub(more, Ordering::AcqRel);
            return Err(self.enolck());
        }
        let mut m = self.per_file.lock().unwrap();
        let on_file = m.entry(node).or_default();
        if *on_file + more > self.max_per_file {
            if *on_file == 0 {
                m.remove(&node);
            }
            drop(m);
            self.counters.held.fetch_sub(more, Ordering::AcqRel);
            return Err(self.enolck());
        }
        *on_file += more;
        Ok(more)
    }

    /// Applies `plan` to `ranges` and counts the change, of which `reserved` ranges were
    /// counted already (`reserve`).
    pub(super) fn commit(&self, node: u64, ranges: &mut RangeSet, plan: Plan, reserved: usize) {
        let (old, now) = (ranges.len(), plan.len_after);
        ranges.commit(plan);
        if now >= old {
            self.count(node, (now - old).saturating_sub(reserved));
            self.uncount(node, reserved.saturating_sub(now - old));
        } else {
            self.uncount(node, old - now + reserved);
        }
    }

    /// `n` more ranges held on `node`.
    pub(super) fn count(&self, node: u64, n: usize) {
        self.counters.held.fetch_add(n, Ordering::Relaxed);
        *self.per_file.lock().unwrap().entry(node).or_default() += n;
    }

    /// `n` fewer ranges held on `node`.
    pub(super) fn uncount(&self, node: u64, n: usize) {
        if n == 0 {
            return;
        }
        self.counters.held.fetch_sub(n, Ordering::Relaxed);
        let mut m = self.per_file.lock().unwrap();
        if let Some(c) = m.get_mut(&node) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                m.remove(&node);
            }
        }
    }

    /// Takes a waiter place (`--max-lock-waiters`), or ENOLCK.
    pub(super) fn waiter(&self) -> io::Result<()> {
        let n = self.counters.waiters.fetch_add(1, Ordering::AcqRel);
        if n >= self.max_waiters {
            self.counters.waiters.fetch_sub(1, Ordering::AcqRel);
            return Err(self.enolck());
        }
        Ok(())
    }

    /// Checks flock wait `w` for a cycle of flock waits among the guest's processes
    /// (`Flocks::closes_cycle`): EDEADLK if it would close one, else its record is kept
    /// until it ends. Checked and recorded in one critical section, as POSIX waits are.
    pub(super) fn flock_wait(&self, w: &mut Wait) -> io::Result<()> {
        let Wait::Flock {
            node,
            fh,
            pid,
            typ,
            record,
            ..
        } = w
        else {
            return Ok(());
        };
        if *pid == 0 {
            return Ok(());
        }
        let mut fl = self.flocks.lock().unwrap();
        if fl.closes_cycle(*pid, *node, *fh, *typ) {
            self.counters.edeadlk.fetch_add(1, Ordering::Relaxed);
            return Err(errno(libc::EDEADLK));
        }
        *record = fl.add_wait(*pid, *node, *fh, *typ);
        Ok(())
    }

    /// GETLK: the first lock that would conflict with `r` for `owner`, or `r` as F_UNLCK.
    /// Its pid is the guest pid when the holder is an owner of this guest, else 0. An
    /// owner with no locks yet is asked through `probe` (the guest handle's own host fd,
    /// which carries no OFD lock), so a GETLK opens nothing and makes no owner.
    pub fn getlk(&self, node: u64, owner: u64, r: Range, probe: RawFd) -> io::Result<(Range, u32)> {
        if r.typ == libc::F_UNLCK {
            return Err(errno(libc::EINVAL));
        }
        let now = self.now_ms();
        let mine = {
            let mut m = self.owners.lock().unwrap();
            m.touch(owner, now);
            m.get(node, owner).map(|e| e.owner.clone())
        };
        let fd = mine.as_ref().map_or(probe, |o| o.fd.as_raw_fd());
        let Some(found) = ofd_getlk(fd, &r)? else {
            return Ok((
                Range {
                    typ: libc::F_UNLCK,
                    ..r
                },
                0,
            ));
        };
        // Table, then each owner's state: the one lock order.
        let m = self.owners.lock().unwrap();
        let pid = m
            .by_node
            .get(&node)
            .and_then(|owners| {
                owners.iter().find(|(&k, e)| {
                    k != owner && e.owner.state.lock().unwrap().ranges.holds(&found)
                })
            })
            .map_or(0, |(_, e)| e.owner.pid.load(Ordering::Relaxed));
        Ok((found, pid))
    }

    /// SETLK (and the first try of a SETLKW) through guest handle `fh`: places or removes
    /// `r` for `owner` without waiting. `Ok(None)` done; `Ok(Some(wait))` the lock is
    /// taken by someone else and the caller asked to wait.
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        self: &Arc<Self>,
        node: u64,
        fh: u64,
        owner: u64,
        pid: u32,
        r: Range,
        wait: bool,
        open: impl Fn(bool) -> io::Result<OwnedFd>,
        fh_open: impl Fn() -> bool,
    ) -> io::Result<Option<Wait>> {
        // A migrated owner still being taken again: its retake is over (its ranges, on a
        // description of its own, gone) before this call places any.
        self.call_off_retake(node, owner);
        // An owner found dead was dropped between the table and its state: take a fresh
        // one. Each round needs another request to drop it, so a few rounds settle it.
        for _ in 0..8 {
            let o = if r.typ == libc::F_UNLCK {
                // Unlocking what was never locked needs no host description.
                let now = self.now_ms();
                let mut m = self.owners.lock().unwrap();
                m.touch(owner, now);
                match m.get(node, owner) {
                    Some(e) => e.owner.clone(),
                    None => return Ok(None),
                }
            } else {
                self.owner(node, owner, fh, &open, &fh_open)?
            };
            let mut st = o.state.lock().unwrap();
            if st.dead {
                continue;
            }
            o.pid.store(pid, Ordering::Relaxed);
            if let Some(slot) = &o.slot {
                slot.set_pid(pid);
            }
            let new = st.ranges.plan(r);
            let reserved = match self.reserve(node, st.ranges.len(), new.len_after) {
                Ok(n) => n,
                Err(e) => {
                    drop(st);
                    self.drop_if_unused(node, owner, &o);
                    return Err(e);
                }
            };
            let res = ofd_lock(o.fd.as_raw_fd(), &r, false);
            if res.is_err() {
                self.uncount(node, reserved);
            }
            let busy =
                |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES));
            let out = match res {
                Ok(_) => {
                    self.commit(node, &mut st.ranges, new, reserved);
                    Ok(None)
                }
                Err(e) if wait && busy(&e) => match self.waiter() {
                    Ok(()) => {
                        st.waiting += 1;
                        drop(st);
                        let mut w = Wait::Posix {
                            locks: self.clone(),
                            node,
                            key: owner,
                            owner: o,
                            range: r,
                            record: 0,
                        };
                        // The owner stays (it waits) while its state is let go: the
                        // check takes the table and then owners' states.
                        let mut m = self.owners.lock().unwrap();
                        if m.waits.closes_cycle(&m.by_node, owner, node, r) {
                            drop(m);
                            self.counters.edeadlk.fetch_add(1, Ordering::Relaxed);
                            // Dropping the wait gives its place back.
                            drop(w);
                            return Err(errno(libc::EDEADLK));
                        }
                        if let Wait::Posix { record, .. } = &mut w {
                            *record = m.waits.add(owner, node, r, self.now_ms());
                        }
                        drop(m);
                        if self.stall_ms > 0 {
                            self.start_watchdog();
                            self.watchdog.wake();
                        }
                        return Ok(Some(w));
                    }
                    Err(e) => Err(e),
                },
                Err(e) if busy(&e) => Err(errno(libc::EAGAIN)),
                Err(e) => Err(e),
            };
            drop(st);
            self.drop_if_unused(node, owner, &o);
            return out;
        }
        Err(errno(libc::EAGAIN))
    }

    /// FLUSH by `owner` (the guest's close()): its POSIX locks on the node go, as a local
    /// filesystem drops a process's locks when it closes any fd of the file.
    /// A wait of the owner goes on (Linux keeps a blocked F_SETLKW of a process whose
    /// other thread closes the file), so an owner with waits stays, holding nothing.
    pub fn release_owner(&self, node: u64, owner: u64) {
        // A migrated owner still being taken again goes too: nothing it is granted later
        // may outlive the close.
        self.call_off_retake(node, owner);
        let now = self.now_ms();
        let o = {
            let mut m = self.owners.lock().unwrap();
            m.touch(owner, now);
            match m.get(node, owner) {
                None => return,
                Some(e) if e.owner.state.lock().unwrap().waiting > 0 => {
                    let o = e.owner.clone();
                    drop(m);
                    self.unlock_all(&o);
                    return;
                }
                Some(_) => m.remove(node, owner),
            }
        };
        if let Some(o) = o {
            self.drop_owner(&o);
        }
    }

    /// RELEASE of guest handle `fh` (the open file's last close): the owners that locked
    /// only through it go. That is every OFD lock of that open file, whose owner is the
    /// open file itself and which no FLUSH names; a process's POSIX owner was released by
    /// the FLUSH of its own close already.
    pub fn release_handle(&self, node: u64, fh: u64) {
        self.flocks.lock().unwrap().remove(node, fh);
        let gone: Vec<Arc<Owner>> = {
            let mut m = self.owners.lock().unwrap();
            let mut keys = Vec::new();
            if let Some(owners) = m.by_node.get_mut(&node) {
                for (&k, e) in owners.iter_mut() {
                    e.handles.retain(|&h| h != fh);
                    if e.handles.is_empty() {
                        keys.push(k);
                    }
                }
            }
            let gone = keys.into_iter().filter_map(|k| m.remove(node, k)).collect();
            self.counters.owners.store(m.count, Ordering::Relaxed);
            gone
        };
        for o in gone {
            self.drop_owner(&o);
        }
    }

    /// Every owner's locks on `node` (the node forgotten).
    pub fn release_node(&self, node: u64) {
        self.flocks.lock().unwrap().remove_node(node);
        let gone: Vec<Arc<Owner>> = {
            let mut m = self.owners.lock().unwrap();
            let keys: Vec<u64> = m
                .by_node
                .get(&node)
                .map(|owners| owners.keys().copied().collect())
                .unwrap_or_default();
            let gone: Vec<Arc<Owner>> =
                keys.into_iter().filter_map(|k| m.remove(node, k)).collect();
            self.counters.owners.store(m.count, Ordering::Relaxed);
            gone
        };
        for o in gone {
            self.drop_owner(&o);
        }
    }

    /// Everything (DESTROY, a new INIT).
    pub fn release_all(&self) {
        self.pending.lock().unwrap().clear();
        // The flock waits' records stay: each goes with its wait, which is cancelled.
        self.flocks.lock().unwrap().clear_held();
        let gone: Vec<Arc<Owner>> = {
            let mut m = self.owners.lock().unwrap();
            // The waits' records stay: each goes with its wait, which is cancelled.
            let all = std::mem::take(&mut m.by_node);
            m.count = 0;
            m.keys.clear();
            m.active.last.clear();
            self.counters.owners.store(0, Ordering::Relaxed);
            all.into_values()
                .flat_map(|owners| owners.into_values().map(|e| e.owner))
                .collect()
        };
        let shared = self.shared.load(Ordering::Acquire);
        for o in gone {
            if shared {
                // Only closed: the other daemon's copy of the description keeps them.
                let mut st = o.state.lock().unwrap();
                st.dead = true;
                self.uncount(o.node, st.ranges.len());
                st.ranges = RangeSet::default();
            } else {
                self.drop_owner(&o);
            }
        }
    }

    /// Ends an owner already out of the table: its host locks go and it is marked dead
    /// (under its state lock, so a waiter granted a lock afterwards sees it and undoes it).
    fn drop_owner(&self, o: &Owner) {
        let mut st = o.state.lock().unwrap();
        st.dead = true;
        self.unlock_locked(o, &mut st);
    }

    /// Removes every lock of an owner that stays (it has waits).
    fn unlock_all(&self, o: &Owner) {
        let mut st = o.state.lock().unwrap();
        self.unlock_locked(o, &mut st);
    }

    fn unlock_locked(&self, o: &Owner, st: &mut OwnerState) {
        ofd_unlock_all(o.fd.as_raw_fd());
        self.uncount(o.node, st.ranges.len());
        st.ranges = RangeSet::default();
    }

    /// Locks held now (for tests and statistics).
    pub fn held(&self) -> usize {
        self.counters.held.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64, typ: i32) -> Range {
        Range { start, end, typ }
    }

    /// Owners racing SETLKs against `--max-locks` (and, in a second run, against
    /// `--max-locks-per-file`) never hold more ranges together than the bound: the room a
    /// lock needs is taken in the same step that checks for it.
    #[test]
    fn racing_setlks_never_pass_the_lock_bounds() {
        const THREADS: u64 = 16;
        const BOUND: usize = 4;
        let f = tempfile::NamedTempFile::new_in("/dev/shm")
            .or_else(|_| tempfile::NamedTempFile::new())
            .unwrap();
        for (max, per_file) in [(BOUND, 1000), (1000, BOUND)] {
            for _ in 0..100 {
                let locks = Arc::new(FileLocks::new(true, true, max, per_file, 16, false));
                let go = Arc::new(std::sync::Barrier::new(THREADS as usize));
                let granted: usize = std::thread::scope(|s| {
                    let all: Vec<_> = (0..THREADS)
                        .map(|k| {
                            let (locks, go, f) = (locks.clone(), go.clone(), &f);
                            s.spawn(move || {
                                let open = |_: bool| Ok(OwnedFd::from(f.reopen()?));
                                go.wait();
                                let mut n = 0;
                                for i in 0..4 {
                                    let byte = 2 * (k * 4 + i);
                                    let rg = r(byte, byte, libc::F_RDLCK);
                                    if locks
                                        .setlk(2, 1, 0x100 + k, 1, rg, false, open, || true)
                                        .is_ok()
                                    {
                                        n += 1;
                                    }
                                }
                                n
                            })
                        })
                        .collect();
                    all.into_iter().map(|t| t.join().unwrap()).sum()
                });
                let modelled: usize = locks.export().iter().map(|o| o.ranges.len()).sum();
                assert!(
                    granted <= BOUND && modelled <= BOUND && locks.held() <= BOUND,
                    "bound {BOUND} (max {max}, per file {per_file}): {granted} granted, \
                     {modelled} held, counted {}",
                    locks.held()
                );
            }
        }
    }
}
