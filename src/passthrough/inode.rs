//! The inode table: FUSE node ids mapped to O_PATH fds of host files.
//!
//! A host file is identified by (st_dev, st_ino, mount id); looking the same file up twice
//! returns the same node id with its lookup count raised. FORGET lowers the count and, at
//! zero, drops the entry and closes its fd.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::lock::IoLock;
use crate::sys;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct InodeKey {
    pub ino: u64,
    pub dev: u64,
    pub mnt_id: u64,
}

impl InodeKey {
    pub fn of(st: &sys::StatX) -> InodeKey {
        InodeKey {
            ino: st.st.st_ino,
            dev: st.st.st_dev,
            mnt_id: st.mnt_id,
        }
    }
}

pub struct Inode {
    pub nodeid: u64,
    /// O_PATH | O_NOFOLLOW fd: names this file without opening it for I/O.
    pub fd: OwnedFd,
    pub key: InodeKey,
    /// `S_IFMT` bits; a host file never changes type under a live fd.
    pub file_type: u32,
    /// Guest lookup count (FUSE "nlookup").
    lookups: AtomicU64,
    /// Serialises size-changing I/O against in-EOF I/O on this inode.
    pub io: IoLock,
}

impl Inode {
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn is_dir(&self) -> bool {
        self.file_type == libc::S_IFDIR
    }

    pub fn is_reg(&self) -> bool {
        self.file_type == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type == libc::S_IFLNK
    }

    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }
}

struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
    next_id: u64,
}

/// All inodes the guest currently knows. Reads (the I/O path) take the lock shared;
/// only lookups of new files and forgets take it exclusively.
pub struct InodeTable {
    maps: RwLock<Maps>,
    /// Write-concurrency figures of inodes already forgotten, so statistics outlive them.
    retired_peak: std::sync::atomic::AtomicU32,
    retired_violations: AtomicU64,
}

impl InodeTable {
    pub fn new() -> Self {
        InodeTable {
            maps: RwLock::new(Maps {
                by_id: HashMap::new(),
                by_key: HashMap::new(),
                next_id: fuse_backend_rs::api::filesystem::ROOT_ID + 1,
            }),
            retired_peak: Default::default(),
            retired_violations: Default::default(),
        }
    }

    /// Installs the share's root as node id 1. Its count never reaches zero.
    pub fn insert_root(&self, fd: OwnedFd, st: &sys::StatX) {
        let nodeid = fuse_backend_rs::api::filesystem::ROOT_ID;
        let key = InodeKey::of(st);
        let inode = Arc::new(Inode {
            nodeid,
            fd,
            key,
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(u64::MAX / 2),
            io: IoLock::default(),
        });
        let mut m = self.maps.write().unwrap();
        m.by_id.insert(nodeid, inode);
        m.by_key.insert(key, nodeid);
    }

    pub fn get(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        self.maps
            .read()
            .unwrap()
            .by_id
            .get(&nodeid)
            .cloned()
            .ok_or_else(|| sys::errno(libc::EBADF))
    }

    /// Registers one guest lookup of the file `fd` names. If the file is already known the
    /// new fd is dropped and the existing node's count goes up.
    pub fn lookup_insert(&self, fd: OwnedFd, st: &sys::StatX) -> Arc<Inode> {
        let key = InodeKey::of(st);
        let mut m = self.maps.write().unwrap();
        if let Some(id) = m.by_key.get(&key) {
            let inode = m.by_id[id].clone();
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return inode;
        }
        let nodeid = m.next_id;
        m.next_id += 1;
        let inode = Arc::new(Inode {
            nodeid,
            fd,
            key,
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            io: IoLock::default(),
        });
        m.by_id.insert(nodeid, inode.clone());
        m.by_key.insert(key, nodeid);
        inode
    }

    /// Lowers a node's lookup count by `count`; at zero the node is removed (its fd closes
    /// when the last open handle referring to it is released).
    pub fn forget(&self, nodeid: u64, count: u64) {
        let mut m = self.maps.write().unwrap();
        let Some(inode) = m.by_id.get(&nodeid) else {
            return;
        };
        let cur = inode.lookups.load(Ordering::Relaxed);
        let new = cur.saturating_sub(count);
        inode.lookups.store(new, Ordering::Relaxed);
        if new == 0 {
            let s = inode.io.stats();
            self.retired_peak
                .fetch_max(s.peak_writes_in_flight, Ordering::Relaxed);
            self.retired_violations
                .fetch_add(s.exclusive_violations, Ordering::Relaxed);
            let key = inode.key;
            m.by_id.remove(&nodeid);
            if m.by_key.get(&key) == Some(&nodeid) {
                m.by_key.remove(&key);
            }
        }
    }

    pub fn retired_peak(&self) -> u32 {
        self.retired_peak.load(Ordering::Relaxed)
    }

    pub fn retired_violations(&self) -> u64 {
        self.retired_violations.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.maps.read().unwrap().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A snapshot of all known inodes (for statistics).
    pub fn snapshot(&self) -> Vec<Arc<Inode>> {
        self.maps.read().unwrap().by_id.values().cloned().collect()
    }
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}
