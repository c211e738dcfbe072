//! Locks: GETLK, SETLK, SETLKW (which may wait on a waiter thread of its own, `waiters`)
//! and INTERRUPT, which cancels a waiting SETLKW; and the SETLKWs a ring stop suspended,
//! taken up again (`resume`).

use std::io;

use fuse_backend_rs::abi::fuse_abi::{InHeader, InterruptIn, LkIn, LkOut};
use log::warn;
use vm_memory::{ByteValued, GuestAddress};

use super::waiters::{self, Deferred};
use super::wire::codec::{args, decode, errno};
use super::wire::guest::GuestMem;
use super::wire::reply::reply_address;
use super::{Call, FuseServer, Opcode, Reply};
use crate::filesystem::{FileSystem, InFlight};

/// FUSE_LK_FLOCK in `lk_flags`: a whole-file flock rather than a byte range.
const LK_FLOCK: u32 = 1;

impl<F: FileSystem> FuseServer<F> {
    pub(super) fn getlk(&self, c: &Call) -> Reply {
        let r = args::<LkIn>(c.args).and_then(|a| {
            let flock = a.lk_flags & LK_FLOCK != 0;
            let found = self.fs.getlk(c.hdr.nodeid, a.fh, a.owner, a.lk, flock)?;
            Ok(LkOut { lk: found }.as_slice().to_vec())
        });
        Reply::Payload(r)
    }

    pub(super) fn setlk(&self, c: &Call) -> Reply {
        Reply::Payload(self.set_lock(&c.hdr, c.args, false).map(|_| Vec::new()))
    }

    /// SETLKW, which may wait for its lock on a waiter thread of its own.
    pub(super) fn setlkw(
        &self,
        c: &Call,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> Reply {
        // A wait's reply is one header written at the first writable buffer: a chain
        // whose first buffer can't take one is refused now, with an errno in whatever
        // room it has. SETLKW takes a reply; leaving it unanswered would leave the
        // guest's caller waiting for good.
        let Some(at) = reply_address(c.bufs) else {
            return Reply::Malformed(errno(libc::EINVAL));
        };
        match self.lock_or_wait(&c.hdr, c.args, at, defer) {
            Ok(true) => Reply::Later,
            Ok(false) => Reply::Payload(Ok(Vec::new())),
            Err(e) => Reply::Payload(Err(e)),
        }
    }

    /// INTERRUPT: cancels the waits of the requests it names.
    pub(super) fn interrupt(&self, c: &Call) -> Reply {
        if let Some(i) = decode::<InterruptIn>(c.args) {
            self.waiters.interrupt(i.unique);
        }
        Reply::Nothing { malformed: false }
    }

    /// SETLK or SETLKW. `Ok(None)`: done; `Ok(Some(wait))`: must wait.
    fn set_lock(&self, hdr: &InHeader, args: &[u8], wait: bool) -> io::Result<Option<F::LockWait>> {
        let a: LkIn = decode(args).ok_or_else(|| errno(libc::EINVAL))?;
        let flock = a.lk_flags & LK_FLOCK != 0;
        self.fs.setlk(hdr.nodeid, a.fh, a.owner, a.lk, flock, wait)
    }

    /// A SETLKW: granted now (`Ok(false)`), or waiting on a waiter thread that answers it
    /// through the `Deferred` that `defer` makes (`Ok(true)`). The request's place in its
    /// ring's share of lock waits is taken first, so a wait past the share costs no owner
    /// description, deadlock walk or waiter place: it is tried without waiting, and
    /// answered ENOLCK if it would wait.
    fn lock_or_wait(
        &self,
        hdr: &InHeader,
        args: &[u8],
        at: GuestAddress,
        defer: &mut dyn FnMut() -> Option<Box<dyn Deferred>>,
    ) -> io::Result<bool> {
        let Some(d) = defer() else {
            return match self.set_lock(hdr, args, false) {
                Ok(_) => Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    self.fs.count_lock_refusal();
                    Err(errno(libc::ENOLCK))
                }
                Err(e) => Err(e),
            };
        };
        match self.set_lock(hdr, args, true)? {
            None => Ok(false),
            Some(w) => match waiters::spawn_waiter(&self.waiters, w, *hdr, args, at, d) {
                Ok(()) => Ok(true),
                Err(e) => {
                    warn!("no lock waiter thread: {e}");
                    Err(errno(libc::ENOLCK))
                }
            },
        }
    }

    /// Whether a ring stop left requests suspended, for the device to resume.
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
    /// LkIn exactly (what `waiters::spawn_waiter` carries).
    pub fn resumable(&self, r: &InFlight) -> bool {
        let len = std::mem::size_of::<InHeader>() + std::mem::size_of::<LkIn>();
        r.request.len() == len
            && decode::<InHeader>(&r.request)
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
        let at = GuestAddress(r.reply_at);
        let hdr_len = std::mem::size_of::<InHeader>();
        let hdr: Option<InHeader> = r.request.get(..hdr_len).and_then(decode);
        let Some(hdr) = hdr.filter(|h| h.opcode == Opcode::Setlkw as u32) else {
            warn!("a suspended request that is not a SETLKW: dropped");
            return None;
        };
        let args = &r.request[hdr_len..];
        let answer = |e: Option<io::Error>| {
            let r = e.map_or(Ok(()), Err);
            waiters::write_header(mem, at, hdr.unique, &r)
        };
        match self.lock_or_wait(&hdr, args, at, defer) {
            Ok(true) => None,
            Ok(false) => Some(answer(None)),
            Err(e) => Some(answer(Some(e))),
        }
    }
}
