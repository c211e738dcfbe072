//! vfsd's passthrough filesystem: serves FUSE requests from a host directory.
//!
//! Split by concern: `inode` (node ids ↔ O_PATH fds), `handle` (open files), `lock` (the
//! per-inode I/O lock behind parallel direct writes), `dir` (names: lookup, create, rename,
//! readdir), `file` (data: open, read, write, fallocate, copy), `nowait` (page-cache reads
//! served without blocking), `attr` (getattr, setattr, statfs, access) and `xattr`. This
//! file holds the configuration and shared helpers; `filesystem` implements vfsd's
//! `FileSystem` trait (`crate::filesystem`), routing each request to them.

mod acl;
mod attr;
mod create_ext;
mod dir;
mod file;
pub mod filelocks;
mod filesystem;
pub mod handle;
pub(crate) mod handover;
pub use handover::RuntimeDir;
pub mod idtranslate;
pub mod inode;
pub mod ioctl;
mod killpriv;
pub mod lock;
pub mod migration;
pub mod node_handle;
use node_handle::Need;
pub mod nowait;
mod xattr;
pub mod xattrmap;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{CreateIn, FOPEN_IN_KILL_SUIDGID};
use fuse_backend_rs::api::filesystem::{Context, Entry, OpenOptions, ROOT_ID};

use crate::filesystem::{CreateExt, OpenWait};
use crate::sys;
use handle::HandleTable;
use inode::{Inode, InodeTable};

/// FOPEN_PARALLEL_DIRECT_WRITES (FUSE 7.36): the guest may send several direct writes to
/// this file at once. fuse-backend-rs has no constant for it.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// FOPEN_NOFLUSH (FUSE 7.31): the guest sends no FLUSH when it closes the file.
pub const FOPEN_NOFLUSH: u32 = 1 << 5;

/// How much the guest may cache, with virtiofsd's meanings (`cli::Cache` spells them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// Close-to-open: attributes for 1 s, data revalidated on open.
    Auto,
    /// Cache everything for a long time; host-side changes may be missed.
    Always,
    /// No caching: every access goes to the host, file I/O is direct.
    Never,
    /// Cache metadata like `always`, but do file I/O directly.
    Metadata,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub root_dir: PathBuf,
    pub cache: CachePolicy,
    pub xattr: bool,
    pub readonly: bool,
    pub writeback: bool,
    pub allow_direct_io: bool,
    pub parallel_direct_writes: bool,
    pub announce_submounts: bool,
    pub inode_file_handles: inode::FileHandleMode,
    /// Offer READDIRPLUS (`--no-readdirplus` turns it off).
    pub readdirplus: bool,
    /// Pass the guest's O_NOATIME to host opens (`--preserve-noatime`). By default it is
    /// dropped, as virtiofsd does: it fails with EPERM on files the daemon does not own.
    pub preserve_noatime: bool,
    /// Offer FUSE_ALLOW_IDMAP (`--allow-idmap`): idmapped mounts of the share in the guest.
    pub allow_idmap: bool,
    /// Offer FUSE_HANDLE_KILLPRIV_V2 (`--no-killpriv-v2` turns it off). vfsd drops
    /// privileges on data changes by non-root callers either way (see `killpriv`).
    pub killpriv_v2: bool,
    /// Forward POSIX (and OFD) locks to the host (`--no-posix-lock` turns it off).
    pub posix_lock: bool,
    /// Forward flock to the host (`--no-flock` turns it off).
    pub flock: bool,
    /// Zero-message open (`--no-open`, `node_handle`): OPEN answered ENOSYS, I/O by node.
    pub no_open: bool,
    /// How long a node's fd for writing stays open unwritten (`node_handle::WRITE_IDLE`).
    pub no_open_write_idle: Duration,
    /// Byte ranges the guest may hold locked at once (`--max-locks`).
    pub max_locks: usize,
    /// Byte ranges the guest may hold locked on one file (`--max-locks-per-file`).
    pub max_locks_per_file: usize,
    /// SETLKW requests that may wait at once (`--max-lock-waiters`).
    pub max_lock_waiters: usize,
    /// How long a POSIX wait waits for guest holders that have all gone quiet before it
    /// is answered EDEADLK (`--lock-stall-timeout`; zero: never).
    pub lock_stall_timeout: std::time::Duration,
    /// Offer FUSE_DIRECT_IO_ALLOW_MMAP (`--allow-mmap`): shared mmap of files opened for
    /// direct I/O (`--cache never`, `metadata`).
    pub allow_mmap: bool,
    /// Guest changes of project ids and project inheritance (`--allow-project-id`).
    pub allow_project_id: bool,
    /// POSIX ACLs (`--posix-acl`): FUSE_POSIX_ACL and DONT_MASK are offered and the
    /// `system.posix_acl_*` names are passed to the host (see `acl`).
    pub posix_acl: bool,
    /// Label new nodes with the guest's security context (`--security-label`,
    /// FUSE_SECURITY_CTX; see `create_ext`).
    pub security_label: bool,
    /// `--translate-uid` / `--translate-gid` (identity when not given).
    pub id_translate: idtranslate::IdTranslate,
    /// How guest xattr names map to host names (`--xattrmap`; by default
    /// `xattrmap::DEFAULT_RULES`, which keeps privileged names under a private prefix).
    pub xattrmap: xattrmap::XattrMap,
    /// `--migration-*`: how the device state names files, and what a load does with one
    /// it can't find.
    pub migration: migration::MigrationConfig,
    /// Where a migration's lock handover listens (`handover`); none: no handover.
    pub runtime_dir: Option<Arc<handover::RuntimeDir>>,
    /// Where the session, nodes and handles are recorded for the serving process that
    /// takes over should this one die (`recovery`); none: not recorded.
    pub crash_record: Option<Arc<crate::recovery::record::Record>>,
}

impl Config {
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Config {
            root_dir: root_dir.into(),
            cache: CachePolicy::Auto,
            xattr: false,
            readonly: false,
            writeback: false,
            allow_direct_io: false,
            parallel_direct_writes: true,
            announce_submounts: false,
            inode_file_handles: inode::FileHandleMode::Never,
            readdirplus: true,
            preserve_noatime: false,
            allow_idmap: false,
            killpriv_v2: true,
            posix_lock: true,
            flock: true,
            no_open: false,
            no_open_write_idle: node_handle::WRITE_IDLE,
            max_locks: 65536,
            max_locks_per_file: 4096,
            max_lock_waiters: 1024,
            lock_stall_timeout: std::time::Duration::from_secs(30),
            allow_mmap: false,
            allow_project_id: false,
            posix_acl: false,
            security_label: false,
            id_translate: idtranslate::IdTranslate::default(),
            xattrmap: xattrmap::XattrMap::builtin(),
            migration: Default::default(),
            runtime_dir: None,
            crash_record: None,
        }
    }

    fn timeout(&self) -> Duration {
        match self.cache {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto => Duration::from_secs(1),
            CachePolicy::Always | CachePolicy::Metadata => Duration::from_secs(86400),
        }
    }
}

/// What the filesystem tells the statistics (`PassthroughFs::counters`).
pub struct FsCounters {
    pub live_inodes: usize,
    pub open_handles: usize,
    /// Highest writes in flight on one file, forgotten nodes included.
    pub peak_writes_in_flight: u32,
    /// Exclusivity violations seen, forgotten nodes included (must stay 0).
    pub exclusive_violations: u64,
    /// Live nodes that have seen writes.
    pub written: Vec<InodeCounters>,
    /// Lock byte ranges held, SETLKW requests waiting, and ENOLCK answers.
    pub locks_held: usize,
    pub lock_waiters: usize,
    pub lock_enolck: u64,
    /// SETLKWs answered EDEADLK (a cycle of waits).
    pub lock_edeadlk: u64,
    /// Lock owners, each with a host open file description.
    pub lock_owners: usize,
    /// SETLKWs answered EDEADLK for waiting on stalled guest holders.
    pub lock_stalled: u64,
    /// O_PATH fds nodes hold, and their bound (`inode::FdCache`).
    pub inode_fds: usize,
    pub inode_fd_limit: usize,
    /// RWF_NOWAIT reads answered EOPNOTSUPP (at most about one per host filesystem).
    pub nowait_unsupported: u64,
}

pub struct InodeCounters {
    pub nodeid: u64,
    pub host_ino: u64,
    pub io: lock::IoLockStats,
}

/// The longest a guest may cache a negative LOOKUP (`negative_timeout`).
pub const NEGATIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The most open fds a metrics scrape counts one by one (on a kernel before 6.2, which
/// gives no count): past it, the scrape leaves the figure out rather than walk up to a
/// million /proc entries.
pub const OPEN_FDS_COUNTED: usize = 65_536;

pub struct PassthroughFs {
    cfg: Config,
    inodes: InodeTable,
    handles: HandleTable,
    /// Under `--no-open`, the fd each node's handle 0 uses (`node_handle`).
    node_handles: node_handle::NodeHandles,
    /// Whether the share's root is on a file system that does nothing on close()
    /// (`sys::close_is_silent`).
    close_silent_root: bool,
    /// File locks forwarded to the host.
    locks: Arc<filelocks::FileLocks>,
    /// Where the xattr map keeps a guest's `security.capability` on the host, which a data
    /// change by a non-root caller drops too (`killpriv`).
    mapped_cap: Option<CString>,
    /// `/proc/self/fd`, to reopen O_PATH fds for I/O without resolving any guest path.
    proc_self_fd: OwnedFd,
    /// The INIT flags both sides enabled (`abi::flags`): the writeback cache,
    /// FUSE_DONT_MASK (see `acl`), submounts (FUSE_ATTR_SUBMOUNT).
    enabled: std::sync::atomic::AtomicU64,
    /// Host filesystems without RWF_NOWAIT (see `nowait`).
    nowait_unsupported: nowait::Unsupported,
    /// Counts resets: what a migration's lock retakes (`migration`) check they still
    /// belong to.
    session: std::sync::atomic::AtomicU64,
    /// A migration's lock retakes, called off when the session ends.
    retakes: std::sync::Mutex<Vec<Arc<crate::filesystem::Blocker>>>,
}

impl PassthroughFs {
    pub fn new(cfg: Config) -> io::Result<Self> {
        let proc_self_fd = sys::openat(
            libc::AT_FDCWD,
            c"/proc/self/fd",
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        Self::with_proc_fd(cfg, proc_self_fd)
    }

    /// As `new`, with `/proc/self/fd` opened by the caller (before a sandbox hid /proc).
    pub fn with_proc_fd(mut cfg: Config, proc_self_fd: OwnedFd) -> io::Result<Self> {
        if cfg.no_open {
            // A close sends no RELEASE, which is what releases a flock and an OFD lock of
            // the guest's: under --no-open its locks are its own.
            cfg.posix_lock = false;
            cfg.flock = false;
        }
        let root_path = CString::new(cfg.root_dir.as_os_str().as_encoded_bytes())
            .map_err(|_| sys::errno(libc::EINVAL))?;
        let root_fd = sys::openat(
            libc::AT_FDCWD,
            &root_path,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        let st = sys::statx(root_fd.as_raw_fd(), sys::EMPTY, libc::AT_EMPTY_PATH)?;
        if cfg.xattr {
            let root = sys::fd_name(root_fd.as_raw_fd());
            let how = sys::probe_xattrat(proc_self_fd.as_raw_fd(), &root);
            log::info!("xattrs through {how}");
        }
        // Modes from the guest already had its umask applied; the daemon's must not apply twice.
        // SAFETY: umask has no preconditions.
        unsafe { libc::umask(0) };
        let mut inodes = InodeTable::with_file_handles(
            cfg.inode_file_handles,
            inode::FdCache::limit_for(sys::nofile_limit()),
        );
        let mut handles = HandleTable::new();
        if let Some(r) = &cfg.crash_record {
            inodes.set_record(r.clone());
            handles.set_record(r.clone());
        }
        let close_silent_root = sys::close_is_silent(&root_fd);
        inodes.insert_root(root_fd, &st)?;
        let locks = Arc::new(
            filelocks::FileLocks::new(
                cfg.posix_lock,
                cfg.flock,
                cfg.max_locks,
                cfg.max_locks_per_file,
                cfg.max_lock_waiters,
                cfg.readonly,
            )
            .with_stall_timeout(cfg.lock_stall_timeout)
            .with_record(cfg.crash_record.clone()),
        );
        let write_idle = cfg.no_open_write_idle;
        Ok(PassthroughFs {
            mapped_cap: killpriv::mapped_name(&cfg.xattrmap),
            locks,
            cfg,
            inodes,
            handles,
            node_handles: node_handle::NodeHandles::new(
                node_handle::limit_for(sys::nofile_limit()),
                write_idle,
            ),
            close_silent_root,
            proc_self_fd,
            enabled: Default::default(),
            nowait_unsupported: Default::default(),
            session: Default::default(),
            retakes: Default::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A request of guest thread `pid` came: a lock holder that sends requests is not
    /// stalled (`--lock-stall-timeout`).
    pub fn note_caller(&self, pid: u32) {
        self.locks.note_caller(pid);
    }

    /// A lock request refused at a bound outside the lock table (a ring's share of lock
    /// waits): counted with the table's own ENOLCKs.
    pub fn count_lock_refusal(&self) {
        self.locks
            .counters
            .enolck
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// This process's open fds and resident memory (None where /proc can't be read, and
    /// the fds when a kernel before 6.2 would have them counted one by one past
    /// `OPEN_FDS_COUNTED`).
    pub fn process_gauges(&self) -> (Option<usize>, Option<u64>) {
        let fd = self.proc_self_fd.as_raw_fd();
        (
            sys::open_fds(fd, OPEN_FDS_COUNTED).ok().flatten(),
            sys::resident_bytes(fd).ok(),
        )
    }

    /// `counters` without the per-inode figures, which take a walk of every node.
    pub fn gauges(&self) -> FsCounters {
        FsCounters {
            live_inodes: self.inodes.len(),
            open_handles: self.handles.len(),
            peak_writes_in_flight: self.inodes.retired_peak(),
            exclusive_violations: self.inodes.retired_violations(),
            written: Vec::new(),
            locks_held: self.locks.held(),
            lock_waiters: self
                .locks
                .counters
                .waiters
                .load(std::sync::atomic::Ordering::Relaxed),
            lock_enolck: self
                .locks
                .counters
                .enolck
                .load(std::sync::atomic::Ordering::Relaxed),
            lock_edeadlk: self
                .locks
                .counters
                .edeadlk
                .load(std::sync::atomic::Ordering::Relaxed),
            lock_owners: self
                .locks
                .counters
                .owners
                .load(std::sync::atomic::Ordering::Relaxed),
            lock_stalled: self
                .locks
                .counters
                .stalled
                .load(std::sync::atomic::Ordering::Relaxed),
            inode_fds: self.inodes.fd_cache().held(),
            inode_fd_limit: self.inodes.fd_cache().limit(),
            nowait_unsupported: self
                .nowait_unsupported
                .seen
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A snapshot of the counters the statistics report.
    pub fn counters(&self) -> FsCounters {
        let mut c = self.gauges();
        for inode in self.inodes.snapshot() {
            let s = inode.io.stats();
            c.peak_writes_in_flight = c.peak_writes_in_flight.max(s.peak_writes_in_flight);
            c.exclusive_violations += s.exclusive_violations;
            if s.shared_writes + s.exclusive_writes > 0 {
                c.written.push(InodeCounters {
                    nodeid: inode.nodeid,
                    host_ino: inode.key.ino,
                    io: s,
                });
            }
        }
        c
    }

    pub(crate) fn inode(&self, nodeid: u64) -> io::Result<Arc<Inode>> {
        self.inodes.get(nodeid)
    }

    /// The handle a request names: under `--no-open`, handle 0 is the node's own
    /// (`node_handle`); otherwise one an OPEN, CREATE or OPENDIR gave.
    pub(crate) fn handle(&self, fh: u64, nodeid: u64) -> io::Result<Arc<handle::Handle>> {
        self.handle_for(fh, nodeid, Need::Any)
    }

    /// Whether handle `fh` of `nodeid` is open for appending (`server::FuseServer::again`).
    pub fn appends(&self, fh: u64, nodeid: u64) -> bool {
        self.handles.get(fh, nodeid).is_ok_and(|h| h.is_append())
    }

    /// Whether handle `fh` of `nodeid` is open.
    pub fn has_handle(&self, fh: u64, nodeid: u64) -> bool {
        self.handles.get(fh, nodeid).is_ok()
    }

    /// `handle`, with a node's fd that serves `need`: one that does not is replaced.
    pub(crate) fn handle_for(
        &self,
        fh: u64,
        nodeid: u64,
        need: Need,
    ) -> io::Result<Arc<handle::Handle>> {
        if fh != 0 || !self.cfg.no_open {
            return self.handles.get(fh, nodeid);
        }
        let i = self.inode(nodeid)?;
        if !i.is_reg() {
            return Err(sys::errno(libc::EBADF));
        }
        if let Some(h) = self
            .node_handles
            .get(nodeid)
            .filter(|h| need.served_by(h.flags))
        {
            if need == Need::Write {
                self.node_handles.wrote(&h);
            }
            return Ok(h);
        }
        // The guest kernel checked the caller's access (virtiofs mounts with
        // default_permissions); the fd serves every caller of the node. A queue thread
        // hands the request to a worker rather than wait for a host lease break here.
        let wait = nowait::open_wait_here();
        let mut last = sys::errno(libc::EACCES);
        for &acc in need.flags_to_try() {
            match self.with_fd_room(|| self.reopen_to_open(&i, acc, wait)) {
                Ok(fd) => {
                    let nowait = self.nowait_unsupported.worth_trying(i.key.mnt_id);
                    let h = self.node_handles.put(i.clone(), fd, acc, nowait);
                    // A FORGET or a new session may have come meanwhile: no fd is kept
                    // for a node that is gone.
                    if !self.inode(nodeid).is_ok_and(|now| Arc::ptr_eq(&now, &i)) {
                        self.node_handles.remove(nodeid, Some(&h));
                    }
                    return Ok(h);
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
                    ) =>
                {
                    last = e
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The handle a queue thread may read through without opening anything: under
    /// `--no-open`, the node's fd if one is open for reading.
    pub(crate) fn open_handle(&self, fh: u64, nodeid: u64) -> Option<Arc<handle::Handle>> {
        if fh == 0 && self.cfg.no_open {
            return self
                .node_handles
                .get(nodeid)
                .filter(|h| Need::Read.served_by(h.flags));
        }
        self.handles.get(fh, nodeid).ok()
    }

    /// Opens the file behind an O_PATH fd for I/O through `/proc/self/fd/N`: this names the
    /// exact inode, so no path component is resolved again.
    pub(crate) fn reopen(&self, inode: &Arc<Inode>, flags: i32) -> io::Result<OwnedFd> {
        if inode.is_symlink() {
            return Err(sys::errno(libc::ELOOP));
        }
        if !inode.is_reg() && !inode.is_dir() {
            // Opening a FIFO or device on the host could block or reach hardware.
            return Err(sys::errno(libc::ENXIO));
        }
        let flags = flags & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
        let open = || {
            if let Some(fd) = inode.open_by_handle(flags | libc::O_NOCTTY) {
                return fd;
            }
            let pfd = inode.path_fd()?;
            sys::openat(
                self.proc_self_fd.as_raw_fd(),
                &sys::fd_name(pfd.as_raw_fd()),
                flags | libc::O_NOCTTY,
                0,
            )
        };
        self.with_fd_room(open)
    }

    /// Runs `open` (something that makes an fd); out of fds (EMFILE, ENFILE), nodes give
    /// up some of their cached O_PATH fds and it runs once more. What the guest asks for
    /// (a lookup, an open file) comes before the cache.
    pub(crate) fn with_fd_room<T>(&self, open: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match open() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                self.inodes.fd_cache().shrink();
                open()
            }
            r => r,
        }
    }

    pub(crate) fn check_writable(&self) -> io::Result<()> {
        if self.cfg.readonly {
            Err(sys::errno(libc::EROFS))
        } else {
            Ok(())
        }
    }

    pub(crate) fn entry(&self, inode: &Inode, st: libc::stat64) -> Entry {
        let t = self.cfg.timeout();
        Entry {
            inode: inode.nodeid,
            generation: 0,
            attr: self.guest_attr(st),
            attr_flags: 0,
            attr_timeout: t,
            entry_timeout: t,
        }
    }

    /// Whether a data change by the request's caller (`uid`, `gid`: the guest's ids) drops
    /// set-id bits and file capabilities: Some(the caller's host gid) or None (see
    /// `killpriv`). `asked` is the request's KILL_SUIDGID flag, None for an opcode that
    /// has none (FALLOCATE, COPY_FILE_RANGE).
    pub fn kill_privs(&self, uid: u32, gid: u32, asked: Option<bool>) -> Option<u32> {
        let host_gid = self.cfg.id_translate.gid.to_host(gid).unwrap_or(u32::MAX);
        if uid == crate::abi::FUSE_INVALID_UIDGID && self.enabled(crate::abi::flags::ALLOW_IDMAP) {
            // No caller named outside creates. With HANDLE_KILLPRIV_V2 the guest's flag says
            // whether the caller lacks CAP_FSETID; without it, or with no flag to send, the
            // change drops them as any non-root caller's would (root's too).
            let drop = match asked {
                Some(flag) => flag || !self.enabled(crate::abi::flags::HANDLE_KILLPRIV_V2),
                None => true,
            };
            return drop.then_some(host_gid);
        }
        killpriv::needed(uid, host_gid, asked.unwrap_or(false))
    }

    /// The caller's gid on the host (`--translate-gid`); one no host file has when the
    /// translation forbids it, so no group membership is assumed.
    pub fn host_gid(&self, ctx: &Context) -> u32 {
        self.cfg
            .id_translate
            .gid
            .to_host(ctx.gid)
            .unwrap_or(u32::MAX)
    }

    /// Host attributes as the guest sees them (`--translate-uid/gid`): every attribute
    /// reply passes here.
    pub(crate) fn guest_attr(&self, st: libc::stat64) -> libc::stat64 {
        self.cfg.id_translate.stat_to_guest(st)
    }

    pub(crate) fn attr_timeout(&self) -> Duration {
        self.cfg.timeout()
    }

    /// How long the guest may cache that a name does not exist: the cache mode's entry
    /// timeout, at most `NEGATIVE_TIMEOUT` (a name the host creates shows within it, as
    /// a name it removes does in `auto`); none with `--cache never`.
    pub fn negative_timeout(&self) -> Duration {
        self.cfg.timeout().min(NEGATIVE_TIMEOUT)
    }

    pub(crate) fn session(&self) -> u64 {
        self.session.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records the INIT flags both sides enabled, as the INIT reply says.
    pub fn start_session(&self, enabled: u64) {
        self.enabled
            .store(enabled, std::sync::atomic::Ordering::Release);
        if let Some(r) = &self.cfg.crash_record {
            r.set_session(enabled);
        }
    }

    /// Whether this session enabled INIT flag `flag` (`abi::flags`).
    pub(crate) fn enabled(&self, flag: u64) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::Acquire) & flag != 0
    }

    pub(crate) fn writeback_enabled(&self) -> bool {
        self.enabled(crate::abi::flags::WRITEBACK_CACHE)
    }

    /// Open options for a regular file opened with guest flags `flags`.
    pub(crate) fn file_open_options(&self, flags: u32) -> OpenOptions {
        let mut bits = match self.cfg.cache {
            CachePolicy::Never | CachePolicy::Metadata => OpenOptions::DIRECT_IO.bits(),
            CachePolicy::Always => OpenOptions::KEEP_CACHE.bits(),
            CachePolicy::Auto => 0,
        };
        let direct = bits & OpenOptions::DIRECT_IO.bits() != 0
            || (self.cfg.allow_direct_io && flags as i32 & libc::O_DIRECT != 0);
        if direct && self.cfg.parallel_direct_writes {
            bits |= FOPEN_PARALLEL_DIRECT_WRITES;
        }
        // SAFETY: OpenOptions is a plain u32 bit set (bitflags 1.x marks retaining unknown bits
        // unsafe only because they have no name); bit 6 is FOPEN_PARALLEL_DIRECT_WRITES in the
        // FUSE ABI and is passed to the guest unchanged.
        unsafe { OpenOptions::from_bits_unchecked(bits) }
    }

    /// `file_open_options` for a file open as `fd`, with FOPEN_NOFLUSH where a FLUSH would
    /// carry nothing: no POSIX lock of the guest's reaches the host (`--no-posix-lock`), and
    /// the host filesystem does nothing on close() that the guest could see (network and
    /// FUSE filesystems write back and report errors there).
    pub(crate) fn open_options_for(&self, flags: u32, fd: &OwnedFd) -> OpenOptions {
        let opts = self.file_open_options(flags);
        if self.cfg.posix_lock || !sys::close_is_silent(fd) {
            return opts;
        }
        // SAFETY: as in file_open_options; bit 5 is FOPEN_NOFLUSH in the FUSE ABI.
        unsafe { OpenOptions::from_bits_unchecked(opts.bits() | FOPEN_NOFLUSH) }
    }

    /// The file locks forwarded to the host.
    pub fn locks(&self) -> &Arc<filelocks::FileLocks> {
        &self.locks
    }

    /// Drops every node and handle but the root (the guest unmounted, or a new INIT), and
    /// every lock. A handle's flock goes at once, even if a request still running holds
    /// the handle (and so its fd) a moment longer.
    fn reset(&self) {
        self.session
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // Before the locks go: a retake granted afterwards would outlive them.
        self.cancel_retakes();
        self.locks.release_all();
        let shared = self.locks.shared.load(std::sync::atomic::Ordering::Acquire);
        for h in self.handles.clear() {
            if shared {
                continue; // closed only: another daemon's copy holds the flock
            }
            let _ = filelocks::flock(h.fd.as_raw_fd(), libc::F_UNLCK, false);
        }
        self.node_handles.clear();
        for inode in self.inodes.snapshot() {
            if inode.nodeid != ROOT_ID {
                self.inodes.forget(inode.nodeid, u64::MAX);
            }
        }
    }
}

impl PassthroughFs {
    /// A new FUSE session: the INIT flags (64-bit, `abi::flags`) this filesystem wants.
    /// Also resets per-session state; `start_session` then records what was enabled.
    pub fn negotiate(&self) -> u64 {
        // A new session (a guest reset or crashed sends no DESTROY): nothing of an earlier
        // one survives, exactly as after DESTROY.
        self.reset();
        self.wanted_flags()
    }

    /// The INIT flags this filesystem wants, with its options.
    pub(crate) fn wanted_flags(&self) -> u64 {
        use crate::abi::flags as f;
        let mut want = f::ASYNC_READ
            | f::PARALLEL_DIROPS
            | f::BIG_WRITES
            | f::MAX_PAGES
            | f::AUTO_INVAL_DATA
            | f::ASYNC_DIO
            | f::EXPORT_SUPPORT
            | f::CACHE_SYMLINKS;
        // Never FUSE_ATOMIC_O_TRUNC: the guest kernel then sends an O_TRUNC open's
        // truncation as a SETATTR after the open, and only once it has checked that it runs
        // no program from the file. With it, OPEN truncates before that check, and an
        // O_RDONLY|O_TRUNC open that gets ETXTBSY has emptied the running program.
        if self.cfg.writeback && self.cfg.cache != CachePolicy::Never {
            want |= f::WRITEBACK_CACHE;
        }
        if self.cfg.announce_submounts {
            want |= f::SUBMOUNTS;
        }
        if self.cfg.killpriv_v2 {
            want |= f::HANDLE_KILLPRIV_V2;
        }
        if self.cfg.posix_lock {
            want |= f::POSIX_LOCKS;
        }
        if self.cfg.flock {
            want |= f::FLOCK_LOCKS;
        }
        if self.cfg.allow_mmap {
            want |= f::DIRECT_IO_ALLOW_MMAP;
        }
        if self.cfg.security_label {
            want |= f::SECURITY_CTX;
        }
        // The caller's supplementary group matters when vfsd creates as the caller.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            want |= f::CREATE_SUPP_GROUP;
        }
        if self.cfg.posix_acl {
            // SETXATTR_EXT carries the kill-sgid flag of an ACL change (see `acl`).
            want |= f::POSIX_ACL | f::DONT_MASK | f::SETXATTR_EXT;
        }
        if self.cfg.readdirplus {
            want |= f::DO_READDIRPLUS | f::READDIRPLUS_AUTO;
        }
        // Idmapped mounts of the share in the guest. The guest then names the caller only in
        // creates (`kill_privs` says what that changes), so only when asked for.
        if self.cfg.allow_idmap {
            want |= f::ALLOW_IDMAP;
        }
        want
    }
}

/// The create opcodes, with what their requests carry beside the arguments (`ext`: a
/// security context, the caller's supplementary group). vfsd's server calls these.
impl PassthroughFs {
    pub fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
        ext: &CreateExt,
    ) -> io::Result<(Entry, u64, OpenOptions)> {
        if self.cfg.no_open {
            // The guest kernel then makes files with MKNOD and opens them without a
            // message: an untar into an empty share sends no RELEASE either, where a
            // CREATE's handle would have one even after OPEN's ENOSYS.
            return Err(sys::errno(libc::ENOSYS));
        }
        let mode = self.creation_mode(parent, args.mode, args.umask)?;
        self.do_create(ctx, parent, name, args.flags, mode, ext)
    }

    /// OPEN of a file (OPENDIR is `opendir`); `wait` says whether it may wait for a
    /// host lease break where it runs (`OpenWait`, `nowait`).
    pub fn open_file(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
        wait: OpenWait,
    ) -> io::Result<(u64, OpenOptions)> {
        let kill = self.kill_privs(
            ctx.uid,
            ctx.gid,
            Some(fuse_flags & FOPEN_IN_KILL_SUIDGID != 0),
        );
        if self.cfg.no_open {
            // The guest kernel then sends no OPEN and no RELEASE again (`node_handle`).
            return Err(sys::errno(libc::ENOSYS));
        }
        self.do_open(inode, flags, kill, wait)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        let mode = self.creation_mode(parent, mode, umask)?;
        self.do_mknod(ctx, parent, name, mode, rdev, ext)
    }

    pub fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        let mode = self.creation_mode(parent, mode, umask)?;
        self.do_mkdir(ctx, parent, name, mode, ext)
    }

    pub fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
        ext: &CreateExt,
    ) -> io::Result<Entry> {
        self.do_symlink(ctx, linkname, parent, name, ext)
    }
}

#[cfg(test)]
mod tests;
