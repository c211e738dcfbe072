//! File locks forwarded to the host: POSIX byte-range locks (and OFD locks, which the guest
//! sends the same way) and flock.
//!
//! The host kernel arbitrates. Each (node, guest lock owner) pair gets its own host open
//! file description, and the owner's byte ranges are placed on it with OFD locks
//! (`F_OFD_SETLK`). OFD locks conflict between descriptions, so two owners of one guest,
//! two guests on two daemons, and host processes using POSIX, OFD or flock locks all
//! exclude each other, while POSIX merging and splitting hold per owner. Classic POSIX
//! locks would not do: every worker thread belongs to one process, whose locks never
//! conflict with each other. flock goes on the guest handle's own host fd: one guest open
//! file is one FUSE handle is one host description, as flock wants.
//!
//! Bounds, so a guest can't pin unbounded host kernel memory (lock records are not charged
//! to memory cgroups): `--max-locks` byte ranges per connection, counted with a model of
//! each owner's ranges that merges and splits as the kernel does (`RangeSet`), and
//! `--max-lock-waiters` blocked SETLKW requests. Past either, ENOLCK.
//!
//! Deadlocks. The host does no deadlock detection for OFD locks, and the virtio-fs guest
//! never sends FUSE_INTERRUPT, so a cycle of SETLKW waits among the guest's owners would
//! hang those guest processes for good: a process blocked in a forwarded F_SETLKW can't
//! even be killed until the daemon answers. So a SETLKW that must wait is first checked
//! for a cycle among the owners this table serves, as Linux's `posix_locks_deadlock`
//! checks processes (`Waits::closes_cycle`): the wait that would close one gets EDEADLK.
//! The guest's OFD locks get the same check. FUSE can't tell them from its POSIX locks
//! (the guest's `fuse_lk_fill` sends the owner id, range, type and pid, and no
//! FL_OFDLCK), and while Linux gives OFD waits no EDEADLK, there a signal ends such a
//! wait; here nothing would. Not found: waits on locks of other daemons' guests or host
//! processes (the walk ends at a holder it doesn't know), cycles longer than
//! `DEADLOCK_DEPTH` or past `DEADLOCK_STEPS`, and cycles closed by a change while a waiter
//! already sleeps in the host's F_OFD_SETLKW (a holder taking another range a waiter
//! needs; Linux checks again whenever a waiter wakes, the host does that for us unseen),
//! and waits whose holder waits for something else of the waiter's, such as its exit (a
//! parent that kills its child, blocked in a forwarded F_SETLKW for the parent's lock, and
//! waits for it before closing the file: the signal can't end the child's wait here);
//! the stall rule below ends those.
//!
//! flock waits get a cycle check too (`Flocks::closes_cycle`). flock's owner is the open
//! file, so the walk follows processes: each handle's flock is noted with the guest pid
//! (the tgid FUSE sends) that took it, a flock wait by pid P is blocked by the other
//! handles holding a conflicting flock on its node, and a holder's pid that waits itself
//! leads on; a holder that is P closes the cycle, and that wait gets EDEADLK. Linux on a
//! local file system never answers flock EDEADLK, but there a signal ends the wait. The
//! holder is taken to be the process that took the flock: one that handed its open file
//! on (fork, SCM_RIGHTS) may be found in a cycle its file's other holder could break.
//! Cycles mixing flock and POSIX waits are not looked for.
//!
//! Stalled holders (`--lock-stall-timeout` T, default 30 s; 0 turns it off). A POSIX or
//! OFD wait that has waited T, where at least one owner of this table holds a conflicting
//! range and every such owner is stalled (no SETLK, SETLKW, GETLK or FLUSH from it for T,
//! and no wait of its own), is answered EDEADLK by a watchdog thread (`watchdog`), which
//! ticks only while waits exist. The guest process then returns to user mode, where a
//! pending signal (a parent's SIGKILL) is delivered. EINTR would not do: the guest's
//! `fuse_setlk` turns it into ERESTARTSYS, which a process with no signal pending would
//! see as errno 512. Linux's fcntl(2) says its deadlock detection has false positives too:
//! a guest process that holds a lock for longer than T without any lock call or close
//! while another waits for it makes that wait fail. Holders outside this table (host
//! processes, other guests) never trigger the rule.
//!
//! A wait that never ends is over only when its holder lets go: in the guest, end or
//! unlock the holding process (`/proc/locks` in the guest doesn't list forwarded locks;
//! the host's does, with vfsd as holder); otherwise the holder on the host or in the
//! other guest must go, or the guest be reset (a new INIT or DESTROY cancels every wait
//! with EINTR).
//!
//! The parts: `range_set` (byte ranges and one owner's set of them), `deadlock` (the
//! waits and the cycle walks), `table` (`FileLocks`: owners, bounds, lock requests),
//! `stall` (the stall rule and its watchdog), `wait` (a SETLKW's wait), `retake` (what a
//! migration saves, loads and takes again), `host` (the OFD and flock calls); the range
//! set and the deadlock walks make no host calls. Below: GETLK and SETLK as the
//! filesystem serves them.

mod deadlock;
mod host;
mod range_set;
mod retake;
mod stall;
mod table;
mod wait;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use host::{flock, ofd_lock, ofd_unlock_all};
pub use range_set::{Range, OFFSET_MAX};
pub use retake::OwnerRecord;
pub use table::FileLocks;
pub use wait::Wait;

use super::handle::Handle;
use super::PassthroughFs;
use crate::sys::errno;

impl PassthroughFs {
    /// A new host open file description of `nodeid`'s file for an owner's OFD locks:
    /// read-write where the host allows, else read-only, else write-only; read-only on a
    /// read-only share (a guest there takes read locks only), where a write open would
    /// keep the host from running the file (ETXTBSY) and break its read leases.
    pub(super) fn lock_description(
        &self,
        nodeid: u64,
    ) -> impl Fn(bool) -> io::Result<OwnedFd> + '_ {
        move |readonly| {
            let i = self.inode(nodeid)?;
            if !i.is_reg() {
                return Err(errno(libc::EINVAL));
            }
            if readonly {
                return self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK);
            }
            self.reopen(&i, libc::O_RDWR | libc::O_NONBLOCK)
                .or_else(|_| self.reopen(&i, libc::O_RDONLY | libc::O_NONBLOCK))
                .or_else(|_| self.reopen(&i, libc::O_WRONLY | libc::O_NONBLOCK))
        }
    }

    /// The guest handle a lock request names, checked against the lock type as fcntl
    /// checks a file's mode: a read lock needs read access, a write lock write access.
    fn lock_handle(&self, nodeid: u64, fh: u64, typ: i32) -> io::Result<Arc<Handle>> {
        let h = self.handle(fh, nodeid)?;
        let acc = h.flags & libc::O_ACCMODE;
        let ok = match typ {
            libc::F_RDLCK => acc != libc::O_WRONLY,
            libc::F_WRLCK => acc != libc::O_RDONLY,
            _ => true,
        };
        if !ok || h.dir.is_some() {
            return Err(errno(libc::EBADF));
        }
        Ok(h)
    }

    /// GETLK: the conflicting lock and its holder's guest pid (0 outside this guest), or
    /// the request's range as F_UNLCK.
    pub fn getlk(
        &self,
        nodeid: u64,
        fh: u64,
        owner: u64,
        r: Range,
        is_flock: bool,
    ) -> io::Result<(Range, u32)> {
        if is_flock || !self.locks.posix {
            return Err(errno(libc::ENOSYS));
        }
        let h = self.lock_handle(nodeid, fh, libc::F_UNLCK)?;
        self.locks.getlk(nodeid, owner, r, h.fd.as_raw_fd())
    }

    /// SETLK and SETLKW: `Ok(Some(wait))` when a SETLKW must wait (for a waiter thread).
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        &self,
        nodeid: u64,
        fh: u64,
        owner: u64,
        pid: u32,
        r: Range,
        is_flock: bool,
        wait: bool,
    ) -> io::Result<Option<Wait>> {
        if is_flock {
            if !self.locks.flock {
                return Err(errno(libc::ENOSYS));
            }
            let h = self.lock_handle(nodeid, fh, libc::F_UNLCK)?;
            // The guest's own call: a migrated flock still being taken again is called
            // off first (if the host granted it meanwhile, this call converts it).
            let retake = h.flock_pending.lock().unwrap().take();
            if let Some(b) = retake {
                b.cancel();
            }
            let res = {
                // Orders the call and its record against a retake that a cancel gave up
                // on, which sets the description back to `flock` when it is granted.
                let _order = h.flock_pending.lock().unwrap();
                let res = flock(h.fd.as_raw_fd(), r.typ, false);
                if res.is_ok() {
                    h.flock.store(r.typ, Ordering::Relaxed);
                }
                res
            };
            let busy = matches!(&res, Err(e) if e.raw_os_error() == Some(libc::EAGAIN));
            if res.is_ok() || busy {
                // A refused conversion has let go of the handle's earlier flock (as flock(2)
                // converts: the old lock first goes).
                let typ = if busy { libc::F_UNLCK } else { r.typ };
                self.locks
                    .flocks
                    .lock()
                    .unwrap()
                    .set(nodeid, fh, pid, typ, &h);
            }
            return match res {
                Err(_) if wait && busy => {
                    self.locks.waiter()?;
                    let mut w = Wait::Flock {
                        locks: self.locks.clone(),
                        handle: h,
                        typ: r.typ,
                        node: nodeid,
                        fh,
                        pid,
                        record: 0,
                    };
                    self.locks.flock_wait(&mut w)?;
                    Ok(Some(w))
                }
                r => r.map(|_| None),
            };
        }
        if !self.locks.posix {
            return Err(errno(libc::ENOSYS));
        }
        self.lock_handle(nodeid, fh, r.typ)?;
        self.locks.setlk(
            nodeid,
            fh,
            owner,
            pid,
            r,
            wait,
            self.lock_description(nodeid),
            || self.handle(fh, nodeid).is_ok(),
        )
    }
}
