//! The per-inode I/O lock behind parallel direct writes.
//!
//! Invariants (the rule the kernel's FUSE maintainers settled on for
//! FOPEN_PARALLEL_DIRECT_WRITES):
//! - Shared: reads, and writes that end at or before the host file's current EOF. While any
//!   shared holder runs, the file size does not change through this daemon.
//! - Exclusive: writes that extend the file, appends, truncating setattr and O_TRUNC opens,
//!   every fallocate mode, the destination of copy_file_range: anything that changes the
//!   size or the block layout.
//! - "Extends" is decided against the host's size read *under* the lock. A write that took
//!   the lock shared and finds it would extend drops it and retakes it exclusively (then
//!   re-checks nothing: exclusive covers both cases).
//!
//! - An operation on two inodes (copy_file_range) takes the lower node id's lock first.
//!
//! - One host file has exactly one lock for as long as anything refers to it: the lock
//!   belongs to the host file (`FileId`), not to a node, so two node ids for one file (a
//!   bind mount inside the share, or a node forgotten while a handle still holds it) share
//!   it. `LockTable` hands them out.
//!
//! No global lock is taken on the I/O path; counters are per inode and lock-free. The
//! table is only touched when a node is made or its last reference goes.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use crate::sys::FileHandle;

/// A host file's identity: (st_dev, st_ino), plus its file handle where nodes use them
/// (the handle carries the inode's generation, so a reused inode number is another file).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub handle: Option<FileHandle>,
}

const SHARDS: usize = 16;
type Shard = Mutex<HashMap<FileId, Weak<FileLock>>>;

/// The I/O locks of all host files some node or handle refers to.
pub struct LockTable {
    shards: Arc<Vec<Shard>>,
}

/// A host file's `IoLock`; leaves the table when its last holder drops it.
pub struct FileLock {
    io: IoLock,
    id: FileId,
    shards: Weak<Vec<Shard>>,
}

impl Deref for FileLock {
    type Target = IoLock;
    fn deref(&self) -> &IoLock {
        &self.io
    }
}

fn shard_of(id: &FileId) -> usize {
    (id.ino as usize ^ id.dev as usize) % SHARDS
}

impl LockTable {
    pub fn new() -> Self {
        LockTable {
            shards: Arc::new((0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect()),
        }
    }

    /// The lock of the host file `id`: the one already in use, or a new one.
    pub fn get(&self, id: FileId) -> Arc<FileLock> {
        let mut m = self.shards[shard_of(&id)].lock().unwrap();
        if let Some(l) = m.get(&id).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(FileLock {
            io: IoLock::default(),
            id: id.clone(),
            shards: Arc::downgrade(&self.shards),
        });
        m.insert(id, Arc::downgrade(&l));
        l
    }

    /// Host files with a lock (for tests and statistics).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let Some(shards) = self.shards.upgrade() else {
            return;
        };
        let mut m = shards[shard_of(&self.id)].lock().unwrap();
        // A lookup may have replaced the entry since this lock's last holder went.
        if m.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&self.id);
        }
    }
}

#[derive(Default)]
pub struct IoLock {
    lock: RwLock<()>,
    writes_in_flight: AtomicU32,
    peak_writes_in_flight: AtomicU32,
    exclusive_in_flight: AtomicU32,
    /// Times an exclusive section saw another write in flight: must stay 0.
    exclusive_violations: AtomicU64,
    shared_writes: AtomicU64,
    exclusive_writes: AtomicU64,
    /// Times a write asked the host for the file's size.
    size_checks: AtomicU64,
    /// A size the host file had at least (0: unknown). Writes ending within it take the
    /// lock shared without asking the host, which on a network file system (FUSE with
    /// no attribute cache, NFS) costs a round trip per write. Only lowered or cleared
    /// (every exclusive holder may shrink the file) unless a write or a query proves
    /// more; a shrink from outside vfsd shows at the next getattr.
    known_size: AtomicU64,
}

/// Which side of the lock a size-changing or data operation holds.
pub enum IoGuard<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Counts one write in flight on the inode for as long as it lives.
pub struct WriteInFlight<'a> {
    lock: &'a IoLock,
    exclusive: bool,
}

impl IoLock {
    pub fn shared(&self) -> IoGuard<'_> {
        // A poisoned lock only means another request panicked; the data it guards is ().
        IoGuard::Shared(self.lock.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The shared side if nobody holds (or waits for) the exclusive one; never blocks.
    pub fn try_shared(&self) -> Option<IoGuard<'_>> {
        match self.lock.try_read() {
            Ok(g) => Some(IoGuard::Shared(g)),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(IoGuard::Shared(e.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub fn exclusive(&self) -> IoGuard<'_> {
        let g = self.lock.write().unwrap_or_else(|e| e.into_inner());
        // It may truncate, punch or collapse: forget the size until proven again.
        self.known_size.store(0, Ordering::Relaxed);
        IoGuard::Exclusive(g)
    }

    /// The exclusive side if nobody holds either side; never blocks.
    pub fn try_exclusive(&self) -> Option<IoGuard<'_>> {
        let g = match self.lock.try_write() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        self.known_size.store(0, Ordering::Relaxed);
        Some(IoGuard::Exclusive(g))
    }

    /// Whether the file is known to reach `end` (call with the lock held).
    pub fn known_to_reach(&self, end: u64) -> bool {
        end <= self.known_size.load(Ordering::Relaxed)
    }

    /// The file reached `end` (a write ended there, or it was measured): raise what is
    /// known. Call with the lock held.
    pub fn reached(&self, end: u64) {
        self.known_size.fetch_max(end, Ordering::Relaxed);
    }

    /// The host reported `size` (getattr, under the shared lock): that replaces what was
    /// known, so a shrink made outside vfsd is seen.
    pub fn measured(&self, size: u64) {
        self.known_size.store(size, Ordering::Relaxed);
    }

    /// Counts a query of the host file's size made to choose a write's lock.
    pub fn size_checked(&self) {
        self.size_checks.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks a write as running under `guard`; used for the in-flight statistics and the
    /// exclusivity check.
    pub fn write_started(&self, guard: &IoGuard<'_>) -> WriteInFlight<'_> {
        let exclusive = matches!(guard, IoGuard::Exclusive(_));
        let now = self.writes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_writes_in_flight.fetch_max(now, Ordering::Relaxed);
        if exclusive {
            self.exclusive_writes.fetch_add(1, Ordering::Relaxed);
            let ex = self.exclusive_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            if now != 1 || ex != 1 {
                self.exclusive_violations.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            self.shared_writes.fetch_add(1, Ordering::Relaxed);
            if self.exclusive_in_flight.load(Ordering::SeqCst) != 0 {
                self.exclusive_violations.fetch_add(1, Ordering::Relaxed);
            }
        }
        WriteInFlight {
            lock: self,
            exclusive,
        }
    }

    pub fn stats(&self) -> IoLockStats {
        IoLockStats {
            peak_writes_in_flight: self.peak_writes_in_flight.load(Ordering::Relaxed),
            shared_writes: self.shared_writes.load(Ordering::Relaxed),
            exclusive_writes: self.exclusive_writes.load(Ordering::Relaxed),
            exclusive_violations: self.exclusive_violations.load(Ordering::Relaxed),
            size_checks: self.size_checks.load(Ordering::Relaxed),
        }
    }
}

impl Drop for WriteInFlight<'_> {
    fn drop(&mut self) {
        if self.exclusive {
            self.lock.exclusive_in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        self.lock.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoLockStats {
    pub peak_writes_in_flight: u32,
    pub shared_writes: u64,
    pub exclusive_writes: u64,
    pub exclusive_violations: u64,
    pub size_checks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn shared_writers_overlap_and_exclusive_ones_do_not() {
        let l = Arc::new(IoLock::default());
        let g1 = l.shared();
        let w1 = l.write_started(&g1);
        let g2 = l.shared();
        let w2 = l.write_started(&g2);
        assert_eq!(l.stats().peak_writes_in_flight, 2);
        drop((w1, w2, g1, g2));
        let g = l.exclusive();
        let w = l.write_started(&g);
        drop((w, g));
        let s = l.stats();
        assert_eq!(s.exclusive_violations, 0);
        assert_eq!(s.shared_writes, 2);
        assert_eq!(s.exclusive_writes, 1);
    }

    #[test]
    fn exclusive_beside_a_shared_writer_is_reported() {
        // Simulates a broken caller that counts an exclusive write while a shared one runs:
        // the check must notice it.
        let l = IoLock::default();
        let g = l.shared();
        let _w = l.write_started(&g);
        // A guard of an unrelated lock stands in for a wrongly taken one.
        static OTHER: RwLock<()> = RwLock::new(());
        let fake = IoGuard::Exclusive(OTHER.write().unwrap());
        let _w2 = l.write_started(&fake);
        assert_eq!(l.stats().exclusive_violations, 1);
    }

    #[test]
    fn one_host_file_has_one_lock_while_anything_holds_it() {
        let t = LockTable::new();
        let id = |ino| FileId {
            dev: 1,
            ino,
            handle: None,
        };
        let a = t.get(id(5));
        let b = t.get(id(5));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &t.get(id(6))));
        drop(a);
        assert_eq!(t.len(), 1, "b still holds it");
        let c = t.get(id(5));
        assert!(Arc::ptr_eq(&b, &c));
        drop((b, c));
        assert!(t.is_empty(), "the entry goes with its last holder");
    }

    #[test]
    fn try_shared_never_waits_for_a_size_change() {
        let l = IoLock::default();
        let g = l.shared();
        assert!(l.try_shared().is_some(), "readers share");
        drop(g);
        let x = l.exclusive();
        assert!(
            l.try_shared().is_none(),
            "an exclusive holder must turn it away"
        );
        drop(x);
        assert!(l.try_shared().is_some());
    }
}
