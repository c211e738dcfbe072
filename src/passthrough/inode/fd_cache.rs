//! The bound on the O_PATH fds nodes hold (`FdCache`): past it, the fd of a node not used
//! lately is closed (CLOCK), and nodes that must keep theirs are pinned, up to half of it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::Inode;

/// The bound on the O_PATH fds nodes hold, and the nodes holding them in the order they
/// got them.
pub struct FdCache {
    limit: usize,
    pub(super) held: AtomicUsize,
    /// Nodes that keep their fds whatever the sweep says (at most half the limit).
    pub(super) pinned: AtomicUsize,
    ring: Mutex<VecDeque<Weak<Inode>>>,
}

impl FdCache {
    pub fn new(limit: usize) -> FdCache {
        FdCache {
            limit: limit.max(1),
            held: AtomicUsize::new(0),
            pinned: AtomicUsize::new(0),
            ring: Mutex::new(VecDeque::new()),
        }
    }

    /// The bound for an fd limit of `nofile`: half of it (the rest is for open files,
    /// lock descriptions, the daemon's own), at most 65,536.
    pub fn limit_for(nofile: u64) -> usize {
        (nofile / 2).clamp(16, 65_536) as usize
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub(super) fn max_pinned(&self) -> usize {
        self.limit / 2
    }

    /// `inode` has just taken an fd: count it, and give up others' past the bound.
    pub(super) fn admitted(&self, inode: &Arc<Inode>) {
        self.held.fetch_add(1, Ordering::Relaxed);
        let mut ring = self.ring.lock().unwrap();
        ring.push_back(Arc::downgrade(inode));
        self.sweep(&mut ring, self.limit);
        // Entries of nodes since dropped, or that gave up their fd another way, pile up
        // where nothing is swept: compact now and then.
        if ring.len() > 2 * self.limit + 64 {
            ring.retain(|w| w.upgrade().is_some_and(|i| i.fd.lock().unwrap().is_some()));
        }
    }

    /// Out of fds: give up an eighth of the held ones.
    pub fn shrink(&self) {
        let held = self.held();
        let target = held - held / 8;
        let mut ring = self.ring.lock().unwrap();
        self.sweep(&mut ring, target.min(self.limit));
    }

    /// CLOCK: closes fds of nodes not used since the last pass until `target` are held.
    fn sweep(&self, ring: &mut VecDeque<Weak<Inode>>, target: usize) {
        let mut budget = 2 * ring.len() + 1;
        while self.held() > target && budget > 0 {
            budget -= 1;
            let Some(w) = ring.pop_front() else { break };
            let Some(i) = w.upgrade() else { continue };
            // Pinned, used since the last pass (its second chance), or busy: kept, and
            // looked at again on a later pass.
            let keep = i.pinned.load(Ordering::Relaxed)
                || i.used.swap(false, Ordering::Relaxed)
                || (!i.give_up_fd() && i.fd.lock().map(|f| f.is_some()).unwrap_or(true));
            if keep {
                ring.push_back(w);
            }
        }
    }
}
