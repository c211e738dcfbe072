//! The inode table (`InodeTable`): FUSE node ids and host file keys mapped to nodes,
//! lookups and forgets, and the nodes a migration or a crash record carries.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::FxHashMap;

use super::{FdCache, FileHandleMode, Handle, Inode, InodeKey, Lookups, Name};
use crate::passthrough::lock::{FileId, FileLock, LockTable};
use crate::recovery::record::{NodeEntry, Record};
use crate::sys;

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
    use super::super::Pin;
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
