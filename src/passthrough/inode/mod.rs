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
//!
//! Here: a node (`Inode`) and how it finds its file again; `table`: the table of nodes
//! (`InodeTable`); `fd_cache`: the bound on the fds nodes hold (`FdCache`).

mod fd_cache;
mod table;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::lock::FileLock;
use crate::recovery::record::NodeSlot;
use crate::sys;

pub use fd_cache::FdCache;
pub use table::{InodeTable, NodeRecord};

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
