//! The device state a migration carries (VHOST_USER_PROTOCOL_F_DEVICE_STATE): what the
//! destination needs to go on serving the same guest without a new INIT.
//!
//! - the INIT flags of the session;
//! - every node the guest knows (its id, its lookup count, how to find its file again),
//!   and the forgotten directories their names go through;
//! - every open handle (its number, its node, its open flags, the flock held through it);
//! - every POSIX/OFD lock owner with its byte ranges;
//! - the requests the guest still waits on (a SETLKW whose wait the ring stop suspended),
//!   for the destination to answer on the same descriptors (`InFlight`).
//!
//! How files are found again is `--migration-mode`: find-paths sends each node's name in
//! its parent (the destination opens it with `openat(O_NOFOLLOW)` from the parent it
//! restored first, so no path can leave the share), file-handles sends file handles (the
//! destination checks that what a handle opens lies inside the share). The stream is
//! `MAGIC`, a version, a length and a postcard body, at most `MAX_STATE` bytes; anything
//! else is refused with a `StateError`, never a panic. A load that fails leaves the
//! destination empty (a fresh session), and with `--migration-on-error abort` reports the
//! failure to the VMM, which then resumes the source.
//!
//! Locks: on one host the destination takes the source's own descriptions (`handover`),
//! which hold them already. Otherwise (two hosts over a distributed file system) it takes
//! each again on its own host descriptions; while the source still holds one, it waits for
//! it on a thread of its own, blocked in the host's lock call (flock, F_OFD_SETLKW), so
//! the file system queues it and grants it the lock as the source lets go. The guest keeps
//! its lock the whole time, held first by the source and then by the destination; a third
//! party already queued before the destination can still come first (docs/migration.md).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use fuse_backend_rs::api::filesystem::ROOT_ID;
use serde::{Deserialize, Serialize};

use super::filelocks::{self, OwnerRecord, Range};
use super::handle::Handle;
use super::handover::{self, Item};
use super::inode::{Inode, InodeKey};
use super::wake::{Blocker, FinishOwned};
use super::PassthroughFs;
use crate::sys;

/// The first bytes of a vfsd device state.
pub const MAGIC: [u8; 8] = *b"VFSDSTAT";
/// The format this vfsd writes and reads.
pub const VERSION: u32 = 3;
/// The largest state accepted: about a million nodes with 255-byte names under
/// find-paths (docs/design.md, Bounds).
pub const MAX_STATE: usize = 256 << 20;
/// The most nodes a state may carry: checked as the count is read, before any is decoded,
/// so a stream of minimal nodes (7 bytes each, 128 in memory) can't cost the destination
/// more than this many.
pub const MAX_NODES: usize = 1 << 21;
/// The most handles: each is an open file on the source, within its fd limit (the
/// kernel's nr_open default).
pub const MAX_HANDLES: usize = 1 << 20;
/// Node and handle numbers a state may continue from: past the largest it names by at
/// most this, and far from wrapping.
const MAX_ID_GAP: u64 = 1 << 32;
const MAX_ID: u64 = 1 << 62;
/// How long a load waits, over all its handles, for host lease holders to let go of the
/// files it opens again (`reopen_for_load`).
const LEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// Header: magic, version (le32), body length (le64).
pub const HEADER_LEN: usize = 8 + 4 + 8;

/// `--migration-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    #[default]
    FindPaths,
    FileHandles,
}

/// `--migration-on-error`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    #[default]
    Abort,
    GuestError,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct MigrationConfig {
    pub mode: Mode,
    pub on_error: OnError,
    pub verify_handles: bool,
    pub confirm_paths: bool,
}

/// Why a state could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("not a vfsd device state")]
    BadMagic,
    #[error("device state format {0}; this vfsd reads format {VERSION}")]
    Version(u32),
    #[error("device state of {0} bytes is over the limit of {MAX_STATE}")]
    TooLarge(u64),
    #[error("{0} nodes, over the {MAX_NODES} a destination loads")]
    TooManyNodes(usize),
    #[error("device state truncated: {got} of {want} bytes")]
    Truncated { got: usize, want: usize },
    #[error("malformed device state: {0}")]
    Malformed(String),
    #[error("the session enabled INIT flags {0:#x} this vfsd does not offer with its options")]
    Flags(u64),
    #[error("node {node}: {why}")]
    Node { node: u64, why: String },
    #[error("handle {fh}: {why}")]
    Handle { fh: u64, why: String },
    #[error("lock owner {owner:#x} of node {node}: {why}")]
    Lock { node: u64, owner: u64, why: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A bit of a state's `flags` no INIT flag uses: the source served the guest under
/// `--no-open`, so a destination must too (the guest names every file by handle 0).
const NO_OPEN_SESSION: u64 = 1 << 63;

impl PassthroughFs {
    fn no_open_mark(&self) -> u64 {
        if self.cfg.no_open {
            NO_OPEN_SESSION
        } else {
            0
        }
    }
}

#[derive(Serialize, Deserialize, Debug)]
struct State {
    mode: Mode,
    flags: u64,
    next_node: u64,
    next_handle: u64,
    #[serde(deserialize_with = "caps::nodes")]
    nodes: Vec<NodeState>,
    #[serde(deserialize_with = "caps::handles")]
    handles: Vec<HandleState>,
    #[serde(deserialize_with = "caps::owners")]
    owners: Vec<OwnerState>,
    #[serde(deserialize_with = "caps::in_flight")]
    in_flight: Vec<InFlight>,
    /// Where the destination takes the source's own descriptions (`handover`). Last, so
    /// the save can check its size before it binds the socket (`save_state`).
    handover: Option<handover::Offer>,
}

/// Caps on what a load decodes: each sequence's length is checked as it is read, before
/// any of its elements, so what a stream can make the destination allocate is bounded by
/// the counts, not by how compactly the stream encodes them (docs/design.md, Bounds).
mod caps {
    use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};
    use std::cell::Cell;

    #[derive(Clone, Copy, Debug)]
    pub struct Caps {
        pub nodes: usize,
        pub handles: usize,
        pub owners: usize,
        /// Lock ranges over all owners.
        pub ranges: usize,
        /// Handles the owners name, over all owners.
        pub owner_handles: usize,
        pub in_flight: usize,
    }

    thread_local! {
        static CAPS: Cell<Option<Caps>> = const { Cell::new(None) };
        /// Ranges and owners' handles still allowed in this decode (their caps are over
        /// all owners).
        static RANGES_LEFT: Cell<usize> = const { Cell::new(0) };
        static OWNER_HANDLES_LEFT: Cell<usize> = const { Cell::new(0) };
        /// Elements decoded under a cap in this decode (for the tests).
        static DECODED: Cell<usize> = const { Cell::new(0) };
        /// Why a cap refused (postcard keeps no message of a custom error).
        static REFUSED: Cell<Option<String>> = const { Cell::new(None) };
    }

    /// Why the last decode on this thread was refused by a cap, if it was.
    pub fn refusal() -> Option<String> {
        REFUSED.take()
    }

    /// Runs `f` (a decode) under `caps`.
    pub fn with<T>(caps: Caps, f: impl FnOnce() -> T) -> T {
        CAPS.set(Some(caps));
        RANGES_LEFT.set(caps.ranges);
        OWNER_HANDLES_LEFT.set(caps.owner_handles);
        DECODED.set(0);
        REFUSED.set(None);
        let r = f();
        CAPS.set(None);
        r
    }

    /// Elements the last decode on this thread took.
    #[cfg(test)]
    pub fn decoded() -> usize {
        DECODED.get()
    }

    /// A cap of its own per sequence, or a budget all owners share.
    #[derive(Clone, Copy)]
    enum Cap {
        Own(fn(&Caps) -> usize),
        Shared(&'static std::thread::LocalKey<Cell<usize>>),
    }

    fn capped<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
        what: &'static str,
        cap: Cap,
    ) -> Result<Vec<T>, D::Error> {
        struct V<T> {
            what: &'static str,
            max: usize,
            cap: Cap,
            _t: std::marker::PhantomData<T>,
        }
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "at most {} {}", self.max, self.what)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
                // postcard gives the exact length up front.
                let n = seq
                    .size_hint()
                    .ok_or_else(|| A::Error::custom(format!("{} without a count", self.what)))?;
                if n > self.max {
                    let why = format!("{n} {}, over the limit of {}", self.what, self.max);
                    REFUSED.set(Some(why.clone()));
                    return Err(A::Error::custom(why));
                }
                if let Cap::Shared(left) = self.cap {
                    left.set(left.get() - n);
                }
                let mut v = Vec::with_capacity(n.min(4096));
                while let Some(x) = seq.next_element()? {
                    DECODED.set(DECODED.get() + 1);
                    v.push(x);
                }
                Ok(v)
            }
        }
        let caps = CAPS
            .get()
            .ok_or_else(|| D::Error::custom("decoded outside a load"))?;
        let max = match cap {
            Cap::Own(f) => f(&caps),
            Cap::Shared(left) => left.get(),
        };
        d.deserialize_seq(V::<T> {
            what,
            max,
            cap,
            _t: std::marker::PhantomData,
        })
    }

    pub fn nodes<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        capped(d, "nodes", Cap::Own(|c| c.nodes))
    }
    pub fn handles<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "handles", Cap::Own(|c| c.handles))
    }
    pub fn owners<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "lock owners", Cap::Own(|c| c.owners))
    }
    pub fn ranges<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "lock ranges", Cap::Shared(&RANGES_LEFT))
    }
    pub fn owner_handles<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(
            d,
            "handles of lock owners",
            Cap::Shared(&OWNER_HANDLES_LEFT),
        )
    }
    pub fn in_flight<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        capped(d, "requests in flight", Cap::Own(|c| c.in_flight))
    }
}

/// A request popped from a ring and not answered when the ring stopped (a SETLKW still
/// waiting for its lock): the guest still waits for its reply, in the descriptors it gave.
/// Carried as is for the server layer, which checks it again before it answers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub queue: u16,
    /// The head of its descriptor chain, the id its used entry gives back.
    pub head: u16,
    /// Its position in the avail ring.
    pub position: u16,
    /// The guest address of the reply's header.
    pub reply_at: u64,
    /// The request: its `fuse_in_header` and arguments.
    pub request: Vec<u8>,
}

/// The largest request an `InFlight` carries (a SETLKW is 88 bytes).
pub const MAX_IN_FLIGHT_REQUEST: usize = 256;

#[derive(Serialize, Deserialize, Debug)]
struct NodeState {
    id: u64,
    /// 0: a forgotten directory that names go through.
    lookups: u64,
    file_type: u32,
    /// Its parent's id and its name there.
    name: Option<(u64, Vec<u8>)>,
    /// A path from the share's root, where `--migration-confirm-paths` found the name
    /// stale; it then takes the place of `name`.
    path: Option<Vec<u8>>,
    handle: Option<Vec<u8>>,
    /// The root of a mount other than its parent's (a submount of the share): a handle
    /// opens only on its own mount, and mount ids differ between daemons, so under
    /// file-handles the destination finds it by its name and checks its handle.
    mount_root: bool,
    /// Why the source could not describe it (the destination decides what follows).
    error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug)]
struct HandleState {
    fh: u64,
    node: u64,
    flags: i32,
    dir: bool,
    flock: i32,
}

#[derive(Serialize, Deserialize, Debug)]
struct OwnerState {
    node: u64,
    owner: u64,
    pid: u32,
    #[serde(deserialize_with = "caps::owner_handles")]
    handles: Vec<u64>,
    #[serde(deserialize_with = "caps::ranges")]
    ranges: Vec<(u64, u64, i32)>,
}

/// What a load did (logged, and for the tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadReport {
    pub nodes: usize,
    pub handles: usize,
    pub owners: usize,
    /// Nodes, handles and owners left out under `--migration-on-error guest-error`.
    pub failed: usize,
    /// Locks still held elsewhere (the source), taken by waiting threads.
    pub waiting_locks: usize,
    /// The requests the source left unanswered, for the server to take up.
    pub in_flight: Vec<InFlight>,
}

fn malformed(why: impl Into<String>) -> StateError {
    StateError::Malformed(why.into())
}

/// A name the state may carry: one path component, never `.`, `..` or empty.
fn component(name: &[u8]) -> Result<CString, String> {
    if name.is_empty() || name == b"." || name == b".." || name.len() > 255 {
        return Err(format!("bad name {:?}", String::from_utf8_lossy(name)));
    }
    if name.contains(&b'/') {
        return Err(format!(
            "name {:?} has a slash",
            String::from_utf8_lossy(name)
        ));
    }
    CString::new(name).map_err(|_| "name with a NUL byte".to_string())
}

/// Checks the header; gives the body's length.
pub fn parse_header(h: &[u8]) -> Result<usize, StateError> {
    if h.len() < HEADER_LEN {
        return Err(StateError::Truncated {
            got: h.len(),
            want: HEADER_LEN,
        });
    }
    if h[..8] != MAGIC {
        return Err(StateError::BadMagic);
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(StateError::Version(version));
    }
    let len = u64::from_le_bytes(h[12..20].try_into().unwrap());
    if len > (MAX_STATE - HEADER_LEN) as u64 {
        return Err(StateError::TooLarge(len));
    }
    Ok(len as usize)
}

impl PassthroughFs {
    /// The device state of this session, header included, with the requests `in_flight`
    /// that the destination must answer.
    pub fn save_state(&self, in_flight: &[InFlight]) -> Result<Vec<u8>, StateError> {
        self.save_state_within(in_flight, MAX_STATE)
    }

    /// `save_state`, refusing a state over `limit` bytes before anything is offered.
    fn save_state_within(
        &self,
        in_flight: &[InFlight],
        limit: usize,
    ) -> Result<Vec<u8>, StateError> {
        let mcfg = self.cfg.migration;
        let (records, next_node) = self.inodes.export();
        if records.len() > MAX_NODES {
            return Err(StateError::TooManyNodes(records.len()));
        }
        // The source's own descriptions for a destination on this host (`handover`), if
        // this daemon has a private directory to offer them in.
        let runtime = self.cfg.runtime_dir.clone();
        let mut pass: Vec<(Item, OwnedFd)> = Vec::new();
        let mut nodes = Vec::with_capacity(records.len());
        for r in records {
            let mut n = NodeState {
                id: r.inode.nodeid,
                lookups: r.lookups,
                file_type: r.file_type,
                name: r.name.as_ref().map(|(p, n)| (*p, n.to_bytes().to_vec())),
                path: None,
                handle: None,
                mount_root: r.name.as_ref().is_some_and(|(p, _)| {
                    self.inodes
                        .get(*p)
                        .is_ok_and(|p| p.key.mnt_id != r.inode.key.mnt_id)
                }),
                error: None,
            };
            let want_handle = mcfg.mode == Mode::FileHandles || mcfg.verify_handles;
            if want_handle {
                n.handle = match &r.handle {
                    Some(h) => Some(h.as_bytes().to_vec()),
                    None => r
                        .inode
                        .path_fd()
                        .and_then(|fd| sys::name_to_handle(fd.as_raw_fd()))
                        .map(|(h, _)| h.as_bytes().to_vec())
                        .map_err(|e| n.error = Some(format!("no file handle: {e}")))
                        .ok(),
                };
            }
            // A node without a name (unlinked) has no path to confirm: only the handover
            // moves it.
            if mcfg.mode == Mode::FindPaths && mcfg.confirm_paths && n.name.is_some() {
                if let Err(why) = self.confirm_path(&r.inode, &mut n) {
                    n.error = Some(why);
                }
            }
            // A file the host unlinked while the guest had it: its name finds nothing (or
            // another file), so it moves as a nameless node, by its own fd.
            if n.name.is_some()
                && runtime.is_some()
                && r.file_type == libc::S_IFREG
                && !still_named(&r.inode, &r.name)
            {
                let st = r.inode.path_fd().and_then(|fd| sys::fstat(&fd));
                if st.is_ok_and(|st| st.st_nlink == 0) {
                    n.name = None;
                }
            }
            if n.name.is_none() && n.path.is_none() && runtime.is_some() {
                // Open but unlinked, say: only its own fd can move it.
                if let Ok(fd) = r.inode.path_fd().and_then(|f| sys::dup(f.as_raw_fd())) {
                    pass.push((Item::Node(n.id), fd));
                }
            }
            nodes.push(n);
        }
        let (open, next_handle) = self.handles.export();
        if runtime.is_some() {
            for (fh, h) in &open {
                if let Ok(fd) = h.fd.try_clone() {
                    pass.push((Item::Handle(*fh), fd));
                }
            }
            for ((node, owner), fd) in self.locks.owner_fds() {
                pass.push((Item::Owner(node, owner), fd));
            }
        }
        let handles = open
            .into_iter()
            .map(|(fh, h)| HandleState {
                fh,
                node: h.inode.nodeid,
                flags: h.flags,
                dir: h.dir.is_some(),
                flock: h.flock.load(Ordering::Relaxed),
            })
            .collect();
        let owners = self
            .locks
            .export()
            .into_iter()
            .map(|o| OwnerState {
                node: o.node,
                owner: o.owner,
                pid: o.pid,
                handles: o.handles,
                ranges: o.ranges.iter().map(|r| (r.start, r.end, r.typ)).collect(),
            })
            .collect();
        let state = State {
            mode: mcfg.mode,
            flags: self.enabled.load(Ordering::Acquire) | self.no_open_mark(),
            next_node,
            next_handle,
            nodes,
            handles,
            owners,
            in_flight: in_flight.to_vec(),
            handover: None,
        };
        let mut body = postcard::to_stdvec(&state).map_err(|e| malformed(e.to_string()))?;
        // Its size is known before the socket exists: the offer (the last field) has a
        // fixed size. A state too large binds, shares and starts nothing.
        let offer_len = postcard::to_stdvec(&Some(handover::Offer::sized()))
            .map_err(|e| malformed(e.to_string()))?
            .len();
        let full = body.len() - 1 + if runtime.is_some() { offer_len } else { 1 };
        if HEADER_LEN + full > limit {
            return Err(StateError::TooLarge((HEADER_LEN + full) as u64));
        }
        if let Some(dir) = &runtime {
            match handover::Listener::bind(dir.fd()) {
                Ok(l) => {
                    // The encoded `None` gives way to the offer.
                    body.pop();
                    let offer = postcard::to_stdvec(&Some(l.offer()))
                        .map_err(|e| malformed(e.to_string()))?;
                    body.extend_from_slice(&offer);
                    // From now on a reset only closes: the destination may hold copies.
                    self.locks
                        .shared
                        .store(true, std::sync::atomic::Ordering::Release);
                    let dir = sys::dup(dir.fd())?;
                    std::thread::Builder::new()
                        .name("vfsd-handover".into())
                        .spawn(move || {
                            if l.serve(dir, pass) {
                                log::info!(
                                    "migration: the destination took this daemon's open files and locks"
                                );
                            }
                        })?;
                }
                Err(e) => {
                    log::info!("migration: no lock handover socket ({e}); locks are taken again")
                }
            }
        }
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// `--migration-confirm-paths`: whether the node's name still finds its file; if
    /// not, its current path from the host kernel (`/proc/self/fd`), checked the same way.
    fn confirm_path(&self, inode: &Arc<Inode>, n: &mut NodeState) -> Result<(), String> {
        let fd = inode
            .path_fd()
            .map_err(|e| format!("cannot open it: {e}"))?;
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| e.to_string())?;
        let key = InodeKey::of(&st);
        let found_at = |p: &Arc<Inode>, name: &CStr| {
            let pfd = p.path_fd().ok()?;
            let s = sys::statx(pfd.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW).ok()?;
            (InodeKey::of(&s) == key).then_some(())
        };
        if let Some((pid, name)) = &n.name {
            let parent = self.inodes.get(*pid).ok().or_else(|| inode.parent());
            let cname = CString::new(name.clone()).map_err(|e| e.to_string())?;
            if parent.and_then(|p| found_at(&p, &cname)).is_some() {
                return Ok(());
            }
        }
        // The kernel's idea of the path, relative to the share's root (readlinkat on the
        // /proc/self/fd vfsd opened before its sandbox).
        let name = sys::fd_name(fd.as_raw_fd());
        let buf = sys::readlinkat(self.proc_self_fd.as_raw_fd(), &name)
            .ok()
            .filter(|b| b.len() < libc::PATH_MAX as usize)
            .ok_or("its name is stale and its path unknown")?;
        if buf.ends_with(b" (deleted)") {
            return Err("it was deleted".into());
        }
        let root = self.cfg.root_dir.as_os_str().as_encoded_bytes();
        let root = root.strip_suffix(b"/").unwrap_or(root);
        let rel = buf
            .strip_prefix(root)
            .and_then(|r| r.strip_prefix(b"/"))
            .ok_or_else(|| "its path is outside the share".to_string())?
            .to_vec();
        if rel.is_empty() {
            return Err("its path is the share's root".into());
        }
        // That path must find this very file now.
        let root_inode = self.inodes.get(ROOT_ID).map_err(|e| e.to_string())?;
        let now = self.open_path(&root_inode, &rel)?;
        let s = sys::statx(
            now.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| e.to_string())?;
        if InodeKey::of(&s) != key {
            return Err("its current path finds another file".into());
        }
        n.path = Some(rel);
        Ok(())
    }

    /// Loads a device state `save_state` made (on this or another vfsd) into a daemon
    /// that has served no request since it started or was reset. On an error (and with
    /// `abort`, on any node, handle or lock that can't be restored) nothing stays loaded.
    pub fn load_state(self: &Arc<Self>, bytes: &[u8]) -> Result<LoadReport, StateError> {
        let len = parse_header(bytes)?;
        let body = &bytes[HEADER_LEN.min(bytes.len())..];
        if body.len() != len {
            return Err(StateError::Truncated {
                got: body.len(),
                want: len,
            });
        }
        let state: State = caps::with(self.load_caps(), || postcard::from_bytes(body))
            .map_err(|e| malformed(caps::refusal().unwrap_or_else(|| e.to_string())))?;
        // A fresh session, as after DESTROY: a load replaces whatever was there.
        self.reset();
        let r = self.restore(&state, None);
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// What a load decodes at most: nodes and handles as `MAX_NODES`, `MAX_HANDLES`;
    /// owners and ranges what this daemon's `--max-locks` lets a guest hold (a granted
    /// wait may pass it by one range per waiter, twice), requests in flight its waiters.
    fn load_caps(&self) -> caps::Caps {
        caps::Caps {
            nodes: MAX_NODES,
            handles: MAX_HANDLES,
            owners: self.cfg.max_locks,
            ranges: self.cfg.max_locks + 2 * self.cfg.max_lock_waiters,
            owner_handles: MAX_HANDLES,
            in_flight: self.cfg.max_lock_waiters,
        }
    }

    /// Takes over the session a serving process that died left (`recovery`): its nodes
    /// and handles as its crash record names them, with the fds it held (`kept`, by node
    /// and handle), into this daemon, fresh since it started. A node or handle that can't
    /// be restored is left out (the guest gets errors for it), whatever
    /// `--migration-on-error` says: the alternative is the whole share gone.
    pub(crate) fn take_over(
        self: &Arc<Self>,
        dead: crate::recovery::FsState,
    ) -> Result<LoadReport, StateError> {
        let crate::recovery::FsState {
            session,
            next_ids,
            nodes,
            handles,
            owners,
            kept,
        } = dead;
        let nodes = parents_first(nodes)
            .into_iter()
            .map(|n| NodeState {
                id: n.id,
                lookups: n.lookups,
                file_type: n.file_type,
                name: n.name,
                path: None,
                handle: n.handle,
                mount_root: false,
                error: None,
            })
            .collect::<Vec<_>>();
        let max_node = nodes.iter().map(|n| n.id).max().unwrap_or(ROOT_ID);
        let max_fh = handles.iter().map(|h| h.fh).max().unwrap_or(0);
        let state = State {
            mode: self.cfg.migration.mode,
            flags: session | self.no_open_mark(),
            next_node: next_ids.0.max(max_node + 1),
            next_handle: next_ids.1.max(max_fh + 1),
            nodes,
            handles: handles
                .iter()
                .map(|h| HandleState {
                    fh: h.fh,
                    node: h.node,
                    flags: h.flags,
                    dir: h.dir,
                    flock: libc::F_UNLCK,
                })
                .collect(),
            owners: owners
                .into_iter()
                .map(|o| OwnerState {
                    node: o.owner.node,
                    owner: o.owner.owner,
                    pid: o.owner.pid,
                    // The handles it locked through are not recorded: every open handle
                    // of its file stands for them, so the owner (an OFD lock's is its
                    // open file) ends only with the last of them, never early.
                    handles: handles
                        .iter()
                        .filter(|h| h.node == o.owner.node)
                        .map(|h| h.fh)
                        .collect(),
                    ranges: o.ranges,
                })
                .collect(),
            in_flight: Vec::new(),
            handover: None,
        };
        self.reset();
        let r = self.restore(&state, Some(kept));
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// `kept`: the fds of a dead serving process (`take_over`), used before any other
    /// way of finding a node; their errors leave the node or handle out.
    fn restore(
        self: &Arc<Self>,
        state: &State,
        kept: Option<HashMap<Item, OwnedFd>>,
    ) -> Result<LoadReport, StateError> {
        let taking_over = kept.is_some();
        let mcfg = self.cfg.migration;
        // A source that offered FUSE_ATOMIC_O_TRUNC (an older vfsd, as virtiofsd does) left
        // a guest that sends O_TRUNC in OPEN: served as sent, though not offered here.
        let extra = state.flags
            & !(self.wanted_flags() | self.no_open_mark())
            & !(crate::abi::flags::INIT_EXT | crate::abi::flags::ATOMIC_O_TRUNC);
        if extra & NO_OPEN_SESSION != 0 {
            return Err(malformed(
                "the source served the guest under --no-open (it sends handle 0 for every \
                 file): run this vfsd with --no-open too"
                    .to_string(),
            ));
        }
        if extra != 0 {
            return Err(StateError::Flags(extra));
        }
        if state.mode != mcfg.mode {
            return Err(malformed(format!(
                "the source used {:?}, this daemon --migration-mode {:?}",
                state.mode, mcfg.mode
            )));
        }
        let max_node = state.nodes.iter().map(|n| n.id).max().unwrap_or(ROOT_ID);
        let max_fh = state.handles.iter().map(|h| h.fh).max().unwrap_or(0);
        let bounded = |next: u64, max: u64| {
            next > max && next <= max.saturating_add(MAX_ID_GAP) && next < MAX_ID
        };
        if !bounded(state.next_node, max_node) || !bounded(state.next_handle, max_fh) {
            return Err(malformed("bad id counters"));
        }
        if state.in_flight.len() > self.cfg.max_lock_waiters
            || state
                .in_flight
                .iter()
                .any(|r| r.request.len() > MAX_IN_FLIGHT_REQUEST)
        {
            return Err(malformed(format!(
                "{} requests in flight (at most --max-lock-waiters {}, of {MAX_IN_FLIGHT_REQUEST} bytes each)",
                state.in_flight.len(),
                self.cfg.max_lock_waiters
            )));
        }
        let mut report = LoadReport {
            in_flight: state.in_flight.clone(),
            ..LoadReport::default()
        };
        let guest_error = mcfg.on_error == OnError::GuestError || taking_over;
        // Errors that `guest-error` turns into a missing node, handle or owner.
        let soft = |e: StateError, report: &mut LoadReport| {
            if guest_error {
                log::warn!("migration: {e}; the guest gets errors for it");
                report.failed += 1;
                Ok(())
            } else {
                Err(e)
            }
        };
        let root = self.inodes.get(ROOT_ID)?;
        let mut restored: HashMap<u64, Arc<Inode>> = HashMap::new();
        restored.insert(ROOT_ID, root.clone());
        let anchor = match state.mode {
            Mode::FileHandles => Some(self.inodes.root_anchor()?),
            Mode::FindPaths => None,
        };
        let mut passed = match (&state.handover, &self.cfg.runtime_dir) {
            _ if taking_over => kept.unwrap_or_default(),
            (Some(_), None) => {
                log::info!(
                    "migration: no runtime directory for the lock handover; locks are taken again"
                );
                HashMap::new()
            }
            (Some(offer), Some(dir)) => {
                match handover::receive(dir.fd(), offer, &expected(state)) {
                    Ok(p) => {
                        self.locks
                            .shared
                            .store(true, std::sync::atomic::Ordering::Release);
                        p
                    }
                    Err(e) => {
                        log::info!("migration: no lock handover from the source ({e}); locks are taken again");
                        HashMap::new()
                    }
                }
            }
            (None, _) => HashMap::new(),
        };
        let mut ids = std::collections::HashSet::with_capacity(state.nodes.len());
        for n in &state.nodes {
            if n.id <= ROOT_ID || n.id >= state.next_node || !ids.insert(n.id) {
                return Err(malformed(format!("bad or repeated node id {}", n.id)));
            }
        }
        // Level by level from the root: a node's parent (earlier in the state) is found
        // first, and the nodes of one level are found in parallel, since finding a file
        // again (an openat, a statx, a file handle) is most of a large load's time.
        // A batch at a time: every file found holds an fd until it is installed, and the
        // node fd cache gives fds back only as nodes come in.
        let batches = levels(&state.nodes)
            .into_iter()
            .flat_map(|l| l.chunks(FIND_BATCH).map(<[_]>::to_vec).collect::<Vec<_>>());
        for level in batches {
            let fds: Vec<Option<OwnedFd>> = level
                .iter()
                .map(|n| passed.remove(&Item::Node(n.id)))
                .collect();
            let find = |(n, fd): (&&NodeState, Option<OwnedFd>)| match (&n.error, fd) {
                (Some(why), _) => Err(format!("the source could not send it: {why}")),
                // A name first (the host key then has this namespace's mount id), the
                // kept fd where the name finds nothing (a file the host unlinked).
                (None, Some(fd)) if taking_over && n.name.is_some() => self
                    .find_node(n, state.mode, &restored, anchor.as_ref(), &root)
                    .or_else(|_| kept_node(fd, n, &restored)),
                (None, Some(fd)) if taking_over => kept_node(fd, n, &restored),
                (None, Some(fd)) if n.name.is_none() && n.path.is_none() => {
                    unlinked_node(fd, n, root.key.dev)
                }
                (None, _) => self.find_node(n, state.mode, &restored, anchor.as_ref(), &root),
            };
            let found = in_parallel(level.iter().zip(fds).collect(), find);
            for (n, found) in level.into_iter().zip(found) {
                self.restore_found(n, found, &mut restored, &mut report, &soft)?;
            }
        }
        self.inodes.continue_ids_from(state.next_node);

        let mut waits = Vec::new();
        let lease_deadline = std::time::Instant::now() + LEASE_WAIT;
        for h in &state.handles {
            let fd = passed.remove(&Item::Handle(h.fh));
            match self.restore_handle(h, state.next_handle, &restored, fd, lease_deadline) {
                Ok(Some(w)) => waits.push(w),
                Ok(None) => {}
                Err(why) => {
                    soft(StateError::Handle { fh: h.fh, why }, &mut report)?;
                    continue;
                }
            }
            report.handles += 1;
        }
        for o in &state.owners {
            let fd = passed.remove(&Item::Owner(o.node, o.owner));
            match self.restore_owner(o, &restored, fd) {
                Ok(Some(w)) => waits.push(w),
                Ok(None) => {}
                Err(why) => {
                    let e = StateError::Lock {
                        node: o.node,
                        owner: o.owner,
                        why,
                    };
                    soft(e, &mut report)?;
                    continue;
                }
            }
            report.owners += 1;
        }
        // Each wait takes a thread, like a guest's SETLKW: bounded the same way.
        if waits.len() > self.cfg.max_lock_waiters {
            return Err(StateError::Malformed(format!(
                "{} locks to wait for, over --max-lock-waiters {}",
                waits.len(),
                self.cfg.max_lock_waiters
            )));
        }
        report.waiting_locks = waits.len();
        // The record carries the counters on, so a process taking over from this one
        // never hands out a number the guest may still hold.
        if let Some(r) = &self.cfg.crash_record {
            r.note_next_node(state.next_node);
            r.note_next_handle(state.next_handle);
        }
        for w in waits {
            w.spawn();
        }
        self.start_session(state.flags);
        Ok(report)
    }

    /// Installs node `n` found as `found` (or leaves it out, as `soft` says).
    fn restore_found(
        &self,
        n: &NodeState,
        found: Result<Found, String>,
        restored: &mut HashMap<u64, Arc<Inode>>,
        report: &mut LoadReport,
        soft: &dyn Fn(StateError, &mut LoadReport) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        match found {
            Ok((fd, st, name)) => {
                let parent = name.as_ref().map(|(p, c)| (p, c.as_c_str()));
                let inode = self
                    .inodes
                    .restore(n.id, n.lookups, fd, &st, parent)
                    .map_err(|e| StateError::Node {
                        node: n.id,
                        why: e.to_string(),
                    })?;
                restored.insert(n.id, inode);
                if n.lookups > 0 {
                    report.nodes += 1;
                }
                Ok(())
            }
            Err(why) => soft(StateError::Node { node: n.id, why }, report),
        }
    }

    /// Opens node `n`'s file the way the state says to find it.
    #[allow(clippy::type_complexity)]
    fn find_node(
        &self,
        n: &NodeState,
        mode: Mode,
        restored: &HashMap<u64, Arc<Inode>>,
        anchor: Option<&OwnedFd>,
        root: &Arc<Inode>,
    ) -> Result<(OwnedFd, sys::StatX, Option<(Arc<Inode>, CString)>), String> {
        let name = match &n.name {
            Some((p, name)) => {
                let parent = restored
                    .get(p)
                    .ok_or_else(|| format!("its parent {p} is not in the state before it"))?;
                if !parent.is_dir() {
                    return Err(format!("its parent {p} is not a directory"));
                }
                Some((parent.clone(), component(name)?))
            }
            None => None,
        };
        let nofollow = libc::O_PATH | libc::O_NOFOLLOW;
        let fd = match (mode, anchor) {
            (Mode::FileHandles, Some(anchor)) => {
                let h = n.handle.as_ref().ok_or("no file handle in the state")?;
                let h = sys::FileHandle::from_bytes(h).map_err(|_| "a malformed file handle")?;
                match &name {
                    // A submount's root: by its name in its parent (inside the share by
                    // construction), and only if it is the very directory the source had.
                    Some((parent, cname)) if n.mount_root => {
                        let pfd = parent.path_fd().map_err(|e| e.to_string())?;
                        let fd = sys::openat(pfd.as_raw_fd(), cname, nofollow, 0)
                            .map_err(|e| format!("{cname:?}: {e}"))?;
                        let now = sys::name_to_handle(fd.as_raw_fd())
                            .map_err(|e| format!("no file handle to check: {e}"))?;
                        if now.0.as_bytes() != h.as_bytes() {
                            return Err("another file is at its name (file handles differ)".into());
                        }
                        fd
                    }
                    _ => {
                        // Decoded on its parent's mount (restored before it), which is its
                        // own: the share's root's for a node with no name.
                        let parent_dir = match &name {
                            Some((parent, _)) => {
                                let pfd = parent.path_fd().map_err(|e| e.to_string())?;
                                let dir = libc::O_RDONLY | libc::O_DIRECTORY;
                                Some(
                                    sys::openat(pfd.as_raw_fd(), c".", dir, 0)
                                        .map_err(|e| e.to_string())?,
                                )
                            }
                            None => None,
                        };
                        let mount_fd = parent_dir.as_ref().unwrap_or(anchor);
                        let fd = sys::open_by_handle(mount_fd.as_raw_fd(), &h, nofollow)
                            .map_err(|e| format!("its file handle does not open: {e}"))?;
                        self.check_inside_share(&fd, name.as_ref(), root)?;
                        fd
                    }
                }
            }
            _ => {
                let fd = match (&n.path, &name) {
                    (Some(path), _) => self.open_path(root, path)?,
                    (None, Some((parent, cname))) => {
                        let pfd = parent.path_fd().map_err(|e| e.to_string())?;
                        sys::openat(pfd.as_raw_fd(), cname, nofollow, 0)
                            .map_err(|e| format!("{:?}: {e}", cname))?
                    }
                    (None, None) => return Err("no name finds it".into()),
                };
                if let Some(h) = &n.handle {
                    // --migration-verify-handles: the very file the source had.
                    let now = sys::name_to_handle(fd.as_raw_fd())
                        .map_err(|e| format!("no file handle to verify: {e}"))?;
                    if now.0.as_bytes() != h.as_slice() {
                        return Err("a different file is at its path (file handles differ)".into());
                    }
                }
                fd
            }
        };
        let st = sys::statx(
            fd.as_raw_fd(),
            sys::EMPTY,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| e.to_string())?;
        if st.st.st_mode & libc::S_IFMT != n.file_type {
            return Err(format!(
                "its file type changed ({:o} to {:o})",
                n.file_type,
                st.st.st_mode & libc::S_IFMT
            ));
        }
        Ok((fd, st, name))
    }

    /// Opens a path of the share component by component from its root, never following a
    /// symlink or leaving the share (`..` is refused).
    fn open_path(&self, root: &Arc<Inode>, path: &[u8]) -> Result<OwnedFd, String> {
        if path.len() > libc::PATH_MAX as usize {
            return Err("a path longer than PATH_MAX".into());
        }
        let mut cur: OwnedFd = {
            let r = root.path_fd().map_err(|e| e.to_string())?;
            sys::openat(r.as_raw_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| e.to_string())?
        };
        let parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        for (i, part) in parts.iter().enumerate() {
            let c = component(part)?;
            let last = i + 1 == parts.len();
            let flags = libc::O_PATH | libc::O_NOFOLLOW | if last { 0 } else { libc::O_DIRECTORY };
            cur = sys::openat(cur.as_raw_fd(), &c, flags, 0).map_err(|e| format!("{c:?}: {e}"))?;
        }
        Ok(cur)
    }

    /// A file a handle opened must lie inside the share: a directory's `..` chain
    /// reaches the share's root; another file is where its name in its (restored,
    /// checked) parent says; an unlinked file (no links) has no place to be outside of.
    fn check_inside_share(
        &self,
        fd: &OwnedFd,
        name: Option<&(Arc<Inode>, CString)>,
        root: &Arc<Inode>,
    ) -> Result<(), String> {
        let outside = || "its file handle names a file outside the share".to_string();
        let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
        let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags).map_err(|e| e.to_string())?;
        if st.st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let mut cur =
                sys::openat(fd.as_raw_fd(), c".", libc::O_PATH, 0).map_err(|e| e.to_string())?;
            for _ in 0..4096 {
                let s =
                    sys::statx(cur.as_raw_fd(), sys::EMPTY, flags).map_err(|e| e.to_string())?;
                if InodeKey::of(&s) == root.key {
                    return Ok(());
                }
                let up = sys::openat(cur.as_raw_fd(), c"..", libc::O_PATH, 0)
                    .map_err(|e| e.to_string())?;
                let su =
                    sys::statx(up.as_raw_fd(), sys::EMPTY, flags).map_err(|e| e.to_string())?;
                if InodeKey::of(&su) == InodeKey::of(&s) {
                    return Err(outside()); // the file system's root
                }
                cur = up;
            }
            return Err(outside());
        }
        // A file with no links could be any deleted file on this file system: only the
        // handover (the source's own fd) moves those.
        let (parent, cname) = name.ok_or_else(outside)?;
        let pfd = parent.path_fd().map_err(|e| e.to_string())?;
        let s =
            sys::statx(pfd.as_raw_fd(), cname, libc::AT_SYMLINK_NOFOLLOW).map_err(|_| outside())?;
        if InodeKey::of(&s) != InodeKey::of(&st) {
            return Err(outside());
        }
        Ok(())
    }

    fn restore_handle(
        self: &Arc<Self>,
        h: &HandleState,
        next: u64,
        restored: &HashMap<u64, Arc<Inode>>,
        passed: Option<OwnedFd>,
        lease_deadline: std::time::Instant,
    ) -> Result<Option<LockWait>, String> {
        let inode = restored
            .get(&h.node)
            .filter(|i| i.lookups() > 0)
            .ok_or_else(|| format!("its node {} was not restored", h.node))?;
        if h.dir != inode.is_dir() {
            return Err("its node's file type does not match".into());
        }
        let flags = if h.dir {
            libc::O_RDONLY | libc::O_DIRECTORY
        } else {
            // Opened again: never create or truncate what the guest already has open; and
            // through this daemon's own rules for guest flags (its --allow-direct-io,
            // --preserve-noatime, writeback).
            let f = h.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
            let f = self.host_flags(f as u32);
            self.check_open_flags(f).map_err(|e| e.to_string())?;
            f
        };
        // The source's own description (its offset, its flock) if it is this node's file,
        // a regular file or directory, open with the state's access mode.
        let usable = |fd: &OwnedFd| {
            (inode.is_reg() || inode.is_dir()) && same_file(fd, inode) && same_access(fd, flags)
        };
        let fd = match passed.filter(usable) {
            Some(fd) => fd,
            None => self.reopen_for_load(inode, flags, lease_deadline)?,
        };
        let nowait = !h.dir && self.nowait_unsupported.worth_trying(inode.key.mnt_id);
        let handle = Handle {
            inode: inode.clone(),
            fd,
            flags,
            dir: h.dir.then(Default::default),
            nowait_reads: AtomicBool::new(nowait),
            flock: AtomicI32::new(libc::F_UNLCK),
            flock_pending: Default::default(),
            write_tick: Default::default(),
        };
        self.handles
            .restore(h.fh, handle, next)
            .map_err(|e| e.to_string())?;
        if h.flock == libc::F_UNLCK {
            return Ok(None);
        }
        if h.flock != libc::F_RDLCK && h.flock != libc::F_WRLCK {
            return Err("bad flock type".into());
        }
        let handle = self.handles.get(h.fh, h.node).map_err(|e| e.to_string())?;
        match filelocks::flock(handle.fd.as_raw_fd(), h.flock, false) {
            Ok(()) => {
                handle.flock.store(h.flock, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                let retake = Arc::new(Blocker::holding_before_start());
                *handle.flock_pending.lock().unwrap() = Some(retake.clone());
                Ok(Some(LockWait::Flock {
                    fs: self.clone(),
                    handle,
                    typ: h.flock,
                    retake: FinishOwned(retake),
                }))
            }
            Err(e) => Err(format!("flock: {e}")),
        }
    }

    /// Opens a handle's file again without waiting on a host lease: a blocking open would
    /// wait `lease-break-time` (45 s by default) for each leased file while the VM is
    /// paused. The open (O_NONBLOCK) tells the holder to let go; the load tries again
    /// until `deadline`, one for the whole load, and then gives the handle up.
    fn reopen_for_load(
        &self,
        inode: &Arc<Inode>,
        flags: i32,
        deadline: std::time::Instant,
    ) -> Result<OwnedFd, String> {
        loop {
            match self.reopen(inode, flags | libc::O_NONBLOCK) {
                Ok(fd) => {
                    if flags & libc::O_NONBLOCK == 0 {
                        sys::clear_nonblock(fd.as_raw_fd()).map_err(|e| e.to_string())?;
                    }
                    return Ok(fd);
                }
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if std::time::Instant::now() >= deadline {
                        return Err("a host lease holds it, and its holder did not let go".into());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn restore_owner(
        self: &Arc<Self>,
        o: &OwnerState,
        restored: &HashMap<u64, Arc<Inode>>,
        passed: Option<OwnedFd>,
    ) -> Result<Option<LockWait>, String> {
        let inode = restored
            .get(&o.node)
            .filter(|i| i.lookups() > 0 && i.is_reg())
            .ok_or_else(|| format!("its node {} was not restored", o.node))?;
        // An owner locks through the guest's handles: with all of them left out, nobody
        // could ever unlock it short of a FORGET (under `guest-error`).
        if !o.handles.is_empty() && !self.handles_open(o.node, &o.handles) {
            return Err("its handles were all left out".into());
        }
        let mut ranges = Vec::with_capacity(o.ranges.len());
        for &(start, end, typ) in &o.ranges {
            ranges.push(Range::new(start, end, typ as u32).map_err(|_| "a bad range")?);
        }
        let rec = OwnerRecord {
            node: o.node,
            owner: o.owner,
            pid: o.pid,
            handles: o.handles.clone(),
            ranges,
        };
        let open = || self.lock_description(o.node)(self.cfg.readonly);
        // The source's own description holds the ranges already: placing them again on
        // it succeeds at once, and nobody else can take them meanwhile.
        let usable = |fd: &OwnedFd| {
            // SAFETY: plain fcntl on an fd we own.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
            same_file(fd, inode) && fl >= 0 && fl & libc::O_PATH == 0
        };
        let fd = match passed.filter(usable) {
            Some(fd) => fd,
            None => open().map_err(|e| e.to_string())?,
        };
        match self.locks.restore_owner(&rec, fd) {
            Ok(()) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                let retake = Arc::new(Blocker::holding_before_start());
                self.locks.set_pending(rec.node, rec.owner, retake.clone());
                Ok(Some(LockWait::Posix {
                    fs: self.clone(),
                    rec,
                    retake: FinishOwned(retake),
                }))
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The fds a handover may bring for `state`: its handles, its owners, its nameless nodes.
fn expected(state: &State) -> std::collections::HashSet<Item> {
    let mut e: std::collections::HashSet<Item> =
        state.handles.iter().map(|h| Item::Handle(h.fh)).collect();
    e.extend(state.owners.iter().map(|o| Item::Owner(o.node, o.owner)));
    e.extend(
        state
            .nodes
            .iter()
            .filter(|n| n.name.is_none() && n.path.is_none())
            .map(|n| Item::Node(n.id)),
    );
    e
}

/// Whether `fd` is open (not O_PATH) with the access mode of `flags`.
fn same_access(fd: &OwnedFd, flags: i32) -> bool {
    // SAFETY: plain fcntl on an fd we own.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    fl >= 0 && fl & libc::O_PATH == 0 && fl & libc::O_ACCMODE == flags & libc::O_ACCMODE
}

/// Whether `fd` (from the handover) is `inode`'s file. By device and inode number: the
/// mount id differs, as the source's fd is on a mount of its own sandbox.
fn same_file(fd: &OwnedFd, inode: &Inode) -> bool {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    sys::statx(fd.as_raw_fd(), sys::EMPTY, flags)
        .is_ok_and(|st| st.st.st_dev == inode.key.dev && st.st.st_ino == inode.key.ino)
}

/// Whether `inode`'s file is still at `name` (its parent's id and its name there), told
/// by a statx of the name in the parent's fd: only directories are opened (once each,
/// then cached), where opening each of 100,000 files, most of them no longer holding an
/// fd, was most of a save's time. False: not known, and the caller looks closer.
fn still_named(inode: &Arc<Inode>, name: &Option<(u64, CString)>) -> bool {
    let (Some(parent), Some((_, name))) = (inode.parent(), name) else {
        return false;
    };
    let Ok(dir) = parent.path_fd() else {
        return false;
    };
    sys::statx(dir.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| super::inode::InodeKey::of(&st) == inode.key && st.st.st_nlink > 0)
}

/// Nodes found again at once in a load (`PassthroughFs::restore`): a few times the
/// cores, far below any fd limit.
const FIND_BATCH: usize = 2048;

/// A node's file found again: its fd, what statx says of it, and its parent and name.
type Found = (OwnedFd, sys::StatX, Option<(Arc<Inode>, CString)>);

/// The state's nodes by depth: a node is one deeper than its parent if the parent comes
/// before it in the state, else at the top (where a missing parent is then an error,
/// as in the state's order).
fn levels(nodes: &[NodeState]) -> Vec<Vec<&NodeState>> {
    let mut depth: HashMap<u64, usize> = HashMap::with_capacity(nodes.len());
    let mut out: Vec<Vec<&NodeState>> = Vec::new();
    for n in nodes {
        let d = match &n.name {
            Some((p, _)) => depth.get(p).map_or(0, |d| d + 1),
            None => 0,
        };
        depth.insert(n.id, d);
        if out.len() <= d {
            out.resize_with(d + 1, Vec::new);
        }
        out[d].push(n);
    }
    out
}

/// `f` over `items` on the machine's cores (at most 8 threads), results in order; small
/// batches on this thread.
fn in_parallel<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    const SMALL: usize = 512;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    if items.len() < SMALL || threads < 2 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(threads);
    let mut chunks: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter();
    loop {
        let c: Vec<T> = items.by_ref().take(per).collect();
        if c.is_empty() {
            break;
        }
        chunks.push(c);
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|c| s.spawn(move || c.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a node search panicked"))
            .collect()
    })
}

/// A node's fd kept from a dead serving process (`take_over`): its file, and the name
/// the record gives it where its parent came first. A directory must be on the share's
/// own file system (one elsewhere is found again by its name, checked on the way).
#[allow(clippy::type_complexity)]
fn kept_node(
    fd: OwnedFd,
    n: &NodeState,
    restored: &HashMap<u64, Arc<Inode>>,
) -> Result<(OwnedFd, sys::StatX, Option<(Arc<Inode>, CString)>), String> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags).map_err(|e| e.to_string())?;
    if st.st.st_mode & libc::S_IFMT != n.file_type {
        return Err("the fd kept for it is another file type".into());
    }
    let root = restored.get(&ROOT_ID).ok_or("no root")?;
    if n.file_type == libc::S_IFDIR && st.st.st_dev != root.key.dev {
        return Err("a kept directory off the share's file system".into());
    }
    let name = match &n.name {
        Some((p, name)) => match restored.get(p) {
            Some(parent) if parent.is_dir() => Some((parent.clone(), component(name)?)),
            _ => None,
        },
        None => None,
    };
    Ok((fd, st, name))
}

/// Nodes ordered so that each comes after the parent its name is in; a node whose
/// parent is missing (or in a loop of names) keeps no name.
fn parents_first(
    nodes: Vec<crate::recovery::record::NodeState>,
) -> Vec<crate::recovery::record::NodeState> {
    let ids: std::collections::HashSet<u64> = nodes.iter().map(|n| n.id).collect();
    let mut children: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        match &n.name {
            Some((p, _)) if *p != n.id && (ids.contains(p) || *p == ROOT_ID) => {
                children.entry(*p).or_default().push(i)
            }
            _ => roots.push(i),
        }
    }
    let mut order = Vec::with_capacity(nodes.len());
    let mut stack: Vec<u64> = vec![ROOT_ID];
    let mut placed = vec![false; nodes.len()];
    for &i in &roots {
        placed[i] = true;
        order.push(i);
        stack.push(nodes[i].id);
    }
    while let Some(id) = stack.pop() {
        for &c in children.get(&id).map(Vec::as_slice).unwrap_or(&[]) {
            if !placed[c] {
                placed[c] = true;
                order.push(c);
                stack.push(nodes[c].id);
            }
        }
    }
    let mut nodes: Vec<Option<_>> = nodes.into_iter().map(Some).collect();
    let mut out: Vec<_> = order.iter().filter_map(|&i| nodes[i].take()).collect();
    // What a loop of names left unplaced comes last, nameless.
    out.extend(nodes.into_iter().flatten().map(|mut n| {
        n.name = None;
        n
    }));
    out
}

/// A node no name finds, from the source's own fd: taken only for a file with no links
/// left (an open but unlinked one), which is nowhere outside the share either.
#[allow(clippy::type_complexity)]
fn unlinked_node(
    fd: OwnedFd,
    n: &NodeState,
    share_dev: u64,
) -> Result<(OwnedFd, sys::StatX, Option<(Arc<Inode>, CString)>), String> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    let st = sys::statx(fd.as_raw_fd(), sys::EMPTY, flags).map_err(|e| e.to_string())?;
    // Only an unlinked regular file on the share's file system: a directory fd (even a
    // removed one) would lead out of the share through `..`.
    let reg = st.st.st_mode & libc::S_IFMT == libc::S_IFREG && n.file_type == libc::S_IFREG;
    if st.st.st_nlink != 0 || !reg || st.st.st_dev != share_dev {
        return Err("the fd the source passed is not an unlinked regular file of the share".into());
    }
    Ok((fd, st, None))
}

/// A lock the destination must wait for: the source (or someone) holds it now. `retake`
/// is the thread's, which a guest lock call for that handle or owner, or the session's
/// end, calls off. It is the last field, so it is finished only once the filesystem and
/// the handle or record were dropped: a cancel that returns (the session's end) leaves
/// nothing of the wait held, even if its thread had not started yet.
enum LockWait {
    Flock {
        fs: Arc<PassthroughFs>,
        handle: Arc<Handle>,
        typ: i32,
        retake: FinishOwned,
    },
    Posix {
        fs: Arc<PassthroughFs>,
        rec: OwnerRecord,
        retake: FinishOwned,
    },
}

/// Retake threads block in the kernel; they need little stack.
const RETAKE_STACK: usize = 64 * 1024;

/// Runs `lock` (a blocking lock call) until the host grants it (true), it fails, or
/// `retake` is called off (false).
fn granted(retake: &Blocker, lock: impl Fn() -> io::Result<()>) -> bool {
    match retake.retry(lock) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => false,
        Err(e) => {
            log::warn!("migration: taking a lock again: {e}");
            false
        }
    }
}

/// Takes every range of `ranges` on description `fd`: blocked on one until the host grants
/// it, then the others without waiting. If one is refused, everything goes and it waits on
/// that one instead. So it never holds a range while it waits, and can't deadlock with a
/// third party that holds one range and waits for another (OFD locks have no deadlock
/// detection). The source lets go of them all at once (it exits), so the first grant is
/// normally the last wait.
fn take_all(retake: &Blocker, fd: std::os::fd::RawFd, ranges: &[Range]) -> bool {
    let mut next = 0;
    loop {
        let Some(first) = ranges.get(next) else {
            return true; // no range at all
        };
        if !granted(retake, || filelocks::ofd_lock(fd, first, true)) {
            return false;
        }
        match ranges
            .iter()
            .position(|r| filelocks::ofd_lock(fd, r, false).is_err())
        {
            None => return true,
            Some(i) => {
                filelocks::ofd_unlock_all(fd);
                next = i;
            }
        }
    }
}

impl LockWait {
    /// Waits on a thread of its own, blocked in the host's lock call, until granted or
    /// called off (a guest lock call for the handle or owner, which then decides; the
    /// session's end: a reset, a new INIT, another load).
    fn spawn(self) {
        let (fs, retake) = match &self {
            LockWait::Flock { fs, retake, .. } | LockWait::Posix { fs, retake, .. } => {
                (fs.clone(), retake.0.clone())
            }
        };
        let session = fs.session();
        fs.register_retake(retake);
        drop(fs);
        // The wait is finished when `this` is dropped, on every way out of the thread (or
        // here, if there is no thread): whoever waits for it finds nothing of it left.
        let r = std::thread::Builder::new()
            .name("vfsd-lock-retake".into())
            .stack_size(RETAKE_STACK)
            .spawn(move || {
                let this = self;
                let live = |fs: &PassthroughFs| fs.session() == session;
                match &this {
                    LockWait::Flock {
                        fs,
                        handle,
                        typ,
                        retake,
                    } => {
                        let fd = handle.fd.as_raw_fd();
                        let got = retake.start()
                            && live(fs)
                            && granted(retake, || filelocks::flock(fd, *typ, true));
                        let mut pending = handle.flock_pending.lock().unwrap();
                        if !pending.as_ref().is_some_and(|p| Arc::ptr_eq(p, &retake.0)) {
                            // The guest's own flock call took over. It waited for this
                            // thread, then converted or dropped what was granted; unless it
                            // gave up waiting (a lock call that ignores the signal), and
                            // then this grant came after it: the description goes back to
                            // what the guest holds.
                            if got && retake.was_abandoned() {
                                let held = handle.flock.load(Ordering::Relaxed);
                                if held != *typ {
                                    let _ = filelocks::flock(fd, held, false);
                                }
                            }
                            return;
                        }
                        *pending = None;
                        if got && live(fs) {
                            handle.flock.store(*typ, Ordering::Relaxed);
                        } else if got {
                            let _ = filelocks::flock(fd, libc::F_UNLCK, false);
                        }
                    }
                    LockWait::Posix { fs, rec, retake } => {
                        let (node, owner) = (rec.node, rec.owner);
                        if !retake.start() || !live(fs) {
                            fs.locks.drop_pending(node, owner, &retake.0);
                            return;
                        }
                        let fd = match fs.lock_description(node)(fs.cfg.readonly) {
                            Ok(fd) => fd,
                            Err(e) => {
                                log::warn!("migration: lock owner {owner:#x}: {e}");
                                fs.locks.drop_pending(node, owner, &retake.0);
                                return;
                            }
                        };
                        // On a fresh description; called off, closing it drops what it took.
                        let got = take_all(retake, fd.as_raw_fd(), &rec.ranges);
                        if !got {
                            fs.locks.drop_pending(node, owner, &retake.0);
                            return;
                        }
                        let keep = || live(fs) && fs.handles_open(node, &rec.handles);
                        if let Err(e) = fs.locks.install_pending(rec, fd, &retake.0, keep) {
                            log::warn!("migration: lock owner {owner:#x}: {e}");
                        }
                    }
                }
            });
        if let Err(e) = r {
            log::warn!("migration: no thread to wait for a lock: {e}");
        }
    }
}

impl PassthroughFs {
    /// Lists a lock retake, for the session's end to call off.
    fn register_retake(&self, retake: Arc<Blocker>) {
        let mut all = self.retakes.lock().unwrap();
        all.retain(|b| !b.is_finished());
        all.push(retake);
    }

    /// Calls off every lock retake (the session ends) and waits for their threads.
    pub(super) fn cancel_retakes(&self) {
        let all = std::mem::take(&mut *self.retakes.lock().unwrap());
        super::wake::cancel_all(&all);
    }

    /// Whether any of `handles` of `node` is still open.
    fn handles_open(&self, node: u64, handles: &[u64]) -> bool {
        handles.iter().any(|&fh| self.handles.get(fh, node).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passthrough::Config;

    fn bytes(state: &State) -> Vec<u8> {
        let body = postcard::to_stdvec(state).unwrap();
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn empty() -> State {
        State {
            mode: Mode::FindPaths,
            flags: 0,
            next_node: 2,
            next_handle: 1,
            nodes: Vec::new(),
            handles: Vec::new(),
            owners: Vec::new(),
            handover: None,
            in_flight: Vec::new(),
        }
    }

    fn fs(dir: &std::path::Path) -> Arc<PassthroughFs> {
        Arc::new(PassthroughFs::new(Config::new(dir)).unwrap())
    }

    /// A POSIX lock retake of `fs` with no ranges, finishing `retake` when dropped.
    fn posix_wait(fs: &Arc<PassthroughFs>, retake: &Arc<Blocker>) -> LockWait {
        LockWait::Posix {
            fs: fs.clone(),
            rec: OwnerRecord {
                node: 2,
                owner: 7,
                pid: 1,
                handles: vec![1],
                ranges: Vec::new(),
            },
            retake: FinishOwned(retake.clone()),
        }
    }

    #[test]
    fn a_session_end_waits_for_a_retake_whose_thread_had_not_started_to_let_go_of_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let retake = Arc::new(Blocker::holding_before_start());
        let wait = posix_wait(&fs, &retake);
        fs.register_retake(retake);
        // A retake thread that has not run yet: it holds the filesystem until the
        // scheduler gets to it, then sees it was called off and ends.
        let late = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(wait);
        });
        fs.cancel_retakes();
        assert_eq!(
            Arc::strong_count(&fs),
            1,
            "the session's end returned while a retake still held the filesystem"
        );
        late.join().unwrap();
    }

    #[test]
    fn a_wait_never_handed_to_a_thread_is_finished_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let retake = Arc::new(Blocker::holding_before_start());
        drop(posix_wait(&fs, &retake));
        assert!(retake.is_finished());
        let t = std::time::Instant::now();
        retake.cancel();
        assert!(t.elapsed() < std::time::Duration::from_millis(500));
    }

    #[test]
    fn a_retake_holds_no_range_while_it_waits_so_a_third_party_waiting_for_one_goes_on() {
        use std::os::fd::AsRawFd;
        crate::passthrough::wake::install_wake_handler();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let open = || {
            std::fs::File::options()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let r = |start, end| Range::new(start, end, libc::F_WRLCK as u32).unwrap();
        let (a, b) = (r(0, 9), r(20, 29));
        // The source holds A, a third party B.
        let (source, third) = (open(), open());
        filelocks::ofd_lock(source.as_raw_fd(), &a, false).unwrap();
        filelocks::ofd_lock(third.as_raw_fd(), &b, false).unwrap();
        let retake = Arc::new(Blocker::default());
        let (mine, rt) = (open(), retake.clone());
        let t = std::thread::spawn(move || {
            let _done = crate::passthrough::wake::Finish(&rt);
            assert!(rt.start());
            take_all(&rt, mine.as_raw_fd(), &[a, b]).then_some(mine)
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(source);
        std::thread::sleep(std::time::Duration::from_millis(100));
        // The third party now waits for A too. A retake holding A while it waits for B
        // would leave both waiting for ever (OFD locks have no deadlock detection).
        let (tx, rx) = std::sync::mpsc::channel();
        let t2 = std::thread::spawn(move || {
            let got = filelocks::ofd_lock(third.as_raw_fd(), &a, true);
            tx.send(got.is_ok()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(third); // lets go of both
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(3));
        if got.is_err() {
            retake.cancel(); // unblock both before failing
        }
        assert_eq!(got, Ok(true), "the third party never got A: a deadlock");
        t2.join().unwrap();
        let mine = t
            .join()
            .unwrap()
            .expect("the retake was not granted both ranges");
        let probe = open();
        for x in [a, b] {
            assert!(
                filelocks::ofd_lock(probe.as_raw_fd(), &x, false).is_err(),
                "the retake does not hold {x:?}"
            );
        }
        drop(mine);
    }

    #[test]
    fn id_counters_near_wrapping_or_far_past_the_state_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        fs.load_state(&bytes(&empty())).unwrap();
        for (node, fh) in [
            (u64::MAX, 1),
            (2, u64::MAX),
            (MAX_ID_GAP + 10, 1),
            (1, 1),
            (2, 0),
        ] {
            let s = State {
                next_node: node,
                next_handle: fh,
                ..empty()
            };
            assert!(fs.load_state(&bytes(&s)).is_err(), "{node} {fh}");
        }
    }

    #[test]
    fn a_state_of_the_other_mode_or_with_flags_not_offered_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let other = State {
            mode: Mode::FileHandles,
            ..empty()
        };
        assert!(matches!(
            fs.load_state(&bytes(&other)),
            Err(StateError::Malformed(_))
        ));
        let flags = State {
            flags: 1 << 62,
            ..empty()
        };
        assert!(matches!(
            fs.load_state(&bytes(&flags)),
            Err(StateError::Flags(_))
        ));
        // A --no-open source's guest names files by handle 0, which only --no-open serves.
        let no_open = State {
            flags: NO_OPEN_SESSION,
            ..empty()
        };
        assert!(matches!(
            fs.load_state(&bytes(&no_open)),
            Err(StateError::Malformed(m)) if m.contains("--no-open")
        ));
    }

    /// vfsd does not offer FUSE_ATOMIC_O_TRUNC, but an older vfsd did: its guest sends O_TRUNC
    /// in OPEN, which OPEN still serves.
    #[test]
    fn a_session_with_atomic_o_trunc_from_an_older_source_loads() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let atomic_o_trunc = State {
            flags: crate::abi::flags::ATOMIC_O_TRUNC,
            ..empty()
        };
        assert!(fs.load_state(&bytes(&atomic_o_trunc)).is_ok());
    }

    #[test]
    fn a_second_node_for_a_known_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let fs = fs(dir.path());
        let node = |id| NodeState {
            id,
            lookups: 1,
            file_type: libc::S_IFREG,
            name: Some((ROOT_ID, b"f".to_vec())),
            path: None,
            handle: None,
            mount_root: false,
            error: None,
        };
        let s = State {
            next_node: 4,
            nodes: vec![node(2), node(3)],
            ..empty()
        };
        assert!(fs.load_state(&bytes(&s)).is_err());
        let dir_as_root = State {
            next_node: 3,
            nodes: vec![NodeState {
                file_type: libc::S_IFDIR,
                path: Some(b"..".to_vec()),
                ..node(2)
            }],
            ..empty()
        };
        assert!(fs.load_state(&bytes(&dir_as_root)).is_err());
    }

    /// A body: `empty()`'s fields around `nodes` given encoded by hand.
    fn with_raw_nodes(count: usize, each: &[u8]) -> Vec<u8> {
        let mut body = postcard::to_stdvec(&(Mode::FindPaths, 0u64, 2u64, 1u64)).unwrap();
        body.extend_from_slice(&postcard::to_stdvec(&(count as u64)).unwrap()[..]);
        for _ in 0..count {
            body.extend_from_slice(each);
        }
        // No handles, owners, requests in flight or handover.
        body.extend_from_slice(&[0, 0, 0, 0]);
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn a_stream_with_more_nodes_than_the_cap_is_refused_before_any_is_decoded() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        // The smallest node there is: id 3, no lookups, no type, no name: 7 bytes, about
        // 128 in memory once decoded.
        let minimal = [3, 0, 0, 0, 0, 0, 0];
        let ok = with_raw_nodes(1, &minimal);
        assert!(fs.load_state(&ok).is_err()); // id 3 is past next_node: decoded, refused
        assert_eq!(caps::decoded(), 1, "the count does not see decoded nodes");
        let flood = with_raw_nodes(MAX_NODES + 1, &minimal);
        assert!(flood.len() < MAX_STATE);
        match fs.load_state(&flood) {
            Err(StateError::Malformed(why)) => assert!(why.contains("over the limit"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            caps::decoded(),
            0,
            "nodes decoded before the count was checked"
        );
    }

    #[test]
    fn lock_ranges_over_what_the_destination_lets_a_guest_hold_are_refused_before_decoding() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let cap = fs.cfg.max_locks + 2 * fs.cfg.max_lock_waiters;
        let owner = |n: usize| OwnerState {
            node: 2,
            owner: 1,
            pid: 1,
            handles: vec![1],
            ranges: vec![(0, 0, libc::F_WRLCK); n],
        };
        // Over all owners: two of more than half the cap each.
        let half = cap / 2 + 1;
        let s = State {
            owners: vec![owner(half), owner(half)],
            ..empty()
        };
        match fs.load_state(&bytes(&s)) {
            Err(StateError::Malformed(why)) => assert!(why.contains("lock ranges"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The first owner's ranges and the two owners' handle lists: not the second's ranges.
        assert_eq!(caps::decoded(), 2 + half + 1);
        // The handles owners name, the same way: 8 bytes in memory for each byte.
        let many = |n: usize| OwnerState {
            handles: vec![1; n],
            ..owner(1)
        };
        let half = MAX_HANDLES / 2 + 1;
        let s = State {
            owners: vec![many(half), many(half)],
            ..empty()
        };
        match fs.load_state(&bytes(&s)) {
            Err(StateError::Malformed(why)) => assert!(why.contains("handles of lock"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(caps::decoded(), half + 1 + 1);
    }

    #[test]
    fn a_save_too_large_binds_no_handover_socket_and_shares_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let private = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(run.path(), private).unwrap();
        let rd = sys::openat(
            libc::AT_FDCWD,
            &CString::new(run.path().as_os_str().as_encoded_bytes()).unwrap(),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
        .unwrap();
        let mut cfg = Config::new(dir.path());
        cfg.runtime_dir = Some(Arc::new(handover::RuntimeDir::from_fd(rd).unwrap()));
        let fs = Arc::new(PassthroughFs::new(cfg).unwrap());
        let sockets = || std::fs::read_dir(run.path()).unwrap().count();
        assert!(matches!(
            fs.save_state_within(&[], HEADER_LEN + 8),
            Err(StateError::TooLarge(_))
        ));
        assert_eq!(sockets(), 0, "a handover socket for a state never sent");
        assert!(!fs.locks.shared.load(Ordering::Acquire));
        // Within the limit: offered.
        fs.save_state_within(&[], MAX_STATE).unwrap();
        assert_eq!(sockets(), 1);
        assert!(fs.locks.shared.load(Ordering::Acquire));
    }

    #[test]
    fn too_many_or_too_large_requests_in_flight_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs(dir.path());
        let r = |len| InFlight {
            queue: 1,
            head: 0,
            position: 0,
            reply_at: 0,
            request: vec![0; len],
        };
        let one = State {
            in_flight: vec![r(88)],
            ..empty()
        };
        assert_eq!(fs.load_state(&bytes(&one)).unwrap().in_flight, vec![r(88)]);
        let large = State {
            in_flight: vec![r(MAX_IN_FLIGHT_REQUEST + 1)],
            ..empty()
        };
        assert!(fs.load_state(&bytes(&large)).is_err());
        let many = State {
            in_flight: (0..=fs.cfg.max_lock_waiters).map(|_| r(88)).collect(),
            ..empty()
        };
        assert!(fs.load_state(&bytes(&many)).is_err());
    }
}
