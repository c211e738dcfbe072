//! Breaking a thread out of a blocking lock call (flock, F_OFD_SETLKW): a guest's SETLKW
//! waiter (`server::waiters`) and a filesystem's lock retake after a migration both block
//! in the kernel on a thread of their own, and both must stop when the guest or the
//! session says so. A signal with a handler that does nothing, installed without
//! SA_RESTART, makes the call return EINTR; `Blocker` makes sure the signal reaches the
//! right thread, and only while it is still at it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The signal that breaks a blocked lock call off: a real-time one, which no operator
/// sends by habit (SIGUSR2 asks vfsd's supervisor for an upgrade in place).
fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

extern "C" fn wake(_: libc::c_int) {}

/// Installs the no-op handler for `wake_signal()`, without SA_RESTART so a blocked lock
/// call returns EINTR.
pub fn install_wake_handler() {
    // SAFETY: sigaction with a zeroed struct, an empty mask and an async-signal-safe
    // handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = wake as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(wake_signal(), &sa, std::ptr::null_mut());
    }
}

/// One thread's blocking work that another thread may call off (`cancel`).
pub struct Blocker {
    cancelled: AtomicBool,
    /// Set once the thread may block: before that a cancel needs no signal (`start`
    /// looks at `cancelled` after it sets this).
    started: AtomicBool,
    /// True until the thread has finished (`finish`). Held while the thread is signalled,
    /// so that a signal never goes to a thread that has moved on, let alone exited.
    working: Mutex<bool>,
    thread: OnceLock<libc::pthread_t>,
    abandoned: AtomicBool,
    /// The work holds resources from before its thread starts (a migration's lock
    /// retake holds the filesystem and a handle): a cancel waits for it to finish even
    /// if it never started, which it does once everything it held is dropped.
    holds_before_start: bool,
}

impl Default for Blocker {
    fn default() -> Self {
        Blocker {
            cancelled: AtomicBool::new(false),
            started: AtomicBool::new(false),
            working: Mutex::new(true),
            thread: OnceLock::new(),
            abandoned: AtomicBool::new(false),
            holds_before_start: false,
        }
    }
}

impl Blocker {
    /// Work that holds resources before its thread starts; whoever owns them must call
    /// `finish` (through `Finish` or `FinishOwned`) when they are dropped, whether or not
    /// a thread ever ran.
    pub fn holding_before_start() -> Self {
        Blocker {
            holds_before_start: true,
            ..Blocker::default()
        }
    }

    /// On the thread that will block, before its first blocking call: from now on a
    /// cancel signals it. False if it was cancelled already (then it must not block).
    pub fn start(&self) -> bool {
        // SAFETY: pthread_self has no preconditions.
        let _ = self.thread.set(unsafe { libc::pthread_self() });
        // Both sides SeqCst: either `cancel` sees `started` and signals, or this sees
        // `cancelled`.
        self.started.store(true, Ordering::SeqCst);
        !self.cancelled.load(Ordering::SeqCst)
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Runs `call`, a blocking lock call, again after each EINTR until it is done or the
    /// work is called off (then EINTR). Looked at before the first call too: a cancel
    /// that came before the thread blocked sent no signal.
    pub fn retry<T>(&self, mut call: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
        loop {
            if self.is_cancelled() {
                return Err(std::io::Error::from_raw_os_error(libc::EINTR));
            }
            match call() {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                r => return r,
            }
        }
    }

    /// On the blocking thread, when it is done with everything a cancel waits for: no
    /// signal reaches it after this.
    pub fn finish(&self) {
        *self.working.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }

    pub fn is_finished(&self) -> bool {
        !*self.working.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls the work off and waits until its thread has finished (`cancel_all`).
    pub fn cancel(&self) {
        cancel_all(std::slice::from_ref(&self));
    }

    /// Whether a cancel stopped waiting for this work before it finished: its lock call
    /// did not return for the signal (a FUSE mount's lock server that ignores FUSE's
    /// INTERRUPT), so whatever it is granted later comes after the canceller moved on.
    pub fn was_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Signals the thread if it is still at it; false once it has finished.
    fn signal_if_working(&self) -> bool {
        let Some(&thread) = self.thread.get() else {
            // Not started: it needs no signal (it sees `cancelled` in `start`), only, if
            // it holds resources already, to be waited for.
            return self.holds_before_start && !self.is_finished();
        };
        let working = self.working.lock().unwrap_or_else(|e| e.into_inner());
        if *working {
            // SAFETY: the thread is alive: it clears `working` under this lock before it
            // exits, and it can't do so while the lock is held here.
            unsafe { libc::pthread_kill(thread, wake_signal()) };
        }
        *working
    }
}

/// Calls off every work of `all` and waits until their threads have finished, for at
/// most a second in all; it signals them until then (a signal that lands just before a
/// thread blocks is lost, so one is not enough). Work that never started needs no wait
/// (its thread sees `cancelled` in `start`), unless it holds resources from before its
/// start (`holding_before_start`): that is waited for until it has dropped them.
pub fn cancel_all<B: std::ops::Deref<Target = Blocker>>(all: &[B]) {
    for b in all {
        b.cancelled.store(true, Ordering::SeqCst);
    }
    let mut left: Vec<&Blocker> = all
        .iter()
        .map(|b| &**b)
        .filter(|b| b.holds_before_start || b.started.load(Ordering::SeqCst))
        .collect();
    let t = Instant::now();
    loop {
        left.retain(|b| b.signal_if_working());
        if left.is_empty() {
            return;
        }
        if t.elapsed() >= Duration::from_secs(1) {
            for b in left {
                b.abandoned.store(true, Ordering::SeqCst);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Calls `finish` when dropped: on every way out of a blocking thread, a panic included.
pub struct Finish<'a>(pub &'a Blocker);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// A shared `Blocker` that is finished when this is dropped. As the last field of what a
/// blocking thread is handed, it finishes the work after everything else there was
/// dropped, whether the thread ran, never started, or was never made.
pub struct FinishOwned(pub std::sync::Arc<Blocker>);

impl std::ops::Deref for FinishOwned {
    type Target = Blocker;
    fn deref(&self) -> &Blocker {
        &self.0
    }
}

impl Drop for FinishOwned {
    fn drop(&mut self) {
        self.0.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    #[test]
    fn a_cancel_breaks_a_blocked_flock_off_and_returns_once_its_thread_finished() {
        install_wake_handler();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let holder = std::fs::File::create(&path).unwrap();
        // SAFETY: plain flock on an fd we own.
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        let b = Arc::new(Blocker::default());
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            let _f = Finish(&b2);
            let mine = std::fs::File::open(&path).unwrap();
            assert!(b2.start());
            loop {
                // SAFETY: as above.
                let r = unsafe { libc::flock(mine.as_raw_fd(), libc::LOCK_EX) };
                let e = std::io::Error::last_os_error().raw_os_error();
                assert_eq!((r, e), (-1, Some(libc::EINTR)), "granted while held");
                if b2.is_cancelled() {
                    return;
                }
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!b.is_finished());
        b.cancel();
        assert!(
            b.is_finished(),
            "cancel returned before the thread finished"
        );
        t.join().unwrap();
    }

    #[test]
    fn work_cancelled_before_it_started_does_not_start() {
        let b = Blocker::default();
        b.cancel();
        assert!(!b.start());
    }
}
