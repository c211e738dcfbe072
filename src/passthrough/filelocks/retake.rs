//! What a migration needs of the table: every owner with its ranges (`export`), the
//! owners of a state installed again (`restore_owner`), and the owners a load leaves to
//! threads that wait for the host to grant their ranges (the pending retakes).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::host::ofd_lock;
use super::range_set::{Range, RangeSet};
use super::table::{Entry, FileLocks, Owner, OwnerState};
use crate::filesystem::Blocker;
use crate::sys::errno;

/// One lock owner as the migration state carries it (`FileLocks::export`).
pub struct OwnerRecord {
    pub node: u64,
    pub owner: u64,
    pub pid: u32,
    /// The guest handles it locked through.
    pub handles: Vec<u64>,
    pub ranges: Vec<Range>,
}

impl FileLocks {
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
                    ranges: st.ranges.iter().collect(),
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
    pub(super) fn call_off_retake(&self, node: u64, key: u64) {
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
        for r in ranges.iter() {
            // A conflict is EAGAIN.
            ofd_lock(fd.as_raw_fd(), &r, false)?;
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
}

#[cfg(test)]
mod tests {
    use super::super::range_set::{ENTRY_COPIES, OFFSET_MAX};
    use super::*;

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
}
