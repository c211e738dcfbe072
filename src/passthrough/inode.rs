//! The inode table: FUSE node ids mapped to host files.
//!
//! A host file is identified by (st_dev, st_ino, mount id); looking the same file up twice
//! returns the same node id with its lookup count raised. FORGET lowers the count and, at
//! zero, drops the entry and closes its fd.
//!
//! Each node names its file either by an O_PATH fd or, with `--inode-file-handles`, by a
//! kernel file handle (no fd held: a guest walking a huge tree can't exhaust the host's
//! fds). `Inode::path_fd` gives an O_PATH fd either way.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::lock::{FileId, FileLock, LockTable};
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

/// How a node names its host file.
pub enum InodeFile {
    /// O_PATH | O_NOFOLLOW fd: names this file without opening it for I/O.
    Fd(OwnedFd),
    /// A file handle, opened on demand relative to a file of its mount.
    Handle {
        handle: sys::FileHandle,
        mount_fd: Arc<OwnedFd>,
    },
}

/// An O_PATH fd of a node's file: the node's own, or one opened from its handle.
pub enum PathFd<'a> {
    Borrowed(&'a OwnedFd),
    Owned(OwnedFd),
}

impl AsRawFd for PathFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            PathFd::Borrowed(f) => f.as_raw_fd(),
            PathFd::Owned(f) => f.as_raw_fd(),
        }
    }
}

/// Whether nodes use file handles instead of fds (virtiofsd's `--inode-file-handles`,
/// spelled by `cli::InodeFileHandles`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileHandleMode {
    /// Always hold an O_PATH fd.
    Never,
    /// Use a file handle where the filesystem supports them, else an fd.
    Prefer,
    /// Use file handles; a lookup on a filesystem without them fails.
    Mandatory,
}

pub struct Inode {
    pub nodeid: u64,
    pub file: InodeFile,
    pub key: InodeKey,
    /// `S_IFMT` bits; a host file never changes type under a live fd.
    pub file_type: u32,
    /// Guest lookup count (FUSE "nlookup").
    lookups: AtomicU64,
    /// Serialises size-changing I/O against in-EOF I/O on this host file; shared with
    /// every other node of the same file (see `lock`).
    pub io: Arc<FileLock>,
}

impl Inode {
    /// An O_PATH fd of this node's file, for `*at()` calls relative to it.
    pub fn path_fd(&self) -> io::Result<PathFd<'_>> {
        match &self.file {
            InodeFile::Fd(fd) => Ok(PathFd::Borrowed(fd)),
            InodeFile::Handle { handle, mount_fd } => Ok(PathFd::Owned(sys::open_by_handle(
                mount_fd.as_raw_fd(),
                handle,
                libc::O_PATH | libc::O_NOFOLLOW,
            )?)),
        }
    }

    /// Opens the file for I/O directly from its handle (None: the node holds an fd).
    pub fn open_by_handle(&self, flags: i32) -> Option<io::Result<OwnedFd>> {
        match &self.file {
            InodeFile::Fd(_) => None,
            InodeFile::Handle { handle, mount_fd } => {
                Some(sys::open_by_handle(mount_fd.as_raw_fd(), handle, flags))
            }
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
}

struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
    next_id: u64,
    /// One O_PATH fd per mount that file handles are opened relative to.
    mount_fds: HashMap<u64, Arc<OwnedFd>>,
    /// Per mount: do its file handles still open after the host evicts the inode?
    durable_handles: HashMap<u64, bool>,
}

/// All inodes the guest currently knows. Reads (the I/O path) take the lock shared;
/// only lookups of new files and forgets take it exclusively.
pub struct InodeTable {
    maps: RwLock<Maps>,
    handles: FileHandleMode,
    locks: LockTable,
    /// Write-concurrency figures of inodes already forgotten, so statistics outlive them.
    retired_peak: std::sync::atomic::AtomicU32,
    retired_violations: AtomicU64,
}

impl InodeTable {
    pub fn new() -> Self {
        Self::with_file_handles(FileHandleMode::Never)
    }

    pub fn with_file_handles(handles: FileHandleMode) -> Self {
        InodeTable {
            handles,
            locks: LockTable::new(),
            maps: RwLock::new(Maps {
                by_id: HashMap::new(),
                by_key: HashMap::new(),
                next_id: fuse_backend_rs::api::filesystem::ROOT_ID + 1,
                mount_fds: HashMap::new(),
                durable_handles: HashMap::new(),
            }),
            retired_peak: Default::default(),
            retired_violations: Default::default(),
        }
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
        if !durable {
            let then = match self.handles {
                FileHandleMode::Prefer => "nodes on it keep an fd each, as with never",
                _ => "lookups on it fail with EOPNOTSUPP under mandatory",
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

    /// A file handle for `fd`'s file under `--inode-file-handles` (None: keep the fd).
    fn handle_of(&self, fd: &OwnedFd) -> io::Result<Option<(sys::FileHandle, u64)>> {
        let mode = self.handles;
        if mode == FileHandleMode::Never {
            return Ok(None);
        }
        match sys::name_to_handle(fd.as_raw_fd()) {
            Ok((h, mnt)) if self.durable_handles(mnt, fd) => Ok(Some((h, mnt))),
            _ if mode == FileHandleMode::Prefer => Ok(None),
            Ok(_) => Err(sys::errno(libc::EOPNOTSUPP)),
            Err(e) => Err(e),
        }
    }

    /// Installs the share's root as node id 1. Its count never reaches zero.
    pub fn insert_root(&self, fd: OwnedFd, st: &sys::StatX) -> io::Result<()> {
        let nodeid = fuse_backend_rs::api::filesystem::ROOT_ID;
        let key = InodeKey::of(st);
        if self.handles == FileHandleMode::Mandatory {
            // Refuse at start rather than fail every lookup later (as virtiofsd does).
            let fail = |why: String| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("--inode-file-handles=mandatory: {why}; use prefer or never"),
                )
            };
            if let Err(e) = sys::name_to_handle(fd.as_raw_fd()) {
                return Err(fail(format!("its file system gives no file handles ({e})")));
            }
            if !matches!(sys::handles_outlive_eviction(fd.as_raw_fd()), Ok(true)) {
                return Err(fail(
                    "it is on a FUSE (or FAT) file system, whose file handles go stale once the host evicts an inode"
                        .into(),
                ));
            }
        }
        let handle = self.handle_of(&fd).ok().flatten().map(|(h, _)| h);
        let io = self.locks.get(file_id(st, handle));
        if self.handles != FileHandleMode::Never {
            let anchor = Arc::new(Self::anchor(&fd)?);
            self.maps
                .write()
                .unwrap()
                .mount_fds
                .insert(st.mnt_id, anchor);
        }
        let inode = Arc::new(Inode {
            nodeid,
            file: InodeFile::Fd(fd),
            key,
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(u64::MAX / 2),
            io,
        });
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

    /// Registers one guest lookup of the file `fd` names. If the file is already known the
    /// new fd is dropped and the existing node's count goes up.
    pub fn lookup_insert(&self, fd: OwnedFd, st: &sys::StatX) -> io::Result<Arc<Inode>> {
        let key = InodeKey::of(st);
        let handle = self.handle_of(&fd)?;
        // A known node of this file, if any. A node named by a file handle holds no fd, so
        // its file may be gone and the inode number reused: a different handle means a
        // different file, which gets a node of its own (the old one answers ESTALE).
        let known = |m: &Maps| {
            let inode = m.by_id.get(m.by_key.get(&key)?)?;
            match (&inode.file, &handle) {
                (InodeFile::Handle { handle: old, .. }, Some((new, _))) if old != new => None,
                _ => Some(inode.clone()),
            }
        };
        if let Some(inode) = known(&self.maps.read().unwrap()) {
            // A count raised under the read lock can't race a removal: forget takes the
            // write lock.
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return Ok(inode);
        }
        let io = self
            .locks
            .get(file_id(st, handle.as_ref().map(|(h, _)| h.clone())));
        let mut m = self.maps.write().unwrap();
        if let Some(inode) = known(&m) {
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return Ok(inode);
        }
        let is_dir = st.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let file = match handle {
            Some((handle, mnt)) if m.mount_fds.contains_key(&mnt) => InodeFile::Handle {
                handle,
                mount_fd: m.mount_fds[&mnt].clone(),
            },
            Some((handle, mnt)) if is_dir => {
                // open_by_handle_at wants a real (not O_PATH) fd on the mount: the first
                // directory seen on it becomes that anchor.
                let anchor = Arc::new(Self::anchor(&fd)?);
                m.mount_fds.insert(mnt, anchor.clone());
                InodeFile::Handle {
                    handle,
                    mount_fd: anchor,
                }
            }
            // No anchor on this mount yet: this node keeps its fd.
            _ => InodeFile::Fd(fd),
        };
        let nodeid = m.next_id;
        m.next_id += 1;
        let inode = Arc::new(Inode {
            nodeid,
            file,
            key,
            file_type: st.st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            io,
        });
        m.by_id.insert(nodeid, inode.clone());
        m.by_key.insert(key, nodeid);
        Ok(inode)
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
