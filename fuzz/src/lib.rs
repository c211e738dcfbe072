//! Shared harness for vfsd's fuzz targets.
//!
//! Both targets drive the daemon's real request path: descriptors are laid out in a
//! `GuestMem`, popped from a `virtio_queue::Queue` the way the device (`vfsd::device`)
//! pops them, and served by `vfsd::server::FuseServer::handle` over a `PassthroughFs` on
//! a small temporary directory.
//!
//! - [`request`]: the `fuse_request` target (byte strings become FUSE requests, several per
//!   input, served in order against one server).
//! - [`chain`]: the `descriptor_chain` target (the guest writes arbitrary descriptor tables,
//!   avail rings and indirect tables).
//! - [`state`]: the `migration_state` target (arbitrary bytes loaded as a migration's
//!   device state into a fresh filesystem).
//!
//! Besides "no panic, no hang", every request is checked for:
//! - a used length no larger than the chain's writable bytes;
//! - a reply whose `OutHeader` matches the used length, echoes `unique` and carries a
//!   negative errno (or 0);
//! - a request a waiter thread took (a SETLKW that waits for its lock) answered, its reply
//!   checked as above, or suspended once the input ends and the harness stops its wait as
//!   a ring stop does (`Fixture::settle`); never dropped without either;
//! - no leaked file descriptors once the server is dropped (checked per input).

pub mod chain;
pub mod request;
pub mod state;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader};
use vfsd::passthrough::inode::FileHandleMode;
use vfsd::passthrough::{CachePolicy, Config, PassthroughFs};
use vfsd::server::{FuseServer, GuestMem};
use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddress};

// ---- guest memory layout -------------------------------------------------------------
//
//   0x0000_0000 .. 0x0010_0000  region 0: descriptor table, avail/used rings, indirect tables
//   0x0010_0000 .. 0x0030_0000  region 1: data buffers (requests, replies)
//   0x0030_0000 .. 0x0031_0000  region 2: more data, adjacent to region 1 (a buffer that
//                               crosses the boundary spans two regions)
//   0x0031_0000 ..              nothing: addresses here are outside guest memory

pub const REGION0_SIZE: usize = 0x10_0000;
pub const DATA_BASE: u64 = 0x10_0000;
pub const DATA_SIZE: usize = 0x20_0000;
pub const TAIL_BASE: u64 = 0x30_0000;
pub const TAIL_SIZE: usize = 0x1_0000;
pub const MEM_END: u64 = TAIL_BASE + TAIL_SIZE as u64;

pub const DESC_TABLE: u64 = 0x0;
pub const AVAIL_RING: u64 = 0x8000;
pub const USED_RING: u64 = 0x9000;
/// Indirect tables: `INDIRECT_TABLES` slots of `INDIRECT_SLOT` bytes (4096 descriptors).
pub const INDIRECT_BASE: u64 = 0x1_0000;
pub const INDIRECT_SLOT: u64 = 0x1_0000;
pub const INDIRECT_TABLES: u64 = 8;
/// The device's maximum queue size (`vfsd::device::MAX_QUEUE_SIZE`).
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The largest queue the harness lays out (the table must stay below `AVAIL_RING`).
pub const MAX_FUZZ_QUEUE: u16 = 1024;

pub const VRING_DESC_F_NEXT: u16 = 1;
pub const VRING_DESC_F_WRITE: u16 = 2;
pub const VRING_DESC_F_INDIRECT: u16 = 4;

pub const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();
pub const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();

/// Fresh guest memory (anonymous, zero-filled; pages are only touched when written).
pub fn guest_memory() -> GuestMem {
    GuestMem::from_ranges(&[
        (GuestAddress(0), REGION0_SIZE),
        (GuestAddress(DATA_BASE), DATA_SIZE),
        (GuestAddress(TAIL_BASE), TAIL_SIZE),
    ])
    .expect("guest memory")
}

/// Whether `[addr, addr + len)` lies inside one memory region (what a device can map).
pub fn in_one_region(addr: u64, len: u32) -> bool {
    let end = match addr.checked_add(len as u64) {
        Some(e) => e,
        None => return false,
    };
    [
        (0u64, REGION0_SIZE as u64),
        (DATA_BASE, DATA_SIZE as u64),
        (TAIL_BASE, TAIL_SIZE as u64),
    ]
    .iter()
    .any(|&(b, s)| addr >= b && addr < b + s && end <= b + s)
}

/// Writes one split-queue descriptor (ignoring addresses outside guest memory).
pub fn write_desc(mem: &GuestMem, table: u64, index: u16, d: Desc) {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&d.addr.to_le_bytes());
    raw[8..12].copy_from_slice(&d.len.to_le_bytes());
    raw[12..14].copy_from_slice(&d.flags.to_le_bytes());
    raw[14..16].copy_from_slice(&d.next.to_le_bytes());
    if let Some(a) = table.checked_add(index as u64 * 16) {
        let _ = mem.write_slice(&raw, GuestAddress(a));
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// A split queue as the vhost-user frontend configures it (fixed addresses, power-of-two
/// size), with the device's saved position `next_avail`.
pub fn new_queue(size: u16, event_idx: bool, next_avail: u16) -> Queue {
    let mut q = Queue::new(MAX_QUEUE_SIZE).expect("queue");
    q.set_size(size);
    q.set_desc_table_address(Some(DESC_TABLE as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL_RING as u32), Some(0));
    q.set_used_ring_address(Some(USED_RING as u32), Some(0));
    q.set_event_idx(event_idx);
    q.set_next_avail(next_avail);
    q.set_next_used(next_avail);
    q.set_ready(true);
    q
}

/// Writes the avail ring: `idx`, and `entries` starting at ring slot `first % size`.
pub fn write_avail(mem: &GuestMem, size: u16, idx: u16, first: u16, entries: &[u16]) {
    let _ = mem.write_obj(0u16, GuestAddress(AVAIL_RING));
    let _ = mem.write_obj(idx.to_le(), GuestAddress(AVAIL_RING + 2));
    for (i, e) in entries.iter().enumerate() {
        let slot = (first as usize + i) % size.max(1) as usize;
        let _ = mem.write_obj(e.to_le(), GuestAddress(AVAIL_RING + 4 + 2 * slot as u64));
    }
}

// ---- the filesystem under test -------------------------------------------------------

/// A `FuseServer` over a fresh, small temporary directory.
pub struct Fixture {
    pub server: FuseServer<PassthroughFs>,
    dir: tempfile::TempDir,
    /// Requests served so far that a waiter thread answers later (`settle`).
    later: Mutex<Vec<Expected>>,
}

/// A deferred request (`Served::Later`) and what its reply is checked against.
pub struct Expected {
    pub later: Arc<Later>,
    /// The request header as the device saw it.
    pub hdr: Option<InHeader>,
    /// The chain's writable buffers (address, length).
    pub writable: Vec<(u64, u32)>,
    /// Whether the reply is checked (`check_reply`): the chain target leaves out chains
    /// whose descriptors overlap.
    pub check: bool,
    /// Whether an answer must carry a reply: the guest left room for one.
    pub must_reply: bool,
}

impl Fixture {
    /// `opts` picks the configuration: bit 0 xattr, 1 readonly, 2 writeback, 3-4 cache
    /// policy, 5 allow_direct_io, 6 no parallel direct writes, 7 announce_submounts and
    /// nodes named by file handles (`--inode-file-handles prefer`).
    pub fn new(opts: u8) -> Fixture {
        Self::with(opts, |_| {})
    }

    /// `new`, with the configuration changed by `tweak` before the filesystem is made.
    pub fn with(opts: u8, tweak: impl FnOnce(&mut Config)) -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("vfsd-fuzz-")
            .tempdir_in(tmp_base())
            .expect("temp dir");
        populate(dir.path());
        let mut cfg = Config::new(dir.path());
        cfg.xattr = opts & 0x01 != 0;
        cfg.readonly = opts & 0x02 != 0;
        cfg.writeback = opts & 0x04 != 0;
        cfg.cache = match (opts >> 3) & 3 {
            0 => CachePolicy::Auto,
            1 => CachePolicy::Always,
            2 => CachePolicy::Never,
            _ => CachePolicy::Metadata,
        };
        cfg.allow_direct_io = opts & 0x20 != 0;
        cfg.parallel_direct_writes = opts & 0x40 == 0;
        cfg.announce_submounts = opts & 0x80 != 0;
        cfg.inode_file_handles = if opts & 0x80 != 0 {
            FileHandleMode::Prefer
        } else {
            FileHandleMode::Never
        };
        tweak(&mut cfg);
        let fs = Arc::new(PassthroughFs::new(cfg).expect("PassthroughFs::new"));
        Fixture {
            server: FuseServer::new(fs),
            dir,
            later: Mutex::default(),
        }
    }

    /// Notes a request a waiter thread answers later, for `settle`.
    pub fn expect_later(&self, e: Expected) {
        if tracing() {
            eprintln!(
                "  -> deferred (request opcode {:?})",
                e.hdr.map(|h| h.opcode)
            );
        }
        self.later.lock().unwrap().push(e);
    }

    /// At the end of an input: stops the waits still going, as the device's ring stop
    /// does (the request is suspended, or answered if its wait ended meanwhile), waits
    /// for every deferred request to be answered or suspended, and checks the replies.
    /// A deferred request dropped without either, or still waiting 5 s after the stop,
    /// fails.
    pub fn settle(&self) {
        let all = std::mem::take(&mut *self.later.lock().unwrap());
        for e in &all {
            let stop = {
                let st = e.later.state.lock().unwrap();
                st.end.is_none().then(|| st.stop.clone()).flatten()
            };
            if let Some(stop) = stop {
                stop();
            }
        }
        for e in all {
            let op = e.hdr.map(|h| h.opcode);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut st = e.later.state.lock().unwrap();
            while st.end.is_none() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                assert!(
                    !left.is_zero(),
                    "deferred request (opcode {op:?}) neither answered nor suspended 5 s after its ring stopped"
                );
                st = e.later.ended.wait_timeout(st, left).unwrap().0;
            }
            match st.end.take().unwrap() {
                LaterEnd::Answered { used, mem } => {
                    let capacity: u64 = e.writable.iter().map(|&(_, l)| l as u64).sum();
                    let reply = gather(&mem, &e.writable, OUT_HEADER_LEN);
                    if tracing() {
                        eprintln!("deferred request (opcode {op:?}) answered:");
                    }
                    if e.check {
                        check_reply(e.hdr.as_ref(), used, capacity, &reply);
                    }
                    assert!(
                        used > 0 || !e.must_reply,
                        "deferred opcode {op:?} was answered with nothing although the guest left room for a reply"
                    );
                }
                LaterEnd::Suspended => {
                    if tracing() {
                        eprintln!("deferred request (opcode {op:?}) suspended");
                    }
                }
                LaterEnd::Dropped => {
                    panic!("deferred request (opcode {op:?}) dropped without a reply")
                }
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Whether the temporary directories live on a small filesystem (at most 1 GiB), such as
/// the tmpfs `scripts/fuzz.sh` mounts. `RLIMIT_FSIZE` bounds writes and truncates, but not
/// `fallocate(FALLOC_FL_KEEP_SIZE)`, which could otherwise fill the host disk.
pub fn tmp_is_bounded() -> bool {
    static B: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        let p = std::ffi::CString::new(tmp_base().into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: statvfs fills the struct it is given.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::statvfs(p.as_ptr(), &mut st) };
        r == 0 && (st.f_blocks as u128) * (st.f_frsize as u128) <= 1 << 30
    })
}

/// Largest FALLOCATE length the harness lets through on an unbounded filesystem.
pub const FALLOCATE_CAP: u64 = 16 << 20;

/// On an unbounded filesystem, caps the `length` of a FALLOCATE request in the chain's
/// readable bytes (the only change the harness ever makes to a request it did not build).
pub fn clamp_fallocate(mem: &GuestMem, readable: &[(u64, u32)]) {
    if tmp_is_bounded() {
        return;
    }
    const AT: usize = IN_HEADER_LEN + 16; // FallocateIn.length
    let b = gather(mem, readable, AT + 8);
    if b.len() < AT + 8 || u32::from_le_bytes(b[4..8].try_into().unwrap()) != 43 {
        return;
    }
    if u64::from_le_bytes(b[AT..AT + 8].try_into().unwrap()) > FALLOCATE_CAP {
        scatter(mem, readable, AT, &FALLOCATE_CAP.to_le_bytes());
    }
}

/// Writes `data` into the chain's segments starting `skip` bytes in.
pub fn scatter(mem: &GuestMem, segs: &[(u64, u32)], mut skip: usize, mut data: &[u8]) {
    for &(addr, len) in segs {
        let len = len as usize;
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(data.len());
        let _ = mem.write_slice(&data[..take], GuestAddress(addr + skip as u64));
        data = &data[take..];
        skip = 0;
        if data.is_empty() {
            break;
        }
    }
}

fn tmp_base() -> PathBuf {
    std::env::var_os("VFSD_FUZZ_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// The shared directory every input starts from: node ids are handed out in lookup order
/// (root is 1), so inputs replay deterministically.
fn populate(root: &Path) {
    use std::os::unix::fs::symlink;
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(root.join("f"), &pattern).unwrap();
    std::fs::write(root.join("e"), b"").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/g"), b"inner").unwrap();
    symlink("f", root.join("l")).unwrap();
    symlink("..", root.join("up")).unwrap();
    symlink("/etc", root.join("abs")).unwrap();
    let fifo = std::ffi::CString::new(root.join("p").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
}

// ---- process-wide setup ----------------------------------------------------------------

static INIT: Once = Once::new();

/// Once per process: resource limits, a logger that formats every record (so the crates'
/// trace-level `Debug` output is exercised too), and a warm-up request so lazily opened
/// descriptors do not count as leaks.
pub fn init() {
    // libFuzzer installs its own SIGXFSZ handler (which ends the run) after the init hook:
    // ignore the signal again before every input so EFBIG reaches the daemon code instead.
    // SAFETY: setting a signal's disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // So is its SIGUSR2 handler (it ends the run "gracefully"), and SIGUSR2 is the signal
    // that breaks a lock waiter or a migration's lock retake off: the daemon's own handler
    // again, as `daemon::run` installs it.
    vfsd::server::install_wake_handler();
    INIT.call_once(|| {
        limit_file_size();
        let _ = log::set_logger(&SINK);
        log::set_max_level(if std::env::var_os("VFSD_FUZZ_QUIET").is_some() {
            log::LevelFilter::Off
        } else {
            log::LevelFilter::Trace
        });
        let f = Fixture::new(0);
        let mem = guest_memory();
        let _ = request::serve_one(&f, &mem, &request::Record::new(0, 4096, hdr(26, 1, 1, &[])));
        drop(f);
    });
}

/// Guest writes and truncates may not grow a file beyond 64 MiB; with SIGXFSZ ignored the
/// syscalls fail with EFBIG instead of killing the process.
fn limit_file_size() {
    // SAFETY: plain libc calls with valid arguments.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let lim = libc::rlimit {
            rlim_cur: 64 << 20,
            rlim_max: 64 << 20,
        };
        libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
    }
}

struct Sink;
static SINK: Sink = Sink;
static LOGGED: AtomicU64 = AtomicU64::new(0);

struct Discard(usize);
impl std::fmt::Write for Discard {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

impl log::Log for Sink {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if std::env::var_os("VFSD_FUZZ_LOG").is_some() {
            eprintln!("[{} {}] {}", record.level(), record.target(), record.args());
            return;
        }
        let mut d = Discard(0);
        let _ = write!(d, "{}", record.args());
        LOGGED.fetch_add(d.0 as u64, Ordering::Relaxed);
    }
    fn flush(&self) {}
}

/// `VFSD_FUZZ_TRACE=1`: print one line per served request (for replaying an input by hand).
pub fn tracing() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("VFSD_FUZZ_TRACE").is_some())
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// What the open file descriptors are (for a leak's message).
fn fd_targets() -> Vec<String> {
    let Ok(d) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    d.flatten()
        .map(|e| {
            let to = std::fs::read_link(e.path()).unwrap_or_default();
            format!("{}: {}", e.file_name().to_string_lossy(), to.display())
        })
        .collect()
}

/// Runs `f` and asserts that it leaves no file descriptor open.
pub fn no_fd_leak<R>(f: impl FnOnce() -> R) -> R {
    let before = open_fds();
    let r = f();
    let after = open_fds();
    assert!(
        after <= before,
        "file descriptors leaked: {before} open before the input, {after} after: {:?}",
        fd_targets()
    );
    r
}

// ---- FUSE encoding helpers (seeds and structured blobs) --------------------------------

static UNIQUE: AtomicU64 = AtomicU64::new(1);

/// An `InHeader` with a correct `len`, followed by `body` (the test frontend's layout).
pub fn hdr(opcode: u32, nodeid: u64, unique: u64, body: &[u8]) -> Vec<u8> {
    vfsd::frontend::fuse::request_bytes(opcode, nodeid, unique, &[body])
}

/// A fresh `unique` value (seed building only).
pub fn next_unique() -> u64 {
    UNIQUE.fetch_add(1, Ordering::Relaxed)
}

/// Concatenates ABI structs and raw bytes into a request body.
pub fn body(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// `name\0`.
pub fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

pub fn obj<T: ByteValued>(t: T) -> Vec<u8> {
    t.as_slice().to_vec()
}

/// Opcodes that never get a reply.
pub fn no_reply(op: u32) -> bool {
    matches!(op, 2 | 36 | 41 | 42)
}

/// Reads `n` bytes from the chain's writable segments, in order.
pub fn gather(mem: &GuestMem, segs: &[(u64, u32)], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    for &(addr, len) in segs {
        if out.len() >= n {
            break;
        }
        let take = (n - out.len()).min(len as usize);
        let mut buf = vec![0u8; take];
        if mem.read_slice(&mut buf, GuestAddress(addr)).is_err() {
            break;
        }
        out.extend_from_slice(&buf);
    }
    out
}

/// What serving a chain came to (`serve_chain`).
pub enum Served {
    /// Answered now: the used length (0: nothing written).
    Now(u32),
    /// Taken by a waiter thread (a SETLKW that waits for its lock), to be answered or
    /// suspended later through the harness's `Deferred` (`Fixture::expect_later`).
    Later(Arc<Later>),
}

/// Serves one popped chain as the device (`vfsd::device`) does with a worker pool: a
/// READ is first tried without blocking, and served normally if that attempt gives up.
///
/// A request the server leaves unanswered counts as deferred only if a waiter took its
/// `Deferred` (registered what stops its wait, as `waiters::spawn_waiter` does before it
/// hands the request over); anything else unanswered is `Now(0)`, which the checks treat
/// as no reply.
pub fn serve_chain<M>(
    server: &FuseServer<PassthroughFs>,
    mem: &GuestMem,
    chain: virtio_queue::DescriptorChain<M>,
) -> Served
where
    M: std::ops::Deref<Target = GuestMem> + Clone,
{
    // As the device does: the chain read once, a READ tried without blocking first.
    let mut popped = vfsd::server::Popped::new(mem, chain);
    if popped.opcode() == Some(vfsd::server::Opcode::Read) {
        if let Some(used) = server.try_handle_without_blocking(mem, &mut popped) {
            return Served::Now(used);
        }
    }
    let mut made: Option<Arc<Later>> = None;
    let answered = server.handle(mem, popped, &mut || {
        let later = Arc::new(Later::default());
        made = Some(later.clone());
        Some(Box::new(Deferral(later)))
    });
    match (answered, made) {
        (Some(used), _) => Served::Now(used),
        (None, Some(later)) if later.state.lock().unwrap().taken => Served::Later(later),
        // Neither answered nor handed to a waiter.
        (None, _) => Served::Now(0),
    }
}

/// A request answered after `serve_chain` returned, as the harness's `Deferred` saw it.
#[derive(Default)]
pub struct Later {
    state: Mutex<LaterState>,
    ended: Condvar,
}

#[derive(Default)]
struct LaterState {
    /// A waiter registered what stops its wait (`Deferred::on_stop`).
    taken: bool,
    /// What stops the wait, as a ring stop does (the request is then suspended).
    stop: Option<Arc<dyn Fn() + Send + Sync>>,
    end: Option<LaterEnd>,
}

enum LaterEnd {
    /// `finish`: the used length, and the guest memory the reply was written into: memory
    /// of its own, as the harness reuses its reply buffers for the next requests.
    Answered { used: u32, mem: GuestMem },
    /// `suspend`: left in flight, for the ring to take up again.
    Suspended,
    /// Dropped without either: the request would never be answered.
    Dropped,
}

impl Later {
    fn end(&self, e: LaterEnd) {
        let mut st = self.state.lock().unwrap();
        if st.end.is_none() {
            st.end = Some(e);
        }
        self.ended.notify_all();
    }
}

/// The `Deferred` the harness hands the server: it records how the request ended.
struct Deferral(Arc<Later>);

impl vfsd::server::Deferred for Deferral {
    fn finish(self: Box<Self>, write: &mut dyn FnMut(&GuestMem) -> u32) {
        let mem = guest_memory();
        let used = write(&mem);
        self.0.end(LaterEnd::Answered { used, mem });
    }
    fn on_stop(&self, stop: Box<dyn Fn() + Send + Sync>) -> bool {
        let mut st = self.0.state.lock().unwrap();
        st.taken = true;
        st.stop = Some(Arc::from(stop));
        true
    }
    fn slot(&self) -> vfsd::server::Slot {
        vfsd::server::Slot {
            queue: 1,
            head: 0,
            position: 0,
        }
    }
    fn suspend(self: Box<Self>) {
        self.0.end(LaterEnd::Suspended);
    }
}

impl Drop for Deferral {
    fn drop(&mut self) {
        self.0.end(LaterEnd::Dropped);
    }
}

/// The reply checks shared by both targets. `hdr` is the request header as the device saw
/// it (if the readable part held one), `capacity` the writable bytes of the chain, `reply`
/// the first bytes the device wrote (at least an `OutHeader` if `used >= 16`).
pub fn check_reply(hdr: Option<&InHeader>, used: u32, capacity: u64, reply: &[u8]) {
    assert!(
        used as u64 <= capacity,
        "used length {used} exceeds the chain's {capacity} writable bytes"
    );
    if used == 0 {
        if tracing() {
            eprintln!("  -> no reply (request opcode {:?})", hdr.map(|h| h.opcode));
        }
        return;
    }
    assert!(
        used as usize >= OUT_HEADER_LEN,
        "used length {used} is shorter than a FUSE reply header"
    );
    let mut out = OutHeader::default();
    out.as_mut_slice().copy_from_slice(&reply[..OUT_HEADER_LEN]);
    if tracing() {
        eprintln!(
            "  -> used {used}, error {}, unique {} (request opcode {:?})",
            out.error,
            out.unique,
            hdr.map(|h| h.opcode)
        );
    }
    assert_eq!(
        out.len, used,
        "reply header says {} bytes but the used ring says {used}",
        out.len
    );
    assert!(
        out.error <= 0 && out.error > -4096,
        "reply error {} is not a negative errno",
        out.error
    );
    if out.error != 0 {
        assert_eq!(
            used as usize, OUT_HEADER_LEN,
            "an error reply carries a payload"
        );
    }
    if let Some(h) = hdr {
        assert_eq!(
            out.unique, h.unique,
            "reply does not echo the request's unique"
        );
    }
}

/// With `VFSD_FUZZ_SEEDS=DIR` in the environment, writes the target's seed inputs into DIR
/// (`scripts/fuzz.sh` points it at the corpus before each run).
pub fn write_seeds_if_asked(seeds: fn() -> Vec<(&'static str, Vec<u8>)>) {
    let Some(dir) = std::env::var_os("VFSD_FUZZ_SEEDS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("seed dir");
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
    }
}
