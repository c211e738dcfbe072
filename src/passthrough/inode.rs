//! The inode table: FUSE node ids mapped to host files.
//!
//! A host file is identified by (st_dev, st_ino, mount id); looking the same file up twice
//! returns the same node id with its lookup count raised. FORGET lowers the count and, at
//! zero, drops the entry.
//!
//! How a node finds its file (`Inode::path_fd`), cheapest first:
//! - the O_PATH fd it holds, while it holds one;
//! - its kernel file handle, where the host can reopen handles (`--inode-file-handles`
//!   prefer or mandatory, with CAP_DAC_READ_SEARCH, on a file system whose handles outlive
//!   an evicted inode);
//! - its parent and name, as last seen: the name is opened relative to the nearest
//!   ancestor that holds an fd (walking down, never recursing), with O_NOFOLLOW, and must
//!   be the same file: (st_dev, st_ino, mount), its birth time where the file system keeps
//!   one, and its file handle where it gives one (the handle carries the inode
//!   generation). Another file there, or none, is ESTALE, never the other file.
//!
//! The O_PATH fds nodes hold are bounded (`FdCache`, at most half the fd limit and 65,536):
//! past the bound, the fd of a node not used lately is closed (CLOCK: each use marks a
//! node, the sweep gives a marked node a second chance). Some nodes keep theirs (are
//! pinned), at most half the bound of them: the root; nodes no name finds (an O_TMPFILE,
//! a `..` of a forgotten directory); nodes whose name was unlinked or renamed over
//! through vfsd; and nodes whose file can't be told from a later one with its inode
//! number (neither a file handle nor a birth time). A guest walking a tree of millions of
//! files therefore holds at most the bound in fds; the memory of a known node stays until
//! it is forgotten (a node holds its parent, so a forgotten directory stays in memory
//! while nodes below it are known).
//!
//! Limits: a host-side rename of a file (or of a directory above it) after its node gave
//! up its fd makes the node ESTALE until the guest looks the new name up; a rename through
//! vfsd moves the node's name with it. A hard-linked file is found by the last name the
//! guest looked it up by. Where virtiofsd's `never` keeps an fd per node for ever (and so
//! follows host renames, up to the fd limit), vfsd's nodes past the bound go by name.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use rustc_hash::FxHashMap;

use super::lock::{FileId, FileLock, LockTable};
use crate::recovery::record::{NodeEntry, NodeSlot, Record};
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

/// An O_PATH fd of a node's file, shared with the node while it holds it.
pub struct PathFd(Arc<OwnedFd>);

impl AsRawFd for PathFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Whether nodes use file handles instead of fds (virtiofsd's `--inode-file-handles`,
/// spelled by `cli::InodeFileHandles`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileHandleMode {
    /// Find files again by parent and name only.
    Never,
    /// Use file handles where the host can reopen them, else parent and name.
    Prefer,
    /// Use file handles; a lookup on a filesystem without them fails.
    Mandatory,
}

/// A node's file handle, and the fd of its mount it reopens relative to (None where the
/// host can't reopen handles: the handle then only checks identity).
struct Handle {
    handle: sys::FileHandle,
    mount_fd: Option<Arc<OwnedFd>>,
}

/// Where a node was last seen: its parent and its name there. The parent is held: a
/// directory the guest forgot still finds its children's files.
struct Name {
    parent: Arc<Inode>,
    name: CString,
}

pub struct Inode {
    pub nodeid: u64,
    pub key: InodeKey,
    /// `S_IFMT` bits; a host file never changes type.
    pub file_type: u32,
    /// Guest lookup count (FUSE "nlookup"), kept in the crash record where there is one.
    lookups: Lookups,
    /// Serialises size-changing I/O against in-EOF I/O on this host file; shared with
    /// every other node of the same file (see `lock`).
    pub io: Arc<FileLock>,
    handle: Option<Handle>,
    /// Birth time at lookup, where the file system keeps one: with the handle, what tells
    /// this file from a later one that got its inode number.
    btime: Option<(i64, u32)>,
    name: Mutex<Option<Name>>,
    /// The O_PATH fd while the node holds one (counted in `cache`).
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Used since the last sweep (CLOCK's mark).
    used: AtomicBool,
    /// Keeps its fd: nothing else would find its file again.
    pinned: AtomicBool,
    cache: Arc<FdCache>,
}

/// A node's lookup count: its own, or its slot's in the crash record (`recovery`), which
/// outlives the process.
enum Lookups {
    Local(AtomicU64),
    Recorded(NodeSlot),
}

impl std::ops::Deref for Lookups {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        match self {
            Lookups::Local(a) => a,
            Lookups::Recorded(s) => s.lookups(),
        }
    }
}

/// One node as the migration state carries it (`InodeTable::export`).
pub struct NodeRecord {
    pub inode: Arc<Inode>,
    /// Guest lookups; 0 for a forgotten directory a known node's name goes through.
    pub lookups: u64,
    /// Where it was last seen: its parent's node id and its name there.
    pub name: Option<(u64, CString)>,
    pub handle: Option<sys::FileHandle>,
    pub file_type: u32,
}

/// What `Inode::pin` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pin {
    /// This call pinned the node.
    Took,
    /// It was pinned already (by this request earlier, or another).
    Already,
    /// The bound on pinned nodes is reached: it stays sweepable.
    Full,
}

/// Ancestors followed at most to find a node's file again (a loop of stale names can't
/// recurse forever).
const MAX_DEPTH: usize = 4096;

impl Inode {
    /// An O_PATH fd of this node's file, for `*at()` calls relative to it.
    pub fn path_fd(self: &Arc<Self>) -> io::Result<PathFd> {
        if let Some(fd) = self.held() {
            return Ok(fd);
        }
        match self.find_again() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of fds: give up more of the cached ones and try once more.
                self.cache.shrink();
                self.find_again()
            }
            r => r,
        }
    }

    /// The fd the node holds, if it holds one; never opens one.
    pub(crate) fn held_fd(&self) -> Option<PathFd> {
        self.held()
    }

    /// The fd the node holds, if it holds one (marking it used).
    fn held(&self) -> Option<PathFd> {
        let fd = self.fd.lock().unwrap().as_ref()?.clone();
        self.used.store(true, Ordering::Relaxed);
        Some(PathFd(fd))
    }

    /// Keeps `fd` as the node's (unless another request got one first) and counts it.
    fn keep(self: &Arc<Self>, fd: OwnedFd) -> PathFd {
        let mut held = self.fd.lock().unwrap();
        if let Some(other) = held.as_ref() {
            return PathFd(other.clone());
        }
        let fd = Arc::new(fd);
        *held = Some(fd.clone());
        self.record_fd(fd.as_raw_fd());
        drop(held);
        self.used.store(true, Ordering::Relaxed);
        self.cache.admitted(self);
        PathFd(fd)
    }

    /// Opens the file again: by handle, or by name from the nearest ancestor that holds an
    /// fd or has a handle, each level checked to be its own file. Iterative, so a deep tree
    /// costs no stack; a loop of stale names (host renames) is ESTALE.
    fn find_again(self: &Arc<Self>) -> io::Result<PathFd> {
        let mut below: Vec<(Arc<Inode>, CString)> = Vec::new();
        let mut cur = self.clone();
        let mut base = loop {
            if let Some(fd) = cur.held() {
                break fd;
            }
            if let Some(Handle {
                handle,
                mount_fd: Some(m),
            }) = &cur.handle
            {
                let fd =
                    sys::open_by_handle(m.as_raw_fd(), handle, libc::O_PATH | libc::O_NOFOLLOW)?;
                break cur.keep(fd);
            }
            let (parent, name) = {
                let n = cur.name.lock().unwrap();
                let n = n.as_ref().ok_or_else(|| sys::errno(libc::ESTALE))?;
                (n.parent.clone(), n.name.clone())
            };
            let looped =
                Arc::ptr_eq(&parent, self) || below.iter().any(|(n, _)| Arc::ptr_eq(n, &parent));
            if looped || below.len() >= MAX_DEPTH {
                return Err(sys::errno(libc::ESTALE));
            }
            below.push((cur, name));
            cur = parent;
        };
        while let Some((node, name)) = below.pop() {
            let fd = node.open_at(&base, &name)?;
            base = node.keep(fd);
        }
        Ok(base)
    }

    /// Whether the file `st` describes (with file handle `handle`, where the host gives
    /// durable ones) is this node's: its inode number, its birth time and its handle. A
    /// node that holds its fd holds its inode, so the number can't have gone to another
    /// file; one that gave its fd up and has neither a birth time nor a handle can't be
    /// told from a later file with its number, and is taken for another.
    fn is_file(&self, st: &sys::StatX, handle: Option<&sys::FileHandle>) -> bool {
        if InodeKey::of(st) != self.key {
            return false;
        }
        if self.fd.lock().unwrap().is_some() {
            return true;
        }
        let btime_differs = self.btime.is_some() && st.btime != self.btime;
        let handle_differs = match (&self.handle, handle) {
            (Some(old), Some(new)) => old.handle != *new,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.identifiable() && !btime_differs && !handle_differs
    }

    /// `name` in the directory `dir`, if it is this node's file. A node that can't be
    /// told from a later file with its inode number (`identifiable`) gave up its fd only
    /// past the bound on pinned nodes: ESTALE then, and the guest's next lookup of the
    /// name gets a node of its own, rather than another file's data by inode number.
    fn open_at(&self, dir: &PathFd, name: &CStr) -> io::Result<OwnedFd> {
        if !self.identifiable() {
            return Err(sys::errno(libc::ESTALE));
        }
        let fd = match sys::openat(dir.as_raw_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(sys::errno(libc::ESTALE))
            }
            r => r?,
        };
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )?;
        if InodeKey::of(&st) != self.key || (self.btime.is_some() && st.btime != self.btime) {
            return Err(sys::errno(libc::ESTALE));
        }
        if let Some(h) = &self.handle {
            // The same inode number can be another file (deleted, then reused): the
            // handle's generation tells them apart.
            match sys::name_to_handle(fd.as_raw_fd()) {
                Ok((now, _)) if now == h.handle => {}
                _ => return Err(sys::errno(libc::ESTALE)),
            }
        }
        Ok(fd)
    }

    /// Opens the file for I/O directly from its handle (None: no reopenable handle).
    pub fn open_by_handle(&self, flags: i32) -> Option<io::Result<OwnedFd>> {
        match &self.handle {
            Some(Handle {
                handle,
                mount_fd: Some(m),
            }) => Some(sys::open_by_handle(m.as_raw_fd(), handle, flags)),
            _ => None,
        }
    }

    /// Whether the node finds its file by a reopenable file handle.
    pub fn has_file_handle(&self) -> bool {
        matches!(
            self.handle,
            Some(Handle {
                mount_fd: Some(_),
                ..
            })
        )
    }

    /// Records where the guest last saw this file: `name` in `parent`.
    pub fn seen_at(&self, parent: &Arc<Inode>, name: &CStr) {
        if self.nodeid == fuse_backend_rs::api::filesystem::ROOT_ID {
            // The share's root (seen again through a bind mount inside it) keeps its fd.
            return;
        }
        let mut n = self.name.lock().unwrap();
        *n = Some(Name {
            parent: parent.clone(),
            name: name.to_owned(),
        });
        self.record_name(&n);
        drop(n);
        // A name finds it again now (an O_TMPFILE just linked, say), if its identity can
        // be checked.
        if self.identifiable() {
            self.unpin();
        }
    }

    /// Whether a file found by name can be told to be this one: by its handle, or its
    /// birth time. Otherwise (no handles, no birth time) a reused inode number could pass
    /// for it, so the node keeps its fd.
    fn identifiable(&self) -> bool {
        self.handle.is_some() || self.btime.is_some()
    }

    /// Before the name it was found by goes (an unlink, a rename over it, through vfsd):
    /// the node takes its fd and keeps it, since nothing else might find its file.
    /// (A handle may not reopen an unlinked file either: some file systems answer ESTALE.)
    /// Pinned first, so no sweep takes the fd `path_fd` gives between the two.
    /// A pin this call took is given back if the file can't be found: one another request
    /// took stays.
    pub fn hold_for_name_change(self: &Arc<Self>) {
        let took = self.pin() == Pin::Took;
        if self.path_fd().is_err() && took {
            self.unpin();
        }
    }

    /// The name change went through: the old name no longer finds the file.
    pub fn name_gone(&self) {
        let mut n = self.name.lock().unwrap();
        *n = None;
        self.record_name(&n);
    }

    /// The name change failed: the name still finds it.
    pub fn name_kept(&self) {
        if (self.has_file_handle() || self.identifiable()) && self.name.lock().unwrap().is_some() {
            self.unpin();
        }
    }

    /// The directory it was last seen in.
    pub fn parent(&self) -> Option<Arc<Inode>> {
        self.name.lock().unwrap().as_ref().map(|n| n.parent.clone())
    }

    /// Whether `name` in `parent` is where this node was last seen.
    pub fn is_at(&self, parent: &Arc<Inode>, name: &CStr) -> bool {
        self.name
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|n| n.name.as_c_str() == name && Arc::ptr_eq(&n.parent, parent))
    }

    /// Keeps the node's fd from the sweep, within the cache's bound on pinned nodes
    /// (past it the node stays sweepable: a guest can't pin unbounded fds).
    /// The place in the bound is taken before the node's flag is set, and each set flag
    /// holds exactly one place: a flag set only for a moment would let a concurrent
    /// `unpin` give a place back twice, or a concurrent `pin` see a pin that failed.
    fn pin(&self) -> Pin {
        if self.pinned.load(Ordering::Acquire) {
            return Pin::Already;
        }
        let max = self.cache.max_pinned();
        let place = self
            .cache
            .pinned
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if place.is_err() {
            return Pin::Full;
        }
        if self.pinned.swap(true, Ordering::AcqRel) {
            // Pinned by another request meanwhile, with a place of its own.
            self.cache.pinned.fetch_sub(1, Ordering::AcqRel);
            return Pin::Already;
        }
        Pin::Took
    }

    fn unpin(&self) {
        if self.pinned.swap(false, Ordering::AcqRel) {
            self.cache.pinned.fetch_sub(1, Ordering::AcqRel);
        }
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

    /// The node's last name into its crash-record slot, under the name's lock.
    fn record_name(&self, name: &Option<Name>) {
        if let Lookups::Recorded(slot) = &self.lookups {
            slot.set_name(name.as_ref().map(|n| (n.parent.nodeid, n.name.as_bytes())));
        }
    }

    /// The node's O_PATH fd number into its crash-record slot (-1: none).
    fn record_fd(&self, fd: RawFd) {
        if let Lookups::Recorded(slot) = &self.lookups {
            slot.set_fd(fd);
        }
    }

    /// Closes the node's O_PATH fd unless it is pinned or in use (for `FdCache`).
    fn give_up_fd(&self) -> bool {
        let Ok(mut fd) = self.fd.try_lock() else {
            return false;
        };
        if self.pinned.load(Ordering::Acquire) {
            return false;
        }
        if fd.is_some() {
            // Out of the record before it can close.
            self.record_fd(-1);
            *fd = None;
            self.cache.held.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        false
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if self.fd.get_mut().unwrap().is_some() {
            self.cache.held.fetch_sub(1, Ordering::Relaxed);
        }
        if *self.pinned.get_mut() {
            self.cache.pinned.fetch_sub(1, Ordering::Relaxed);
        }
        // A long chain of parents only this node held goes one by one, not recursively.
        let mut parent = self
            .name
            .get_mut()
            .map(|n| n.take().map(|n| n.parent))
            .unwrap_or(None);
        while let Some(p) = parent {
            parent = match Arc::try_unwrap(p) {
                Ok(mut inode) => inode
                    .name
                    .get_mut()
                    .map(|n| n.take().map(|n| n.parent))
                    .unwrap_or(None),
                Err(_) => None,
            };
        }
    }
}

/// The bound on the O_PATH fds nodes hold, and the nodes holding them in the order they
/// got them.
pub struct FdCache {
    limit: usize,
    held: AtomicUsize,
    /// Nodes that keep their fds whatever the sweep says (at most half the limit).
    pinned: AtomicUsize,
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

    fn max_pinned(&self) -> usize {
        self.limit / 2
    }

    /// `inode` has just taken an fd: count it, and give up others' past the bound.
    fn admitted(&self, inode: &Arc<Inode>) {
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

struct Maps {
    /// Keyed by node ids vfsd hands out from a counter, with a fast unseeded hash: a guest
    /// sees the ids but can't pick them, and gathering colliding ones (forgetting the
    /// rest) costs it far more requests than it could slow its own lookups by. Host keys
    /// (`by_key`) keep the seeded hasher.
    by_id: FxHashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
    next_id: u64,
    /// One fd per mount that file handles are opened relative to.
    mount_fds: HashMap<u64, Arc<OwnedFd>>,
    /// Per mount: do its file handles still open after the host evicts the inode?
    durable_handles: HashMap<u64, bool>,
}

/// All inodes the guest currently knows. Reads (the I/O path) take the lock shared;
/// only lookups of new files and forgets take it exclusively.
pub struct InodeTable {
    maps: RwLock<Maps>,
    handles: FileHandleMode,
    /// Whether this process can reopen file handles at all (CAP_DAC_READ_SEARCH).
    can_open_handles: AtomicBool,
    locks: LockTable,
    cache: Arc<FdCache>,
    /// Write-concurrency figures of inodes already forgotten, so statistics outlive them.
    retired_peak: std::sync::atomic::AtomicU32,
    retired_violations: AtomicU64,
    /// Where nodes are recorded for the next serving process, should this one die.
    record: Option<Arc<Record>>,
    /// Nodes the record had no room for (lost to a crash).
    unrecorded: AtomicU64,
}

impl InodeTable {
    pub fn new() -> Self {
        Self::with_file_handles(FileHandleMode::Never, FdCache::limit_for(1024))
    }

    pub fn with_file_handles(handles: FileHandleMode, fd_limit: usize) -> Self {
        InodeTable {
            handles,
            can_open_handles: AtomicBool::new(true),
            locks: LockTable::new(),
            cache: Arc::new(FdCache::new(fd_limit)),
            maps: RwLock::new(Maps {
                by_id: FxHashMap::default(),
                by_key: HashMap::new(),
                next_id: fuse_backend_rs::api::filesystem::ROOT_ID + 1,
                mount_fds: HashMap::new(),
                durable_handles: HashMap::new(),
            }),
            retired_peak: Default::default(),
            retired_violations: Default::default(),
            record: None,
            unrecorded: AtomicU64::new(0),
        }
    }

    /// Records nodes from now on in `record` (`recovery`).
    pub fn set_record(&mut self, record: Arc<Record>) {
        self.record = Some(record);
    }

    pub fn fd_cache(&self) -> &FdCache {
        &self.cache
    }

    /// A directory fd usable as open_by_handle_at's mount fd.
    fn anchor(dir: &OwnedFd) -> io::Result<OwnedFd> {
        sys::openat(dir.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
    }

    /// Whether file handles on mount `mnt` (the one `fd` is on) can be reopened after the
    /// host kernel evicts their inode (see `sys::handles_outlive_eviction`). Decided once
    /// per mount; a failed check (a FUSE server can fail statfs for a while) counts as
    /// "no" and is asked again next time.
    fn durable_handles(&self, mnt: u64, fd: &OwnedFd) -> bool {
        if let Some(&d) = self.maps.read().unwrap().durable_handles.get(&mnt) {
            return d;
        }
        let Ok(durable) = sys::handles_outlive_eviction(fd.as_raw_fd()) else {
            return false;
        };
        if !durable && self.handles != FileHandleMode::Never {
            let then = match self.handles {
                FileHandleMode::Mandatory => "lookups on it fail with EOPNOTSUPP under mandatory",
                _ => "nodes on it are found again by name",
            };
            log::warn!(
                "mount {mnt} (FUSE or FAT) can't reopen file handles of evicted inodes: {then}"
            );
        }
        self.maps
            .write()
            .unwrap()
            .durable_handles
            .insert(mnt, durable);
        durable
    }

    /// `fd`'s file handle, and whether nodes may reopen it (`--inode-file-handles` and
    /// the host allow it). Without a reopenable handle, a handle still checks identity.
    fn handle_of(&self, fd: &OwnedFd) -> io::Result<Option<(sys::FileHandle, u64, bool)>> {
        let mode = self.handles;
        let can_open =
            mode != FileHandleMode::Never && self.can_open_handles.load(Ordering::Relaxed);
        match sys::name_to_handle(fd.as_raw_fd()) {
            Ok((h, mnt)) => {
                // A FUSE host's handle carries the client's node id, which changes once the
                // host evicts the inode: no use even to check identity there.
                let durable = self.durable_handles(mnt, fd);
                let reopen = can_open && durable;
                if mode == FileHandleMode::Mandatory && !reopen {
                    return Err(sys::errno(libc::EOPNOTSUPP));
                }
                Ok(durable.then_some((h, mnt, reopen)))
            }
            Err(e) if mode == FileHandleMode::Mandatory => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// Installs the share's root as node id 1. Its count never reaches zero, and it keeps
    /// its fd.
    pub fn insert_root(&self, fd: OwnedFd, st: &sys::StatX) -> io::Result<()> {
        let nodeid = fuse_backend_rs::api::filesystem::ROOT_ID;
        let key = InodeKey::of(st);
        let fail = |why: String| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("--inode-file-handles=mandatory: {why}; use prefer or never"),
            )
        };
        if self.handles != FileHandleMode::Never {
            // Can this process reopen handles at all? Without CAP_DAC_READ_SEARCH
            // (rootless, --uid-map) it can't: prefer then finds files by name.
            let probe = Self::anchor(&fd).and_then(|anchor| {
                let (h, _) = sys::name_to_handle(fd.as_raw_fd())?;
                sys::open_by_handle(anchor.as_raw_fd(), &h, libc::O_PATH)?;
                Ok(anchor)
            });
            match probe {
                Ok(anchor) => {
                    self.maps
                        .write()
                        .unwrap()
                        .mount_fds
                        .insert(st.mnt_id, Arc::new(anchor));
                }
                Err(e) if self.handles == FileHandleMode::Mandatory => {
                    return Err(fail(match e.raw_os_error() {
                        Some(libc::EPERM) => "open_by_handle_at needs CAP_DAC_READ_SEARCH".into(),
                        _ => format!("its file system gives no file handles ({e})"),
                    }));
                }
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    log::info!(
                        "--inode-file-handles=prefer: file handles can't be reopened without CAP_DAC_READ_SEARCH; nodes are found again by name"
                    );
                    self.can_open_handles.store(false, Ordering::Relaxed);
                }
                // No handles on the root's file system: nodes there go by name, those on
                // submounts with handles still use them.
                Err(e) => log::info!(
                    "--inode-file-handles=prefer: the share's root has no file handles ({e})"
                ),
            }
            if self.handles == FileHandleMode::Mandatory
                && !matches!(sys::handles_outlive_eviction(fd.as_raw_fd()), Ok(true))
            {
                return Err(fail(
                    "it is on a FUSE (or FAT) file system, whose file handles go stale once the host evicts an inode"
                        .into(),
                ));
            }
        }
        let handle = self.handle_of(&fd).ok().flatten().map(|(h, _, _)| h);
        let io = self.locks.get(file_id(st, handle));
        let inode = Arc::new(Inode {
            nodeid,
            key,
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups: Lookups::Local(AtomicU64::new(u64::MAX / 2)),
            io,
            handle: None,
            btime: st.btime,
            name: Mutex::new(None),
            fd: Mutex::new(Some(Arc::new(fd))),
            used: AtomicBool::new(false),
            pinned: AtomicBool::new(true),
            cache: self.cache.clone(),
        });
        self.cache.held.fetch_add(1, Ordering::Relaxed);
        self.cache.pinned.fetch_add(1, Ordering::Relaxed);
        let mut m = self.maps.write().unwrap();
        m.by_id.insert(nodeid, inode);
        m.by_key.insert(key, nodeid);
        Ok(())
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

    /// Registers one guest lookup of the file `st` describes (found as `name` in
    /// `parent`) if it is a known node that holds its fd, the common case; None if not.
    /// The fd keeps its inode, so the number can't have gone to another file (a birth
    /// time that differs would say so), and no file handle is needed to tell: a name
    /// found by a statx alone, with nothing opened, is that node.
    pub fn lookup_known(
        &self,
        st: &sys::StatX,
        name: Option<(&Arc<Inode>, &CStr)>,
    ) -> Option<Arc<Inode>> {
        let key = InodeKey::of(st);
        let m = self.maps.read().unwrap();
        let inode = m.by_key.get(&key).and_then(|id| m.by_id.get(id))?;
        let holds = inode.fd.lock().unwrap().is_some();
        if !holds || (inode.btime.is_some() && inode.btime != st.btime) {
            return None;
        }
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        let inode = inode.clone();
        drop(m);
        found_as(&inode, name);
        Some(inode)
    }
    /// Registers one guest lookup of the file `fd` names, found as `name` in `parent`
    /// (None: a file with no name, O_TMPFILE). If the file is already known the new fd is
    /// dropped, the existing node's count goes up, and its name becomes this one.
    pub fn lookup_insert(
        &self,
        fd: OwnedFd,
        st: &sys::StatX,
        name: Option<(&Arc<Inode>, &CStr)>,
    ) -> io::Result<Arc<Inode>> {
        let key = InodeKey::of(st);
        let seen = |inode: &Arc<Inode>| found_as(inode, name);
        if let Some(inode) = self.lookup_known(st, name) {
            return Ok(inode);
        }
        let handle = self.handle_of(&fd)?;
        // A known node of this file, if any. A node whose fd is gone may name a file since
        // deleted whose inode number was reused: another file gets a node of its own, and
        // the old one answers ESTALE (`Inode::open_at`).
        let known = |m: &Maps| {
            let inode = m.by_id.get(m.by_key.get(&key)?)?;
            inode
                .is_file(st, handle.as_ref().map(|(h, _, _)| h))
                .then(|| inode.clone())
        };
        if let Some(inode) = known(&self.maps.read().unwrap()) {
            // A count raised under the read lock can't race a removal: forget takes the
            // write lock.
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            seen(&inode);
            return Ok(inode);
        }
        let io = self
            .locks
            .get(file_id(st, handle.as_ref().map(|(h, _, _)| h.clone())));
        let mut m = self.maps.write().unwrap();
        if let Some(inode) = known(&m) {
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            drop(m);
            seen(&inode);
            return Ok(inode);
        }
        let nodeid = m.next_id;
        m.next_id += 1;
        let inode = self.new_node(&mut m, nodeid, 1, fd, st, handle, io, name)?;
        m.by_id.insert(nodeid, inode.clone());
        m.by_key.insert(key, nodeid);
        drop(m);
        self.cache.admitted(&inode);
        Ok(inode)
    }

    /// A node for the file `fd` names, not yet in the maps.
    #[allow(clippy::too_many_arguments)]
    fn new_node(
        &self,
        m: &mut Maps,
        nodeid: u64,
        lookups: u64,
        fd: OwnedFd,
        st: &sys::StatX,
        handle: Option<(sys::FileHandle, u64, bool)>,
        io: Arc<FileLock>,
        name: Option<(&Arc<Inode>, &CStr)>,
    ) -> io::Result<Arc<Inode>> {
        let is_dir = st.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let handle = match handle {
            Some((handle, mnt, true)) => {
                let mount_fd = match m.mount_fds.get(&mnt) {
                    Some(a) => Some(a.clone()),
                    // open_by_handle_at wants a real (not O_PATH) fd on the mount: the
                    // first directory seen on it becomes that anchor.
                    None if is_dir => {
                        let a = Arc::new(Self::anchor(&fd)?);
                        m.mount_fds.insert(mnt, a.clone());
                        Some(a)
                    }
                    None => None,
                };
                Some(Handle { handle, mount_fd })
            }
            Some((handle, _, false)) => Some(Handle {
                handle,
                mount_fd: None,
            }),
            None => None,
        };
        let cache = &self.cache;
        let slot = self.record.as_ref().and_then(|r| {
            let h = handle.as_ref().map(|h| h.handle.as_bytes());
            let slot = r.new_node(&NodeEntry {
                id: nodeid,
                lookups,
                file_type: st.st.st_mode & libc::S_IFMT,
                ino: st.st.st_ino,
                dev: st.st.st_dev,
                fd: fd.as_raw_fd(),
                handle: h,
                name: name.map(|(p, n)| (p.nodeid, n.to_bytes())),
            });
            if slot.is_none() {
                self.unrecorded.fetch_add(1, Ordering::Relaxed);
            }
            slot
        });
        let lookups = match slot {
            Some(s) => Lookups::Recorded(s),
            None => Lookups::Local(AtomicU64::new(lookups)),
        };
        let inode = Arc::new(Inode {
            nodeid,
            key: InodeKey::of(st),
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups,
            io,
            handle,
            btime: st.btime,
            name: Mutex::new(name.map(|(p, n)| Name {
                parent: p.clone(),
                name: n.to_owned(),
            })),
            fd: Mutex::new(Some(Arc::new(fd))),
            used: AtomicBool::new(true),
            pinned: AtomicBool::new(false),
            cache: cache.clone(),
        });
        // Nothing else finds it again (no name, or no way to tell a reused inode number
        // from it): it keeps its fd, within the bound on such nodes.
        let findable = inode.has_file_handle() || (name.is_some() && inode.identifiable());
        if !findable {
            inode.pin();
        }
        Ok(inode)
    }

    /// Every node the guest knows but the root, and the forgotten directories their names
    /// go through (lookups 0), parents before children; and the next node id. For the
    /// migration state (`passthrough::migration`).
    pub fn export(&self) -> (Vec<NodeRecord>, u64) {
        let m = self.maps.read().unwrap();
        let root = fuse_backend_rs::api::filesystem::ROOT_ID;
        let mut seen: std::collections::HashSet<u64> = [root].into();
        let mut out = Vec::with_capacity(m.by_id.len());
        for inode in m.by_id.values() {
            let mut chain = Vec::new();
            let mut cur = inode.clone();
            // Up to the first ancestor already out, however deep: `seen` ends the walk
            // on a loop of names, and one marked seen is always sent.
            while seen.insert(cur.nodeid) {
                let parent = cur.name.lock().unwrap().as_ref().map(|n| n.parent.clone());
                chain.push(cur);
                match parent {
                    Some(p) => cur = p,
                    None => break,
                }
            }
            for n in chain.into_iter().rev() {
                let known = m.by_id.get(&n.nodeid).is_some_and(|k| Arc::ptr_eq(k, &n));
                let name = n
                    .name
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|x| (x.parent.nodeid, x.name.clone()));
                out.push(NodeRecord {
                    lookups: if known { n.lookups() } else { 0 },
                    name,
                    handle: n.handle.as_ref().map(|h| h.handle.clone()),
                    file_type: n.file_type,
                    inode: n,
                });
            }
        }
        (out, m.next_id)
    }

    /// Installs a node the migration state names, with its source's node id and lookup
    /// count, for the file `fd` (found by its name in `name`'s parent, or by handle). A
    /// node with no lookups is only a parent that names go through: not in the maps.
    pub fn restore(
        &self,
        nodeid: u64,
        lookups: u64,
        fd: OwnedFd,
        st: &sys::StatX,
        name: Option<(&Arc<Inode>, &CStr)>,
    ) -> io::Result<Arc<Inode>> {
        if nodeid == fuse_backend_rs::api::filesystem::ROOT_ID {
            return Err(sys::errno(libc::EINVAL));
        }
        let handle = self.handle_of(&fd)?;
        let io = self
            .locks
            .get(file_id(st, handle.as_ref().map(|(h, _, _)| h.clone())));
        let mut m = self.maps.write().unwrap();
        // One node per file: a second node of a known file (the root's above all, whose
        // `..` stays inside the share only as node 1) would change what the first is.
        let key = InodeKey::of(st);
        if m.by_id.contains_key(&nodeid) || m.by_key.contains_key(&key) {
            return Err(sys::errno(libc::EEXIST));
        }
        let inode = self.new_node(&mut m, nodeid, lookups, fd, st, handle, io, name)?;
        if lookups > 0 {
            m.by_id.insert(nodeid, inode.clone());
            m.by_key.insert(inode.key, nodeid);
        }
        m.next_id = m.next_id.max(nodeid + 1);
        drop(m);
        self.cache.admitted(&inode);
        Ok(inode)
    }

    /// Node ids from `next` on are new (the migration source's counter).
    pub fn continue_ids_from(&self, next: u64) {
        let mut m = self.maps.write().unwrap();
        m.next_id = m.next_id.max(next);
    }

    /// An fd on the share's file system that file handles open relative to
    /// (`--migration-mode file-handles`): the root's directory.
    pub fn root_anchor(&self) -> io::Result<OwnedFd> {
        let root = self.get(fuse_backend_rs::api::filesystem::ROOT_ID)?;
        let fd = root.path_fd()?;
        sys::openat(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
    }

    /// The known node of the file `st` describes, if any.
    pub fn by_key(&self, st: &sys::StatX) -> Option<Arc<Inode>> {
        let m = self.maps.read().unwrap();
        m.by_id.get(m.by_key.get(&InodeKey::of(st))?).cloned()
    }

    /// Lowers a node's lookup count by `count`; at zero the node is removed (its fd closes
    /// when the last open handle referring to it is released).
    /// Gives whether the node is gone.
    pub fn forget(&self, nodeid: u64, count: u64) -> bool {
        let mut m = self.maps.write().unwrap();
        let Some(inode) = m.by_id.get(&nodeid) else {
            return false;
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
        new == 0
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

/// The identity `lock` keys a host file's I/O lock by.
fn file_id(st: &sys::StatX, handle: Option<sys::FileHandle>) -> FileId {
    FileId {
        dev: st.st.st_dev,
        ino: st.st.st_ino,
        handle,
    }
}

impl Default for InodeTable {
    fn default() -> Self {
        Self::new()
    }
}

/// A lookup found `inode` as `name` (parent and name), which becomes its name.
fn found_as(inode: &Arc<Inode>, name: Option<(&Arc<Inode>, &CStr)>) {
    if let Some((p, n)) = name {
        if !inode.is_at(p, n) {
            inode.seen_at(p, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of a new file in `dir`, with no name (so it would keep its fd).
    fn node(t: &InodeTable, dir: &std::path::Path, name: &str) -> Arc<Inode> {
        let p = dir.join(name);
        std::fs::write(&p, b"").unwrap();
        let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let fd = sys::openat(libc::AT_FDCWD, &c, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH).unwrap();
        t.lookup_insert(fd, &st, None).unwrap()
    }

    /// The count of pinned nodes stays the number of nodes pinned, whatever pins and
    /// unpins race: with it drifting below, pinned fds could pass the bound until EMFILE.
    #[test]
    fn racing_pins_and_unpins_keep_the_pinned_count_exact() {
        let dir = tempfile::tempdir().unwrap();
        // A bound of 2 fds: one pinned node at most.
        let t = InodeTable::with_file_handles(FileHandleMode::Never, 2);
        let kept = node(&t, dir.path(), "kept");
        assert!(kept.pinned.load(Ordering::Acquire));
        let a = node(&t, dir.path(), "a");
        assert!(
            !a.pinned.load(Ordering::Acquire),
            "past the bound on pinned nodes"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let unpinner = {
            let (a, stop, started) = (a.clone(), stop.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                while !stop.load(Ordering::Relaxed) {
                    a.unpin();
                }
            })
        };
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        for _ in 0..2_000_000 {
            assert_eq!(a.pin(), Pin::Full, "a pin past the bound succeeded");
        }
        stop.store(true, Ordering::Relaxed);
        unpinner.join().unwrap();
        a.unpin();
        assert_eq!(
            t.cache.pinned.load(Ordering::Acquire),
            1,
            "only `kept` is pinned"
        );
        // And with a place free, one of two racing pins takes it once.
        kept.unpin();
        let pins: Vec<_> = (0..2)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || a.pin())
            })
            .collect();
        let mut took = 0;
        for p in pins {
            match p.join().unwrap() {
                Pin::Took => took += 1,
                Pin::Already => {}
                Pin::Full => panic!("a pin with a place free failed"),
            }
        }
        assert_eq!(took, 1);
        assert_eq!(t.cache.pinned.load(Ordering::Acquire), 1);
        a.unpin();
        assert_eq!(t.cache.pinned.load(Ordering::Acquire), 0);
    }
}
