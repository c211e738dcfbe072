//! The FUSE server: turns one virtqueue descriptor chain into one FUSE request and reply,
//! over any filesystem that implements vfsd's `FileSystem` trait (`crate::filesystem`).
//!
//! vfsd decodes and dispatches every opcode itself: one `match` on `Opcode`
//! (`FuseServer::dispatch`), one handler each, in files by the FUSE spec's areas:
//! `session` (INIT with the full 64-bit flags, DESTROY, SYNCFS), `entry` (names and
//! attributes, the creates with their request extensions), `data` (open files: READ and
//! WRITE straight between guest memory and host files), `dir`, `xattr` and `locks`.
//! The wire format (descriptor chains, the request copy, decoding, reply writing) is
//! `wire`'s; fuse-backend-rs gives the ABI structs.
//!
//! Each chain's descriptors are read from the guest's table once and its readable part
//! copied out of guest memory once (`wire::chain::Popped`, `wire::request`): the head of
//! the copy when it is popped, the rest on the thread that serves it. Everything is
//! decided on that reading: where it runs, what it does, and where its reply goes, READ's
//! data and READDIR's entries too (`wire::reply::ReplyData`). A guest rewriting its
//! buffers or its table mid-request can't change the opcode, the arguments or the reply's
//! room between two reads. An opcode that changes something is refused before the
//! filesystem is called if its reply could not be written (`Opcode::effect_reply_size`).
//!
//! A malformed request still gets an errno reply (never one that takes none), so it never
//! leaves the guest waiting. A panic while serving one is answered with EIO.

use std::io;
use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader};
use fuse_backend_rs::api::filesystem::Context;
use log::{debug, error, warn};
use vm_memory::GuestAddress;

use crate::filesystem::{CreateExt, FileSystem, OpenWait};
use crate::stats::Stats;
use waiters::Waiters;
use wire::codec::errno;
use wire::descs::Descs;
use wire::reply::{answer_errno, reply_pieces, reply_sent, OUT_HDR};
use wire::request::{self, Request};

mod data;
mod dir;
mod entry;
mod locks;
pub mod opcode;
mod replay;
mod session;
#[cfg(feature = "test-hooks")]
mod test_hooks;
#[cfg(test)]
mod tests;
mod waiters;
pub(crate) mod wire;
mod xattr;

pub use crate::filesystem::install_wake_handler;
pub use opcode::Opcode;
pub use waiters::{Deferred, Slot};
pub use wire::chain::Popped;
pub use wire::descs::MAX_DESCS;
pub use wire::guest::GuestMem;
pub use wire::init;

/// What serving a request came to.
pub(crate) enum Reply {
    /// A reply to write: its payload, or the errno.
    Payload(io::Result<Vec<u8>>),
    /// A reply its handler wrote into the chain itself (READ, READDIR): the used length.
    Written(u32),
    /// A malformed request, answered with this errno (and counted).
    Malformed(io::Error),
    /// No reply: the opcode takes none (`malformed`: a malformed one, counted).
    Nothing { malformed: bool },
    /// Answered later through a `Deferred` (a SETLKW that waits).
    Later,
    /// Not served: an open would wait for a host lease break, and must not
    /// (`OpenWait::Never`). Nothing was written.
    WouldWait,
}

impl Reply {
    /// A handler that wrote its reply itself (its used length), or failed before.
    fn written(r: io::Result<u32>) -> Reply {
        match r {
            Ok(len) => Reply::Written(len),
            Err(e) => Reply::Payload(Err(e)),
        }
    }
}

/// A reply sent: what the counters need of it.
struct Sent {
    /// The used length.
    len: u32,
    /// Whether the request was malformed.
    malformed: bool,
    /// The errno the reply carries (0 for none, or no reply).
    error: i32,
}

/// One request as its handler sees it.
pub(crate) struct Call<'a> {
    pub mem: &'a GuestMem,
    /// The chain's descriptors, read once.
    pub descs: &'a Descs,
    /// Their writable buffers: the room an effect's check found is the room its reply
    /// is written to.
    pub bufs: &'a [(GuestAddress, u32)],
    /// The request, without its extensions.
    pub req: &'a Request,
    pub hdr: InHeader,
    pub ctx: Context,
    /// The bytes after the header, as copied (`body` is what the header says).
    pub args: &'a [u8],
    /// The create extensions this session agreed to (`FuseServer::negotiated`).
    pub ext: CreateExt,
    pub wait: OpenWait,
}

impl<'a> Call<'a> {
    /// The body: the bytes after the header, as long as the header says.
    pub fn body(&self) -> io::Result<&'a [u8]> {
        request::body(self.req)
    }

    /// The reply `f` makes of the body; a malformed body is answered with its errno.
    pub fn reply(&self, f: impl FnOnce(&'a [u8]) -> io::Result<Vec<u8>>) -> Reply {
        match self.body() {
            Ok(b) => Reply::Payload(f(b)),
            Err(e) => Reply::Malformed(e),
        }
    }

    /// For an opcode that takes no reply: `f` run on the body, if it has one.
    pub fn no_reply(&self, name: &str, f: impl FnOnce(&'a [u8])) -> Reply {
        match self.body() {
            Ok(b) => {
                f(b);
                Reply::Nothing { malformed: false }
            }
            Err(e) => {
                debug!("dropping a malformed {name} ({e})");
                Reply::Nothing { malformed: true }
            }
        }
    }
}

/// Where the device ran a request, beyond the pool (`FuseServer::count_placement`).
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// On its queue thread, the guest waiting on one request at a time.
    ServedAlone,
    /// A READ that would have blocked, served on its queue thread all the same.
    ReadServedAlone,
    /// A READ handed to the pool: one that would have blocked, or one of several large
    /// READs in one pop, spread over the pool.
    ReadHandedOff,
    /// A quick metadata request served on its queue thread beside others in flight
    /// (`Opcode::is_quick_metadata`, in a pop `device::route` allows).
    ServedInline,
    /// A request without a reply (FORGET, BATCH_FORGET, INTERRUPT) served on its queue
    /// thread.
    NoReplyOnQueueThread,
}

/// The FUSE server over filesystem `F`: whoever composes the layers names it (the
/// daemon serves the host directory; the server's own tests a fake).
pub struct FuseServer<F: FileSystem> {
    fs: Arc<F>,
    stats: Stats,
    /// SETLKW requests waiting on their own threads.
    waiters: Arc<Waiters>,
}

impl<F: FileSystem> FuseServer<F> {
    pub fn new(fs: Arc<F>) -> Self {
        FuseServer {
            fs,
            stats: Stats::default(),
            waiters: Arc::default(),
        }
    }

    pub fn fs(&self) -> &Arc<F> {
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
            Reply::Written(len) => Some(len),
            Reply::Later => None,
            // Only under OpenWait::Never (`serve` checks it).
            _ => {
                debug_assert!(false, "a request that may wait said it would not");
                None
            }
        }
    }

    /// `handle`, except that an OPEN or CREATE that would wait for a host lease break
    /// (`FileSystem::is_would_wait`) is not served: the request comes back unanswered,
    /// its copy as it was, for a worker to serve. For a queue thread, which must not wait
    /// that long.
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
            Reply::Written(len) => Ok(Some(len)),
            Reply::WouldWait => {
                self.stats.opens_handed_off.fetch_add(1, Ordering::Relaxed);
                Err(popped)
            }
            _ => Ok(None),
        }
    }

    /// Serves `popped`: `Written` (the used length), `Later` or `WouldWait`.
    fn handle_with<M>(
        &self,
        mem: &GuestMem,
        popped: &mut Popped<M>,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Reply
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let start = Instant::now();
        let (descs, copy) = popped.parts(mem);
        // The room an effect's check finds (`dispatch`) is the room its reply is written to.
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
                    req.hdr.unique, MAX_DESCS
                );
                let len = answer_errno(mem, &bufs, &req.hdr, libc::EINVAL);
                (Some(len), req.hdr.opcode, true, libc::EINVAL)
            }
            Ok(req) => {
                let op = req.hdr.opcode;
                #[cfg(feature = "test-hooks")]
                test_hooks::crash(test_hooks::When::Popped, op);
                // For the lock stall rule: a lock holder that sends anything is busy.
                self.fs.note_caller(req.hdr.pid);
                let served = panic::catch_unwind(AssertUnwindSafe(|| {
                    self.fs
                        .with_open_wait(wait, || self.serve(mem, descs, &bufs, req, defer, wait))
                }));
                #[cfg(feature = "test-hooks")]
                test_hooks::crash(test_hooks::When::Served, op);
                match served {
                    Ok(Ok(s)) => {
                        self.count_fd_exhaustion(&s);
                        if op == Opcode::Read as u32 && s.error == 0 {
                            self.count_read(s.len);
                        }
                        (Some(s.len), op, s.malformed, s.error)
                    }
                    // Counted where it is served.
                    Ok(Err(Reply::WouldWait)) => return Reply::WouldWait,
                    Ok(Err(_)) => (None, op, false, 0),
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
            Some(len) => Reply::Written(len),
            None => Reply::Later,
        }
    }

    /// One request, from its copy `req`: Ok, the reply sent; Err, one not sent now
    /// (`Later` or `WouldWait`). Every reply is written here from what the opcode's
    /// handler came to, into `bufs`, the writable buffers of `descs`.
    fn serve(
        &self,
        mem: &GuestMem,
        descs: &Descs,
        bufs: &[(GuestAddress, u32)],
        req: &Request,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Result<Sent, Reply> {
        let hdr = &req.hdr;
        let (len, malformed, error) = match self.dispatch(mem, descs, bufs, req, defer, wait) {
            // Nothing is written: the guest hears of it from the worker that serves it.
            Reply::Payload(Err(e)) if wait == OpenWait::Never && self.fs.is_would_wait(&e) => {
                return Err(Reply::WouldWait)
            }
            Reply::Payload(r) => {
                let (len, error) = reply_sent(mem, bufs, hdr, r);
                (len, false, error)
            }
            Reply::Written(len) => (len, false, 0),
            Reply::Malformed(e) => {
                let (len, error) = reply_sent(mem, bufs, hdr, Err(e));
                (len, true, error)
            }
            Reply::Nothing { malformed } => (0, malformed, 0),
            r @ (Reply::Later | Reply::WouldWait) => return Err(r),
        };
        Ok(Sent {
            len,
            malformed,
            error,
        })
    }

    /// What request `req` comes to: the one `match` on its opcode, one handler each.
    fn dispatch(
        &self,
        mem: &GuestMem,
        descs: &Descs,
        bufs: &[(GuestAddress, u32)],
        req: &Request,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
        wait: OpenWait,
    ) -> Reply {
        let hdr = req.hdr;
        #[cfg(feature = "test-hooks")]
        test_hooks::panic_for(hdr.nodeid, hdr.opcode);
        let Some(op) = Opcode::of(hdr.opcode) else {
            debug!("opcode {} not supported", hdr.opcode);
            return Reply::Payload(Err(errno(libc::ENOSYS)));
        };
        if let Some(need) = op.effect_reply_size() {
            if reply_pieces(mem, bufs, OUT_HDR + need).is_err() {
                // Refused before it changes anything: a reply that could not be written
                // (too little room, or room outside guest memory) would leave a file
                // made, or a node or handle taken, that the guest never hears of.
                return Reply::Malformed(errno(libc::EINVAL));
            }
        }
        // The request's extensions: the create opcodes use them, the others drop them.
        // Not WRITE's: its copy holds only header and arguments, and the kernel sends it
        // none.
        let taken = match op {
            Opcode::Write => Ok((CreateExt::default(), None)),
            _ => wire::ext::take(req),
        };
        let (ext, cut) = match taken {
            Ok((e, cut)) => (self.negotiated(e), cut),
            Err(e) if op.takes_no_reply() => {
                debug!("dropping a {} with bad extensions (errno {e})", op.name());
                return Reply::Nothing { malformed: true };
            }
            Err(e) => return Reply::Malformed(errno(e)),
        };
        // Without its extensions, where it had any.
        let req = cut.as_ref().unwrap_or(req);
        let c = Call {
            mem,
            descs,
            bufs,
            req,
            hdr,
            ctx: Context::from(&hdr),
            args: req.args(),
            ext,
            wait,
        };
        use Opcode::*;
        match op {
            // Session.
            Init => self.init(&c),
            Destroy => self.destroy(&c),
            Syncfs => self.syncfs(&c),
            NotifyReply => self.notify_reply(&c),
            // Entry.
            Lookup => self.lookup(&c),
            Forget => self.forget(&c),
            BatchForget => self.batch_forget(&c),
            Getattr => self.getattr(&c),
            Setattr => self.setattr(&c),
            Statx => self.statx(&c),
            Readlink => self.readlink(&c),
            Symlink => self.symlink(&c),
            Mknod => self.mknod(&c),
            Mkdir => self.mkdir(&c),
            Create => self.create(&c),
            Tmpfile => self.tmpfile(&c),
            Unlink => self.unlink(&c),
            Rmdir => self.rmdir(&c),
            Rename => self.rename(&c),
            Rename2 => self.rename2(&c),
            Link => self.link(&c),
            Statfs => self.statfs(&c),
            Access => self.access(&c),
            // Data.
            Open => self.open(&c),
            Read => self.read(&c),
            Write => self.write(&c),
            Flush => self.flush(&c),
            Release => self.release(&c),
            Fsync => self.fsync(&c),
            Fallocate => self.fallocate(&c),
            Lseek => self.lseek(&c),
            CopyFileRange => self.copy_file_range(&c),
            Ioctl => self.ioctl(&c),
            Poll => self.poll(&c),
            Bmap => self.bmap(&c),
            Setupmapping | Removemapping => self.no_dax_window(&c),
            // Dir.
            Opendir => self.opendir(&c),
            Readdir => self.readdir(&c),
            Readdirplus => self.readdirplus(&c),
            Releasedir => self.releasedir(&c),
            Fsyncdir => self.fsyncdir(&c),
            // Xattr.
            Setxattr => self.setxattr(&c),
            Getxattr => self.getxattr(&c),
            Listxattr => self.listxattr(&c),
            Removexattr => self.removexattr(&c),
            // Locks.
            Getlk => self.getlk(&c),
            Setlk => self.setlk(&c),
            Setlkw => self.setlkw(&c, defer),
            Interrupt => self.interrupt(&c),
        }
    }

    /// The parts of a create's extensions this session agreed to: a guest can't have a
    /// security context applied without `--security-label`, nor a group without
    /// FUSE_CREATE_SUPP_GROUP, by sending the block anyway.
    fn negotiated(&self, mut e: CreateExt) -> CreateExt {
        if !self.fs.enabled(crate::abi::flags::SECURITY_CTX) {
            e.secctx = None;
        }
        if !self.fs.enabled(crate::abi::flags::CREATE_SUPP_GROUP) {
            e.groups.clear();
        }
        e
    }

    /// The request counters (`--metrics` reads them).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// `--stats`: the counters, with the filesystem's, as one JSON value.
    pub fn stats_snapshot(&self) -> serde_json::Value {
        self.fs.stats_snapshot(&self.stats)
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

    /// A successful READ's data: the reply past its header.
    fn count_read(&self, used_len: u32) {
        let data = (used_len as usize).saturating_sub(std::mem::size_of::<OutHeader>());
        self.stats
            .bytes_read
            .fetch_add(data as u64, Ordering::Relaxed);
    }

    /// Counts a reply of EMFILE or ENFILE: the host's fd limits were reached, and
    /// `--stats` says so.
    fn count_fd_exhaustion(&self, s: &Sent) {
        let header_only = s.len as usize == std::mem::size_of::<OutHeader>();
        if header_only && (s.error == libc::EMFILE || s.error == libc::ENFILE) {
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
}
