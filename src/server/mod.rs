//! The FUSE server: turns one virtqueue descriptor chain into one FUSE request and reply.
//!
//! vfsd decodes and dispatches every opcode itself (`Opcode`, one match in `serve`): INIT
//! with the full 64-bit flags, request extensions, locks, WRITE and READ straight between
//! guest memory and host files, and the rest (`ops`) onto the passthrough filesystem's
//! `FileSystem` methods. fuse-backend-rs gives the ABI structs.
//!
//! Each chain's descriptors are read from the guest's table once and its readable part
//! copied out of guest memory once (`chain::Popped`, `request`): the head of the copy
//! when it is popped, the rest on the thread that serves it. Everything is decided on
//! that reading: where it runs, what it does, and where its reply goes, READ's data and
//! READDIR's entries too (`ops::ReplyData`). A guest rewriting its buffers
//! or its table mid-request can't change the opcode, the arguments or the reply's room
//! between two reads. WRITE's data goes straight from guest
//! memory to the host file (`write`); READ's usual shape is served on the queue thread
//! (`fast_read`).
//!
//! A malformed request still gets an errno reply (never one that takes none), so it never
//! leaves the guest waiting. A panic while serving one is answered with EIO.

use std::io;
use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{CopyFileRangeIn, InHeader, LkIn, OutHeader, WriteOut};
use fuse_backend_rs::api::filesystem::FileSystem;
use log::{debug, error, warn};
use smallvec::SmallVec;
use vm_memory::{Address, ByteValued, GuestAddress};

use crate::passthrough::migration::InFlight;
use crate::passthrough::{nowait, CreateExt, OpenWait, PassthroughFs};

mod chain;
mod create;
mod ext;
mod fast_read;
pub mod init;
mod locks;
mod newer;
pub mod opcode;
mod ops;
mod request;
mod write;
mod xattr;
pub use crate::passthrough::wake::install_wake_handler;
use crate::stats::Stats;
use chain::Descs;
pub use chain::{Popped, MAX_DESCS};
use fast_read::FastRead;
pub use locks::{Deferred, Slot};
pub use opcode::Opcode;

/// Guest memory as the device maps it. Each region carries a dirty-page log that is off
/// until the VMM migrates (VHOST_F_LOG_ALL, SET_LOG_BASE): then every write vfsd makes into
/// guest memory sets the bits of its pages, through vm-memory's writes or, where vfsd reads
/// a host file straight into guest buffers, by hand (`fast_read`).
pub type GuestMem = vm_memory::GuestMemoryMmap<crate::dirty_log::DirtyBitmap>;

/// Sets the dirty-page log bits of `len` bytes at `addr`, which vfsd wrote without
/// vm-memory (a host file read straight into guest buffers). A no-op while the VMM is not
/// logging.
fn log_guest_write(mem: &GuestMem, addr: vm_memory::GuestAddress, len: usize) {
    use vm_memory::bitmap::Bitmap;
    use vm_memory::GuestMemory;
    if let Ok(s) = mem.get_slice(addr, len) {
        s.bitmap().mark_dirty(0, len);
    }
}

/// What `FuseServer::handle_with` did with a request.
enum Handled {
    /// Answered: the used length.
    Answered(u32),
    /// To be answered later, through a `Deferred`.
    Later,
    /// Not served: it would wait, and must not (`OpenWait::Never`).
    WouldWait,
}

/// What `FuseServer::serve` did: `answer`'s result, or nothing for a request that would
/// wait and must not.
enum Served {
    Answered(Option<Answer>),
    WouldWait,
}

/// A reply written (`answer`).
struct Answer {
    /// The used length.
    len: u32,
    /// Whether the request was malformed.
    malformed: bool,
    /// The errno the handler answered (0 for none, or no reply), which the reply carries
    /// unless it could not be written as it was.
    error: i32,
}

/// What serving a request came to (`FuseServer::outcome`); `answer` writes it.
pub(crate) enum Outcome {
    /// A reply: its payload, or the errno.
    Reply(io::Result<Vec<u8>>),
    /// A reply its handler wrote into the chain itself (READ, READDIR): the used length.
    Written(u32),
    /// A malformed request, answered with this errno (and counted).
    Malformed(io::Error),
    /// An opcode that takes no reply (a malformed one counted).
    NoReply { malformed: bool },
    /// Answered later through a `Deferred` (a SETLKW that waits).
    Deferred,
}

impl Outcome {
    /// A handler that wrote its reply itself (its used length), or failed before.
    fn written(r: io::Result<u32>) -> Outcome {
        match r {
            Ok(len) => Outcome::Written(len),
            Err(e) => Outcome::Reply(Err(e)),
        }
    }
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Writes `outcome` into the chain's writable buffers; None for one answered later.
fn answer(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    outcome: Outcome,
) -> Option<Answer> {
    let (len, malformed, error) = match outcome {
        Outcome::Reply(r) => {
            let (len, error) = reply_sent(mem, bufs, hdr, r);
            (len, false, error)
        }
        Outcome::Written(len) => (len, false, 0),
        Outcome::Malformed(e) => {
            let (len, error) = reply_sent(mem, bufs, hdr, Err(e));
            (len, true, error)
        }
        Outcome::NoReply { malformed } => (0, malformed, 0),
        Outcome::Deferred => return None,
    };
    Some(Answer {
        len,
        malformed,
        error,
    })
}

/// A request's body: the bytes after its header, as long as the header says. Too long a
/// request is ENOMEM (the kernel's FUSE never sends one), a header claiming more than was
/// sent EINVAL.
fn body(req: &request::Request) -> io::Result<&[u8]> {
    let len = req.hdr.len as usize;
    if len > request::MAX_REQUEST {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    req.bytes
        .get(request::HDR_LEN..len)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opcodes that never get a reply (FUSE spec).
fn no_reply(op: u32) -> bool {
    Opcode::of(op).is_some_and(Opcode::takes_no_reply)
}

/// Where the device ran a request, beyond the pool (`FuseServer::count_placement`).
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// On its queue thread, the guest waiting on one request at a time.
    ServedAlone,
    /// A READ that would have blocked, served on its queue thread all the same.
    ReadServedAlone,
    /// A READ that would have blocked, handed to the pool.
    ReadHandedOff,
    /// A quick metadata request served on its queue thread beside others in flight
    /// (`Opcode::is_quick_metadata`, in a pop `device::route` allows).
    ServedInline,
    /// A request without a reply (FORGET, BATCH_FORGET, INTERRUPT) served on its queue
    /// thread.
    NoReplyOnQueueThread,
}

pub struct FuseServer {
    fs: Arc<PassthroughFs>,
    stats: Stats,
    /// Fault injection for the tests (`VFSD_TEST_PANIC_NODEID`): requests for this node
    /// panic, so the panic handling is exercised through the real socket.
    panic_nodeid: Option<u64>,
    /// SETLKW requests waiting on their own threads.
    waiters: Arc<locks::Waiters>,
}

impl FuseServer {
    pub fn new(fs: Arc<PassthroughFs>) -> Self {
        FuseServer {
            fs,
            stats: Stats::default(),
            waiters: Arc::default(),
            panic_nodeid: std::env::var("VFSD_TEST_PANIC_NODEID")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    pub fn fs(&self) -> &Arc<PassthroughFs> {
        &self.fs
    }

    /// Serves the request `popped`; returns the number of bytes written to the guest
    /// (the used-ring length). A request that panics is answered with EIO and counted;
    /// the calling worker lives on.
    ///
    /// None: the request is answered later, through the `Deferred` that `defer` makes (a
    /// SETLKW that waits for its lock on a waiter thread).
    pub fn handle<M>(
        &self,
        mem: &GuestMem,
        mut popped: Popped<M>,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Option<u32>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        match self.handle_with(mem, &mut popped, defer, OpenWait::Allowed) {
            Handled::Answered(len) => Some(len),
            Handled::Later => None,
            // Only under OpenWait::Never (`serve` checks it).
            Handled::WouldWait => {
                debug_assert!(false, "a request that may wait said it would not");
                None
            }
        }
    }

    /// `handle`, except that an OPEN or CREATE that would wait for a host lease break
    /// (`passthrough::nowait`) is not served: the request comes back unanswered, its copy
    /// as it was, for a worker to serve. For a queue thread, which must not wait that
    /// long.
    // The request comes back whole only when it would wait: boxing it would cost an
    // allocation on every call instead.
    #[allow(clippy::result_large_err)]
    pub fn handle_unless_it_waits<M>(
        &self,
        mem: &GuestMem,
        mut popped: Popped<M>,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Result<Option<u32>, Popped<M>>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        match self.handle_with(mem, &mut popped, defer, OpenWait::Never) {
            Handled::Answered(len) => Ok(Some(len)),
            Handled::Later => Ok(None),
            Handled::WouldWait => {
                self.stats.opens_handed_off.fetch_add(1, Ordering::Relaxed);
                Err(popped)
            }
        }
    }

    fn handle_with<M>(
        &self,
        mem: &GuestMem,
        popped: &mut Popped<M>,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Handled
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let start = Instant::now();
        let (descs, copy) = popped.parts(mem);
        // The room an effect's check finds (`outcome`) is the room its reply is written to.
        let bufs = descs.writable_bufs();
        let (len, op, bad, error) = match copy {
            Err(request::BadRequest { hdr: None, why }) => {
                warn!("dropping request: {why}");
                (Some(0), 0, true, 0)
            }
            // The header was readable, so the guest learns its request failed.
            Err(request::BadRequest { hdr: Some(h), why }) => {
                warn!("request {} answered EFAULT: {why}", h.unique);
                let len = answer_errno(mem, &bufs, h, libc::EFAULT);
                (Some(len), h.opcode, true, libc::EFAULT)
            }
            Ok(req) if descs.overlong() => {
                warn!(
                    "request {} answered EINVAL: a chain of more than {} descriptors",
                    req.hdr.unique,
                    chain::MAX_DESCS
                );
                let len = answer_errno(mem, &bufs, &req.hdr, libc::EINVAL);
                (Some(len), req.hdr.opcode, true, libc::EINVAL)
            }
            Ok(req) => {
                let op = req.hdr.opcode;
                #[cfg(feature = "test-hooks")]
                crash_hook::check(crash_hook::When::Popped, op);
                // For the lock stall rule: a lock holder that sends anything is busy.
                self.fs.note_caller(req.hdr.pid);
                let served = panic::catch_unwind(AssertUnwindSafe(|| {
                    nowait::with_open_wait(wait, || self.serve(mem, descs, &bufs, req, defer, wait))
                }));
                #[cfg(feature = "test-hooks")]
                crash_hook::check(crash_hook::When::Served, op);
                match served {
                    Ok(Served::Answered(Some(a))) => {
                        self.count_fd_exhaustion(&a);
                        if op == Opcode::Read as u32 && a.error == 0 {
                            self.count_read(a.len);
                        }
                        (Some(a.len), op, a.malformed, a.error)
                    }
                    Ok(Served::Answered(None)) => (None, op, false, 0),
                    // Counted where it is served.
                    Ok(Served::WouldWait) => return Handled::WouldWait,
                    Err(_) => (
                        Some(self.answer_panic(mem, &bufs, &req.hdr)),
                        op,
                        true,
                        libc::EIO,
                    ),
                }
            }
        };
        self.stats.record(op, start.elapsed(), bad, error);
        match len {
            Some(len) => Handled::Answered(len),
            None => Handled::Later,
        }
    }

    /// The request counters (`--metrics` reads them).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// `--stats`: the counters, with the filesystem's, as one JSON value.
    pub fn stats_snapshot(&self) -> serde_json::Value {
        self.stats.snapshot(&self.fs)
    }

    /// Counts where the device ran a request (`device::route`), for `--stats`.
    pub fn count_placement(&self, p: Placement) {
        let c = match p {
            Placement::ServedAlone => &self.stats.served_alone,
            Placement::ReadServedAlone => &self.stats.reads_served_alone,
            Placement::ReadHandedOff => &self.stats.reads_handed_off,
            Placement::ServedInline => &self.stats.served_inline,
            Placement::NoReplyOnQueueThread => &self.stats.no_reply_on_queue_thread,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Serves a request a serving process that died had popped and not answered
    /// (`device::recover`): again where running it twice comes to the same as once,
    /// answered EIO where it may have acted already and a second run would differ (the
    /// table in docs/design.md). A FORGET, BATCH_FORGET or INTERRUPT is not run again (it
    /// has no reply): a count it lowered is at worst left higher, never lower. `twice`:
    /// a serving process already died serving it again, so it is answered EIO: a request
    /// that kills every process that serves it must not kill them all.
    pub fn serve_again<M>(
        &self,
        mem: &GuestMem,
        mut popped: Popped<M>,
        twice: bool,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Option<u32>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let verdict = {
            let (descs, copy) = popped.parts(mem);
            match copy {
                Ok(req) if !descs.overlong() => {
                    let args = &req.bytes[request::HDR_LEN.min(req.bytes.len())..];
                    let v = match self.again(req.hdr.opcode, req.hdr.nodeid, args) {
                        Again::Nothing => Again::Nothing,
                        _ if twice => {
                            warn!(
                                "request {} (opcode {}) was in flight at two deaths in a row; answered EIO",
                                req.hdr.unique, req.hdr.opcode
                            );
                            Again::Eio
                        }
                        v => v,
                    };
                    match v {
                        Again::Run => None,
                        Again::Eio => Some(answer_errno(
                            mem,
                            &descs.writable_bufs(),
                            &req.hdr,
                            libc::EIO,
                        )),
                        Again::Done => Some(reply_into(
                            mem,
                            &descs.writable_bufs(),
                            &req.hdr,
                            Ok(Vec::new()),
                        )),
                        Again::Nothing => Some(0),
                    }
                }
                // Malformed: served as before (an errno, or dropped).
                _ => None,
            }
        };
        self.stats
            .requests_after_crash
            .fetch_add(1, Ordering::Relaxed);
        match verdict {
            Some(len) => Some(len),
            None => self.handle(mem, popped, defer),
        }
    }

    /// What `serve_again` does with a request of `opcode` on `nodeid` with arguments
    /// `args`.
    fn again(&self, opcode: u32, nodeid: u64, args: &[u8]) -> Again {
        use fuse_backend_rs::abi::fuse_abi::{
            CreateIn, FallocateIn, ReleaseIn, SetxattrIn, WriteIn,
        };
        use Opcode::*;
        let Some(op) = Opcode::of(opcode) else {
            return Again::Eio;
        };
        match op {
            Lookup | Getattr | Readlink | Open | Opendir | Read | Readdir | Readdirplus
            | Statfs | Statx | Access | Getxattr | Listxattr | Flush | Fsync | Fsyncdir
            | Syncfs | Getlk | Setlk | Setlkw | Lseek | Bmap | Setattr | CopyFileRange | Init
            | Destroy => Again::Run,
            Forget | BatchForget | Interrupt | NotifyReply => Again::Nothing,
            Write => match request::decode::<WriteIn>(args) {
                Some(w) if self.fs.appends(w.fh, nodeid) => Again::Eio,
                _ => Again::Run,
            },
            Create => match request::decode::<CreateIn>(args) {
                Some(c) if c.flags as i32 & libc::O_EXCL != 0 => Again::Eio,
                _ => Again::Run,
            },
            Setxattr => match request::decode::<SetxattrIn>(args) {
                Some(x) if x.flags as i32 & libc::XATTR_CREATE != 0 => Again::Eio,
                _ => Again::Run,
            },
            Fallocate => {
                const SAME_TWICE: [i32; 5] = [
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_ZERO_RANGE,
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                ];
                match request::decode::<FallocateIn>(args) {
                    Some(f) if SAME_TWICE.contains(&(f.mode as i32)) => Again::Run,
                    _ => Again::Eio,
                }
            }
            Release | Releasedir => match request::decode::<ReleaseIn>(args) {
                // Released before the death: the guest only waits for the answer.
                Some(r) if !self.fs.has_handle(r.fh, nodeid) => Again::Done,
                _ => Again::Run,
            },
            Mknod | Mkdir | Symlink | Link | Unlink | Rmdir | Rename | Rename2 | Tmpfile
            | Removexattr | Ioctl | Poll | Setupmapping | Removemapping => Again::Eio,
        }
    }

    /// Whether a ring stop left requests suspended (`locks`), for the device to resume.
    pub fn any_suspended(&self) -> bool {
        self.waiters.any_suspended()
    }

    /// The suspended requests, for the device state.
    pub fn suspended(&self) -> Vec<InFlight> {
        self.waiters.suspended()
    }

    /// Replaces the suspended requests: a loaded device state's, or none (a reset).
    pub fn set_suspended(&self, list: Vec<InFlight>) {
        self.waiters.set_suspended(list)
    }

    /// Takes the suspended requests of `queue` out, for `resume`.
    pub fn take_suspended(&self, queue: u16) -> Vec<InFlight> {
        self.waiters.take_suspended(queue)
    }

    /// Whether a suspended request is one `resume` takes up: a SETLKW, header and
    /// LkIn exactly (what `locks::spawn_waiter` carries).
    pub fn resumable(&self, r: &InFlight) -> bool {
        let len = std::mem::size_of::<InHeader>() + std::mem::size_of::<LkIn>();
        r.request.len() == len
            && request::decode::<InHeader>(&r.request)
                .is_some_and(|h| h.opcode == Opcode::Setlkw as u32 && h.len as usize == len)
    }

    /// Takes up a suspended request again: a SETLKW waits anew (a waiter thread, answered
    /// through `defer`'s `Deferred`), or is answered now. Returns the reply's length when
    /// answered now. The request is checked as if new: what a state carries is not
    /// trusted more than a guest.
    pub fn resume(
        &self,
        mem: &GuestMem,
        r: &InFlight,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Option<u32> {
        let at = vm_memory::GuestAddress(r.reply_at);
        let hdr_len = std::mem::size_of::<InHeader>();
        let hdr: Option<InHeader> = r.request.get(..hdr_len).and_then(request::decode);
        let Some(hdr) = hdr.filter(|h| h.opcode == Opcode::Setlkw as u32) else {
            warn!("a suspended request that is not a SETLKW: dropped");
            return None;
        };
        let args = &r.request[hdr_len..];
        let answer = |e: Option<io::Error>| {
            let r = e.map_or(Ok(()), Err);
            locks::write_header(mem, at, hdr.unique, &r)
        };
        match self.setlkw(&hdr, args, at, defer) {
            Ok(true) => None,
            Ok(false) => Some(answer(None)),
            Err(e) => Some(answer(Some(e))),
        }
    }

    /// A SETLKW: granted now (`Ok(false)`), or waiting on a waiter thread that answers it
    /// through the `Deferred` that `defer` makes (`Ok(true)`). The request's place in its
    /// ring's share of lock waits is taken first, so a wait past the share costs no owner
    /// description, deadlock walk or waiter place: it is tried without waiting, and
    /// answered ENOLCK if it would wait.
    fn setlkw(
        &self,
        hdr: &InHeader,
        args: &[u8],
        at: GuestAddress,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> io::Result<bool> {
        let Some(d) = defer() else {
            return match locks::setlk(&self.fs, hdr, args, false) {
                Ok(_) => Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    self.fs.count_lock_refusal();
                    Err(errno(libc::ENOLCK))
                }
                Err(e) => Err(e),
            };
        };
        match locks::setlk(&self.fs, hdr, args, true)? {
            None => Ok(false),
            Some(w) => match locks::spawn_waiter(&self.waiters, w, *hdr, args, at, d) {
                Ok(()) => Ok(true),
                Err(e) => {
                    warn!("no lock waiter thread: {e}");
                    Err(errno(libc::ENOLCK))
                }
            },
        }
    }

    /// A successful READ's data: the reply past its header.
    fn count_read(&self, used_len: u32) {
        let data = (used_len as usize).saturating_sub(std::mem::size_of::<OutHeader>());
        self.stats
            .bytes_read
            .fetch_add(data as u64, Ordering::Relaxed);
    }

    /// Counts a reply of EMFILE or ENFILE: the host's fd limits were reached, and
    /// `--stats` says so.
    fn count_fd_exhaustion(&self, a: &Answer) {
        let header_only = a.len as usize == std::mem::size_of::<OutHeader>();
        if header_only && (a.error == libc::EMFILE || a.error == libc::ENFILE) {
            self.stats.fds_exhausted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The reply to a request whose handler panicked: EIO, unless the opcode takes none.
    fn answer_panic(&self, mem: &GuestMem, bufs: &[(GuestAddress, u32)], hdr: &InHeader) -> u32 {
        self.stats.panics.fetch_add(1, Ordering::Relaxed);
        error!(
            "{} request {} panicked; answered EIO",
            crate::stats::opcode_name(hdr.opcode),
            hdr.unique
        );
        answer_errno(mem, bufs, hdr, libc::EIO)
    }

    /// Serves `popped`, a READ by its opcode (callers sort requests by it first), on the
    /// calling thread if it can be answered without blocking (see `passthrough::nowait`);
    /// None leaves it unanswered for `handle`. This is the one no-wait entry point: only
    /// the usual READ shape is tried, anything else goes to the pool.
    pub fn try_handle_without_blocking<M>(
        &self,
        mem: &GuestMem,
        popped: &mut Popped<M>,
    ) -> Option<u32>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let (descs, Ok(req)) = popped.parts(mem) else {
            return None;
        };
        #[cfg(feature = "test-hooks")]
        crash_hook::check(crash_hook::When::Popped, req.hdr.opcode);
        #[cfg(feature = "test-hooks")]
        let op = req.hdr.opcode;
        if descs.overlong() {
            return None;
        }
        let start = Instant::now();
        let tried = panic::catch_unwind(AssertUnwindSafe(|| {
            fast_read::read(&self.fs, mem, req, descs, self.panic_nodeid)
        }));
        let len = match tried {
            Ok(FastRead::Served(len)) => len,
            Ok(FastRead::WouldBlock | FastRead::NotHandled) => return None,
            Err(_) => {
                // The general path serves it again (on this thread or in the pool), and
                // answers EIO if it panics there too.
                self.stats.panics.fetch_add(1, Ordering::Relaxed);
                error!("a READ panicked on the direct path; serving it the general way");
                return None;
            }
        };
        self.stats
            .record(Opcode::Read as u32, start.elapsed(), false, 0);
        self.count_read(len);
        self.stats.reads_direct.fetch_add(1, Ordering::Relaxed);
        self.stats
            .reads_on_queue_thread
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        crash_hook::check(crash_hook::When::Served, op);
        Some(len)
    }

    /// One request, from its copy `req`: the reply written, or None when it is answered
    /// later. Every reply is written here, by `answer`, from what the opcode's handler
    /// came to, into `bufs`, the writable buffers of `descs` (the chain's descriptors, read
    /// once).
    fn serve(
        &self,
        mem: &GuestMem,
        descs: &Descs,
        bufs: &[(GuestAddress, u32)],
        req: &request::Request,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Served {
        let hdr = req.hdr;
        match self.outcome(mem, descs, bufs, req, defer, wait) {
            // Nothing is written: the guest hears of it from the worker that serves it.
            Outcome::Reply(Err(e)) if wait == OpenWait::Never && nowait::is_would_wait(&e) => {
                Served::WouldWait
            }
            outcome => Served::Answered(answer(mem, bufs, &hdr, outcome)),
        }
    }

    /// What request `req` comes to: the one `match` on its opcode, one handler each.
    fn outcome(
        &self,
        mem: &GuestMem,
        descs: &Descs,
        bufs: &[(GuestAddress, u32)],
        req: &request::Request,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Outcome {
        use Outcome::*;
        let hdr = req.hdr;
        if Some(hdr.nodeid) == self.panic_nodeid && hdr.opcode != Opcode::Init as u32 {
            panic!("VFSD_TEST_PANIC_NODEID: request for node {}", hdr.nodeid);
        }
        if let Some(need) = effect_reply_size(hdr.opcode) {
            let len = std::mem::size_of::<OutHeader>() + need;
            if reply_pieces(mem, bufs, len).is_err() {
                // Refused before it changes anything: a reply that could not be written
                // (too little room, or room outside guest memory) would leave a file
                // made, or a node or handle taken, that the guest never hears of.
                return Malformed(errno(libc::EINVAL));
            }
        }
        let Some(op) = Opcode::of(hdr.opcode) else {
            debug!("opcode {} not supported", hdr.opcode);
            return Reply(Err(errno(libc::ENOSYS)));
        };
        // The request's extensions: the create opcodes use them, the others drop them.
        // Not WRITE's: its copy holds only header and arguments, and the kernel sends it
        // none.
        let taken = match op {
            Opcode::Write => Ok((CreateExt::default(), None)),
            _ => ext::take(req),
        };
        let (ext, cut) = match taken {
            Ok((e, cut)) => (self.negotiated(e), cut),
            Err(e) if op.takes_no_reply() => {
                debug!("dropping a {} with bad extensions (errno {e})", op.name());
                return NoReply { malformed: true };
            }
            Err(e) => return Malformed(errno(e)),
        };
        // Without its extensions, where it had any.
        let req = cut.as_ref().unwrap_or(req);
        let (fs, args) = (&*self.fs, req.args());
        match op {
            Opcode::Init => {
                // A new session: no wait of an earlier one goes on.
                self.waiters.cancel_all();
                Reply(self.init(args))
            }
            Opcode::Destroy => {
                self.waiters.cancel_all();
                fs.destroy();
                Reply(Ok(Vec::new()))
            }
            Opcode::Getlk => Reply(locks::getlk(fs, &hdr, args)),
            Opcode::Setlk | Opcode::Setlkw => self.setlk(bufs, &hdr, args, op, defer),
            Opcode::Interrupt => {
                if let Some(u) = locks::interrupt_target(args) {
                    self.waiters.interrupt(u);
                }
                NoReply { malformed: false }
            }
            // The answer to a retrieve notification, which vfsd never sends.
            Opcode::NotifyReply => NoReply { malformed: false },
            Opcode::Create => Reply(create::create(fs, &hdr, args, &ext)),
            Opcode::Open => match body(req) {
                Ok(b) => Reply(ops::open(fs, &hdr, b, wait)),
                Err(e) => Malformed(e),
            },
            Opcode::Mkdir => Reply(create::mkdir(fs, &hdr, args, &ext)),
            Opcode::Mknod => Reply(create::mknod(fs, &hdr, args, &ext)),
            Opcode::Symlink => Reply(create::symlink(fs, &hdr, args, &ext)),
            Opcode::Tmpfile => Reply(newer::tmpfile(fs, &hdr, args, ext)),
            Opcode::Write => match write::write(fs, mem, descs, req) {
                Ok(r) => {
                    if let Some(out) = r.as_ref().ok().and_then(|o| o.get(..4)) {
                        let n = u32::from_le_bytes(out.try_into().unwrap());
                        self.stats
                            .bytes_written
                            .fetch_add(n.into(), Ordering::Relaxed);
                    }
                    Reply(r)
                }
                Err(bad) => Malformed(errno(bad)),
            },
            Opcode::Setxattr if fs.enabled(crate::abi::flags::SETXATTR_EXT) => {
                Reply(xattr::setxattr_ext(fs, &hdr, args).map(|()| Vec::new()))
            }
            Opcode::CopyFileRange => Reply(self.copy_file_range(&hdr, args)),
            Opcode::Syncfs => Reply(fs.syncfs(hdr.nodeid).map(|_| Vec::new())),
            Opcode::Ioctl => Reply(create::ioctl(fs, &hdr, args)),
            Opcode::Statx => Reply(newer::statx(fs, &hdr, args)),
            Opcode::Setupmapping | Opcode::Removemapping => Reply(Err(errno(libc::ENOSYS))),
            Opcode::Read => match body(req) {
                Ok(b) => Outcome::written(ops::read(fs, mem, bufs, &hdr, b)),
                Err(e) => Malformed(e),
            },
            Opcode::Readdir | Opcode::Readdirplus => match body(req) {
                Ok(b) => {
                    let plus = op == Opcode::Readdirplus;
                    Outcome::written(ops::readdir(fs, mem, bufs, &hdr, b, plus))
                }
                Err(e) => Malformed(e),
            },
            Opcode::Lookup
            | Opcode::Forget
            | Opcode::Getattr
            | Opcode::Setattr
            | Opcode::Readlink
            | Opcode::Unlink
            | Opcode::Rmdir
            | Opcode::Rename
            | Opcode::Link
            | Opcode::Statfs
            | Opcode::Release
            | Opcode::Fsync
            | Opcode::Setxattr
            | Opcode::Getxattr
            | Opcode::Listxattr
            | Opcode::Removexattr
            | Opcode::Flush
            | Opcode::Opendir
            | Opcode::Releasedir
            | Opcode::Fsyncdir
            | Opcode::Access
            | Opcode::Bmap
            | Opcode::Poll
            | Opcode::BatchForget
            | Opcode::Fallocate
            | Opcode::Rename2
            | Opcode::Lseek => match body(req) {
                Ok(b) => ops::serve(fs, op, &hdr, b),
                Err(e) if op.takes_no_reply() => {
                    debug!("dropping a malformed {} ({e})", op.name());
                    NoReply { malformed: true }
                }
                Err(e) => Malformed(e),
            },
        }
    }

    /// SETLK, and SETLKW, which may wait for its lock on a waiter thread of its own.
    fn setlk(
        &self,
        bufs: &[(GuestAddress, u32)],
        hdr: &InHeader,
        args: &[u8],
        op: Opcode,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Outcome {
        if op == Opcode::Setlk {
            return match locks::setlk(&self.fs, hdr, args, false) {
                Ok(_) => Outcome::Reply(Ok(Vec::new())),
                Err(e) => Outcome::Reply(Err(e)),
            };
        }
        // A wait's reply is one header written at the first writable buffer: a chain
        // whose first buffer can't take one is refused now, with an errno in whatever
        // room it has. SETLKW takes a reply; leaving it unanswered would leave the
        // guest's caller waiting for good.
        let Some(at) = reply_address(bufs) else {
            return Outcome::Malformed(errno(libc::EINVAL));
        };
        match self.setlkw(hdr, args, at, defer) {
            Ok(true) => Outcome::Deferred,
            Ok(false) => Outcome::Reply(Ok(Vec::new())),
            Err(e) => Outcome::Reply(Err(e)),
        }
    }

    /// INIT (see `init`): negotiates the full 64-bit flags with the filesystem's wants.
    fn init(&self, args: &[u8]) -> io::Result<Vec<u8>> {
        let offer = init::parse(args)?;
        let want = self.fs.negotiate();
        let (out, session) =
            init::reply(&offer, want).ok_or_else(|| io::Error::from_raw_os_error(libc::EPROTO))?;
        if let Some(s) = session {
            log::info!(
                "FUSE INIT: guest 7.{} offered {:#x}; vfsd speaks 7.{}, enabled {:#x}",
                offer.minor,
                offer.flags,
                s.minor,
                s.flags
            );
            self.fs.start_session(s.flags);
        }
        Ok(out)
    }

    /// The parts of a create's extensions this session agreed to: a guest can't have a
    /// security context applied without `--security-label`, nor a group without
    /// FUSE_CREATE_SUPP_GROUP, by sending the block anyway.
    fn negotiated(&self, mut e: crate::passthrough::CreateExt) -> crate::passthrough::CreateExt {
        if !self.fs.enabled(crate::abi::flags::SECURITY_CTX) {
            e.secctx = None;
        }
        if !self.fs.enabled(crate::abi::flags::CREATE_SUPP_GROUP) {
            e.groups.clear();
        }
        e
    }

    fn copy_file_range(&self, hdr: &InHeader, args: &[u8]) -> io::Result<Vec<u8>> {
        request::decode::<CopyFileRangeIn>(args)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
            .and_then(|a| {
                // The reply carries a u32 count; keep within it (as the kernel does).
                let len = a.len.min(u32::MAX as u64 & !0xfff);
                self.fs.copy_file_range(
                    self.fs.kill_privs(hdr.uid, hdr.gid, None),
                    hdr.nodeid,
                    a.fh_in,
                    a.offset_in,
                    a.nodeid_out,
                    a.fh_out,
                    a.offset_out,
                    len,
                    a.flags,
                )
            })
            .map(|n| {
                WriteOut {
                    size: n as u32,
                    padding: 0,
                }
                .as_slice()
                .to_vec()
            })
    }
}

/// The reply payload size of an opcode that changes something (a file, a node's lookup
/// count, a handle) before it replies.
fn effect_reply_size(op: u32) -> Option<usize> {
    use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, OpenOut};
    use std::mem::size_of;
    use Opcode::*;
    Some(match Opcode::of(op)? {
        Lookup | Symlink | Mknod | Mkdir | Link => size_of::<EntryOut>(),
        Create | Tmpfile => size_of::<EntryOut>() + size_of::<OpenOut>(),
        Open | Opendir => size_of::<OpenOut>(),
        Write | CopyFileRange => size_of::<WriteOut>(),
        Setattr => size_of::<AttrOut>(),
        _ => return None,
    })
}

/// Where a reply header goes: the first writable buffer, if it has room for one.
fn reply_address(bufs: &[(GuestAddress, u32)]) -> Option<GuestAddress> {
    bufs.first()
        .filter(|&&(_, len)| len as usize >= std::mem::size_of::<OutHeader>())
        .map(|&(addr, _)| addr)
}

/// The reply to a request that failed before its handler could answer it: `errno`,
/// unless the opcode takes no reply (then nothing is written, and the length is 0).
/// A test build's way to make the serving process die at a chosen request (cargo feature
/// `test-hooks`, never in a release of vfsd): `VFSD_TEST_CRASH=popped:OPCODE[:N]` dies
/// before serving the Nth request of that opcode (default the first), `served:...` after
/// the file system acted and before its reply goes on the used ring; with a last `:every`
/// the supervisor passes the variable on to the processes that replace a dead one (else
/// they never get it). The death is an
/// abort, a real one even for a pid namespace's init, which ignores signals it sends
/// itself.
#[cfg(feature = "test-hooks")]
mod crash_hook {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum When {
        Popped,
        Served,
    }

    fn armed() -> Option<(When, u32, u32)> {
        static ARMED: OnceLock<Option<(When, u32, u32)>> = OnceLock::new();
        *ARMED.get_or_init(|| {
            let v = std::env::var("VFSD_TEST_CRASH").ok()?;
            let mut it = v.split(':');
            let when = match it.next()? {
                "popped" => When::Popped,
                "served" => When::Served,
                _ => return None,
            };
            let op = it.next()?.parse().ok()?;
            let nth = match it.next() {
                None | Some("every") => 1,
                Some(n) => n.parse().ok()?,
            };
            Some((when, op, nth))
        })
    }

    pub fn check(when: When, op: u32) {
        static SEEN: AtomicU32 = AtomicU32::new(0);
        if let Some((w, o, nth)) = armed() {
            if w == when && o == op && SEEN.fetch_add(1, Ordering::Relaxed) + 1 == nth {
                log::warn!("crash hook: dying at opcode {op}");
                std::process::abort();
            }
        }
    }
}

/// What becomes of a request a dead serving process held (`FuseServer::again`).
enum Again {
    /// Served again as if new.
    Run,
    /// Answered EIO.
    Eio,
    /// Answered with success and no payload (a release of a handle already gone).
    Done,
    /// Not served; no reply.
    Nothing,
}

fn answer_errno(mem: &GuestMem, bufs: &[(GuestAddress, u32)], hdr: &InHeader, errno: i32) -> u32 {
    if no_reply(hdr.opcode) {
        return 0;
    }
    reply_into(mem, bufs, hdr, Err(io::Error::from_raw_os_error(errno)))
}

/// Writes a reply (header plus `payload`, or an errno) into a chain's writable buffers
/// (`Descs::writable_bufs`, read once: a guest may point its buffers at its descriptor
/// table, and the room checked must be the room written). Straight into guest memory:
/// the crate's writer would first gather every writable descriptor into a heap list of
/// 64 slices, for one reply of a few dozen bytes.
fn reply_into(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    r: io::Result<Vec<u8>>,
) -> u32 {
    reply_sent(mem, bufs, hdr, r).0
}

/// `reply_into`, with the errno the reply carries (0 for none): EIO for an error without
/// one, EINVAL for a reply that did not fit.
fn reply_sent(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    r: io::Result<Vec<u8>>,
) -> (u32, i32) {
    let (mut error, mut payload) = match r {
        Ok(p) => (0, p),
        Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO), Vec::new()),
    };
    // At most u32::MAX: the chain's iterator ends where its lengths would sum past that.
    let room: usize = bufs.iter().map(|&(_, len)| len as usize).sum();
    let header = std::mem::size_of::<OutHeader>();
    if room < header {
        warn!("no room for a reply header in the guest's buffers; dropping the reply");
        return (0, 0);
    }
    if header + payload.len() > room {
        // The guest left room for a header but not for this reply: an errno still tells
        // it the request is done (as for a request the crate can't answer).
        debug!(
            "reply of {} bytes does not fit; answering EINVAL",
            payload.len()
        );
        (error, payload) = (-libc::EINVAL, Vec::new());
    }
    let out = OutHeader {
        len: (header + payload.len()) as u32,
        error,
        unique: hdr.unique,
    };
    if let Err(e) = write_into(mem, bufs, &[out.as_slice(), &payload]) {
        warn!("reply does not fit the guest's buffers ({e}); dropping it");
        return (0, 0);
    }
    (out.len, -error)
}

/// Writes `parts`, one after the other, into `bufs` (writable descriptors, in order).
/// Err, with nothing written, if they don't all fit or a byte of them would fall outside
/// guest memory; bytes of `bufs` past the parts are never looked at.
fn write_into(mem: &GuestMem, bufs: &[(GuestAddress, u32)], parts: &[&[u8]]) -> io::Result<()> {
    let pieces = reply_pieces(mem, bufs, parts.iter().map(|p| p.len()).sum())?;
    // The pieces hold exactly the parts' bytes, so each piece finds its bytes.
    let mut parts = parts.iter().copied().filter(|p| !p.is_empty());
    let mut part: &[u8] = &[];
    for (addr, n) in pieces {
        let mut off = 0;
        while off < n {
            if part.is_empty() {
                part = parts.next().ok_or_else(|| errno(libc::EIO))?;
            }
            let k = part.len().min(n - off);
            // Within the range `reply_pieces` found in guest memory.
            let at = addr.unchecked_add(off as u64);
            chain::write_guest(mem, &part[..k], at).map_err(|e| io::Error::other(e.to_string()))?;
            (off, part) = (off + k, &part[k..]);
        }
    }
    Ok(())
}

/// The pieces of `bufs` that the first `len` bytes of a reply fill (address, length), each
/// checked to lie in guest memory. Err if `bufs` are too short (ENOSPC) or a piece is not
/// in guest memory (EFAULT).
fn reply_pieces(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    len: usize,
) -> io::Result<SmallVec<[(GuestAddress, usize); 4]>> {
    let mut left = len;
    let mut pieces = SmallVec::new();
    for &(addr, buf_len) in bufs {
        if left == 0 {
            break;
        }
        let n = left.min(buf_len as usize);
        if n == 0 {
            continue;
        }
        if !chain::in_memory(mem, addr, n) {
            return Err(errno(libc::EFAULT));
        }
        pieces.push((addr, n));
        left -= n;
    }
    if left > 0 {
        return Err(errno(libc::ENOSPC));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    const MEM: u64 = 0x10000;
    const HDR: usize = std::mem::size_of::<OutHeader>();
    const W: bool = true;
    const R: bool = false;

    /// The used length of `r` as the reply to a request (unique 9) whose chain is
    /// `descs` (address, length, writable) in guest memory of `regions`, and that memory
    /// after it. Readable buffers are filled with 0xee first.
    fn reply_in(
        regions: &[(u64, usize)],
        descs: &[(u64, u32, bool)],
        r: io::Result<Vec<u8>>,
    ) -> (u32, GuestMem) {
        let ranges: Vec<_> = regions.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        let mem = GuestMem::from_ranges(&ranges).unwrap();
        for &(a, l, _) in descs.iter().filter(|d| !d.2) {
            mem.write_slice(&vec![0xee; l as usize], GuestAddress(a))
                .unwrap();
        }
        let chain = chain::mock_chain(&mem, descs);
        let hdr = InHeader {
            unique: 9,
            ..Default::default()
        };
        let bufs = Descs::read(&chain).writable_bufs();
        (reply_into(&mem, &bufs, &hdr, r), mem)
    }

    /// `reply_in` with one readable descriptor, then writable ones (address, length).
    fn reply_to_writable(writable: &[(u64, u32)], r: io::Result<Vec<u8>>) -> (u32, GuestMem) {
        let descs: Vec<_> = std::iter::once((0x4000, 40, R))
            .chain(writable.iter().map(|&(a, l)| (a, l, W)))
            .collect();
        reply_in(&[(0, MEM as usize)], &descs, r)
    }

    fn bytes_at(mem: &GuestMem, at: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        b
    }

    fn out_header(mem: &GuestMem, at: u64) -> OutHeader {
        mem.read_obj(GuestAddress(at)).unwrap()
    }

    #[test]
    fn a_reply_split_over_writable_descriptors_is_written_in_order() {
        let payload: Vec<u8> = (1..=40).collect();
        // 5 bytes of the header, the rest of it and 3 payload bytes, then the rest.
        let descs = [(0x8000, 5), (0x9000, HDR as u32 - 5 + 3), (0xa000, 100)];
        let (len, mem) = reply_to_writable(&descs, Ok(payload.clone()));
        assert_eq!(len as usize, HDR + payload.len());
        let mut got = bytes_at(&mem, 0x8000, 5);
        got.extend(bytes_at(&mem, 0x9000, HDR - 5 + 3));
        got.extend(bytes_at(&mem, 0xa000, payload.len() - 3));
        let hdr: OutHeader = request::decode(&got).unwrap();
        assert_eq!((hdr.len, hdr.error, hdr.unique), (len, 0, 9));
        assert_eq!(&got[HDR..], &payload[..]);
        // Nothing past the reply: the last descriptor's byte after it is untouched.
        assert_eq!(bytes_at(&mem, 0xa000 + payload.len() as u64 - 3, 1), [0]);
    }

    #[test]
    fn a_reply_goes_only_into_writable_descriptors_between_readable_ones() {
        // Readable, writable, readable, writable: the kernel never sends this shape, but
        // a guest may; the reply skips the readable buffers and leaves them as they were.
        let descs = [
            (0x4000, 40, R),
            (0x8000, 10, W),
            (0x5000, 16, R),
            (0x9000, 64, W),
        ];
        let (len, mem) = reply_in(&[(0, MEM as usize)], &descs, Ok(vec![0x11; 20]));
        assert_eq!(len as usize, HDR + 20);
        assert_eq!(bytes_at(&mem, 0x4000, 40), vec![0xee; 40]);
        assert_eq!(bytes_at(&mem, 0x5000, 16), vec![0xee; 16]);
        let mut got = bytes_at(&mem, 0x8000, 10);
        got.extend(bytes_at(&mem, 0x9000, HDR + 20 - 10));
        assert_eq!(request::decode::<OutHeader>(&got).unwrap().unique, 9);
        assert_eq!(&got[HDR..], &[0x11; 20]);
    }

    #[test]
    fn a_reply_across_two_memory_regions_is_written_whole() {
        let regions = [(0, 0x8000), (0x8000, 0x8000)];
        let descs = [(0x4000, 40, R), (0x7ff8, 64, W)];
        let (len, mem) = reply_in(&regions, &descs, Ok(vec![0x22; 24]));
        assert_eq!(len as usize, HDR + 24);
        let got = bytes_at(&mem, 0x7ff8, HDR + 24);
        assert_eq!(request::decode::<OutHeader>(&got).unwrap().len, len);
        assert_eq!(&got[HDR..], &[0x22; 24]);
    }

    #[test]
    fn an_errno_reply_and_a_reply_too_long_for_the_buffers() {
        let (len, mem) = reply_to_writable(&[(0x8000, 64)], Err(errno(libc::ENOENT)));
        assert_eq!(len as usize, HDR);
        let h = out_header(&mem, 0x8000);
        assert_eq!((h.len as usize, h.error, h.unique), (HDR, -libc::ENOENT, 9));
        // Room for the header only: EINVAL, so the guest still hears the request is done.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32 + 3)], Ok(vec![7; 4]));
        assert_eq!(len as usize, HDR);
        assert_eq!(out_header(&mem, 0x8000).error, -libc::EINVAL);
        // Not even that, or no writable descriptor at all: nothing is written.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32 - 1)], Ok(vec![]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, 0x8000, HDR), vec![0; HDR]);
        assert_eq!(reply_to_writable(&[], Err(errno(libc::EIO))).0, 0);
    }

    #[test]
    fn zero_length_writable_descriptors_are_skipped_even_outside_memory() {
        let descs = [
            (0x8000, 0),
            (MEM + 0x1000, 0),
            (0x8000, 5),
            (u64::MAX - 3, 0),
            (0x9000, 64),
        ];
        let (len, mem) = reply_to_writable(&descs, Ok(vec![1; 8]));
        assert_eq!(len as usize, HDR + 8);
        let mut got = bytes_at(&mem, 0x8000, 5);
        got.extend(bytes_at(&mem, 0x9000, HDR + 8 - 5));
        assert_eq!(request::decode::<OutHeader>(&got).unwrap().unique, 9);
        assert_eq!(&got[HDR..], &[1; 8]);
    }

    #[test]
    fn a_reply_that_exactly_fills_its_buffers_and_one_a_byte_too_long() {
        let (len, _) = reply_to_writable(&[(0x8000, HDR as u32), (0x9000, 8)], Ok(vec![2; 8]));
        assert_eq!(len as usize, HDR + 8);
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32), (0x9000, 7)], Ok(vec![2; 8]));
        assert_eq!(len as usize, HDR);
        assert_eq!(out_header(&mem, 0x8000).error, -libc::EINVAL);
    }

    #[test]
    fn a_reply_that_would_reach_outside_guest_memory_writes_nothing() {
        // The whole header outside, or its second half past the end of memory.
        assert_eq!(
            reply_to_writable(&[(MEM + 0x1000, 64)], Ok(vec![1; 8])).0,
            0
        );
        let (len, mem) = reply_to_writable(&[(MEM - 8, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, MEM - 8, 8), vec![0; 8]);
        // The payload's buffer outside, or past the end of the address space.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32), (MEM, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, 0x8000, HDR), vec![0; HDR]);
        let (len, _) = reply_to_writable(&[(0x8000, 8), (u64::MAX - 3, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        // A bad buffer the reply doesn't reach is never looked at.
        let (len, _) = reply_to_writable(&[(0x8000, 64), (MEM + 0x1000, 64)], Ok(vec![1; 8]));
        assert_eq!(len as usize, HDR + 8);
    }

    /// READ's data goes where its descriptors said when it was popped: a guest that
    /// rewrites its descriptor table meanwhile (another vCPU) gets nothing written where
    /// it points now. Writing through the crate's writer walked the chain again, without
    /// the descriptor cap (`chain::MAX_DESCS`) the pop applied.
    #[test]
    fn a_read_writes_where_its_descriptors_pointed_when_it_was_popped() {
        use fuse_backend_rs::abi::fuse_abi::ReadIn;
        use fuse_backend_rs::api::filesystem::{Context, ROOT_ID};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"the file's data").unwrap();
        let fs = Arc::new(
            crate::passthrough::PassthroughFs::new(crate::passthrough::Config::new(dir.path()))
                .unwrap(),
        );
        let ctx = Context::default();
        let node = fs
            .lookup(&ctx, ROOT_ID, &std::ffi::CString::new("f").unwrap())
            .unwrap()
            .inode;
        let (fh, _, _) = fs.open(&ctx, node, libc::O_RDONLY as u32, 0).unwrap();
        let server = FuseServer::new(fs.clone());
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let args = ReadIn {
            fh: fh.unwrap(),
            size: 15,
            ..Default::default()
        };
        let hdr = InHeader {
            len: (size_of::<InHeader>() + size_of::<ReadIn>()) as u32,
            opcode: Opcode::Read as u32,
            unique: 9,
            nodeid: node,
            ..Default::default()
        };
        let mut req = hdr.as_slice().to_vec();
        req.extend_from_slice(args.as_slice());
        mem.write_slice(&req, GuestAddress(0x4000)).unwrap();
        let chain = chain::mock_chain(&mem, &[(0x4000, req.len() as u32, R), (0x8000, 4096, W)]);
        let popped = Popped::new(&mem, chain);
        // The mock queue's table is at 0; the reply's descriptor is its second.
        mem.write_obj(0x9000u64, GuestAddress(16)).unwrap();
        let mut later =
            || -> Option<Box<dyn Deferred>> { unreachable!("a READ is answered at once") };
        let len = server.handle(&mem, popped, &mut later).unwrap();
        assert_eq!(len as usize, HDR + 15);
        assert_eq!(out_header(&mem, 0x8000).unique, 9);
        assert_eq!(bytes_at(&mem, 0x8000 + HDR as u64, 15), b"the file's data");
        assert_eq!(bytes_at(&mem, 0x9000, HDR + 15), vec![0; HDR + 15]);
    }

    /// A SETLKW whose first writable buffer has no room for the header its wait would
    /// write there (a zero-length descriptor in front, or a short one) is answered EINVAL
    /// in the room after it, not left without a reply.
    #[test]
    fn a_setlkw_whose_first_writable_buffer_is_too_small_gets_einval() {
        use fuse_backend_rs::abi::fuse_abi::{FileLock, LkIn};
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(
            crate::passthrough::PassthroughFs::new(crate::passthrough::Config::new(dir.path()))
                .unwrap(),
        );
        let server = FuseServer::new(fs);
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let args = LkIn {
            fh: 1,
            owner: 1,
            lk: FileLock {
                start: 0,
                end: u64::MAX,
                type_: libc::F_WRLCK as u32,
                pid: 1,
            },
            ..Default::default()
        };
        let hdr = InHeader {
            len: (size_of::<InHeader>() + size_of::<LkIn>()) as u32,
            opcode: Opcode::Setlkw as u32,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        let mut req = hdr.as_slice().to_vec();
        req.extend_from_slice(args.as_slice());
        mem.write_slice(&req, GuestAddress(0x4000)).unwrap();
        for first in [0, HDR as u32 - 1] {
            mem.write_slice(&[0; 64], GuestAddress(0x8000)).unwrap();
            mem.write_slice(&[0; 64], GuestAddress(0x9000)).unwrap();
            let descs = [
                (0x4000, req.len() as u32, R),
                (0x8000, first, W),
                (0x9000, 64, W),
            ];
            let popped = Popped::new(&mem, chain::mock_chain(&mem, &descs));
            let mut defer = || -> Option<Box<dyn Deferred>> { None };
            let len = server.handle(&mem, popped, &mut defer);
            assert_eq!(
                len,
                Some(HDR as u32),
                "first writable buffer of {first} bytes"
            );
            let mut got = bytes_at(&mem, 0x8000, first as usize);
            got.extend(bytes_at(&mem, 0x9000, HDR - first as usize));
            let h: OutHeader = request::decode(&got).unwrap();
            assert_eq!((h.len as usize, h.error, h.unique), (HDR, -libc::EINVAL, 9));
        }
    }
}
