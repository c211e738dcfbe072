//! Reads that may not block, so a queue thread can serve them itself.
//!
//! Handing a request to the worker pool costs a wake-up and two context switches, more than
//! a READ answered from the host's page cache costs in all. So the queue thread first tries
//! a READ with `preadv2(RWF_NOWAIT)` under a non-blocking take of the inode's I/O lock. If
//! anything would wait (data not cached, the lock held for a size change, a short read that
//! may or may not be EOF, a host filesystem without RWF_NOWAIT) the attempt is abandoned
//! without a reply and the request goes to the pool as before. A worker then serves it
//! from the start, overwriting whatever the attempt left in the guest's buffers; the guest
//! reads them only once the request is on the used ring.

use std::cell::Cell;
use std::io;
use std::os::fd::RawFd;

use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Off,
    Trying,
    WouldBlock,
}

thread_local! {
    static STATE: Cell<State> = const { Cell::new(State::Off) };
}

/// Runs `f` with this thread's reads in non-blocking mode. Gives `f`'s result, or None if a
/// read in it would have blocked (its reply must then be discarded and the request served
/// again by a thread that may block).
pub fn try_without_blocking<R>(f: impl FnOnce() -> R) -> Option<R> {
    /// Turns the mode off however `f` ends, a panic included, so a later blocking request
    /// on this thread is never refused.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            STATE.with(|s| s.set(State::Off));
        }
    }
    let _reset = Reset;
    STATE.with(|s| s.set(State::Trying));
    let r = f();
    let blocked = STATE.with(|s| s.get()) == State::WouldBlock;
    (!blocked).then_some(r)
}

/// Whether the current request runs in non-blocking mode.
pub fn active() -> bool {
    STATE.with(|s| s.get()) != State::Off
}

/// Abandons the current non-blocking attempt; the error only shapes the discarded reply.
pub fn would_block() -> io::Error {
    STATE.with(|s| s.set(State::WouldBlock));
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// A file read with RWF_NOWAIT: EAGAIN instead of waiting for the disk.
pub(super) struct NoWaitFile(pub RawFd);

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

impl NoWaitFile {
    fn preadv2(&self, bufs: &[FileVolatileSlice], offset: u64) -> io::Result<usize> {
        let iov: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec spans a FileVolatileSlice of mapped guest memory that the
        // caller's Writer keeps alive for this call.
        unsafe { preadv2(self.0, &iov, offset) }
    }
}

fn not_for_writing() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl FileReadWriteVolatile for NoWaitFile {
    fn read_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        // Positionless reads are never used for FUSE READ.
        Err(io::Error::from_raw_os_error(libc::ESPIPE))
    }

    fn write_volatile(&mut self, _slice: FileVolatileSlice) -> io::Result<usize> {
        Err(not_for_writing())
    }

    fn read_at_volatile(&mut self, slice: FileVolatileSlice, offset: u64) -> io::Result<usize> {
        self.preadv2(&[slice], offset)
    }

    fn read_vectored_at_volatile(
        &mut self,
        bufs: &[FileVolatileSlice],
        offset: u64,
    ) -> io::Result<usize> {
        self.preadv2(bufs, offset)
    }

    fn write_at_volatile(&mut self, _slice: FileVolatileSlice, _offset: u64) -> io::Result<usize> {
        Err(not_for_writing())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_attempt_leaves_the_thread_in_blocking_mode() {
        let r = std::panic::catch_unwind(|| try_without_blocking(|| panic!("in a read")));
        assert!(r.is_err());
        assert!(!active(), "later requests on this thread would be refused");
    }

    #[test]
    fn would_block_discards_the_result() {
        assert_eq!(try_without_blocking(|| 7), Some(7));
        assert_eq!(
            try_without_blocking(|| {
                let _ = would_block();
                7
            }),
            None
        );
        assert!(!active());
    }
}
