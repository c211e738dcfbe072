//! Reads and opens that may not block, so a queue thread can serve them itself.
//!
//! Handing a request to the worker pool costs a wake-up and two context switches, more than
//! a READ answered from the host's page cache costs in all. So the queue thread first tries
//! the usual READ shape (`server::data`) with `preadv2(RWF_NOWAIT)` under a
//! non-blocking take of the inode's I/O lock. If anything would wait (data not cached, the
//! lock held for a size change, a short read that may or may not be EOF, a host filesystem
//! without RWF_NOWAIT) the attempt is abandoned without a reply and the request goes to the
//! pool. A worker then serves it from the start, overwriting whatever the attempt left in
//! the guest's buffers; the guest reads them only once the request is on the used ring.
//!
//! An OPEN (or a CREATE of an existing name) waits in the host kernel only for a lease
//! another host process holds on the file (Samba, nfsd's delegations, F_SETLEASE), which
//! the kernel breaks before the open goes on, for up to /proc/sys/fs/lease-break-time. On
//! a queue thread (`OpenWait::Never`) the host open is made with O_NONBLOCK, which fails
//! with EWOULDBLOCK instead of waiting; then nothing has changed on the host but the start
//! of the break, and a worker serves the request from the start.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::filesystem::OpenWait;

/// Host filesystems (by mount id) found without RWF_NOWAIT (EOPNOTSUPP, e.g. a GlusterFS
/// FUSE mount): a handle opened there never tries, so the cost of finding out is paid
/// once per filesystem, not once per handle. Read at OPEN, written once per filesystem;
/// the READ path itself reads only its handle's flag.
#[derive(Default)]
pub struct Unsupported {
    mounts: RwLock<Vec<u64>>,
    /// EOPNOTSUPP answers seen (statistics: at most one per filesystem and racing READ).
    pub seen: AtomicU64,
}

impl Unsupported {
    /// Whether a handle on mount `mnt_id` should try no-wait reads.
    pub fn worth_trying(&self, mnt_id: u64) -> bool {
        !self
            .mounts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&mnt_id)
    }

    /// Records that mount `mnt_id` answered EOPNOTSUPP.
    pub fn record(&self, mnt_id: u64) {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut m = self.mounts.write().unwrap_or_else(|e| e.into_inner());
        if !m.contains(&mnt_id) {
            m.push(mnt_id);
        }
    }
}

/// `preadv2(fd, iov, offset, RWF_NOWAIT)`.
///
/// # Safety
/// Every iovec must describe writable memory that stays mapped for the call.
pub(super) unsafe fn preadv2(fd: RawFd, iov: &[libc::iovec], offset: u64) -> io::Result<usize> {
    let off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let cnt =
        libc::c_int::try_from(iov.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the caller vouches for the buffers; the kernel writes only inside them.
    let n = unsafe { libc::preadv2(fd, iov.as_ptr(), cnt, off, libc::RWF_NOWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

thread_local! {
    /// How the request this thread serves may open files (`with_open_wait`).
    static OPEN_WAIT: std::cell::Cell<OpenWait> = const { std::cell::Cell::new(OpenWait::Allowed) };
}

/// Runs `f` with opens made for it on this thread (`open_wait_here`) told `wait`: what a
/// request's own open on a path the server does not pass `OpenWait` through (a node's fd
/// under `--no-open`) goes by.
pub fn with_open_wait<R>(wait: OpenWait, f: impl FnOnce() -> R) -> R {
    struct Restore(OpenWait);
    impl Drop for Restore {
        fn drop(&mut self) {
            OPEN_WAIT.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(OPEN_WAIT.with(|w| w.replace(wait)));
    f()
}

/// The `OpenWait` of the request this thread serves (`with_open_wait`; else `Allowed`).
pub fn open_wait_here() -> OpenWait {
    OPEN_WAIT.with(|w| w.get())
}

/// The error of an open that would have waited under `OpenWait::Never`.
#[derive(Debug)]
struct WouldWait;

impl std::fmt::Display for WouldWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the open would wait for a host lease break")
    }
}

impl std::error::Error for WouldWait {}

pub(super) fn would_wait() -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, WouldWait)
}

/// Whether `e` is `would_wait()`'s: never sent to a guest, which did not ask for a
/// non-blocking open (one that did gets the host's EWOULDBLOCK itself).
pub fn is_would_wait(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<WouldWait>())
}
