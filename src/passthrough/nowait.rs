//! Reads that may not block, so a queue thread can serve them itself.
//!
//! Handing a request to the worker pool costs a wake-up and two context switches, more than
//! a READ answered from the host's page cache costs in all. So the queue thread first tries
//! the usual READ shape (`server::fast_read`) with `preadv2(RWF_NOWAIT)` under a
//! non-blocking take of the inode's I/O lock. If anything would wait (data not cached, the
//! lock held for a size change, a short read that may or may not be EOF, a host filesystem
//! without RWF_NOWAIT) the attempt is abandoned without a reply and the request goes to the
//! pool. A worker then serves it from the start, overwriting whatever the attempt left in
//! the guest's buffers; the guest reads them only once the request is on the used ring.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

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
