//! The crash record: what a serving process keeps, as it serves, in shared memory that
//! outlives it, so that the next one can take its guest over.
//!
//! One sealed memfd, made by the process that stays when the serving process dies (the
//! keeper, `keeper`), mapped shared by the serving process, which writes it as it goes:
//! - the session's INIT flags;
//! - per ring: the avail index it has popped to, the used index it has written, and which
//!   descriptor heads it holds (popped, not yet answered);
//! - per node: its id, lookup count (the node's own counter lives here), host identity,
//!   file handle, last name and the fd number of its O_PATH fd while it holds one;
//! - per open handle: its number, node, flags and fd number.
//!
//! The fds themselves stay open in the fd table the serving process shares with the
//! keeper. Nothing here is trusted by the reader more than a migration state is: a dead
//! process may have been hostile, and every value is checked as it is loaded.
//!
//! Writes are plain stores into the mapping, published by an atomic store last (an id, an
//! index), so a reader after the writer's death sees whole entries or none; a name being
//! changed at the death is marked by an odd sequence number and not used.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

const MAGIC: u64 = u64::from_le_bytes(*b"vfsdcrs1");
/// Bumped when the layout changes: a binary reads only its own.
pub const VERSION: u32 = 1;

/// Rings the record has room for (vfsd serves at most 63 request queues and the
/// high-priority one).
pub const MAX_RINGS: usize = 64;
/// The largest ring virtio allows.
const MAX_RING_SIZE: usize = 32768;
/// Nodes and handles the record has room for: the migration state's bounds.
pub const MAX_NODES: usize = crate::passthrough::migration::MAX_NODES;
pub const MAX_HANDLES: usize = crate::passthrough::migration::MAX_HANDLES;
/// POSIX lock owners the record has room for (each holds at least one lock, so
/// `--max-locks` bounds them far below this).
pub const MAX_OWNERS: usize = 1 << 20;
pub const MAX_NAME: usize = 255;
pub const MAX_HANDLE_BYTES: usize = 128;

/// A head's mark in a ring's part: popped, or popped again after a death.
const POPPED: u8 = 1;
const AGAIN: u8 = 2;

const HEADER: usize = 4096;
const RING: usize = 64 + MAX_RING_SIZE;
const NODE: usize = 512;
const HANDLE: usize = 32;
const OWNER: usize = 32;
const RINGS_AT: usize = HEADER;
const NODES_AT: usize = RINGS_AT + MAX_RINGS * RING;
const HANDLES_AT: usize = NODES_AT + MAX_NODES * NODE;
const OWNERS_AT: usize = HANDLES_AT + MAX_HANDLES * HANDLE;
/// The memfd's size: sparse, so only what is written takes memory.
pub const SIZE: usize = OWNERS_AT + MAX_OWNERS * OWNER;

/// Header fields (byte offsets).
mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const SESSION: usize = 16;
    pub const NEXT_NODE: usize = 24;
    pub const NEXT_HANDLE: usize = 32;
    /// Node and handle slots ever used: a reader looks no further.
    pub const NODE_TOP: usize = 40;
    pub const HANDLE_TOP: usize = 48;
    pub const OWNER_TOP: usize = 56;
}

/// Ring fields (byte offsets in a ring's part).
mod ring {
    /// 1 while the ring runs and this part describes it.
    pub const RUNNING: usize = 0;
    pub const NEXT_AVAIL: usize = 4;
    pub const NEXT_USED: usize = 8;
    /// The head being put on the used ring, plus one (0: none).
    pub const COMPLETING: usize = 12;
    pub const SIZE: usize = 16;
    pub const HEADS: usize = 64;
}

/// Node fields (byte offsets in a node's slot).
mod node {
    pub const ID: usize = 0;
    pub const LOOKUPS: usize = 8;
    pub const PARENT: usize = 16;
    /// Odd while the name is being changed.
    pub const NAME_SEQ: usize = 24;
    pub const FD: usize = 28;
    pub const FILE_TYPE: usize = 32;
    pub const NAME_LEN: usize = 36;
    pub const HANDLE_LEN: usize = 40;
    pub const INO: usize = 48;
    pub const DEV: usize = 56;
    pub const HANDLE: usize = 64;
    pub const NAME: usize = HANDLE + super::MAX_HANDLE_BYTES;
}

/// Handle fields (byte offsets in a handle's slot).
mod handle {
    pub const FH: usize = 0;
    pub const NODE: usize = 8;
    pub const FLAGS: usize = 16;
    pub const FD: usize = 20;
    pub const DIR: usize = 24;
}

/// Lock owner fields (byte offsets in an owner's slot).
mod owner {
    pub const OWNER: usize = 0;
    pub const NODE: usize = 8;
    pub const PID: usize = 16;
    pub const FD: usize = 20;
    /// 1 once the slot is whole (an owner id may be 0).
    pub const USED: usize = 24;
}

/// The mapped record of one serving process.
pub struct Record {
    base: *mut u8,
    _fd: OwnedFd,
    free_nodes: Mutex<Slots>,
    free_handles: Mutex<Slots>,
    free_owners: Mutex<Slots>,
}

// SAFETY: the mapping is shared memory that every access goes through atomics or through
// the slot a caller owns (`NodeSlot`, `HandleSlot`, each written by one owner).
unsafe impl Send for Record {}
// SAFETY: as above.
unsafe impl Sync for Record {}

#[derive(Default)]
struct Slots {
    free: Vec<u32>,
    top: u32,
}

impl Slots {
    fn take(&mut self, cap: usize) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        if (self.top as usize) < cap {
            self.top += 1;
            return Some(self.top - 1);
        }
        None
    }
}

/// A new record: a sealed memfd of `SIZE` bytes.
pub fn create() -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
    let fd = unsafe {
        libc::memfd_create(
            c"vfsd-crash-record".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new fd nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on our fd.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        // A reader maps it whole: nobody may make it shorter (a read past its end would
        // be SIGBUS).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

impl Record {
    /// Maps `fd` (from `create`). `fresh`: a record this process starts writing; else one
    /// a dead process left, checked to be of this layout.
    pub fn map(fd: OwnedFd, fresh: bool) -> io::Result<Record> {
        // SAFETY: F_GET_SEALS only reads the fd's seals.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into a valid out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 || st.st_size as usize != SIZE {
            return Err(io::Error::other("not a crash record of this vfsd"));
        }
        // SAFETY: a shared mapping of the whole memfd, whose size can't shrink (sealed);
        // the pointer is used only within it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let r = Record {
            base: base.cast(),
            _fd: fd,
            free_nodes: Default::default(),
            free_handles: Default::default(),
            free_owners: Default::default(),
        };
        if fresh {
            r.u64(hdr::MAGIC).store(MAGIC, Ordering::Relaxed);
            r.u32(hdr::VERSION).store(VERSION, Ordering::Release);
        } else if r.u64(hdr::MAGIC).load(Ordering::Acquire) != MAGIC
            || r.u32(hdr::VERSION).load(Ordering::Acquire) != VERSION
        {
            return Err(io::Error::other(
                "the crash record is of another vfsd version",
            ));
        }
        Ok(r)
    }

    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < SIZE);
        // SAFETY: every offset used is inside the mapping (constants and slot indices
        // bounded by the caps above).
        unsafe { self.base.add(off) }
    }
    fn u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned offset inside the mapping, which lives as long as self.
        unsafe { &*(self.at(off) as *const AtomicU64) }
    }
    fn u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: 4-aligned offset inside the mapping.
        unsafe { &*(self.at(off) as *const AtomicU32) }
    }
    fn i32(&self, off: usize) -> &AtomicI32 {
        // SAFETY: 4-aligned offset inside the mapping.
        unsafe { &*(self.at(off) as *const AtomicI32) }
    }
    fn u8(&self, off: usize) -> &AtomicU8 {
        // SAFETY: an offset inside the mapping.
        unsafe { &*(self.at(off) as *const AtomicU8) }
    }
    /// Writes `bytes` at `off`, inside a slot its caller owns.
    fn write(&self, off: usize, bytes: &[u8]) {
        debug_assert!(off + bytes.len() <= SIZE);
        // SAFETY: inside the mapping; the slot is the caller's alone to write.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at(off), bytes.len()) }
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping; read after its writer died.
        unsafe { std::ptr::copy_nonoverlapping(self.at(off), v.as_mut_ptr(), len) }
        v
    }

    // ---- session ---------------------------------------------------------------------

    /// The session's INIT flags (0: none yet).
    pub fn set_session(&self, flags: u64) {
        self.u64(hdr::SESSION).store(flags, Ordering::Release);
    }
    pub fn session(&self) -> u64 {
        self.u64(hdr::SESSION).load(Ordering::Acquire)
    }
    pub fn note_next_node(&self, next: u64) {
        self.u64(hdr::NEXT_NODE).fetch_max(next, Ordering::AcqRel);
    }
    pub fn note_next_handle(&self, next: u64) {
        self.u64(hdr::NEXT_HANDLE).fetch_max(next, Ordering::AcqRel);
    }
    pub fn next_ids(&self) -> (u64, u64) {
        (
            self.u64(hdr::NEXT_NODE).load(Ordering::Acquire),
            self.u64(hdr::NEXT_HANDLE).load(Ordering::Acquire),
        )
    }

    // ---- rings -----------------------------------------------------------------------

    fn ring(&self, q: usize) -> Option<usize> {
        (q < MAX_RINGS).then_some(RINGS_AT + q * RING)
    }

    /// Ring `q` runs from avail index `next_avail` with `next_used` written and no head
    /// held (a start, or a restart after a stop).
    pub fn ring_started(&self, q: usize, size: u16, next_avail: u16, next_used: u16) {
        let Some(r) = self.ring(q) else { return };
        self.u32(r + ring::RUNNING).store(0, Ordering::Release);
        for h in 0..usize::from(size).min(MAX_RING_SIZE) {
            self.u8(r + ring::HEADS + h).store(0, Ordering::Relaxed);
        }
        self.u32(r + ring::SIZE)
            .store(size.into(), Ordering::Relaxed);
        self.u32(r + ring::NEXT_AVAIL)
            .store(next_avail.into(), Ordering::Relaxed);
        self.u32(r + ring::NEXT_USED)
            .store(next_used.into(), Ordering::Relaxed);
        self.u32(r + ring::COMPLETING).store(0, Ordering::Relaxed);
        self.u32(r + ring::RUNNING).store(1, Ordering::Release);
    }

    /// Ring `q` as a dead process left it (`st`), until this process takes it up: should
    /// this one die first, the next finds the same.
    pub fn inherit_ring(&self, q: usize, st: &RingState) {
        let Some(r) = self.ring(q) else { return };
        self.ring_started(q, st.size, st.next_avail, st.next_used);
        self.u32(r + ring::RUNNING).store(0, Ordering::Release);
        self.mark(q, st.heads.iter().copied(), st.next_avail, POPPED);
        self.mark(q, st.again.iter().copied(), st.next_avail, AGAIN);
        if let Some(h) = st.completing {
            self.completing(q, h);
        }
        self.u32(r + ring::RUNNING).store(1, Ordering::Release);
    }

    /// Ring `q` stopped: what it held is the device state's business now.
    pub fn ring_stopped(&self, q: usize) {
        if let Some(r) = self.ring(q) {
            self.u32(r + ring::RUNNING).store(0, Ordering::Release);
        }
    }

    /// Heads just popped, the avail index now `next_avail`. Under the ring's lock. The
    /// heads are marked before the index moves: a death between the two leaves heads
    /// marked that the avail ring still offers, which the reader drops (`RingState`).
    pub fn popped(&self, q: usize, heads: impl Iterator<Item = u16>, next_avail: u16) {
        self.mark(q, heads, next_avail, POPPED);
    }

    /// Heads a dead process held, now served again: should this process die too, the
    /// next one answers them EIO rather than run them a third time.
    pub fn popped_again(&self, q: usize, heads: impl Iterator<Item = u16>, next_avail: u16) {
        self.mark(q, heads, next_avail, AGAIN);
    }

    fn mark(&self, q: usize, heads: impl Iterator<Item = u16>, next_avail: u16, how: u8) {
        let Some(r) = self.ring(q) else { return };
        for h in heads {
            if usize::from(h) < MAX_RING_SIZE {
                self.u8(r + ring::HEADS + usize::from(h))
                    .store(how, Ordering::Release);
            }
        }
        self.u32(r + ring::NEXT_AVAIL)
            .store(next_avail.into(), Ordering::Release);
    }

    /// Head `head` is going on the used ring (its entry, then the used index): if the
    /// process dies meanwhile, the guest's used index tells whether it went.
    pub fn completing(&self, q: usize, head: u16) {
        if let Some(r) = self.ring(q) {
            self.u32(r + ring::COMPLETING)
                .store(u32::from(head) + 1, Ordering::Release);
        }
    }

    /// Head `head` is on the used ring, whose index is now `next_used`.
    pub fn completed(&self, q: usize, head: u16, next_used: u16) {
        let Some(r) = self.ring(q) else { return };
        if usize::from(head) < MAX_RING_SIZE {
            self.u8(r + ring::HEADS + usize::from(head))
                .store(0, Ordering::Release);
        }
        self.u32(r + ring::NEXT_USED)
            .store(next_used.into(), Ordering::Release);
        self.u32(r + ring::COMPLETING).store(0, Ordering::Release);
    }

    /// What a dead process left of ring `q`, if it ran.
    pub fn ring_state(&self, q: usize) -> Option<RingState> {
        let r = self.ring(q)?;
        if self.u32(r + ring::RUNNING).load(Ordering::Acquire) != 1 {
            return None;
        }
        let size = self.u32(r + ring::SIZE).load(Ordering::Acquire) as usize;
        let size = size.min(MAX_RING_SIZE);
        let mark = |h: usize| self.u8(r + ring::HEADS + h).load(Ordering::Acquire);
        let heads = (0..size)
            .filter(|&h| mark(h) != 0)
            .map(|h| h as u16)
            .collect();
        let again = (0..size)
            .filter(|&h| mark(h) == AGAIN)
            .map(|h| h as u16)
            .collect();
        let completing = self.u32(r + ring::COMPLETING).load(Ordering::Acquire);
        Some(RingState {
            size: size as u16,
            next_avail: self.u32(r + ring::NEXT_AVAIL).load(Ordering::Acquire) as u16,
            next_used: self.u32(r + ring::NEXT_USED).load(Ordering::Acquire) as u16,
            completing: completing.checked_sub(1).map(|h| h as u16),
            heads,
            again,
        })
    }

    // ---- nodes -----------------------------------------------------------------------

    /// A slot for node `id`, or None when the record is full (the node is then lost to a
    /// crash; counted by the caller).
    pub fn new_node(self: &std::sync::Arc<Self>, n: &NodeEntry<'_>) -> Option<NodeSlot> {
        let i = self.free_nodes.lock().unwrap().take(MAX_NODES)?;
        self.u64(hdr::NODE_TOP)
            .fetch_max(u64::from(i) + 1, Ordering::AcqRel);
        let s = NODES_AT + i as usize * NODE;
        self.u64(s + node::ID).store(0, Ordering::Release);
        self.u64(s + node::LOOKUPS)
            .store(n.lookups, Ordering::Relaxed);
        self.u32(s + node::FILE_TYPE)
            .store(n.file_type, Ordering::Relaxed);
        self.u64(s + node::INO).store(n.ino, Ordering::Relaxed);
        self.u64(s + node::DEV).store(n.dev, Ordering::Relaxed);
        self.i32(s + node::FD).store(n.fd, Ordering::Relaxed);
        let h = n
            .handle
            .filter(|h| h.len() <= MAX_HANDLE_BYTES)
            .unwrap_or(&[]);
        self.write(s + node::HANDLE, h);
        self.u32(s + node::HANDLE_LEN)
            .store(h.len() as u32, Ordering::Relaxed);
        let slot = NodeSlot {
            rec: self.clone(),
            at: s,
            index: i,
        };
        slot.set_name(n.name);
        self.u64(s + node::ID).store(n.id, Ordering::Release);
        self.note_next_node(n.id + 1);
        Some(slot)
    }

    /// Every node a dead process left.
    pub fn nodes(&self) -> Vec<NodeState> {
        let top = (self.u64(hdr::NODE_TOP).load(Ordering::Acquire) as usize).min(MAX_NODES);
        let mut out = Vec::new();
        for i in 0..top {
            let s = NODES_AT + i * NODE;
            let id = self.u64(s + node::ID).load(Ordering::Acquire);
            if id == 0 {
                continue;
            }
            let seq = self.u32(s + node::NAME_SEQ).load(Ordering::Acquire);
            let parent = self.u64(s + node::PARENT).load(Ordering::Acquire);
            let name_len = self.u32(s + node::NAME_LEN).load(Ordering::Acquire) as usize;
            let name = (seq.is_multiple_of(2) && parent != 0 && name_len <= MAX_NAME)
                .then(|| (parent, self.read(s + node::NAME, name_len)));
            let hlen = (self.u32(s + node::HANDLE_LEN).load(Ordering::Acquire) as usize)
                .min(MAX_HANDLE_BYTES);
            out.push(NodeState {
                id,
                lookups: self.u64(s + node::LOOKUPS).load(Ordering::Acquire),
                file_type: self.u32(s + node::FILE_TYPE).load(Ordering::Acquire),
                ino: self.u64(s + node::INO).load(Ordering::Acquire),
                dev: self.u64(s + node::DEV).load(Ordering::Acquire),
                fd: self.i32(s + node::FD).load(Ordering::Acquire),
                handle: (hlen > 0).then(|| self.read(s + node::HANDLE, hlen)),
                name,
            });
        }
        out
    }

    // ---- handles ---------------------------------------------------------------------

    pub fn new_handle(self: &std::sync::Arc<Self>, h: &HandleState) -> Option<HandleSlot> {
        let i = self.free_handles.lock().unwrap().take(MAX_HANDLES)?;
        self.u64(hdr::HANDLE_TOP)
            .fetch_max(u64::from(i) + 1, Ordering::AcqRel);
        let s = HANDLES_AT + i as usize * HANDLE;
        self.u64(s + handle::FH).store(0, Ordering::Release);
        self.u64(s + handle::NODE).store(h.node, Ordering::Relaxed);
        self.i32(s + handle::FLAGS)
            .store(h.flags, Ordering::Relaxed);
        self.i32(s + handle::FD).store(h.fd, Ordering::Relaxed);
        self.u32(s + handle::DIR)
            .store(h.dir as u32, Ordering::Relaxed);
        self.u64(s + handle::FH).store(h.fh, Ordering::Release);
        self.note_next_handle(h.fh + 1);
        Some(HandleSlot {
            rec: self.clone(),
            at: s,
            index: i,
        })
    }

    pub fn handles(&self) -> Vec<HandleState> {
        let top = (self.u64(hdr::HANDLE_TOP).load(Ordering::Acquire) as usize).min(MAX_HANDLES);
        let mut out = Vec::new();
        for i in 0..top {
            let s = HANDLES_AT + i * HANDLE;
            let fh = self.u64(s + handle::FH).load(Ordering::Acquire);
            if fh == 0 {
                continue;
            }
            out.push(HandleState {
                fh,
                node: self.u64(s + handle::NODE).load(Ordering::Acquire),
                flags: self.i32(s + handle::FLAGS).load(Ordering::Acquire),
                fd: self.i32(s + handle::FD).load(Ordering::Acquire),
                dir: self.u32(s + handle::DIR).load(Ordering::Acquire) != 0,
            });
        }
        out
    }
}

impl Record {
    /// A slot for lock owner `o` (None: the record is full; the owner's locks are then
    /// released should this process die).
    pub fn new_owner(self: &std::sync::Arc<Self>, o: &OwnerState) -> Option<OwnerSlot> {
        let i = self.free_owners.lock().unwrap().take(MAX_OWNERS)?;
        self.u64(hdr::OWNER_TOP)
            .fetch_max(u64::from(i) + 1, Ordering::AcqRel);
        let s = OWNERS_AT + i as usize * OWNER;
        self.u32(s + owner::USED).store(0, Ordering::Release);
        self.u64(s + owner::OWNER).store(o.owner, Ordering::Relaxed);
        self.u64(s + owner::NODE).store(o.node, Ordering::Relaxed);
        self.u32(s + owner::PID).store(o.pid, Ordering::Relaxed);
        self.i32(s + owner::FD).store(o.fd, Ordering::Relaxed);
        self.u32(s + owner::USED).store(1, Ordering::Release);
        Some(OwnerSlot {
            rec: self.clone(),
            at: s,
            index: i,
        })
    }

    pub fn owners(&self) -> Vec<OwnerState> {
        let top = (self.u64(hdr::OWNER_TOP).load(Ordering::Acquire) as usize).min(MAX_OWNERS);
        (0..top)
            .map(|i| OWNERS_AT + i * OWNER)
            .filter(|&s| self.u32(s + owner::USED).load(Ordering::Acquire) == 1)
            .map(|s| OwnerState {
                owner: self.u64(s + owner::OWNER).load(Ordering::Acquire),
                node: self.u64(s + owner::NODE).load(Ordering::Acquire),
                pid: self.u32(s + owner::PID).load(Ordering::Acquire),
                fd: self.i32(s + owner::FD).load(Ordering::Acquire),
            })
            .collect()
    }
}

/// A POSIX lock owner, as written and as read back: its locks are on its own open file
/// description `fd`, whose ranges the reader asks the host for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerState {
    pub owner: u64,
    pub node: u64,
    pub pid: u32,
    pub fd: RawFd,
}

/// A lock owner's slot, freed when the owner goes (before its fd closes).
pub struct OwnerSlot {
    rec: std::sync::Arc<Record>,
    at: usize,
    index: u32,
}

impl OwnerSlot {
    /// The guest pid of its last lock request.
    pub fn set_pid(&self, pid: u32) {
        self.rec
            .u32(self.at + owner::PID)
            .store(pid, Ordering::Release);
    }
}

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        self.rec
            .u32(self.at + owner::USED)
            .store(0, Ordering::Release);
        self.rec.free_owners.lock().unwrap().free.push(self.index);
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Record").finish_non_exhaustive()
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no reference into it outlives
        // self (slots hold an Arc of it).
        unsafe { libc::munmap(self.base.cast(), SIZE) };
    }
}

/// A node as `Record::new_node` takes it.
pub struct NodeEntry<'a> {
    pub id: u64,
    pub lookups: u64,
    pub file_type: u32,
    pub ino: u64,
    pub dev: u64,
    pub fd: RawFd,
    pub handle: Option<&'a [u8]>,
    pub name: Option<(u64, &'a [u8])>,
}

/// A node as a dead process left it.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub id: u64,
    pub lookups: u64,
    pub file_type: u32,
    pub ino: u64,
    pub dev: u64,
    /// Its O_PATH fd's number in the dead process's fd table, or -1.
    pub fd: RawFd,
    pub handle: Option<Vec<u8>>,
    pub name: Option<(u64, Vec<u8>)>,
}

/// An open handle, as written and as read back.
#[derive(Debug, Clone)]
pub struct HandleState {
    pub fh: u64,
    pub node: u64,
    pub flags: i32,
    pub fd: RawFd,
    pub dir: bool,
}

/// A ring as a dead process left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingState {
    /// Its size (at most 32,768).
    pub size: u16,
    pub next_avail: u16,
    pub next_used: u16,
    /// A head that was going on the used ring.
    pub completing: Option<u16>,
    /// Heads popped and not answered.
    pub heads: Vec<u16>,
    /// Those of them that were being served again after an earlier death.
    pub again: Vec<u16>,
}

/// A node's slot: its lookup count lives here; freed when the node goes.
pub struct NodeSlot {
    rec: std::sync::Arc<Record>,
    at: usize,
    index: u32,
}

impl NodeSlot {
    /// The node's lookup count.
    pub fn lookups(&self) -> &AtomicU64 {
        self.rec.u64(self.at + node::LOOKUPS)
    }

    /// Where the node was last seen. Called under the node's name lock (one writer).
    pub fn set_name(&self, name: Option<(u64, &[u8])>) {
        let seq = self.rec.u32(self.at + node::NAME_SEQ);
        seq.fetch_add(1, Ordering::AcqRel);
        match name {
            Some((parent, n)) if n.len() <= MAX_NAME => {
                self.rec.write(self.at + node::NAME, n);
                self.rec
                    .u32(self.at + node::NAME_LEN)
                    .store(n.len() as u32, Ordering::Release);
                self.rec
                    .u64(self.at + node::PARENT)
                    .store(parent, Ordering::Release);
            }
            _ => self
                .rec
                .u64(self.at + node::PARENT)
                .store(0, Ordering::Release),
        }
        seq.fetch_add(1, Ordering::AcqRel);
    }

    /// The node's O_PATH fd (-1: none). Set after the fd opens, cleared before it closes.
    pub fn set_fd(&self, fd: RawFd) {
        self.rec
            .i32(self.at + node::FD)
            .store(fd, Ordering::Release);
    }
}

impl Drop for NodeSlot {
    fn drop(&mut self) {
        self.rec.u64(self.at + node::ID).store(0, Ordering::Release);
        self.rec.free_nodes.lock().unwrap().free.push(self.index);
    }
}

/// A handle's slot, freed when the handle goes (before its fd closes).
pub struct HandleSlot {
    rec: std::sync::Arc<Record>,
    at: usize,
    index: u32,
}

impl Drop for HandleSlot {
    fn drop(&mut self) {
        self.rec
            .u64(self.at + handle::FH)
            .store(0, Ordering::Release);
        self.rec.free_handles.lock().unwrap().free.push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pair() -> (Arc<Record>, OwnedFd) {
        let fd = create().unwrap();
        let again = fd.try_clone().unwrap();
        (Arc::new(Record::map(fd, true).unwrap()), again)
    }

    #[test]
    fn nodes_and_handles_written_are_read_back_by_another_mapping() {
        let (rec, fd) = pair();
        let a = rec
            .new_node(&NodeEntry {
                id: 7,
                lookups: 1,
                file_type: libc::S_IFREG,
                ino: 11,
                dev: 12,
                fd: 30,
                handle: Some(&[1, 2, 3]),
                name: Some((1, b"f")),
            })
            .unwrap();
        a.lookups().fetch_add(2, Ordering::Relaxed);
        a.set_name(Some((5, b"g")));
        let gone = rec
            .new_node(&NodeEntry {
                id: 8,
                lookups: 1,
                file_type: libc::S_IFDIR,
                ino: 1,
                dev: 1,
                fd: -1,
                handle: None,
                name: None,
            })
            .unwrap();
        drop(gone);
        let _h = rec
            .new_handle(&HandleState {
                fh: 3,
                node: 7,
                flags: libc::O_RDWR,
                fd: 31,
                dir: false,
            })
            .unwrap();
        let other = Record::map(fd, false).unwrap();
        let nodes = other.nodes();
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!((n.id, n.lookups, n.ino, n.dev, n.fd), (7, 3, 11, 12, 30));
        assert_eq!(n.name, Some((5, b"g".to_vec())));
        assert_eq!(n.handle.as_deref(), Some(&[1u8, 2, 3][..]));
        let hs = other.handles();
        assert_eq!(hs.len(), 1);
        assert_eq!((hs[0].fh, hs[0].node, hs[0].fd), (3, 7, 31));
        assert_eq!(other.next_ids(), (9, 4));
    }

    #[test]
    fn a_ring_keeps_the_heads_popped_and_not_answered() {
        let (rec, fd) = pair();
        rec.ring_started(1, 256, 10, 10);
        rec.popped(1, [4u16, 9, 200].into_iter(), 13);
        rec.completing(1, 9);
        rec.completed(1, 9, 11);
        rec.completing(1, 4);
        let other = Record::map(fd, false).unwrap();
        assert_eq!(
            other.ring_state(1),
            Some(RingState {
                size: 256,
                next_avail: 13,
                next_used: 11,
                completing: Some(4),
                heads: vec![4, 200],
                again: vec![],
            })
        );
        assert_eq!(other.ring_state(0), None);
        rec.ring_stopped(1);
        assert_eq!(other.ring_state(1), None);
    }

    #[test]
    fn a_record_of_another_size_or_unsealed_is_refused() {
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        assert!(Record::map(fd, false).is_err());
    }
}
