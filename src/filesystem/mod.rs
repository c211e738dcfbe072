//! The seam between the FUSE server (`server`) and a filesystem: vfsd's own
//! `FileSystem` trait, one method per request the server passes on, and the types the two
//! share.
//!
//! The server decodes every request and writes every reply; a filesystem only answers
//! the calls. Beside what any FUSE filesystem answers, the trait carries what vfsd's
//! server needs of its filesystem: a create's extensions (`CreateExt`), whether an open
//! may wait (`OpenWait`), the privileges a data change drops (`kill_privs`), lock waits
//! (`LockWait`), the session's flags, and READ straight into guest buffers (`read`,
//! `read_nowait`) and WRITE straight from them (`write_iov`).
//!
//! A method a filesystem may go without answers ENOSYS by default (ENOTTY for IOCTL),
//! so a test's fake filesystem implements only what it serves.
//!
//! The shared types live here by topic: `create` (a create's extensions), `open_wait`,
//! `in_flight` (a request a migration carries) and `wake` (calling off a thread blocked
//! in a lock call, `Blocker`).

use std::ffi::CStr;
use std::io;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, FileLock};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, GetxattrReply, ListxattrReply, OpenOptions, SetattrValid,
    ZeroCopyWriter,
};

use crate::stats::Stats;

mod create;
mod in_flight;
mod open_wait;
pub mod wake;

pub use create::{CreateExt, SecCtx};
pub use in_flight::InFlight;
pub use open_wait::OpenWait;
pub use wake::{install_wake_handler, Blocker};

fn enosys<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// A SETLKW's wait for its lock, run on a waiter thread of its own.
pub trait LockWait: Send + 'static {
    /// Blocks until the lock is granted, or `blocker` is called off (EINTR).
    fn block(self, blocker: &Blocker) -> io::Result<()>;
}

/// No wait: for a filesystem whose SETLKW never waits.
pub enum NoLockWait {}

impl LockWait for NoLockWait {
    fn block(self, _: &Blocker) -> io::Result<()> {
        match self {}
    }
}

/// What vfsd's server needs of a filesystem, by area: session, entry, data, dir, xattr,
/// locks. Node ids and handles are the FUSE protocol's u64s.
pub trait FileSystem: Send + Sync + 'static {
    /// What a SETLKW that has to wait waits on.
    type LockWait: LockWait;

    // Session.

    /// A new FUSE session (INIT): the 64-bit INIT flags (`abi::flags`) the filesystem
    /// wants. Nothing of an earlier session survives.
    fn negotiate(&self) -> u64;

    /// The flags INIT enabled on both sides.
    fn start_session(&self, enabled: u64);

    /// Whether the session enabled `flag`.
    fn enabled(&self, flag: u64) -> bool;

    /// DESTROY: the session ends.
    fn destroy(&self);

    /// SYNCFS: the filesystem that holds `node`.
    fn syncfs(&self, _node: u64) -> io::Result<()> {
        enosys()
    }

    /// A request came from the guest's process `pid` (the lock stall rule: a lock
    /// holder that sends anything is busy).
    fn note_caller(&self, _pid: u32) {}

    /// Runs `f` (one request) with opens allowed to wait for a host lease break or not.
    fn with_open_wait<R>(&self, _wait: OpenWait, f: impl FnOnce() -> R) -> R {
        f()
    }

    /// Whether `e` says an open would have waited under `OpenWait::Never`.
    fn is_would_wait(&self, _e: &io::Error) -> bool {
        false
    }

    /// `--stats`: the server's counters `stats` with the filesystem's, as one JSON value.
    fn stats_snapshot(&self, _stats: &Stats) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Whether handle `fh` of `node` is open for appending: a WRITE a dead serving
    /// process may have done already is then not done again.
    fn appends(&self, _fh: u64, _node: u64) -> bool {
        true
    }

    /// Whether handle `fh` of `node` is open.
    fn has_handle(&self, _fh: u64, _node: u64) -> bool {
        true
    }

    // Entry: names and attributes.

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry>;

    /// How long the guest may cache a LOOKUP's ENOENT (zero: a bare ENOENT).
    fn negative_timeout(&self) -> Duration {
        Duration::ZERO
    }

    fn forget(&self, _ctx: &Context, _node: u64, _count: u64) {}

    fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
        for (node, count) in requests {
            self.forget(ctx, node, count);
        }
    }

    fn getattr(
        &self,
        ctx: &Context,
        node: u64,
        fh: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)>;

    fn setattr(
        &self,
        _ctx: &Context,
        _node: u64,
        _attr: libc::stat64,
        _fh: Option<u64>,
        _valid: SetattrValid,
    ) -> io::Result<(libc::stat64, Duration)> {
        enosys()
    }

    fn readlink(&self, _ctx: &Context, _node: u64) -> io::Result<Vec<u8>> {
        enosys()
    }

    fn symlink(
        &self,
        _ctx: &Context,
        _target: &CStr,
        _parent: u64,
        _name: &CStr,
        _ext: &CreateExt,
    ) -> io::Result<Entry> {
        enosys()
    }

    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &CStr,
        _mode: u32,
        _rdev: u32,
        _umask: u32,
        _ext: &CreateExt,
    ) -> io::Result<Entry> {
        enosys()
    }

    fn mkdir(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &CStr,
        _mode: u32,
        _umask: u32,
        _ext: &CreateExt,
    ) -> io::Result<Entry> {
        enosys()
    }

    fn unlink(&self, _ctx: &Context, _parent: u64, _name: &CStr) -> io::Result<()> {
        enosys()
    }

    fn rmdir(&self, _ctx: &Context, _parent: u64, _name: &CStr) -> io::Result<()> {
        enosys()
    }

    fn rename(
        &self,
        _ctx: &Context,
        _olddir: u64,
        _oldname: &CStr,
        _newdir: u64,
        _newname: &CStr,
        _flags: u32,
    ) -> io::Result<()> {
        enosys()
    }

    fn link(&self, _ctx: &Context, _node: u64, _newparent: u64, _name: &CStr) -> io::Result<Entry> {
        enosys()
    }

    fn statfs(&self, _ctx: &Context, _node: u64) -> io::Result<libc::statvfs64> {
        enosys()
    }

    fn access(&self, _ctx: &Context, _node: u64, _mask: u32) -> io::Result<()> {
        enosys()
    }

    /// STATX: the node's (or open handle's) statx, and how long it is valid.
    fn statx(
        &self,
        _node: u64,
        _fh: Option<u64>,
        _sync: i32,
        _mask: u32,
    ) -> io::Result<(libc::statx, Duration)> {
        enosys()
    }

    /// CREATE: the new node's entry and the open handle.
    fn create(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &CStr,
        _args: CreateIn,
        _ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        enosys()
    }

    /// TMPFILE: an unnamed file in `parent`, as CREATE answers it.
    fn tmpfile(
        &self,
        _ctx: &Context,
        _parent: u64,
        _flags: u32,
        _mode: u32,
        _umask: u32,
        _ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        enosys()
    }

    // Data: open files.

    /// OPEN of a file; under `OpenWait::Never` an open that would wait fails with an
    /// error `is_would_wait` knows.
    fn open(
        &self,
        _ctx: &Context,
        _node: u64,
        _flags: u32,
        _fuse_flags: u32,
        _wait: OpenWait,
    ) -> io::Result<(u64, OpenOptions)> {
        enosys()
    }

    /// READ into `w` (the guest's buffers).
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _w: &mut dyn ZeroCopyWriter,
        _size: u32,
        _offset: u64,
        _lock_owner: Option<u64>,
        _flags: u32,
    ) -> io::Result<usize> {
        enosys()
    }

    /// READ into `iov` (guest memory) if it can be done without blocking; None if it
    /// would block (or is not tried), and nothing was read.
    ///
    /// # Safety
    /// Each iovec must span memory writable for the whole call.
    unsafe fn read_nowait(
        &self,
        _node: u64,
        _fh: u64,
        _offset: u64,
        _iov: &[libc::iovec],
    ) -> Option<usize> {
        None
    }

    /// The set-id bits a data change by `uid`:`gid` drops (`asked`: the guest's
    /// KILL_PRIV flag, None where the request has none); None for nothing to drop.
    fn kill_privs(&self, _uid: u32, _gid: u32, _asked: Option<bool>) -> Option<u32> {
        None
    }

    /// WRITE from `iov` (guest memory), dropping `kill` privileges first.
    ///
    /// # Safety
    /// Each iovec must span memory readable for the whole call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn write_iov(
        &self,
        _node: u64,
        _fh: u64,
        _offset: u64,
        _iov: &[libc::iovec],
        _kill: Option<u32>,
        _flags: u32,
    ) -> io::Result<usize> {
        enosys()
    }

    fn flush(&self, _ctx: &Context, _node: u64, _fh: u64, _lock_owner: u64) -> io::Result<()> {
        enosys()
    }

    #[allow(clippy::too_many_arguments)]
    fn release(
        &self,
        _ctx: &Context,
        _node: u64,
        _flags: u32,
        _fh: u64,
        _flush: bool,
        _flock_release: bool,
        _lock_owner: Option<u64>,
    ) -> io::Result<()> {
        enosys()
    }

    fn fsync(&self, _ctx: &Context, _node: u64, _datasync: bool, _fh: u64) -> io::Result<()> {
        enosys()
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _mode: u32,
        _offset: u64,
        _length: u64,
    ) -> io::Result<()> {
        enosys()
    }

    fn lseek(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _offset: u64,
        _whence: u32,
    ) -> io::Result<u64> {
        enosys()
    }

    /// COPY_FILE_RANGE, dropping `kill` privileges of the file written first.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _kill: Option<u32>,
        _node_in: u64,
        _fh_in: u64,
        _off_in: u64,
        _node_out: u64,
        _fh_out: u64,
        _off_out: u64,
        _len: u64,
        _flags: u64,
    ) -> io::Result<usize> {
        enosys()
    }

    /// IOCTL: the result and the out data (at most `out_size` bytes).
    fn ioctl(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _cmd: u32,
        _data: Option<&[u8]>,
        _out_size: u32,
    ) -> io::Result<(i32, Vec<u8>)> {
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }

    fn bmap(&self, _ctx: &Context, _node: u64, _block: u64, _blocksize: u32) -> io::Result<u64> {
        enosys()
    }

    fn poll(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _kh: u64,
        _flags: u32,
        _events: u32,
    ) -> io::Result<u32> {
        enosys()
    }

    // Dir: directories.

    fn opendir(&self, _ctx: &Context, _node: u64, _flags: u32) -> io::Result<(u64, OpenOptions)> {
        enosys()
    }

    /// READDIR: calls `add_entry` for each entry from `offset` on until it returns 0.
    fn readdir(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _size: u32,
        _offset: u64,
        _add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        enosys()
    }

    /// READDIRPLUS: READDIR with each entry's node looked up.
    fn readdirplus(
        &self,
        _ctx: &Context,
        _node: u64,
        _fh: u64,
        _size: u32,
        _offset: u64,
        _add_entry: &mut dyn FnMut(DirEntry, Entry) -> io::Result<usize>,
    ) -> io::Result<()> {
        enosys()
    }

    fn releasedir(&self, _ctx: &Context, _node: u64, _flags: u32, _fh: u64) -> io::Result<()> {
        enosys()
    }

    fn fsyncdir(&self, _ctx: &Context, _node: u64, _datasync: bool, _fh: u64) -> io::Result<()> {
        enosys()
    }

    // Xattr.

    fn setxattr(
        &self,
        _ctx: &Context,
        _node: u64,
        _name: &CStr,
        _value: &[u8],
        _flags: u32,
    ) -> io::Result<()> {
        enosys()
    }

    fn getxattr(
        &self,
        _ctx: &Context,
        _node: u64,
        _name: &CStr,
        _size: u32,
    ) -> io::Result<GetxattrReply> {
        enosys()
    }

    fn listxattr(&self, _ctx: &Context, _node: u64, _size: u32) -> io::Result<ListxattrReply> {
        enosys()
    }

    fn removexattr(&self, _ctx: &Context, _node: u64, _name: &CStr) -> io::Result<()> {
        enosys()
    }

    /// Clears S_ISGID after an ACL change by a caller entitled to neither the file's
    /// group nor CAP_FSETID (SETXATTR_EXT's kill-sgid flag).
    fn acl_kill_sgid(&self, _node: u64) -> io::Result<()> {
        enosys()
    }

    // Locks.

    /// GETLK: the lock that would conflict with `lock` (type F_UNLCK for none).
    fn getlk(
        &self,
        _node: u64,
        _fh: u64,
        _owner: u64,
        _lock: FileLock,
        _flock: bool,
    ) -> io::Result<FileLock> {
        enosys()
    }

    /// SETLK, or SETLKW (`wait`): Ok(None) when done, Ok(Some) for a wait to block on.
    #[allow(clippy::too_many_arguments)]
    fn setlk(
        &self,
        _node: u64,
        _fh: u64,
        _owner: u64,
        _lock: FileLock,
        _flock: bool,
        _wait: bool,
    ) -> io::Result<Option<Self::LockWait>> {
        enosys()
    }

    /// Counts a SETLKW refused ENOLCK (past its ring's share of lock waits).
    fn count_lock_refusal(&self) {}
}
