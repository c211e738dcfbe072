//! Whether a request's opens may wait in the host kernel (for a lease another host
//! process holds, which the kernel breaks before the open goes on). A queue thread must
//! not wait, so it serves an OPEN or CREATE only if nothing waits, and leaves the rest
//! unanswered for the worker pool.

/// Whether an open may wait where it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenWait {
    /// It may: a worker.
    Allowed,
    /// It must not: a queue thread. An open that would wait fails with an error
    /// `FileSystem::is_would_wait` knows, and is left unanswered for the pool.
    Never,
}
