//! Locks the source still holds, taken again on the destination by threads of their own
//! (`LockWait`), each blocked in the host's lock call until the source lets go.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::filesystem::wake::{Blocker, FinishOwned};
use crate::passthrough::filelocks::{self, OwnerRecord, Range};
use crate::passthrough::handle::Handle;
use crate::passthrough::PassthroughFs;

/// A lock the destination must wait for: the source (or someone) holds it now. `retake`
/// is the thread's, which a guest lock call for that handle or owner, or the session's
/// end, calls off. It is the last field, so it is finished only once the filesystem and
/// the handle or record were dropped: a cancel that returns (the session's end) leaves
/// nothing of the wait held, even if its thread had not started yet.
pub(super) enum LockWait {
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
    pub(super) fn spawn(self) {
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
    pub(in crate::passthrough) fn cancel_retakes(&self) {
        let all = std::mem::take(&mut *self.retakes.lock().unwrap());
        crate::filesystem::wake::cancel_all(&all);
    }

    /// Whether any of `handles` of `node` is still open.
    pub(super) fn handles_open(&self, node: u64, handles: &[u64]) -> bool {
        handles.iter().any(|&fh| self.handles.get(fh, node).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::fs;
    use super::*;

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
        crate::filesystem::wake::install_wake_handler();
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
            let _done = crate::filesystem::wake::Finish(&rt);
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
}
