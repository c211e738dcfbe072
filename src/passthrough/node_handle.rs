//! Zero-message open (`--no-open`): OPEN is answered ENOSYS, so the guest kernel sets
//! `no_open` and sends no OPEN and no RELEASE again; its READ, WRITE and the rest name the
//! node with handle 0. vfsd serves handle 0 from one host fd per node, opened on first use
//! with the access the request needs (read-only for readers) and kept in a bounded table.
//! A node's fd goes when the table is full (requests still using it keep it open until
//! they end), when the guest forgets the node, and when the session ends. Nothing of an
//! open reaches vfsd, so a node's fd carries no open flags of the guest's.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;

use super::handle::Handle;
use super::inode::Inode;

const SHARDS: usize = 16;

/// How many of a full shard's fds an insert looks at for one to close: one of a file still
/// linked on the host (`evict`).
const CANDIDATES: usize = 8;

/// Host fds vfsd keeps open for nodes under `--no-open` (docs/design.md): at most 4096,
/// and a quarter of the fd limit `nofile`, so the guest's nodes keep their room.
pub fn limit_for(nofile: u64) -> usize {
    (nofile / 4).clamp(SHARDS as u64, 4096) as usize
}

/// The access a request on handle 0 needs from the node's fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
    /// Any fd of the file will do (fsync, SEEK_DATA, an ioctl).
    Any,
}

impl Need {
    /// Whether an fd open with host flags `flags` serves it.
    pub fn served_by(self, flags: i32) -> bool {
        match self {
            Need::Read => flags & libc::O_ACCMODE != libc::O_WRONLY,
            Need::Write => flags & libc::O_ACCMODE != libc::O_RDONLY,
            Need::Any => true,
        }
    }

    /// The host open flags to try, in order, for a fd that serves it: readers read only
    /// (a read-only share, a file being executed on the host, no copy-up on overlayfs);
    /// a writer also reads where it may, and an append-only file opens only with
    /// O_APPEND.
    pub fn flags_to_try(self) -> &'static [i32] {
        const READ: &[i32] = &[libc::O_RDONLY, libc::O_RDWR];
        const WRITE: &[i32] = &[
            libc::O_RDWR,
            libc::O_WRONLY,
            libc::O_RDWR | libc::O_APPEND,
            libc::O_WRONLY | libc::O_APPEND,
        ];
        match self {
            Need::Read | Need::Any => READ,
            Need::Write => WRITE,
        }
    }
}

/// One fd per node, sharded like `HandleTable` so readers of different files rarely meet.
pub struct NodeHandles {
    shards: Vec<Shard>,
    per_shard: usize,
}

impl NodeHandles {
    /// A table of at most `max` fds, and as many again of files unlinked on the host.
    pub fn new(max: usize) -> Self {
        NodeHandles {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            per_shard: (max / SHARDS).max(1),
        }
    }

    fn shard(&self, nodeid: u64) -> &Shard {
        &self.shards[(nodeid as usize) % SHARDS]
    }

    /// The node's handle if one is open.
    pub fn get(&self, nodeid: u64) -> Option<Arc<Handle>> {
        read(self.shard(nodeid)).get(&nodeid).cloned()
    }

    /// Keeps `fd` (open with host flags `flags`) as the node's handle, in place of any it
    /// had.
    pub fn put(&self, inode: Arc<Inode>, fd: OwnedFd, flags: i32, nowait: bool) -> Arc<Handle> {
        let nodeid = inode.nodeid;
        let h = Arc::new(Handle {
            inode,
            fd,
            flags,
            dir: None,
            nowait_reads: AtomicBool::new(nowait),
            flock: AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
        });
        // Looked at without the shard's lock: a stat may take a while on some hosts.
        let victim = self.victim(nodeid);
        // Closed after the shard's lock is let go: a close may flush on the host.
        let (_old, _evicted) = {
            let mut shard = write(self.shard(nodeid));
            let old = shard.remove(&nodeid);
            let evicted = if shard.len() < self.per_shard {
                None
            } else {
                match victim {
                    // Unless another request replaced or dropped it meanwhile.
                    Some((n, v)) if shard.get(&n).is_some_and(|cur| Arc::ptr_eq(cur, &v)) => {
                        shard.remove(&n)
                    }
                    _ if shard.len() >= 2 * self.per_shard => {
                        let any = shard.keys().next().copied();
                        any.and_then(|n| shard.remove(&n))
                    }
                    _ => None,
                }
            };
            shard.insert(nodeid, h.clone());
            (old, evicted)
        };
        h
    }

    /// In a full shard, the fd to close to make room for `nodeid`'s: an fd of a file
    /// unlinked on the host may be all that keeps its data while the guest has it open,
    /// so one of a linked file, among `CANDIDATES`.
    fn victim(&self, nodeid: u64) -> Option<(u64, Arc<Handle>)> {
        let candidates: Vec<(u64, Arc<Handle>)> = {
            let shard = read(self.shard(nodeid));
            if shard.len() < self.per_shard {
                return None;
            }
            shard
                .iter()
                .filter(|(&n, _)| n != nodeid)
                .take(CANDIDATES)
                .map(|(&n, h)| (n, h.clone()))
                .collect()
        };
        candidates.into_iter().find(|(_, h)| linked(h))
    }

    /// Drops the node's handle, if it is `h` (none given: whatever it is).
    pub fn remove(&self, nodeid: u64, h: Option<&Arc<Handle>>) {
        let _gone = {
            let mut shard = write(self.shard(nodeid));
            match (shard.get(&nodeid), h) {
                (Some(cur), Some(h)) if !Arc::ptr_eq(cur, h) => None,
                _ => shard.remove(&nodeid),
            }
        };
    }

    pub fn clear(&self) {
        for s in &self.shards {
            let _gone: Vec<_> = write(s).drain().collect();
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

type Shard = RwLock<FxHashMap<u64, Arc<Handle>>>;

// A panic elsewhere while a shard was locked leaves its map whole (every change is one
// insert or remove): the table goes on rather than fail every later request.
fn read(s: &Shard) -> std::sync::RwLockReadGuard<'_, FxHashMap<u64, Arc<Handle>>> {
    s.read().unwrap_or_else(|e| e.into_inner())
}

fn write(s: &Shard) -> std::sync::RwLockWriteGuard<'_, FxHashMap<u64, Arc<Handle>>> {
    s.write().unwrap_or_else(|e| e.into_inner())
}

/// Whether `h`'s file still has a name on the host (or that can't be told).
fn linked(h: &Handle) -> bool {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: statx writes one struct statx into `stx`; the empty, NUL-terminated path with
    // AT_EMPTY_PATH names the fd itself. AT_STATX_DONT_SYNC: the cached link count will do.
    let r = unsafe {
        libc::statx(
            h.fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_NLINK,
            stx.as_mut_ptr(),
        )
    };
    // SAFETY: zeroed, and filled by a successful statx.
    r != 0 || unsafe { stx.assume_init() }.stx_nlink > 0
}
