//! Zero-message open (`--no-open`): OPEN is answered ENOSYS, so the guest kernel sets
//! `no_open` and sends no OPEN and no RELEASE again; its READ, WRITE and the rest name the
//! node with handle 0. vfsd serves handle 0 from one host fd per node, opened on first use
//! with the access the request needs (read-only for readers) and kept in a bounded table.
//! A node's fd goes when the table is full (requests still using it keep it open until
//! they end), when the guest forgets the node, and when the session ends. Nothing of an
//! open reaches vfsd, so a node's fd carries no open flags of the guest's.
//!
//! Nor does a close: an fd open for writing would keep the host file busy (execve gets
//! ETXTBSY, leases are refused, no IN_CLOSE_WRITE) for as long as the guest keeps the
//! node. So a writer's fd is closed once no request has taken it for writing for
//! `WRITE_IDLE`, by a reaper thread that ticks only while such fds are in the table; the
//! next request opens the file again with the access it needs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

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

/// How long a node's fd for writing stays open with no request taking it for writing
/// (docs/features.md): long enough that a copy writing in bursts rarely opens the file
/// again, short enough that the host can run a file soon after the guest wrote it.
pub const WRITE_IDLE: Duration = Duration::from_secs(2);

/// Reaper ticks per idle time: a writer's fd is closed between `WRITE_IDLE` and a tick
/// more after its last write.
const TICKS: u64 = 4;

/// One fd per node, sharded like `HandleTable` so readers of different files rarely meet;
/// with the reaper of idle fds for writing, started with the first one.
pub struct NodeHandles(Arc<Table>);

pub struct Table {
    shards: Vec<Shard>,
    per_shard: usize,
    /// Counted up by the reaper on each tick: a request that takes an fd for writing
    /// stamps it with this (`Handle::write_tick`), an atomic load and store and no clock.
    tick: AtomicU64,
    tick_len: Duration,
    reaper: Mutex<Reaper>,
    wake: Condvar,
}

#[derive(Default)]
struct Reaper {
    started: bool,
    /// Ticking: an fd for writing is in the table, or was at the last tick.
    armed: bool,
    /// An fd for writing came into the table since the reaper last looked.
    kicked: bool,
    stop: bool,
}

impl NodeHandles {
    /// A table of at most `max` fds, and as many again of files unlinked on the host,
    /// whose fds for writing close when not written through for `write_idle`.
    pub fn new(max: usize, write_idle: Duration) -> Self {
        NodeHandles(Arc::new(Table {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            per_shard: (max / SHARDS).max(1),
            tick: AtomicU64::new(0),
            tick_len: (write_idle / TICKS as u32).max(Duration::from_millis(1)),
            reaper: Default::default(),
            wake: Condvar::new(),
        }))
    }

    /// Keeps `fd` (open with host flags `flags`) as the node's handle, in place of any it
    /// had.
    pub fn put(&self, inode: Arc<Inode>, fd: OwnedFd, flags: i32, nowait: bool) -> Arc<Handle> {
        let h = self.0.insert(inode, fd, flags, nowait);
        // After the insert: a reaper that looked before it finds `kicked` set.
        if is_writer(&h) {
            self.arm();
        }
        h
    }

    /// Has the reaper tick, starting it if it has not started.
    fn arm(&self) {
        let mut r = lock(&self.0.reaper);
        r.kicked = true;
        if !r.armed {
            r.armed = true;
            self.0.wake.notify_one();
        }
        if !r.started {
            r.started = true;
            let t = self.0.clone();
            let spawned = std::thread::Builder::new()
                .name("vfsd-fd-reaper".into())
                .stack_size(256 << 10)
                .spawn(move || t.reap_while_armed());
            if let Err(e) = spawned {
                log::warn!(
                    "--no-open: no thread to close idle write fds ({e}): files the guest \
                     writes stay open on the host until it forgets them"
                );
            }
        }
    }
}

impl Drop for NodeHandles {
    fn drop(&mut self) {
        lock(&self.0.reaper).stop = true;
        self.0.wake.notify_all();
    }
}

impl std::ops::Deref for NodeHandles {
    type Target = Table;

    fn deref(&self) -> &Table {
        &self.0
    }
}

impl Table {
    fn shard(&self, nodeid: u64) -> &Shard {
        &self.shards[(nodeid as usize) % SHARDS]
    }

    /// The node's handle if one is open.
    pub fn get(&self, nodeid: u64) -> Option<Arc<Handle>> {
        read(self.shard(nodeid)).get(&nodeid).cloned()
    }

    /// Notes that a request takes `h`, a node's fd, for writing: the reaper leaves it
    /// open for another `WRITE_IDLE`.
    pub fn wrote(&self, h: &Handle) {
        h.write_tick
            .store(self.tick.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    fn insert(&self, inode: Arc<Inode>, fd: OwnedFd, flags: i32, nowait: bool) -> Arc<Handle> {
        let nodeid = inode.nodeid;
        let h = Arc::new(Handle {
            inode,
            fd,
            flags,
            dir: None,
            nowait_reads: AtomicBool::new(nowait),
            flock: AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: AtomicU64::new(self.tick.load(Ordering::Relaxed)),
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

    /// The reaper's thread: while armed, a tick every `tick_len`; disarmed once a tick
    /// finds no fd for writing and none came meanwhile.
    fn reap_while_armed(&self) {
        let mut r = lock(&self.reaper);
        loop {
            while !r.armed && !r.stop {
                r = self.wake.wait(r).unwrap_or_else(|e| e.into_inner());
            }
            let until = Instant::now() + self.tick_len;
            loop {
                if r.stop {
                    return;
                }
                let now = Instant::now();
                if now >= until {
                    break;
                }
                r = self
                    .wake
                    .wait_timeout(r, until - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            r.kicked = false;
            drop(r);
            let writers_left = self.reap();
            r = lock(&self.reaper);
            if !writers_left && !r.kicked {
                r.armed = false;
            }
        }
    }

    /// One tick: closes the fds for writing no request took for writing in the last
    /// `TICKS` ticks. Whether any fd for writing is left.
    fn reap(&self) -> bool {
        let now = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let idle = |h: &Handle| now.saturating_sub(h.write_tick.load(Ordering::Relaxed)) > TICKS;
        let mut left = false;
        for s in &self.shards {
            let mut candidates = Vec::new();
            for (&n, h) in read(s).iter().filter(|(_, h)| is_writer(h)) {
                if idle(h) {
                    candidates.push((n, h.clone()));
                } else {
                    left = true;
                }
            }
            if candidates.is_empty() {
                continue;
            }
            // Looked at without the shard's lock, as in `victim`: the fd of a file unlinked on
            // the host may be all that keeps its data, so it stays, looked at again a whole
            // idle time later.
            let (gone, kept): (Vec<_>, Vec<_>) =
                candidates.into_iter().partition(|(_, h)| linked(h));
            for (_, h) in &kept {
                h.write_tick.store(now, Ordering::Relaxed);
                left = true;
            }
            // A request using an fd keeps it open until it ends (its `Arc`), so no request
            // sees its fd closed or its number reused. Closed after the lock is let go: a
            // close may flush on the host (NFS). A write-back error it meets is not marked
            // seen in the file's error sequence, so the guest's next fsync, through the fd
            // opened then, still reports it.
            let _closed: Vec<Arc<Handle>> = {
                let mut shard = write(s);
                gone.iter()
                    .filter_map(|(n, h)| {
                        // Unless a request took it for writing, or another fd replaced it,
                        // meanwhile.
                        let same = shard.get(n).is_some_and(|cur| Arc::ptr_eq(cur, h));
                        if same && idle(h) {
                            shard.remove(n)
                        } else {
                            left = true;
                            None
                        }
                    })
                    .collect()
            };
        }
        left
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

fn lock(m: &Mutex<Reaper>) -> std::sync::MutexGuard<'_, Reaper> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_writer(h: &Handle) -> bool {
    h.flags & libc::O_ACCMODE != libc::O_RDONLY
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passthrough::inode::{FileHandleMode, InodeTable};
    use crate::sys;
    use std::ffi::CString;

    const IDLE: Duration = Duration::from_millis(40);

    /// A node of a new file `name` in `dir`, and an fd of it open with `flags`.
    fn file(
        t: &InodeTable,
        dir: &std::path::Path,
        name: &str,
        flags: i32,
    ) -> (Arc<Inode>, OwnedFd) {
        let p = CString::new(dir.join(name).as_os_str().as_encoded_bytes()).unwrap();
        std::fs::write(dir.join(name), b"x").unwrap();
        let path = sys::openat(libc::AT_FDCWD, &p, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = sys::statx(path.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH).unwrap();
        let fd = sys::openat(libc::AT_FDCWD, &p, flags | libc::O_NOFOLLOW, 0).unwrap();
        (t.lookup_insert(path, &st, None).unwrap(), fd)
    }

    /// Waits up to a second for `cond`; whether it came.
    fn within_a_second(cond: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        cond()
    }

    #[test]
    fn a_writers_fd_closes_once_idle_and_a_readers_stays() {
        let dir = tempfile::tempdir().unwrap();
        let inodes = InodeTable::with_file_handles(FileHandleMode::Never, 64);
        let nh = NodeHandles::new(64, IDLE);
        let (r, rfd) = file(&inodes, dir.path(), "r", libc::O_RDONLY);
        let (w, wfd) = file(&inodes, dir.path(), "w", libc::O_RDWR);
        let (rn, wn) = (r.nodeid, w.nodeid);
        nh.put(r, rfd, libc::O_RDONLY, false);
        assert!(!lock(&nh.reaper).started, "a reaper for readers only");
        let put = Instant::now();
        nh.put(w, wfd, libc::O_RDWR, false);
        assert!(within_a_second(|| nh.get(wn).is_none()), "writer's fd kept");
        let after = put.elapsed();
        assert!(after >= IDLE, "closed {after:?} after its last write");
        assert!(nh.get(rn).is_some(), "reader's fd closed");
        // With no fd for writing left the reaper stops ticking.
        assert!(within_a_second(|| !lock(&nh.reaper).armed));
        let tick = nh.tick.load(Ordering::Relaxed);
        std::thread::sleep(IDLE);
        assert_eq!(
            nh.tick.load(Ordering::Relaxed),
            tick,
            "ticking with no writer"
        );
    }

    #[test]
    fn writes_keep_a_writers_fd_and_a_request_using_it_keeps_it_open() {
        let dir = tempfile::tempdir().unwrap();
        let inodes = InodeTable::with_file_handles(FileHandleMode::Never, 64);
        let nh = NodeHandles::new(64, IDLE);
        let (w, wfd) = file(&inodes, dir.path(), "w", libc::O_RDWR);
        let wn = w.nodeid;
        let ino = sys::fstat(&wfd).unwrap().st_ino;
        let h = nh.put(w, wfd, libc::O_RDWR, false);
        let end = Instant::now() + 4 * IDLE;
        while Instant::now() < end {
            nh.wrote(&h);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            nh.get(wn).is_some_and(|cur| Arc::ptr_eq(&cur, &h)),
            "closed while written"
        );
        // A request that holds the fd while the reaper lets it go still has the same file.
        assert!(within_a_second(|| nh.get(wn).is_none()), "writer's fd kept");
        assert_eq!(sys::fstat(&h.fd).unwrap().st_ino, ino);
        // SAFETY: a write of a live buffer to an fd the handle owns.
        let n = unsafe { libc::pwrite(h.fd.as_raw_fd(), b"y".as_ptr().cast(), 1, 1) };
        assert_eq!(n, 1);
        drop(h);
        assert_eq!(std::fs::read(dir.path().join("w")).unwrap(), b"xy");
    }

    #[test]
    fn an_unlinked_files_fd_for_writing_stays() {
        let dir = tempfile::tempdir().unwrap();
        let inodes = InodeTable::with_file_handles(FileHandleMode::Never, 64);
        let nh = NodeHandles::new(64, IDLE);
        let (w, wfd) = file(&inodes, dir.path(), "w", libc::O_RDWR);
        let (l, lfd) = file(&inodes, dir.path(), "l", libc::O_WRONLY);
        let (wn, ln) = (w.nodeid, l.nodeid);
        nh.put(w, wfd, libc::O_RDWR, false);
        nh.put(l, lfd, libc::O_WRONLY, false);
        std::fs::remove_file(dir.path().join("w")).unwrap();
        assert!(
            within_a_second(|| nh.get(ln).is_none()),
            "linked file's fd kept"
        );
        std::thread::sleep(3 * IDLE);
        assert!(
            nh.get(wn).is_some(),
            "the only fd of an unlinked file closed"
        );
    }
}
