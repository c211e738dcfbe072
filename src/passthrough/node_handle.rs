//! Zero-message open (`--no-open`): OPEN is answered ENOSYS, so the guest kernel sets
//! `no_open` and sends no OPEN and no RELEASE again; its READ, WRITE and the rest name the
//! node with handle 0. vfsd serves handle 0 from one host fd per node, opened on first use
//! and kept in a bounded table: a node's fd goes when the table is full (requests still
//! using it keep it open until they end), when the guest forgets the node, and when the
//! session ends. Nothing of an open reaches vfsd, so a node's fd carries no guest open
//! flags: the write request's own flags say O_APPEND, O_DSYNC and O_SYNC (`WriteFlags`).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;

use super::handle::Handle;
use super::inode::Inode;

const SHARDS: usize = 16;

/// Host fds vfsd keeps open for nodes under `--no-open` (docs/design.md): at most 4096,
/// and a quarter of the fd limit `nofile`, so the guest's nodes keep their room.
pub fn limit_for(nofile: u64) -> usize {
    (nofile / 4).clamp(16, 4096) as usize
}

/// One fd per node, sharded like `HandleTable` so readers of different files rarely meet.
pub struct NodeHandles {
    shards: Vec<RwLock<FxHashMap<u64, Arc<Handle>>>>,
    per_shard: usize,
}

impl NodeHandles {
    pub fn new(max: usize) -> Self {
        NodeHandles {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            per_shard: max.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, nodeid: u64) -> &RwLock<FxHashMap<u64, Arc<Handle>>> {
        &self.shards[(nodeid as usize) % SHARDS]
    }

    /// The node's handle if one is open (a queue thread must not open one: that may wait).
    pub fn get(&self, nodeid: u64) -> Option<Arc<Handle>> {
        self.shard(nodeid).read().unwrap().get(&nodeid).cloned()
    }

    /// The node's handle, opened with `open` if it has none. Two requests racing here may
    /// both open: the first one stored wins and the other fd is closed.
    pub fn get_or_open(
        &self,
        inode: &Arc<Inode>,
        open: impl FnOnce() -> io::Result<(std::os::fd::OwnedFd, i32)>,
    ) -> io::Result<Arc<Handle>> {
        if let Some(h) = self.get(inode.nodeid) {
            return Ok(h);
        }
        let (fd, flags) = open()?;
        Ok(self.insert(inode.clone(), fd, flags))
    }

    /// Keeps `fd` (open with host flags `flags`) as the node's handle unless it has one.
    pub fn insert(&self, inode: Arc<Inode>, fd: std::os::fd::OwnedFd, flags: i32) -> Arc<Handle> {
        let nodeid = inode.nodeid;
        let mut shard = self.shard(nodeid).write().unwrap();
        if let Some(h) = shard.get(&nodeid) {
            return h.clone();
        }
        if shard.len() >= self.per_shard {
            // Any one goes: the table bounds fds, it does not promise to keep them.
            if let Some(&victim) = shard.keys().next() {
                shard.remove(&victim);
            }
        }
        let h = Arc::new(Handle {
            inode,
            fd,
            flags,
            dir: None,
            nowait_reads: AtomicBool::new(true),
            flock: AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
        });
        shard.insert(nodeid, h.clone());
        h
    }

    pub fn remove(&self, nodeid: u64) {
        self.shard(nodeid).write().unwrap().remove(&nodeid);
    }

    pub fn clear(&self) {
        for s in &self.shards {
            s.write().unwrap().clear();
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().unwrap().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
