//! Open file and directory handles (the FUSE `fh`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::FxHashMap;

use super::inode::Inode;
use crate::recovery::record::{HandleSlot, HandleState, Record};
use crate::sys;

/// Read position state of an open directory; READDIR on one handle is serialised by it.
#[derive(Default)]
pub struct DirState {
    /// Raw getdents64 records not yet handed to the guest, and where they continue.
    pub buf: Vec<u8>,
    pub pos: usize,
    /// The directory offset (`d_off` cookie) the next record in `buf` starts at.
    pub next_offset: u64,
}

pub struct Handle {
    pub inode: Arc<Inode>,
    /// An fd opened for I/O (not O_PATH).
    pub fd: OwnedFd,
    /// Open flags as given to the host (after vfsd's adjustments).
    pub flags: i32,
    pub dir: Option<Mutex<DirState>>,
    /// Whether reads on this handle may be tried with RWF_NOWAIT (`nowait`); cleared when
    /// the host filesystem says it can't.
    pub nowait_reads: AtomicBool,
    /// The flock the guest holds through this handle (F_RDLCK, F_WRLCK or F_UNLCK), for
    /// the migration state.
    pub flock: AtomicI32,
    /// A migrated flock not yet granted again: the thread that takes it (`migration`),
    /// which a guest flock call on the handle calls off first.
    pub flock_pending: std::sync::Mutex<Option<Arc<crate::filesystem::Blocker>>>,
    /// A node's fd under `--no-open`: the reaper's tick in which a request last took it
    /// for writing (`node_handle`).
    pub write_tick: AtomicU64,
}

impl Handle {
    pub fn is_append(&self) -> bool {
        self.flags & libc::O_APPEND != 0
    }
}

const SHARDS: usize = 16;

/// Handles by number, sharded so that concurrent requests on different files rarely touch
/// the same lock.
pub struct HandleTable {
    /// Keyed by handle numbers vfsd hands out from a counter, with a fast unseeded hash:
    /// a guest sees them but can't pick them (see `inode::Maps::by_id`).
    shards: Vec<RwLock<FxHashMap<u64, Arc<Handle>>>>,
    next: AtomicU64,
    /// Where handles are recorded for the next serving process (`recovery`), and their
    /// slots there by number, per shard (changed under the shard's write lock).
    record: Option<Arc<Record>>,
    slots: Vec<Mutex<FxHashMap<u64, HandleSlot>>>,
}

impl HandleTable {
    pub fn new() -> Self {
        HandleTable {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            next: AtomicU64::new(1),
            record: None,
            slots: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
        }
    }

    /// Records handles from now on in `record`.
    pub fn set_record(&mut self, record: Arc<Record>) {
        self.record = Some(record);
    }

    /// Handle `fh` into the record, under its shard's write lock.
    fn record(&self, fh: u64, h: &Handle) {
        let Some(r) = &self.record else { return };
        let slot = r.new_handle(&HandleState {
            fh,
            node: h.inode.nodeid,
            flags: h.flags,
            fd: h.fd.as_raw_fd(),
            dir: h.dir.is_some(),
        });
        if let Some(slot) = slot {
            self.slots[(fh as usize) % SHARDS]
                .lock()
                .unwrap()
                .insert(fh, slot);
        }
    }

    /// Handle `fh` out of the record (before its fd can close).
    fn unrecord(&self, fh: u64) {
        if self.record.is_some() {
            self.slots[(fh as usize) % SHARDS]
                .lock()
                .unwrap()
                .remove(&fh);
        }
    }

    fn shard(&self, fh: u64) -> &RwLock<FxHashMap<u64, Arc<Handle>>> {
        &self.shards[(fh as usize) % SHARDS]
    }

    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(fh).write().unwrap();
        self.record(fh, &h);
        shard.insert(fh, Arc::new(h));
        fh
    }

    /// Looks a handle up and checks that it belongs to `nodeid`: a guest may not use one
    /// file's handle to reach another.
    pub fn get(&self, fh: u64, nodeid: u64) -> io::Result<Arc<Handle>> {
        let h = self
            .shard(fh)
            .read()
            .unwrap()
            .get(&fh)
            .cloned()
            .ok_or_else(|| sys::errno(libc::EBADF))?;
        if h.inode.nodeid != nodeid {
            return Err(sys::errno(libc::EBADF));
        }
        Ok(h)
    }

    /// Installs a handle under the number the migration source gave it; numbers from
    /// `next` on are new.
    pub fn restore(&self, fh: u64, h: Handle, next: u64) -> io::Result<()> {
        if fh == 0 || fh >= next {
            return Err(sys::errno(libc::EINVAL));
        }
        let mut shard = self.shard(fh).write().unwrap();
        if shard.contains_key(&fh) {
            return Err(sys::errno(libc::EEXIST));
        }
        self.record(fh, &h);
        shard.insert(fh, Arc::new(h));
        self.next.fetch_max(next, Ordering::Relaxed);
        Ok(())
    }

    /// Every open handle with its number (for the migration state).
    pub fn export(&self) -> (Vec<(u64, Arc<Handle>)>, u64) {
        let mut all = Vec::new();
        for s in &self.shards {
            all.extend(s.read().unwrap().iter().map(|(&fh, h)| (fh, h.clone())));
        }
        all.sort_by_key(|(fh, _)| *fh);
        (all, self.next.load(Ordering::Relaxed))
    }

    pub fn remove(&self, fh: u64, nodeid: u64) -> io::Result<Arc<Handle>> {
        let mut shard = self.shard(fh).write().unwrap();
        match shard.get(&fh) {
            Some(h) if h.inode.nodeid == nodeid => {
                self.unrecord(fh);
                Ok(shard.remove(&fh).unwrap())
            }
            _ => Err(sys::errno(libc::EBADF)),
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().unwrap().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for HandleTable {
    fn default() -> Self {
        Self::new()
    }
}

impl HandleTable {
    /// Empties the table; gives what it held.
    pub fn clear(&self) -> Vec<Arc<Handle>> {
        let mut all = Vec::new();
        for (s, slots) in self.shards.iter().zip(&self.slots) {
            let mut s = s.write().unwrap();
            slots.lock().unwrap().clear();
            all.extend(s.drain().map(|(_, h)| h));
        }
        all
    }
}
