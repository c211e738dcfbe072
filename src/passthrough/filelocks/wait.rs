//! A SETLKW that must wait (`Wait`): what it holds while its waiter thread blocks in the
//! host's lock call, and what that thread does when the host grants the lock.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::host::{flock, ofd_lock, ofd_setlkw};
use super::range_set::Range;
use super::table::{FileLocks, Owner};
use crate::filesystem::wake::{Blocker, Finish};
use crate::passthrough::handle::Handle;
use crate::sys::errno;

/// What a SETLKW that must wait leaves for its waiter thread. It holds one of the
/// `--max-lock-waiters` places until it is dropped.
pub enum Wait {
    Posix {
        locks: Arc<FileLocks>,
        node: u64,
        key: u64,
        owner: Arc<Owner>,
        range: Range,
        /// Its record for the deadlock check (0: none yet).
        record: u64,
    },
    Flock {
        locks: Arc<FileLocks>,
        handle: Arc<Handle>,
        typ: i32,
        node: u64,
        fh: u64,
        pid: u32,
        /// Its record for the deadlock check (0: none yet).
        record: u64,
    },
}

impl Drop for Wait {
    fn drop(&mut self) {
        match self {
            Wait::Posix {
                locks,
                node,
                key,
                owner,
                record,
                ..
            } => {
                if *record != 0 {
                    locks.owners.lock().unwrap().waits.remove(*key, *record);
                }
                owner.state.lock().unwrap().waiting -= 1;
                locks.drop_if_unused(*node, *key, owner);
                locks.counters.waiters.fetch_sub(1, Ordering::AcqRel);
            }
            Wait::Flock {
                locks, pid, record, ..
            } => {
                if *record != 0 {
                    locks.flocks.lock().unwrap().remove_wait(*pid, *record);
                }
                locks.counters.waiters.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}
impl Wait {
    /// Blocks until the lock is granted or `blocker` is called off (EINTR, from the
    /// signal its canceller sends). Run on a waiter thread, never on a request worker.
    ///
    /// A POSIX wait that the stall rule ends (`FileLocks::stalled_waits`) gets EDEADLK.
    pub fn block(self, blocker: &Blocker) -> io::Result<()> {
        let stall = self.register_stall();
        // Dropped before the wait (and its record) goes: no stall signal comes after it.
        let _finish = stall.as_deref().map(Finish);
        let stalled = || stall.as_ref().is_some_and(|b| b.is_cancelled());
        let r = blocker.retry(|| {
            if stalled() {
                return Err(errno(libc::EDEADLK));
            }
            self.wait_once()
        });
        match r {
            Err(e)
                if stalled() && matches!(e.raw_os_error(), Some(libc::EINTR | libc::EDEADLK)) =>
            {
                if let Wait::Posix { locks, .. } = &self {
                    locks.counters.stalled.fetch_add(1, Ordering::Relaxed);
                }
                Err(errno(libc::EDEADLK))
            }
            r => r,
        }
    }

    /// On the waiter thread, before it blocks: what lets the stall watchdog break this
    /// thread's host call off, noted in the wait's record (POSIX waits, with the rule on).
    fn register_stall(&self) -> Option<Arc<Blocker>> {
        let Wait::Posix {
            locks, key, record, ..
        } = self
        else {
            return None;
        };
        if locks.stall_ms == 0 || *record == 0 {
            return None;
        }
        let b = Arc::new(Blocker::default());
        b.start();
        let mut m = locks.owners.lock().unwrap();
        m.waits.get_mut(*key, *record)?.stall = Some(b.clone());
        Some(b)
    }

    fn wait_once(&self) -> io::Result<()> {
        let (locks, owner, range) = match self {
            Wait::Flock {
                locks,
                handle,
                typ,
                node,
                fh,
                pid,
                ..
            } => {
                flock(handle.fd.as_raw_fd(), *typ, true)?;
                handle.flock.store(*typ, Ordering::Relaxed);
                let mut fl = locks.flocks.lock().unwrap();
                fl.set(*node, *fh, *pid, *typ, handle);
                return Ok(());
            }
            Wait::Posix {
                locks,
                owner,
                range,
                ..
            } => (locks, owner, range),
        };
        let node = owner.node;
        ofd_setlkw(owner.fd.as_raw_fd(), range)?;
        let mut st = owner.state.lock().unwrap();
        if st.dead {
            // Released meanwhile (RELEASE, FORGET, DESTROY, a new INIT): the lock must
            // not outlive that. Final, as Linux answers a lock that lost its fd to a
            // close (EBADF): a retry would be granted and undone for ever.
            let un = Range {
                typ: libc::F_UNLCK,
                ..*range
            };
            let _ = ofd_lock(owner.fd.as_raw_fd(), &un, false);
            return Err(errno(libc::EBADF));
        }
        // Not refused past `--max-locks` (or `--max-locks-per-file`) now that the host
        // granted it: undoing it would free bytes the owner held before to others for a
        // moment. A wait adds at most two ranges, so each count stays within its bound +
        // 2 x --max-lock-waiters.
        let new = st.ranges.plan(*range);
        locks.commit(node, &mut st.ranges, new, 0);
        Ok(())
    }
}
