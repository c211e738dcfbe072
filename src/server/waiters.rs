//! The waiter threads of SETLKWs that wait for their lock (`locks`).
//!
//! A SETLKW that has to wait never holds a request worker: it gets a waiter thread of its
//! own (at most `--max-lock-waiters`, then ENOLCK), which answers the request when the
//! lock is granted, through `Deferred`. INTERRUPT for it, DESTROY or a new INIT cancel
//! the wait with a signal (EINTR).
//!
//! A ring that stops (GET_VRING_BASE: the VM stops, or migrates) suspends its waits: the
//! waiter stops waiting and leaves the request unanswered, in flight for the guest, as an
//! `InFlight` the device state carries. When the ring runs again, here (the VM goes on, or
//! a migration failed) or on a destination, the request is taken up again and answered on
//! its own descriptors (`FuseServer::resume`): the guest's program never sees the move. A
//! guest that reset its queue meanwhile no longer waits for it, and it is dropped.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fuse_backend_rs::abi::fuse_abi::{InHeader, LkIn, OutHeader};
use log::warn;
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::wire::guest::GuestMem;
use crate::filesystem::{Blocker, InFlight, LockWait};

/// Waiter threads block in the kernel; they need little stack.
const WAITER_STACK: usize = 64 * 1024;

/// Completes a request answered after its worker moved on (a SETLKW that waited).
pub trait Deferred: Send {
    /// Runs `write` (which writes the reply into the guest memory it is given, the map of
    /// now, and gives its length) and puts the request on the used ring, unless the ring
    /// was stopped since; then neither happens.
    fn finish(self: Box<Self>, write: &mut dyn FnMut(&GuestMem) -> u32);

    /// Registers what suspends the wait when its ring stops (a VMM's GET_VRING_BASE
    /// before migration, a reset), so the stop does not wait on it. False: the ring has
    /// stopped since the request came (its reply would be dropped), and nothing was
    /// registered.
    fn on_stop(&self, suspend: Box<dyn Fn() + Send + Sync>) -> bool;

    /// Where the reply belongs, for `InFlight`.
    fn slot(&self) -> Slot;

    /// Leaves the request unanswered and no longer in flight on its ring (which is
    /// stopping and waits for that).
    fn suspend(self: Box<Self>);
}

/// Where a suspended request's reply belongs: its queue, chain head and avail position.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub queue: u16,
    pub head: u16,
    pub position: u16,
}

struct Waiter {
    /// The guest's `unique` of the request (what an INTERRUPT names). Not a key: a guest
    /// may send two requests under one unique.
    unique: u64,
    /// Cancelled by a ring stop: the request is suspended, not answered...
    suspend: AtomicBool,
    /// ...unless the guest interrupted it too: then it gets its EINTR.
    interrupted: AtomicBool,
    /// Finished when the thread stops waiting, before it answers.
    blocker: Blocker,
}

/// The waiting SETLKWs, by an id vfsd gives each, and the suspended ones.
#[derive(Default)]
pub struct Waiters {
    next_id: AtomicU64,
    by_id: Mutex<HashMap<u64, Arc<Waiter>>>,
    suspended: Mutex<Vec<InFlight>>,
    /// Whether `suspended` has any (read by every queue pass, written rarely).
    any_suspended: AtomicBool,
}

impl Waiters {
    /// Cancels the waits of requests sent under `unique` (FUSE_INTERRUPT).
    pub fn interrupt(&self, unique: u64) {
        let hit: Vec<Arc<Waiter>> = self
            .by_id
            .lock()
            .unwrap()
            .values()
            .filter(|w| w.unique == unique)
            .cloned()
            .collect();
        for w in hit {
            w.interrupted.store(true, Ordering::SeqCst);
            w.blocker.cancel();
        }
    }

    /// Ends the wait with vfsd's id `id` with EINTR, if it still waits.
    fn interrupt_id(&self, id: u64) {
        let w = self.by_id.lock().unwrap().get(&id).cloned();
        if let Some(w) = w {
            w.interrupted.store(true, Ordering::SeqCst);
            w.blocker.cancel();
        }
    }

    /// Suspends the wait with vfsd's id `id`, if it still waits (its ring stops).
    fn suspend_id(&self, id: u64) {
        let w = self.by_id.lock().unwrap().get(&id).cloned();
        if let Some(w) = w {
            w.suspend.store(true, Ordering::Release);
            w.blocker.cancel();
        }
    }

    /// Cancels every wait and forgets the suspended ones (DESTROY, a new INIT).
    pub fn cancel_all(&self) {
        let all: Vec<Arc<Waiter>> = self.by_id.lock().unwrap().values().cloned().collect();
        for w in all {
            w.blocker.cancel();
        }
        self.set_suspended(Vec::new());
    }

    /// The suspended requests (for the device state).
    pub fn suspended(&self) -> Vec<InFlight> {
        self.suspended.lock().unwrap().clone()
    }

    /// Replaces the suspended requests (a loaded device state's, or none on a reset).
    pub fn set_suspended(&self, list: Vec<InFlight>) {
        let mut s = self.suspended.lock().unwrap();
        self.any_suspended
            .store(!list.is_empty(), Ordering::Release);
        *s = list;
    }

    pub fn any_suspended(&self) -> bool {
        self.any_suspended.load(Ordering::Acquire)
    }

    /// Takes the suspended requests of `queue` out of the list.
    pub fn take_suspended(&self, queue: u16) -> Vec<InFlight> {
        let mut s = self.suspended.lock().unwrap();
        let (mine, rest) = std::mem::take(&mut *s)
            .into_iter()
            .partition(|r| r.queue == queue);
        *s = rest;
        self.any_suspended.store(!s.is_empty(), Ordering::Release);
        mine
    }

    fn push_suspended(&self, r: InFlight) {
        let mut s = self.suspended.lock().unwrap();
        s.push(r);
        self.any_suspended.store(true, Ordering::Release);
    }
}

/// A waiter thread's place in `Waiters`, for as long as it may be signalled.
struct Registered<'a> {
    waiters: &'a Waiters,
    id: u64,
    me: &'a Waiter,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.me.blocker.finish();
        self.waiters
            .by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Writes a lock request's whole reply, a bare `fuse_out_header` with `r`'s errno, at
/// `at` (checked as a reply address when the request came); gives the used length.
pub fn write_header(mem: &GuestMem, at: GuestAddress, unique: u64, r: &io::Result<()>) -> u32 {
    let out = OutHeader {
        len: std::mem::size_of::<OutHeader>() as u32,
        error: match r {
            Ok(()) => 0,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        },
        unique,
    };
    match mem.write_obj(out, at) {
        Ok(()) => out.len,
        Err(e) => {
            warn!("lock reply: {e}");
            0
        }
    }
}

/// Starts a waiter thread for `wait`; it answers request `hdr` (whose arguments are
/// `args`) through `d`, which holds the request's place in its ring's share of lock
/// waits, writing the reply header at `reply_at`. An error means no thread: the caller
/// answers the request.
pub fn spawn_waiter<W: LockWait>(
    waiters: &Arc<Waiters>,
    wait: W,
    hdr: InHeader,
    args: &[u8],
    reply_at: GuestAddress,
    d: Box<dyn Deferred>,
) -> io::Result<()> {
    // What a suspension carries: the header and the LkIn (whatever else a guest put
    // after them is not kept for as long as the wait lasts).
    let lk = args
        .get(..std::mem::size_of::<LkIn>())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut carried = hdr;
    carried.len = (std::mem::size_of::<InHeader>() + lk.len()) as u32;
    let mut request = carried.as_slice().to_vec();
    request.extend_from_slice(lk);
    let waiters2 = waiters.clone();
    let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Deferred>>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<u64>();
    std::thread::Builder::new()
        .name("vfsd-lock-waiter".into())
        .stack_size(WAITER_STACK)
        .spawn(move || {
            let id = waiters2.next_id.fetch_add(1, Ordering::Relaxed);
            let me = Arc::new(Waiter {
                unique: hdr.unique,
                suspend: AtomicBool::new(false),
                interrupted: AtomicBool::new(false),
                blocker: Blocker::default(),
            });
            waiters2.by_id.lock().unwrap().insert(id, me.clone());
            // Stops the signals and leaves the table when dropped: on every way out of
            // the thread, a panic included, so no signal goes to an exited thread.
            let registered = Registered {
                waiters: &waiters2,
                id,
                me: &me,
            };
            let _ = ready_tx.send(id);
            let Ok(done) = rx.recv() else {
                return;
            };
            // Cancelled already (its ring stopped as it began): `block` says EINTR.
            me.blocker.start();
            let r = wait.block(&me.blocker);
            // No signal reaches this thread after this: the reply's writes and the
            // guest's notification can't be interrupted.
            drop(registered);
            let interrupted = me.interrupted.load(Ordering::SeqCst);
            // A wait the stall rule ended (EDEADLK) is answered even as its ring stops.
            let stalled = r
                .as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::EDEADLK));
            if r.is_err() && me.suspend.load(Ordering::SeqCst) && !interrupted && !stalled {
                // Listed before the ring hears of it: the stop, and the device state saved
                // after it, must find it.
                let slot = done.slot();
                waiters2.push_suspended(InFlight {
                    queue: slot.queue,
                    head: slot.head,
                    position: slot.position,
                    reply_at: reply_at.0,
                    request,
                });
                done.suspend();
                return;
            }
            done.finish(&mut |mem| write_header(mem, reply_at, hdr.unique, &r));
        })?;
    // Registered before the request's worker returns, so an INTERRUPT finds it.
    let id = ready_rx.recv();
    if let Ok(id) = id {
        let w = waiters.clone();
        if !d.on_stop(Box::new(move || w.suspend_id(id))) {
            // Its ring stopped and moved on while the request was being served: the
            // guest gets the request again (or never), so the wait ends now, and its
            // answer goes nowhere.
            waiters.interrupt_id(id);
        }
    }
    let _ = tx.send(d);
    Ok(())
}
