//! The deadlock check: the SETLKW waits among this table's owners (`Waits`) and the flock
//! holders and waits among the guest's processes (`Flocks`), and the walks that tell
//! whether a new wait would close a cycle of them (module doc of `filelocks`). Plain
//! data: no host calls.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use super::range_set::{Range, RangeSet};
use crate::filesystem::Blocker;

/// The SETLKWs waiting on their threads, by guest lock owner: what each waits for.
/// An owner here is the guest's lock owner id, whatever node it locks: a process holding
/// a range of one file may wait for another file.
#[derive(Default)]
pub(super) struct Waits {
    pub(super) by_owner: HashMap<u64, Vec<WaitRecord>>,
    next_id: u64,
}

pub(super) struct WaitRecord {
    pub(super) id: u64,
    pub(super) node: u64,
    pub(super) range: Range,
    /// When it began (`FileLocks::now_ms`).
    pub(super) started: u64,
    /// What breaks its thread's host call off for the stall rule, once the thread blocks.
    pub(super) stall: Option<Arc<Blocker>>,
    /// The stall rule ended it (its `stall` was called off).
    pub(super) stalled: bool,
}

/// Hops the deadlock walk follows from a new wait (an owner waiting for an owner that
/// waits for ...), as Linux's `MAX_DEADLK_ITERATIONS`; a longer cycle is not found.
pub const DEADLOCK_DEPTH: usize = 10;
/// Owners and ranges the walk may look at, in all: it runs under the table's mutex.
/// Past it, no EDEADLK.
pub const DEADLOCK_STEPS: usize = 4096;

/// An owner in the way of a wait, as the walk sees it: whether it holds a range that
/// conflicts with the wanted one, each range looked at costing one of `budget`.
pub(super) trait Holder {
    fn conflicts(&self, range: &Range, budget: &mut usize) -> bool;
}

impl Holder for RangeSet {
    fn conflicts(&self, range: &Range, budget: &mut usize) -> bool {
        RangeSet::conflicts(self, range, budget)
    }
}

impl Waits {
    pub(super) fn add(&mut self, owner: u64, node: u64, range: Range, started: u64) -> u64 {
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

    pub(super) fn get_mut(&mut self, owner: u64, id: u64) -> Option<&mut WaitRecord> {
        self.by_owner
            .get_mut(&owner)?
            .iter_mut()
            .find(|w| w.id == id)
    }

    pub(super) fn remove(&mut self, owner: u64, id: u64) {
        if let Some(v) = self.by_owner.get_mut(&owner) {
            v.retain(|w| w.id != id);
            if v.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }

    /// Whether `me` waiting for `range` of `node` would close a cycle of waits among
    /// the owners of `by_node` (the table's), as Linux's `posix_locks_deadlock` finds one among processes.
    /// A wait is blocked by each other owner of its node whose ranges conflict with it;
    /// only an owner that itself waits (or `me`) leads on. Holders this table does not
    /// know (host processes, other daemons) end the walk. At most `DEADLOCK_DEPTH` hops
    /// and `DEADLOCK_STEPS` owners and ranges looked at; past either, no cycle.
    pub(super) fn closes_cycle<H: Holder>(
        &self,
        by_node: &HashMap<u64, HashMap<u64, H>>,
        me: u64,
        node: u64,
        range: Range,
    ) -> bool {
        let mut budget = DEADLOCK_STEPS;
        let mut seen = HashSet::from([me]);
        let mut frontier = vec![(node, range, me)];
        for _ in 0..DEADLOCK_DEPTH {
            let mut next = Vec::new();
            for (node, range, waiter) in frontier {
                let Some(owners) = by_node.get(&node) else {
                    continue;
                };
                // Those that may lead on: the waiting owners with an entry on the node,
                // found from the smaller side.
                let leads = |k: u64| k != waiter && (k == me || self.by_owner.contains_key(&k));
                let candidates: Vec<(u64, &H)> = if owners.len() <= self.by_owner.len() + 1 {
                    budget = budget.saturating_sub(owners.len());
                    owners
                        .iter()
                        .filter(|(&k, _)| leads(k))
                        .map(|(&k, e)| (k, e))
                        .collect()
                } else {
                    budget = budget.saturating_sub(self.by_owner.len() + 1);
                    self.by_owner
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
                    if !e.conflicts(&range, &mut budget) {
                        continue;
                    }
                    if k == me {
                        return true;
                    }
                    if seen.insert(k) {
                        for w in self.by_owner.get(&k).into_iter().flatten() {
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
}

/// deadlock check of flock waits. flock's owner is the open file; a cycle runs through
/// processes, so each handle's flock is noted with the guest pid (tgid) that took it.
pub(super) struct Flocks<H> {
    /// node -> guest handle -> its flock.
    held: HashMap<u64, HashMap<u64, FlockHolder<H>>>,
    /// guest pid -> its flock waits.
    waits: HashMap<u32, Vec<FlockWait>>,
    next_id: u64,
}

struct FlockHolder<H> {
    pid: u32,
    typ: i32,
    /// A handle released meanwhile holds nothing (a grant can come after its RELEASE).
    handle: Weak<H>,
}

struct FlockWait {
    id: u64,
    node: u64,
    fh: u64,
    typ: i32,
}

impl<H> Default for Flocks<H> {
    fn default() -> Self {
        Flocks {
            held: HashMap::new(),
            waits: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<H> Flocks<H> {
    /// Handle `fh` of `node` now holds flock `typ` (F_UNLCK: none), taken by `pid`.
    pub(super) fn set(&mut self, node: u64, fh: u64, pid: u32, typ: i32, handle: &Arc<H>) {
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

    pub(super) fn remove(&mut self, node: u64, fh: u64) {
        if let Some(m) = self.held.get_mut(&node) {
            m.remove(&fh);
            if m.is_empty() {
                self.held.remove(&node);
            }
        }
    }

    /// Notes a flock wait of `pid` for `typ` on `node` through handle `fh`; gives its id.
    pub(super) fn add_wait(&mut self, pid: u32, node: u64, fh: u64, typ: i32) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let wait = FlockWait { id, node, fh, typ };
        self.waits.entry(pid).or_default().push(wait);
        id
    }

    /// No handle of `node` holds a flock any more.
    pub(super) fn remove_node(&mut self, node: u64) {
        self.held.remove(&node);
    }

    /// No handle holds a flock any more (the waits' records stay).
    pub(super) fn clear_held(&mut self) {
        self.held.clear();
    }

    pub(super) fn remove_wait(&mut self, pid: u32, id: u64) {
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
    /// a cycle, one that waits itself leads on. Bounded as `Waits::closes_cycle`.
    pub(super) fn closes_cycle(&self, me: u32, node: u64, fh: u64, typ: i32) -> bool {
        let mut budget = DEADLOCK_STEPS;
        let mut seen = HashSet::from([me]);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: u64, end: u64) -> Range {
        Range {
            start,
            end,
            typ: libc::F_WRLCK,
        }
    }

    /// Owner `owner` holding `range` of `node` in `by_node`.
    fn hold(by_node: &mut HashMap<u64, HashMap<u64, RangeSet>>, node: u64, owner: u64, r: Range) {
        let set = by_node.entry(node).or_default().entry(owner).or_default();
        let plan = set.plan(r);
        set.commit(plan);
    }

    /// A chain of `len` owners each waiting for the next one's range, the last one for a
    /// range of owner 0: owner 0 waiting for owner 1's closes a cycle `len + 1` hops long.
    fn chain(len: u64) -> (HashMap<u64, HashMap<u64, RangeSet>>, Waits) {
        let (mut by_node, mut waits) = (HashMap::new(), Waits::default());
        for k in 0..=len {
            hold(&mut by_node, 100 + k, k, w(0, 9));
        }
        for k in 1..=len {
            let next = if k == len { 100 } else { 100 + k + 1 };
            waits.add(k, next, w(0, 9), 0);
        }
        (by_node, waits)
    }

    #[test]
    fn a_wait_closing_a_cycle_of_posix_waits_is_found_within_the_depth() {
        let (by_node, waits) = chain(1);
        assert!(waits.closes_cycle(&by_node, 0, 101, w(5, 5)));
        // A range owner 1 does not hold blocks nothing.
        assert!(!waits.closes_cycle(&by_node, 0, 101, w(10, 19)));
        let (by_node, waits) = chain(DEADLOCK_DEPTH as u64 - 1);
        assert!(waits.closes_cycle(&by_node, 0, 101, w(0, 0)));
        // One hop longer than the walk follows: not found.
        let (by_node, waits) = chain(DEADLOCK_DEPTH as u64);
        assert!(!waits.closes_cycle(&by_node, 0, 101, w(0, 0)));
    }

    #[test]
    fn a_wait_whose_holder_waits_for_nobody_closes_no_cycle() {
        let (by_node, mut waits) = chain(2);
        let ids: Vec<u64> = waits.by_owner[&2].iter().map(|r| r.id).collect();
        waits.remove(2, ids[0]);
        assert!(!waits.closes_cycle(&by_node, 0, 101, w(0, 9)));
        // Two read locks don't conflict.
        let (by_node, waits) = chain(1);
        let read = Range {
            typ: libc::F_RDLCK,
            ..w(0, 9)
        };
        let mut reads = HashMap::new();
        hold(&mut reads, 101, 1, read);
        hold(&mut reads, 100, 0, read);
        assert!(!waits.closes_cycle(&reads, 0, 101, read));
        assert!(waits.closes_cycle(&by_node, 0, 101, read));
    }

    #[test]
    fn a_flock_wait_closing_a_cycle_of_processes_is_found() {
        let (a, b) = (Arc::new(()), Arc::new(()));
        let mut f: Flocks<()> = Flocks::default();
        // Process 10 holds node 2 through handle 1, process 20 node 3 through handle 2,
        // and 20 waits for node 2 through handle 3.
        f.set(2, 1, 10, libc::F_WRLCK, &a);
        f.set(3, 2, 20, libc::F_WRLCK, &b);
        f.add_wait(20, 2, 3, libc::F_WRLCK);
        assert!(f.closes_cycle(10, 3, 4, libc::F_WRLCK));
        // Shared flocks don't conflict.
        f.set(3, 2, 20, libc::F_RDLCK, &b);
        assert!(!f.closes_cycle(10, 3, 4, libc::F_RDLCK));
        assert!(f.closes_cycle(10, 3, 4, libc::F_WRLCK));
        // A released handle holds nothing.
        drop(b);
        assert!(!f.closes_cycle(10, 3, 4, libc::F_WRLCK));
    }
}
