//! File locks forwarded to the host: POSIX byte-range locks (and OFD locks, which the guest
//! sends the same way) and flock.
//!
//! The host kernel arbitrates. Each (node, guest lock owner) pair gets its own host open
//! file description, and the owner's byte ranges are placed on it with OFD locks
//! (`F_OFD_SETLK`). OFD locks conflict between descriptions, so two owners of one guest,
//! two guests on two daemons, and host processes using POSIX, OFD or flock locks all
//! exclude each other, while POSIX merging and splitting hold per owner. Classic POSIX
//! locks would not do: every worker thread belongs to one process, whose locks never
//! conflict with each other. flock goes on the guest handle's own host fd: one guest open
//! file is one FUSE handle is one host description, as flock wants.
//!
//! Bounds, so a guest can't pin unbounded host kernel memory (lock records are not charged
//! to memory cgroups): `--max-locks` byte ranges per connection, counted with a model of
//! each owner's ranges that merges and splits as the kernel does (`RangeSet`), and
//! `--max-lock-waiters` blocked SETLKW requests. Past either, ENOLCK.
//!
//! Deadlocks. The host does no deadlock detection for OFD locks, and the virtio-fs guest
//! never sends FUSE_INTERRUPT, so a cycle of SETLKW waits among the guest's owners would
//! hang those guest processes for good: a process blocked in a forwarded F_SETLKW can't
//! even be killed until the daemon answers. So a SETLKW that must wait is first checked
//! for a cycle among the owners this table serves, as Linux's `posix_locks_deadlock`
//! checks processes (`Owners::closes_cycle`): the wait that would close one gets EDEADLK.
//! The guest's OFD locks get the same check. FUSE can't tell them from its POSIX locks
//! (the guest's `fuse_lk_fill` sends the owner id, range, type and pid, and no
//! FL_OFDLCK), and while Linux gives OFD waits no EDEADLK, there a signal ends such a
//! wait; here nothing would. Not found: waits on locks of other daemons' guests or host
//! processes (the walk ends at a holder it doesn't know), cycles longer than
//! `DEADLOCK_DEPTH` or past `DEADLOCK_STEPS`, and cycles closed by a change while a waiter
//! already sleeps in the host's F_OFD_SETLKW (a holder taking another range a waiter
//! needs; Linux checks again whenever a waiter wakes, the host does that for us unseen),
//! and waits whose holder waits for something else of the waiter's, such as its exit (a
//! parent that kills its child, blocked in a forwarded F_SETLKW for the parent's lock, and
//! waits for it before closing the file: the signal can't end the child's wait here);
//! the stall rule below ends those.
//!
//! flock waits get a cycle check too (`Flocks::closes_cycle`). flock's owner is the open
//! file, so the walk follows processes: each handle's flock is noted with the guest pid
//! (the tgid FUSE sends) that took it, a flock wait by pid P is blocked by the other
//! handles holding a conflicting flock on its node, and a holder's pid that waits itself
//! leads on; a holder that is P closes the cycle, and that wait gets EDEADLK. Linux on a
//! local file system never answers flock EDEADLK, but there a signal ends the wait. The
//! holder is taken to be the process that took the flock: one that handed its open file
//! on (fork, SCM_RIGHTS) may be found in a cycle its file's other holder could break.
//! Cycles mixing flock and POSIX waits are not looked for.
//!
//! Stalled holders (`--lock-stall-timeout` T, default 30 s; 0 turns it off). A POSIX or
//! OFD wait that has waited T, where at least one owner of this table holds a conflicting
//! range and every such owner is stalled (no SETLK, SETLKW, GETLK or FLUSH from it for T,
//! and no wait of its own), is answered EDEADLK by a watchdog thread (`watchdog`), which
//! ticks only while waits exist. The guest process then returns to user mode, where a
//! pending signal (a parent's SIGKILL) is delivered. EINTR would not do: the guest's
//! `fuse_setlk` turns it into ERESTARTSYS, which a process with no signal pending would
//! see as errno 512. Linux's fcntl(2) says its deadlock detection has false positives too:
//! a guest process that holds a lock for longer than T without any lock call or close
//! while another waits for it makes that wait fail. Holders outside this table (host
//! processes, other guests) never trigger the rule.
//!
//! A wait that never ends is over only when its holder lets go: in the guest, end or
//! unlock the holding process (`/proc/locks` in the guest doesn't list forwarded locks;
//! the host's does, with vfsd as holder); otherwise the holder on the host or in the
//! other guest must go, or the guest be reset (a new INIT or DESTROY cancels every wait
//! with EINTR).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use super::handle::Handle;
use super::wake::{cancel_all, Blocker, Finish};
use super::PassthroughFs;
use crate::recovery::record::{OwnerSlot, OwnerState as RecordedOwner, Record};
use crate::sys::{cvt, errno};

/// `OFFSET_MAX`: a FUSE lock ending here runs to the end of the file.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock request as FUSE carries it: inclusive byte range and F_RDLCK/F_WRLCK/F_UNLCK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
}

impl Range {
    pub fn new(start: u64, end: u64, typ: u32) -> io::Result<Range> {
        let typ = typ as i32;
        if start > end || end > OFFSET_MAX {
            return Err(errno(libc::EINVAL));
        }
        if typ != libc::F_RDLCK && typ != libc::F_WRLCK && typ != libc::F_UNLCK {
            return Err(errno(libc::EINVAL));
        }
        Ok(Range { start, end, typ })
    }

    fn flock(&self) -> libc::flock {
        // SAFETY: flock is plain data; all-zero is valid (l_pid must be 0 for OFD locks).
        let mut f: libc::flock = unsafe { std::mem::zeroed() };
        f.l_type = self.typ as libc::c_short;
        f.l_whence = libc::SEEK_SET as libc::c_short;
        f.l_start = self.start as libc::off_t;
        f.l_len = if self.end == OFFSET_MAX {
            0
        } else {
            (self.end - self.start + 1) as libc::off_t
        };
        f
    }

    fn of_flock(f: &libc::flock) -> Range {
        let start = f.l_start.max(0) as u64;
        let end = if f.l_len <= 0 {
            OFFSET_MAX
        } else {
            (start + f.l_len as u64 - 1).min(OFFSET_MAX)
        };
        Range {
            start,
            end,
            typ: f.l_type as i32,
        }
    }
}

/// One owner's locked ranges, merged and split as the kernel does for POSIX locks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> (end, type), disjoint.
    ranges: BTreeMap<u64, (u64, i32)>,
}

impl Clone for RangeSet {
    fn clone(&self) -> Self {
        #[cfg(test)]
        tests::ENTRY_COPIES.with(|c| c.set(c.get() + self.ranges.len()));
        RangeSet {
            ranges: self.ranges.clone(),
        }
    }
}

impl RangeSet {
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// What applying `r` (a lock or an unlock) changes: only the ranges that overlap or
    /// touch it, so a guest holding many ranges pays per request only for those.
    pub fn plan(&self, r: Range) -> Plan {
        let lo = r.start.saturating_sub(1);
        let hi = r.end.saturating_add(1).min(OFFSET_MAX);
        // Disjoint and sorted: the ends are sorted too, so walk back from `hi`.
        let mut old: Vec<(u64, (u64, i32))> = Vec::new();
        for (&s, &(e, t)) in self.ranges.range(..=hi).rev() {
            if e < lo {
                break;
            }
            old.push((s, (e, t)));
        }
        old.reverse();
        let mut window = BTreeMap::new();
        for &(s, (e, t)) in &old {
            if e < r.start || s > r.end {
                window.insert(s, (e, t));
                continue;
            }
            // Overlapping: keep the parts outside `r`.
            if s < r.start {
                window.insert(s, (r.start - 1, t));
            }
            if e > r.end {
                window.insert(r.end + 1, (e, t));
            }
        }
        if r.typ != libc::F_UNLCK {
            window.insert(r.start, (r.end, r.typ));
        }
        // Merge neighbours of the same type that touch.
        let mut new: Vec<(u64, (u64, i32))> = Vec::new();
        for (s, (e, t)) in window {
            if let Some((_, last)) = new.last_mut() {
                if last.1 == t && last.0 != OFFSET_MAX && last.0 + 1 == s {
                    last.0 = e;
                    continue;
                }
            }
            new.push((s, (e, t)));
        }
        let len_after = self.ranges.len() - old.len() + new.len();
        Plan {
            old: old.into_iter().map(|(s, _)| s).collect(),
            new,
            len_after,
        }
    }

    /// The set of `ranges`, which must be sorted, disjoint and merged, as a set holds
    /// them (checked in one pass; else EINVAL).
    fn of_sorted(ranges: &[Range]) -> io::Result<RangeSet> {
        let mut last: Option<&Range> = None;
        for r in ranges {
            Range::new(r.start, r.end, r.typ as u32)?;
            if r.typ == libc::F_UNLCK {
                return Err(errno(libc::EINVAL));
            }
            if let Some(p) = last {
                // p.end < OFFSET_MAX: a later range starts past it.
                if r.start <= p.end || (r.start == p.end + 1 && r.typ == p.typ) {
                    return Err(errno(libc::EINVAL));
                }
            }
            last = Some(r);
        }
        // Sorted input: the map is built in bulk, in linear time.
        Ok(RangeSet {
            ranges: ranges.iter().map(|r| (r.start, (r.end, r.typ))).collect(),
        })
    }

    pub fn commit(&mut self, p: Plan) {
        for s in p.old {
            self.ranges.remove(&s);
        }
        self.ranges.extend(p.new);
    }

    /// The set after `r` is applied (for tests).
    pub fn apply(&self, r: Range) -> RangeSet {
        let mut s = self.clone();
        let p = s.plan(r);
        s.commit(p);
        s
    }

    /// Whether a range of this set conflicts with `r` (they overlap and either is a write
    /// lock). Each range looked at costs one of `budget`; none left: false.
    fn conflicts(&self, r: &Range, budget: &mut usize) -> bool {
        for (_, &(e, t)) in self.ranges.range(..=r.end).rev() {
            if e < r.start || *budget == 0 {
                return false;
            }
            *budget -= 1;
            if t == libc::F_WRLCK || r.typ == libc::F_WRLCK {
                return true;
            }
        }
        false
    }

    /// Whether a range of this set is `r` exactly (the GETLK answer is one of ours).
    fn holds(&self, r: &Range) -> bool {
        self.ranges.get(&r.start) == Some(&(r.end, r.typ))
    }
}

/// A change to a `RangeSet`: the starts of the ranges it replaces, and their replacement.
pub struct Plan {
    old: Vec<u64>,
    new: Vec<(u64, (u64, i32))>,
    pub len_after: usize,
}

/// One guest lock owner's POSIX locks on one node.
pub struct Owner {
    /// The node it locks (for the count per file).
    node: u64,
    /// Its slot in the crash record (`recovery`): dropped before `fd` closes.
    slot: Option<OwnerSlot>,
    /// Its own host open file description, carrying its OFD locks.
    fd: OwnedFd,
    state: Mutex<OwnerState>,
    /// The guest pid of its last lock request (GETLK reports it).
    pid: AtomicU32,
}

/// What an owner's mutex guards. Lock order: the owners table first, then an owner's
/// state; nothing takes the table while it holds an owner's state.
#[derive(Default)]
struct OwnerState {
    ranges: RangeSet,
    /// Left the table (released, or dropped once empty): a lock it is granted now is
    /// undone, and a request that finds it dead takes a fresh owner.
    dead: bool,
    /// SETLKWs of this owner waiting on their threads: an owner with waits is kept.
    waiting: usize,
}

/// An owner in the table, with the guest handles it locked through: an OFD lock's owner
/// is its open file, so the RELEASE of the last such handle ends it.
struct Entry {
    owner: Arc<Owner>,
    handles: Vec<u64>,
}

#[derive(Default)]
struct Owners {
    /// node -> guest lock owner -> entry.
    by_node: HashMap<u64, HashMap<u64, Entry>>,
    count: usize,
    /// The POSIX waits, for the deadlock check. Under the table's mutex: a wait is
    /// checked and registered in one critical section, so of two waits that close a
    /// cycle together the second sees the first, and the lock order stays the table,
    /// then an owner's state.
    waits: Waits,
    /// When each guest lock owner last asked anything of the table (the stall rule).
    active: Activity,
    /// The entries of each guest lock owner id in `by_node`: activity is kept only for
    /// ids with one, so what `active` holds is bounded as the entries are.
    keys: HashMap<u64, usize>,
}

/// When each guest lock owner last sent a lock request (SETLK, SETLKW, GETLK) or a FLUSH,
/// in milliseconds of `FileLocks::now_ms`, for the stall rule (`FileLocks::stalled_waits`).
/// An entry older than the timeout means what no entry means, so such entries are pruned
/// as the map grows. Nothing is recorded while the rule is off.
#[derive(Default)]
struct Activity {
    /// `--lock-stall-timeout` in milliseconds; 0: off.
    timeout_ms: u64,
    last: HashMap<u64, u64>,
    prune_at: usize,
}

impl Activity {
    fn touch(&mut self, owner: u64, now: u64) {
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

/// The SETLKWs waiting on their threads, by guest lock owner: what each waits for.
/// An owner here is the guest's lock owner id, whatever node it locks: a process holding
/// a range of one file may wait for another file.
#[derive(Default)]
struct Waits {
    by_owner: HashMap<u64, Vec<WaitRecord>>,
    next_id: u64,
}

struct WaitRecord {
    id: u64,
    node: u64,
    range: Range,
    /// When it began (`FileLocks::now_ms`).
    started: u64,
    /// What breaks its thread's host call off for the stall rule, once the thread blocks.
    stall: Option<Arc<Blocker>>,
    /// The stall rule ended it (its `stall` was called off).
    stalled: bool,
}

/// Hops the deadlock walk follows from a new wait (an owner waiting for an owner that
/// waits for ...), as Linux's `MAX_DEADLK_ITERATIONS`; a longer cycle is not found.
pub const DEADLOCK_DEPTH: usize = 10;
/// Slots of the stall rule's table of guest callers (`FileLocks::note_caller`): 16 KiB.
const CALLER_SLOTS: usize = 4096;
/// Owners and ranges the walk may look at, in all: it runs under the table's mutex.
/// Past it, no EDEADLK.
pub const DEADLOCK_STEPS: usize = 4096;

impl Waits {
    fn add(&mut self, owner: u64, node: u64, range: Range, started: u64) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.by_owner.entry(owner).or_default().push(WaitRecord {
            id,
            node,
            range,
            started,
            stall: None,
            stalled: false,
        });
        id
    }

    fn get_mut(&mut self, owner: u64, id: u64) -> Option<&mut WaitRecord> {
        self.by_owner
            .get_mut(&owner)?
            .iter_mut()
            .find(|w| w.id == id)
    }

    fn remove(&mut self, owner: u64, id: u64) {
        if let Some(v) = self.by_owner.get_mut(&owner) {
            v.retain(|w| w.id != id);
            if v.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }
}

impl Owners {
    /// Notes that guest lock owner `owner` asked something now, if it has an entry.
    fn touch(&mut self, owner: u64, now: u64) {
        if self.keys.contains_key(&owner) {
            self.active.touch(owner, now);
        }
    }

    /// Inserts `owner`'s entry for `node`, counted in `keys`.
    fn insert(&mut self, node: u64, owner: u64, e: Entry) {
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

    fn get(&self, node: u64, owner: u64) -> Option<&Entry> {
        self.by_node.get(&node)?.get(&owner)
    }

    /// Whether `me` waiting for `range` of `node` would close a cycle of waits among
    /// this table's owners, as Linux's `posix_locks_deadlock` finds one among processes.
    /// A wait is blocked by each other owner of its node whose ranges conflict with it;
    /// only an owner that itself waits (or `me`) leads on. Holders this table does not
    /// know (host processes, other daemons) end the walk. At most `DEADLOCK_DEPTH` hops
    /// and `DEADLOCK_STEPS` owners and ranges looked at; past either, no cycle.
    fn closes_cycle(&self, me: u64, node: u64, range: Range) -> bool {
        let mut budget = DEADLOCK_STEPS;
        let mut seen = std::collections::HashSet::from([me]);
        let mut frontier = vec![(node, range, me)];
        for _ in 0..DEADLOCK_DEPTH {
            let mut next = Vec::new();
            for (node, range, waiter) in frontier {
                let Some(owners) = self.by_node.get(&node) else {
                    continue;
                };
                // Those that may lead on: the waiting owners with an entry on the node,
                // found from the smaller side.
                let leads =
                    |k: u64| k != waiter && (k == me || self.waits.by_owner.contains_key(&k));
                let candidates: Vec<(u64, &Entry)> =
                    if owners.len() <= self.waits.by_owner.len() + 1 {
                        budget = budget.saturating_sub(owners.len());
                        owners
                            .iter()
                            .filter(|(&k, _)| leads(k))
                            .map(|(&k, e)| (k, e))
                            .collect()
                    } else {
                        budget = budget.saturating_sub(self.waits.by_owner.len() + 1);
                        self.waits
                            .by_owner
                            .keys()
                            .copied()
                            .chain(std::iter::once(me))
                            .filter(|&k| leads(k))
                            .filter_map(|k| owners.get(&k).map(|e| (k, e)))
                            .collect()
                    };
                for (k, e) in candidates {
                    if budget == 0 {
                        return false;
                    }
                    budget -= 1;
                    if !e
                        .owner
                        .state
                        .lock()
                        .unwrap()
                        .ranges
                        .conflicts(&range, &mut budget)
                    {
                        continue;
                    }
                    if k == me {
                        return true;
                    }
                    if seen.insert(k) {
                        for w in self.waits.by_owner.get(&k).into_iter().flatten() {
                            next.push((w.node, w.range, k));
                        }
                    }
                }
            }
            if next.is_empty() {
                return false;
            }
            frontier = next;
        }
        false
    }

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

    fn remove(&mut self, node: u64, owner: u64) -> Option<Arc<Owner>> {
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

/// One lock owner as the migration state carries it (`FileLocks::export`).
pub struct OwnerRecord {
    pub node: u64,
    pub owner: u64,
    pub pid: u32,
    /// The guest handles it locked through.
    pub handles: Vec<u64>,
    pub ranges: Vec<Range>,
}

/// Who holds a flock through which guest handle, and which flock waits wait, for the
/// deadlock check of flock waits. flock's owner is the open file; a cycle runs through
/// processes, so each handle's flock is noted with the guest pid (tgid) that took it.
#[derive(Default)]
struct Flocks {
    /// node -> guest handle -> its flock.
    held: HashMap<u64, HashMap<u64, FlockHolder>>,
    /// guest pid -> its flock waits.
    waits: HashMap<u32, Vec<FlockWait>>,
    next_id: u64,
}

struct FlockHolder {
    pid: u32,
    typ: i32,
    /// A handle released meanwhile holds nothing (a grant can come after its RELEASE).
    handle: Weak<Handle>,
}

struct FlockWait {
    id: u64,
    node: u64,
    fh: u64,
    typ: i32,
}

impl Flocks {
    /// Handle `fh` of `node` now holds flock `typ` (F_UNLCK: none), taken by `pid`.
    fn set(&mut self, node: u64, fh: u64, pid: u32, typ: i32, handle: &Arc<Handle>) {
        if typ == libc::F_UNLCK || pid == 0 {
            self.remove(node, fh);
            return;
        }
        let holder = FlockHolder {
            pid,
            typ,
            handle: Arc::downgrade(handle),
        };
        let m = self.held.entry(node).or_default();
        // A grant that came after its handle's RELEASE left an entry of a handle gone:
        // such entries go here, so a node keeps at most one besides its live handles'.
        m.retain(|_, h| h.handle.strong_count() > 0);
        m.insert(fh, holder);
    }

    fn remove(&mut self, node: u64, fh: u64) {
        if let Some(m) = self.held.get_mut(&node) {
            m.remove(&fh);
            if m.is_empty() {
                self.held.remove(&node);
            }
        }
    }

    fn remove_wait(&mut self, pid: u32, id: u64) {
        if let Some(v) = self.waits.get_mut(&pid) {
            v.retain(|w| w.id != id);
            if v.is_empty() {
                self.waits.remove(&pid);
            }
        }
    }

    /// Whether process `me` waiting for flock `typ` on `node` through handle `fh` would
    /// close a cycle: the wait is blocked by the other handles holding a conflicting flock
    /// on the node, each held by the process that took it; a holder that is `me` closes
    /// a cycle, one that waits itself leads on. Bounded as `Owners::closes_cycle`.
    fn closes_cycle(&self, me: u32, node: u64, fh: u64, typ: i32) -> bool {
        let mut budget = DEADLOCK_STEPS;
        let mut seen = std::collections::HashSet::from([me]);
        let mut frontier = vec![(node, fh, typ)];
        for _ in 0..DEADLOCK_DEPTH {
            let mut next = Vec::new();
            for (node, fh, typ) in frontier {
                for (&hfh, h) in self.held.get(&node).into_iter().flatten() {
                    if budget == 0 {
                        return false;
                    }
                    budget -= 1;
                    let conflicts = typ == libc::F_WRLCK || h.typ == libc::F_WRLCK;
                    if hfh == fh || !conflicts || h.handle.strong_count() == 0 {
                        continue;
                    }
                    if h.pid == me {
                        return true;
                    }
                    if seen.insert(h.pid) {
                        for w in self.waits.get(&h.pid).into_iter().flatten() {
                            next.push((w.node, w.fh, w.typ));
                        }
                    }
                }
            }
            if next.is_empty() {
                return false;
            }
            frontier = next;
        }
        false
    }
}

/// Owners, ranges and waits the stall watchdog may look at in one tick, in all: it runs
/// under the table's mutex. The waits it did not reach are looked at first next time.
const STALL_STEPS: usize = 16 * DEADLOCK_STEPS;

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
    max_locks: usize,
    /// Byte ranges all owners together may hold on one file (`--max-locks-per-file`):
    /// the host walks every lock of the file at each lock call, so a file's locks cost
    /// each call on it, and a migration's load of n of them n²/2 steps.
    max_per_file: usize,
    /// Byte ranges held per node (a leaf lock: taken under an owner's state, takes
    /// nothing itself).
    per_file: Mutex<HashMap<u64, usize>>,
    max_waiters: usize,
    /// Host descriptions for owners are opened read-only (`--readonly`).
    readonly: bool,
    /// Owners a migration left to take again (`migration`), each with the thread that
    /// waits for the host to grant them: a guest lock call of the owner calls it off and
    /// decides instead.
    pending: Mutex<HashMap<(u64, u64), Arc<Blocker>>>,
    /// Whether `pending` ever had any (a migration's load), so the hot paths skip its lock.
    any_pending: std::sync::atomic::AtomicBool,
    /// The descriptions are shared with another daemon (a migration's lock handover):
    /// a reset closes them without unlocking, the other daemon's copy holds the locks.
    pub shared: std::sync::atomic::AtomicBool,
    owners: Mutex<Owners>,
    /// flock holders and waits, for the deadlock check of flock waits.
    flocks: Mutex<Flocks>,
    /// `--lock-stall-timeout` in milliseconds; 0: the stall rule is off.
    stall_ms: u64,
    /// The stall watchdog's period, and its ticks so far (it ticks only while waits
    /// exist): the clock `callers` is kept in, which a request reads without a syscall.
    tick_ms: u64,
    ticks: AtomicU32,
    /// The tick of the last request of each guest thread id, hashed into a fixed table
    /// (empty while the stall rule is off): a holder whose pid sent anything (I/O on the
    /// share included) is not stalled. Two ids in one slot only make a holder look busy.
    callers: Box<[AtomicU32]>,
    /// What `now_ms` counts from.
    epoch: Instant,
    /// Wakes the stall watchdog when a wait begins (it sleeps while nothing waits), and
    /// when the table ends.
    watchdog: Arc<WatchdogWake>,
    watchdog_started: AtomicBool,
    pub counters: LockCounters,
    /// Where owners are recorded for the serving process that takes over should this
    /// one die (`recovery`).
    record: Option<Arc<Record>>,
}

/// What wakes the stall watchdog, shared with it so that it sleeps without holding the
/// table: a count of wakes.
#[derive(Default)]
struct WatchdogWake {
    count: Mutex<u64>,
    cv: Condvar,
}

impl WatchdogWake {
    fn count(&self) -> u64 {
        *self.count.lock().unwrap()
    }

    fn wake(&self) {
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

impl Drop for FileLocks {
    fn drop(&mut self) {
        // The watchdog, if it sleeps, finds the table gone and ends.
        self.watchdog.wake();
    }
}

/// What a SETLKW that must wait leaves for its waiter thread. It holds one of the
/// `--max-lock-waiters` places until it is dropped.
pub enum Wait {
    Posix {
        locks: Arc<FileLocks>,
        node: u64,
        key: u64,
        owner: Arc<Owner>,
        range: Range,
        /// Its record for the deadlock check (0: none yet).
        record: u64,
    },
    Flock {
        locks: Arc<FileLocks>,
        handle: Arc<Handle>,
        typ: i32,
        node: u64,
        fh: u64,
        pid: u32,
        /// Its record for the deadlock check (0: none yet).
        record: u64,
    },
}

impl Drop for Wait {
    fn drop(&mut self) {
        match self {
            Wait::Posix {
                locks,
                node,
                key,
                owner,
                record,
                ..
            } => {
                if *record != 0 {
                    locks.owners.lock().unwrap().waits.remove(*key, *record);
                }
                owner.state.lock().unwrap().waiting -= 1;
                locks.drop_if_unused(*node, *key, owner);
                locks.counters.waiters.fetch_sub(1, Ordering::AcqRel);
            }
            Wait::Flock {
                locks, pid, record, ..
            } => {
                if *record != 0 {
                    locks.flocks.lock().unwrap().remove_wait(*pid, *record);
                }
                locks.counters.waiters.fetch_sub(1, Ordering::AcqRel);
            }
        }
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

    fn record_owner(&self, node: u64, owner: u64, pid: u32, fd: &OwnedFd) -> Option<OwnerSlot> {
        self.record.as_ref()?.new_owner(&RecordedOwner {
            owner,
            node,
            pid,
            fd: fd.as_raw_fd(),
        })
    }

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

    /// Milliseconds since this table was made: the stall rule's clock.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Starts the stall watchdog on the first wait. It ticks every quarter of the timeout
    /// (100 ms to 1 s) while waits exist, sleeps while none do, and ends with the table.
    fn start_watchdog(self: &Arc<Self>) {
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

    fn enolck(&self) -> io::Error {
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
    fn drop_if_unused(&self, node: u64, key: u64, o: &Arc<Owner>) {
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
    fn commit(&self, node: u64, ranges: &mut RangeSet, plan: Plan, reserved: usize) {
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
    fn count(&self, node: u64, n: usize) {
        self.counters.held.fetch_add(n, Ordering::Relaxed);
        *self.per_file.lock().unwrap().entry(node).or_default() += n;
    }

    /// `n` fewer ranges held on `node`.
    fn uncount(&self, node: u64, n: usize) {
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
    fn waiter(&self) -> io::Result<()> {
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
    fn flock_wait(&self, w: &mut Wait) -> io::Result<()> {
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
        fl.next_id += 1;
        *record = fl.next_id;
        let wait = FlockWait {
            id: *record,
            node: *node,
            fh: *fh,
            typ: *typ,
        };
        fl.waits.entry(*pid).or_default().push(wait);
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
        let mut f = r.flock();
        // SAFETY: plain fcntl on a live fd (the owner's, or the caller's handle's) with a
        // live flock.
        cvt(unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut f) })?;
        if f.l_type as i32 == libc::F_UNLCK {
            return Ok((
                Range {
                    typ: libc::F_UNLCK,
                    ..r
                },
                0,
            ));
        }
        let found = Range::of_flock(&f);
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
            let f = r.flock();
            // SAFETY: plain fcntl on an fd we own with a live flock.
            let res = cvt(unsafe { libc::fcntl(o.fd.as_raw_fd(), libc::F_OFD_SETLK, &f) });
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
                        if m.closes_cycle(owner, node, r) {
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
        self.flocks.lock().unwrap().held.remove(&node);
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
        self.flocks.lock().unwrap().held.clear();
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
        let all = Range {
            start: 0,
            end: OFFSET_MAX,
            typ: libc::F_UNLCK,
        };
        let f = all.flock();
        // SAFETY: plain fcntl on an fd we own.
        unsafe { libc::fcntl(o.fd.as_raw_fd(), libc::F_OFD_SETLK, &f) };
        self.uncount(o.node, st.ranges.len());
        st.ranges = RangeSet::default();
    }

    /// A copy of every owner's host description (for the lock handover).
    pub fn owner_fds(&self) -> Vec<((u64, u64), OwnedFd)> {
        let m = self.owners.lock().unwrap();
        let mut out = Vec::new();
        for (&node, owners) in &m.by_node {
            for (&owner, e) in owners {
                if let Ok(fd) = e.owner.fd.try_clone() {
                    out.push(((node, owner), fd));
                }
            }
        }
        out
    }

    /// Every owner with its ranges (for the migration state).
    pub fn export(&self) -> Vec<OwnerRecord> {
        let m = self.owners.lock().unwrap();
        let mut out = Vec::with_capacity(m.count);
        for (&node, owners) in &m.by_node {
            for (&owner, e) in owners {
                let st = e.owner.state.lock().unwrap();
                out.push(OwnerRecord {
                    node,
                    owner,
                    pid: e.owner.pid.load(Ordering::Relaxed),
                    handles: e.handles.clone(),
                    ranges: st
                        .ranges
                        .ranges
                        .iter()
                        .map(|(&start, &(end, typ))| Range { start, end, typ })
                        .collect(),
                });
            }
        }
        out
    }

    /// Marks owner `key` of `node` as taken again after a migration, by the thread that
    /// `retake` calls off (`install_pending`).
    pub fn set_pending(&self, node: u64, key: u64, retake: Arc<Blocker>) {
        let mut p = self.pending.lock().unwrap();
        p.insert((node, key), retake);
        self.any_pending.store(true, Ordering::Release);
    }

    /// Ends the retake of owner `key` of `node`, if one is under way, and waits for it:
    /// a guest lock call or close of the owner decides instead.
    fn call_off_retake(&self, node: u64, key: u64) {
        // Read by every SETLK and FLUSH; set only by a migration's load.
        if !self.any_pending.load(Ordering::Acquire) {
            return;
        }
        let retake = self.pending.lock().unwrap().remove(&(node, key));
        if let Some(b) = retake {
            b.cancel();
        }
    }

    /// Ends retake `b` of an owner without installing it.
    pub fn drop_pending(&self, node: u64, key: u64, b: &Arc<Blocker>) {
        let mut p = self.pending.lock().unwrap();
        if p.get(&(node, key)).is_some_and(|x| Arc::ptr_eq(x, b)) {
            p.remove(&(node, key));
        }
    }

    /// Installs a migrated owner whose ranges the host granted on `fd` (`restore_owner`),
    /// if `b` still retakes it and `keep()`; false if not. Under the pending lock, so a
    /// guest lock call of the owner comes wholly before this (and called `b` off) or
    /// wholly after (and finds the owner).
    pub fn install_pending(
        &self,
        rec: &OwnerRecord,
        fd: OwnedFd,
        b: &Arc<Blocker>,
        keep: impl FnOnce() -> bool,
    ) -> io::Result<bool> {
        let mut p = self.pending.lock().unwrap();
        let key = (rec.node, rec.owner);
        if !p.get(&key).is_some_and(|x| Arc::ptr_eq(x, b)) {
            return Ok(false);
        }
        p.remove(&key);
        if !keep() {
            return Ok(false);
        }
        self.restore_owner(rec, fd).map(|()| true)
    }

    /// Installs an owner from the migration state on its host description `fd` (a new
    /// one, or the source's own, handed over), placing its ranges without waiting: a
    /// range someone else holds is EAGAIN, and the owner is not installed.
    /// The record's ranges must come as `export` writes them: sorted, disjoint, and
    /// merged (no two of one type touching), else EINVAL; so a load costs one pass, and
    /// an owner past the room `--max-locks` leaves is refused before any of its ranges is
    /// read.
    pub fn restore_owner(&self, rec: &OwnerRecord, fd: OwnedFd) -> io::Result<()> {
        let room = self
            .max_locks
            .saturating_sub(self.counters.held.load(Ordering::Relaxed));
        let on_file = self.per_file.lock().unwrap().get(&rec.node).copied();
        let file_room = self.max_per_file.saturating_sub(on_file.unwrap_or(0));
        if rec.ranges.len() > room.min(file_room) {
            return Err(self.enolck());
        }
        let ranges = RangeSet::of_sorted(&rec.ranges)?;
        let mut m = self.owners.lock().unwrap();
        if m.get(rec.node, rec.owner).is_some() {
            return Err(errno(libc::EEXIST));
        }
        let held = self.counters.held.load(Ordering::Relaxed);
        if m.count >= self.max_locks || held + ranges.len() > self.max_locks {
            return Err(self.enolck());
        }
        for (&start, &(end, typ)) in &ranges.ranges {
            let f = Range { start, end, typ }.flock();
            // SAFETY: plain fcntl on an fd we own with a live flock.
            if let Err(e) = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &f) }) {
                return Err(match e.raw_os_error() {
                    Some(libc::EACCES) => errno(libc::EAGAIN),
                    _ => e,
                });
            }
        }
        self.count(rec.node, ranges.len());
        let o = Arc::new(Owner {
            node: rec.node,
            slot: self.record_owner(rec.node, rec.owner, rec.pid, &fd),
            fd,
            state: Mutex::new(OwnerState {
                ranges,
                ..Default::default()
            }),
            pid: AtomicU32::new(rec.pid),
        });
        m.insert(
            rec.node,
            rec.owner,
            Entry {
                owner: o,
                handles: rec.handles.clone(),
            },
        );
        self.counters.owners.store(m.count, Ordering::Relaxed);
        Ok(())
    }

    /// Locks held now (for tests and statistics).
    pub fn held(&self) -> usize {
        self.counters.held.load(Ordering::Relaxed)
    }
}

impl Wait {
    /// Blocks until the lock is granted or `blocker` is called off (EINTR, from the
    /// signal its canceller sends). Run on a waiter thread, never on a request worker.
    ///
    /// A POSIX wait that the stall rule ends (`FileLocks::stalled_waits`) gets EDEADLK.
    pub fn block(self, blocker: &Blocker) -> io::Result<()> {
        let stall = self.register_stall();
        // Dropped before the wait (and its record) goes: no stall signal comes after it.
        let _finish = stall.as_deref().map(Finish);
        let stalled = || stall.as_ref().is_some_and(|b| b.is_cancelled());
        let r = blocker.retry(|| {
            if stalled() {
                return Err(errno(libc::EDEADLK));
            }
            self.wait_once()
        });
        match r {
            Err(e)
                if stalled() && matches!(e.raw_os_error(), Some(libc::EINTR | libc::EDEADLK)) =>
            {
                if let Wait::Posix { locks, .. } = &self {
                    locks.counters.stalled.fetch_add(1, Ordering::Relaxed);
                }
                Err(errno(libc::EDEADLK))
            }
            r => r,
        }
    }

    /// On the waiter thread, before it blocks: what lets the stall watchdog break this
    /// thread's host call off, noted in the wait's record (POSIX waits, with the rule on).
    fn register_stall(&self) -> Option<Arc<Blocker>> {
        let Wait::Posix {
            locks, key, record, ..
        } = self
        else {
            return None;
        };
        if locks.stall_ms == 0 || *record == 0 {
            return None;
        }
        let b = Arc::new(Blocker::default());
        b.start();
        let mut m = locks.owners.lock().unwrap();
        m.waits.get_mut(*key, *record)?.stall = Some(b.clone());
        Some(b)
    }

    fn wait_once(&self) -> io::Result<()> {
        let (locks, owner, range) = match self {
            Wait::Flock {
                locks,
                handle,
                typ,
                node,
                fh,
                pid,
                ..
            } => {
                flock(handle.fd.as_raw_fd(), *typ, true)?;
                handle.flock.store(*typ, Ordering::Relaxed);
                let mut fl = locks.flocks.lock().unwrap();
                fl.set(*node, *fh, *pid, *typ, handle);
                return Ok(());
            }
            Wait::Posix {
                locks,
                owner,
                range,
                ..
            } => (locks, owner, range),
        };
        let node = owner.node;
        let f = range.flock();
        // SAFETY: plain fcntl on an fd we own with a live flock.
        cvt(unsafe { libc::fcntl(owner.fd.as_raw_fd(), libc::F_OFD_SETLKW, &f) })?;
        let mut st = owner.state.lock().unwrap();
        if st.dead {
            // Released meanwhile (RELEASE, FORGET, DESTROY, a new INIT): the lock must
            // not outlive that. Final, as Linux answers a lock that lost its fd to a
            // close (EBADF): a retry would be granted and undone for ever.
            let un = Range {
                typ: libc::F_UNLCK,
                ..*range
            }
            .flock();
            // SAFETY: as above.
            unsafe { libc::fcntl(owner.fd.as_raw_fd(), libc::F_OFD_SETLK, &un) };
            return Err(errno(libc::EBADF));
        }
        // Not refused past `--max-locks` (or `--max-locks-per-file`) now that the host
        // granted it: undoing it would free bytes the owner held before to others for a
        // moment. A wait adds at most two ranges, so each count stays within its bound +
        // 2 x --max-lock-waiters.
        let new = st.ranges.plan(*range);
        locks.commit(node, &mut st.ranges, new, 0);
        Ok(())
    }
}

impl PassthroughFs {
    /// A new host open file description of `nodeid`'s file for an owner's OFD locks:
    /// read-write where the host allows, else read-only, else write-only; read-only on a
    /// read-only share (a guest there takes read locks only), where a write open would
    /// keep the host from running the file (ETXTBSY) and break its read leases.
    pub(super) fn lock_description(
        &self,
        nodeid: u64,
    ) -> impl Fn(bool) -> io::Result<OwnedFd> + '_ {
        move |readonly| {
            let i = self.inode(nodeid)?;
            if !i.is_reg() {
                return Err(errno(libc::EINVAL));
            }
            if readonly {
                return self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK);
            }
            self.reopen(&i, libc::O_RDWR | libc::O_NONBLOCK)
                .or_else(|_| self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK))
                .or_else(|_| self.reopen(&i, libc::O_WRONLY | libc::O_NONBLOCK))
        }
    }

    /// The guest handle a lock request names, checked against the lock type as fcntl
    /// checks a file's mode: a read lock needs read access, a write lock write access.
    fn lock_handle(&self, nodeid: u64, fh: u64, typ: i32) -> io::Result<Arc<Handle>> {
        let h = self.handle(fh, nodeid)?;
        let acc = h.flags & libc::O_ACCMODE;
        let ok = match typ {
            libc::F_RDLCK => acc != libc::O_WRONLY,
            libc::F_WRLCK => acc != libc::O_RDONLY,
            _ => true,
        };
        if !ok || h.dir.is_some() {
            return Err(errno(libc::EBADF));
        }
        Ok(h)
    }

    /// GETLK: the conflicting lock and its holder's guest pid (0 outside this guest), or
    /// the request's range as F_UNLCK.
    pub fn getlk(
        &self,
        nodeid: u64,
        fh: u64,
        owner: u64,
        r: Range,
        is_flock: bool,
    ) -> io::Result<(Range, u32)> {
        if is_flock || !self.locks.posix {
            return Err(errno(libc::ENOSYS));
        }
        let h = self.lock_handle(nodeid, fh, libc::F_UNLCK)?;
        self.locks.getlk(nodeid, owner, r, h.fd.as_raw_fd())
    }

    /// SETLK and SETLKW: `Ok(Some(wait))` when a SETLKW must wait (for a waiter thread).
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        &self,
        nodeid: u64,
        fh: u64,
        owner: u64,
        pid: u32,
        r: Range,
        is_flock: bool,
        wait: bool,
    ) -> io::Result<Option<Wait>> {
        if is_flock {
            if !self.locks.flock {
                return Err(errno(libc::ENOSYS));
            }
            let h = self.lock_handle(nodeid, fh, libc::F_UNLCK)?;
            // The guest's own call: a migrated flock still being taken again is called
            // off first (if the host granted it meanwhile, this call converts it).
            let retake = h.flock_pending.lock().unwrap().take();
            if let Some(b) = retake {
                b.cancel();
            }
            let res = {
                // Orders the call and its record against a retake that a cancel gave up
                // on, which sets the description back to `flock` when it is granted.
                let _order = h.flock_pending.lock().unwrap();
                let res = flock(h.fd.as_raw_fd(), r.typ, false);
                if res.is_ok() {
                    h.flock.store(r.typ, Ordering::Relaxed);
                }
                res
            };
            let busy = matches!(&res, Err(e) if e.raw_os_error() == Some(libc::EAGAIN));
            if res.is_ok() || busy {
                // A refused conversion has let go of the handle's earlier flock (as flock(2)
                // converts: the old lock first goes).
                let typ = if busy { libc::F_UNLCK } else { r.typ };
                self.locks
                    .flocks
                    .lock()
                    .unwrap()
                    .set(nodeid, fh, pid, typ, &h);
            }
            return match res {
                Err(_) if wait && busy => {
                    self.locks.waiter()?;
                    let mut w = Wait::Flock {
                        locks: self.locks.clone(),
                        handle: h,
                        typ: r.typ,
                        node: nodeid,
                        fh,
                        pid,
                        record: 0,
                    };
                    self.locks.flock_wait(&mut w)?;
                    Ok(Some(w))
                }
                r => r.map(|_| None),
            };
        }
        if !self.locks.posix {
            return Err(errno(libc::ENOSYS));
        }
        self.lock_handle(nodeid, fh, r.typ)?;
        self.locks.setlk(
            nodeid,
            fh,
            owner,
            pid,
            r,
            wait,
            self.lock_description(nodeid),
            || self.handle(fh, nodeid).is_ok(),
        )
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

/// Removes every OFD lock of description `fd`.
pub fn ofd_unlock_all(fd: RawFd) {
    let all = Range {
        start: 0,
        end: OFFSET_MAX,
        typ: libc::F_UNLCK,
    };
    let _ = ofd_lock(fd, &all, false);
}

/// F_OFD_SETLK (F_OFD_SETLKW when `wait`) of `r` on `fd`; a conflict is EAGAIN.
pub fn ofd_lock(fd: RawFd, r: &Range, wait: bool) -> io::Result<()> {
    let f = r.flock();
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    // SAFETY: plain fcntl on an fd the caller owns with a live flock.
    match cvt(unsafe { libc::fcntl(fd, cmd, &f) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Err(errno(libc::EAGAIN)),
        Err(e) => Err(e),
    }
}

/// flock(2) on a guest handle's host fd; `wait` for LOCK_EX/LOCK_SH without LOCK_NB.
pub fn flock(fd: RawFd, typ: i32, wait: bool) -> io::Result<()> {
    let mut op = match typ {
        libc::F_RDLCK => libc::LOCK_SH,
        libc::F_WRLCK => libc::LOCK_EX,
        libc::F_UNLCK => libc::LOCK_UN,
        _ => return Err(errno(libc::EINVAL)),
    };
    if !wait {
        op |= libc::LOCK_NB;
    }
    // SAFETY: plain syscall on an fd the caller owns.
    match cvt(unsafe { libc::flock(fd, op) }) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(errno(libc::EAGAIN)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Range entries copied by `RangeSet::clone` on this thread.
        pub static ENTRY_COPIES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn record(n: u64) -> OwnerRecord {
        OwnerRecord {
            node: 2,
            owner: 0xa,
            pid: 1,
            handles: vec![1],
            // Every other byte: disjoint, sorted, nothing to merge.
            ranges: (0..n).map(|i| r(2 * i, 2 * i, libc::F_RDLCK)).collect(),
        }
    }

    /// An owner from a migration state whose ranges would take its file past
    /// `--max-locks-per-file`, over all the file's owners, is refused before any of them
    /// is placed: the host's work to place n locks on one file grows as n².
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

    #[test]
    fn an_owner_past_the_bound_per_file_is_refused_before_it_places_any() {
        let locks = FileLocks::new(true, true, 1000, 100, 16, false);
        let (_f, fd) = description();
        locks.restore_owner(&record(60), fd).unwrap();
        let (_g, fd) = description();
        let second = OwnerRecord {
            owner: 0xb,
            ..record(60)
        };
        let e = locks.restore_owner(&second, fd).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        assert_eq!(locks.held(), 60);
        // Another file has room of its own.
        let (_h, fd) = description();
        let other = OwnerRecord { node: 3, ..second };
        locks.restore_owner(&other, fd).unwrap();
        assert_eq!(locks.held(), 120);
    }

    fn description() -> (tempfile::NamedTempFile, OwnedFd) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let fd = OwnedFd::from(f.reopen().unwrap());
        (f, fd)
    }

    /// Loading an owner's ranges from a migration state is linear in their number: no
    /// copy of the set per range (that made 65,536 ranges cost about 2e9 entry copies
    /// while the VM was paused).
    #[test]
    fn restoring_an_owner_copies_no_range_sets() {
        const N: u64 = 4096;
        let locks = FileLocks::new(true, true, N as usize, N as usize, 16, false);
        let (_f, fd) = description();
        ENTRY_COPIES.with(|c| c.set(0));
        locks.restore_owner(&record(N), fd).unwrap();
        assert_eq!(locks.held(), N as usize);
        let copies = ENTRY_COPIES.with(|c| c.get());
        assert!(
            copies <= 2 * N as usize,
            "{copies} range entries copied to load {N} ranges"
        );
    }

    /// A record with more ranges than `--max-locks` leaves room for is refused before
    /// any of them is looked at (a bad range at its end is never reached) or placed.
    #[test]
    fn an_owner_past_the_lock_bound_is_refused_before_its_ranges_are_read() {
        let locks = FileLocks::new(true, true, 100, 100, 16, false);
        let (f, fd) = description();
        let mut rec = record(101);
        rec.ranges.push(Range {
            start: 9,
            end: 1,
            typ: libc::F_RDLCK,
        });
        ENTRY_COPIES.with(|c| c.set(0));
        let e = locks.restore_owner(&rec, fd).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        assert_eq!(ENTRY_COPIES.with(|c| c.get()), 0);
        assert_eq!(locks.held(), 0);
        // Nothing was placed on the host: another description takes every byte.
        let other = f.reopen().unwrap();
        assert!(ofd_lock(other.as_raw_fd(), &r(0, OFFSET_MAX, libc::F_WRLCK), false).is_ok());
    }

    /// Ranges out of order, overlapping, or touching with one type (which a set never
    /// holds: they merge) are refused, so a load builds the set in one pass.
    #[test]
    fn a_record_with_unsorted_or_unmerged_ranges_is_refused() {
        for bad in [
            vec![r(10, 19, libc::F_RDLCK), r(0, 5, libc::F_RDLCK)],
            vec![r(0, 10, libc::F_RDLCK), r(10, 19, libc::F_WRLCK)],
            vec![r(0, 9, libc::F_WRLCK), r(10, 19, libc::F_WRLCK)],
            vec![r(0, 9, libc::F_UNLCK)],
        ] {
            let locks = FileLocks::new(true, true, 100, 100, 16, false);
            let (_f, fd) = description();
            let mut rec = record(0);
            rec.ranges = bad.clone();
            let e = locks.restore_owner(&rec, fd).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
            assert_eq!(locks.held(), 0);
        }
        // Touching with two types is what a set holds: accepted.
        let locks = FileLocks::new(true, true, 100, 100, 16, false);
        let (_f, fd) = description();
        let mut rec = record(0);
        rec.ranges = vec![r(0, 9, libc::F_WRLCK), r(10, 19, libc::F_RDLCK)];
        locks.restore_owner(&rec, fd).unwrap();
        assert_eq!(locks.held(), 2);
    }

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

    #[test]
    fn ranges_split_and_merge_as_posix_locks_do() {
        let s = RangeSet::default().apply(r(0, 99, libc::F_WRLCK));
        assert_eq!(s.len(), 1);
        // Unlocking the middle splits it.
        let s = s.apply(r(40, 59, libc::F_UNLCK));
        assert_eq!(s.len(), 2);
        // A read lock in the hole: three ranges of two types.
        let s = s.apply(r(40, 59, libc::F_RDLCK));
        assert_eq!(s.len(), 3);
        // Writing over the hole merges everything back into one.
        let s = s.apply(r(40, 59, libc::F_WRLCK));
        assert_eq!(s.len(), 1);
        assert!(s.holds(&r(0, 99, libc::F_WRLCK)));
        // Adjacent same-type ranges merge; to-EOF ranges stay whole.
        let s = s.apply(r(100, OFFSET_MAX, libc::F_WRLCK));
        assert!(s.holds(&r(0, OFFSET_MAX, libc::F_WRLCK)));
        let s = s.apply(r(0, OFFSET_MAX, libc::F_UNLCK));
        assert!(s.is_empty());
        // Every other byte: no merging, one range each.
        let mut s = RangeSet::default();
        for i in 0..100 {
            s = s.apply(r(2 * i, 2 * i, libc::F_RDLCK));
        }
        assert_eq!(s.len(), 100);
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert!(Range::new(10, 5, libc::F_RDLCK as u32).is_err());
        assert!(Range::new(0, u64::MAX, libc::F_RDLCK as u32).is_err());
        assert!(Range::new(0, 5, 7).is_err());
        assert!(Range::new(0, OFFSET_MAX, libc::F_UNLCK as u32).is_ok());
    }
}
