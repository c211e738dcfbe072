//! Command line, spelled as virtiofsd's so VMM managers can switch binaries.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::passthrough::idtranslate::{IdTranslate, IdTranslation, Rule};
use crate::passthrough::inode::FileHandleMode;
use crate::passthrough::CachePolicy;

/// `--cache` (virtiofsd's values; libvirt's older `none` is `never`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Cache {
    /// Close-to-open: attributes for 1 s, data revalidated on open.
    Auto,
    /// Cache everything for a long time; host-side changes may be missed.
    Always,
    /// No caching: every access goes to the host, file I/O is direct.
    #[value(alias = "none")]
    Never,
    /// Cache metadata like `always`, but do file I/O directly.
    Metadata,
}

impl From<Cache> for CachePolicy {
    fn from(c: Cache) -> Self {
        match c {
            Cache::Auto => CachePolicy::Auto,
            Cache::Always => CachePolicy::Always,
            Cache::Never => CachePolicy::Never,
            Cache::Metadata => CachePolicy::Metadata,
        }
    }
}

/// `--inode-file-handles` (virtiofsd's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InodeFileHandles {
    /// Always hold an O_PATH fd per node.
    Never,
    /// Use a file handle where the filesystem supports them, else an fd.
    Prefer,
    /// Use file handles; a lookup on a filesystem without them fails.
    Mandatory,
}

impl From<InodeFileHandles> for FileHandleMode {
    fn from(m: InodeFileHandles) -> Self {
        match m {
            InodeFileHandles::Never => FileHandleMode::Never,
            InodeFileHandles::Prefer => FileHandleMode::Prefer,
            InodeFileHandles::Mandatory => FileHandleMode::Mandatory,
        }
    }
}

/// `--migration-mode` (virtiofsd's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MigrationMode {
    FindPaths,
    FileHandles,
}

/// `--migration-on-error` (virtiofsd's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MigrationOnError {
    Abort,
    GuestError,
}

/// `--poll`: whether queue threads poll their rings after answering (docs/design.md,
/// "Polling the ring").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// `adaptive` on a host with at least `busy_poll::AUTO_MIN_CPUS` CPUs, else `off`.
    Auto,
    /// Sleep on the kick as soon as a pop is answered.
    Off,
    /// Poll up to 200 µs while the guest's next request keeps coming within reach.
    Adaptive,
    /// Poll 200 µs after every pop the queue thread answers.
    On,
}

/// `--poll`'s value, with one line for a bad one.
fn parse_poll(s: &str) -> Result<Poll, String> {
    match s {
        "auto" => Ok(Poll::Auto),
        "off" => Ok(Poll::Off),
        "adaptive" => Ok(Poll::Adaptive),
        "on" => Ok(Poll::On),
        _ => Err("expected auto, off, adaptive or on".into()),
    }
}

impl From<Poll> for crate::device::PollMode {
    fn from(p: Poll) -> Self {
        use crate::device::PollMode as M;
        match p {
            Poll::Auto => M::for_host(std::thread::available_parallelism().map_or(1, |n| n.get())),
            Poll::Off => M::Off,
            Poll::Adaptive => M::Adaptive,
            Poll::On => M::On,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Sandbox {
    /// No sandbox: the daemon runs in the host's namespaces.
    None,
    /// New user/mount/pid/net namespaces and pivot_root into the shared directory.
    Namespace,
    /// chroot into the shared directory (needs root).
    Chroot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }
}

/// vhost-user-fs backend: shares a host directory with a guest over virtio-fs.
#[derive(Parser, Debug, Clone)]
#[command(name = "vfsd", version, about, long_about = None)]
pub struct Opt {
    /// vhost-user socket path to listen on
    #[arg(long, alias = "socket", value_name = "PATH", required_unless_present_any = ["fd", "print_capabilities"], conflicts_with = "fd")]
    pub socket_path: Option<PathBuf>,

    /// Group (name or number) that owns the socket and may connect to it
    #[arg(long, value_name = "GROUP", requires = "socket_path")]
    pub socket_group: Option<String>,

    /// File descriptor of an already listening vhost-user socket
    #[arg(long, value_name = "FD")]
    pub fd: Option<i32>,

    /// Serve the one vhost-user connection queued on this listening socket: how vfsd's
    /// supervisor starts the process that serves (docs/upgrade.md)
    #[arg(long, hide = true, value_name = "FD")]
    pub serve_fd: Option<i32>,

    /// The supervisor's own state, carried across its exec of a new binary
    #[arg(long, hide = true, value_name = "FD")]
    pub supervisor_state_fd: Option<i32>,

    /// The --metrics socket, already bound by the supervisor
    #[arg(long, hide = true, value_name = "FD", requires = "serve_fd")]
    pub metrics_fd: Option<i32>,

    /// The --stats file, already opened by the supervisor
    #[arg(long, hide = true, value_name = "FD", requires = "serve_fd")]
    pub stats_fd: Option<i32>,

    /// The supervisor's channel to the process that keeps this one's fds should it die
    /// (docs/upgrade.md, "A crash")
    #[arg(long, hide = true, value_name = "FD", requires = "serve_fd")]
    pub keeper_fd: Option<i32>,

    /// The channel to the keeper of a serving process that died, whose guest this one
    /// takes over
    #[arg(long, hide = true, value_name = "FD", requires = "keeper_fd")]
    pub recover_fd: Option<i32>,

    /// Shared directory path
    #[arg(long, value_name = "DIR", required_unless_present_any = ["print_capabilities", "compat_options"])]
    pub shared_dir: Option<PathBuf>,

    /// Tag in the device's config space (only for VMMs that read it from the backend)
    #[arg(long)]
    pub tag: Option<String>,

    /// How much the guest may cache
    #[arg(long, value_enum, default_value = "auto")]
    pub cache: Cache,

    /// Worker threads serving requests from all queues (0: each queue's thread serves its
    /// own requests one at a time). Default: twice the host's CPU count, at least 8.
    #[arg(long, value_name = "N", default_value_t = default_pool_size())]
    pub thread_pool_size: usize,

    /// After answering a request, poll the ring for the guest's next one before sleeping:
    /// off, adaptive (up to 200 µs, only while requests keep coming within it), on
    /// (200 µs every time), or auto: adaptive on a host with at least 4 CPUs, else off
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = parse_poll)]
    pub poll: Poll,

    /// Number of request queues offered to the frontend (the hiprio queue comes on top)
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub request_queues: usize,

    /// Enable extended attributes
    #[arg(long)]
    pub xattr: bool,

    /// Map xattr names between guest and host with virtiofsd's rules (docs/xattrs.md), e.g.
    /// ':map::user.virtiofs.:'. Replaces the default map, which stores the guest's
    /// security.capability and trusted.* as host names user.vfsd.* instead
    #[arg(long, value_name = "RULES")]
    pub xattrmap: Option<String>,

    /// Refuse every modifying request with EROFS
    #[arg(long)]
    pub readonly: bool,

    /// Let the guest use a writeback cache
    #[arg(long)]
    pub writeback: bool,

    /// Honour O_DIRECT from the guest on host files
    #[arg(long)]
    pub allow_direct_io: bool,

    /// Tell the guest about submounts: a directory on another host mount becomes its own
    /// mount in the guest, with its own st_dev
    #[arg(long, overrides_with = "no_announce_submounts")]
    pub announce_submounts: bool,

    /// Do not tell the guest about submounts (the default)
    #[arg(long, hide = true, overrides_with = "announce_submounts")]
    pub no_announce_submounts: bool,

    /// Do not offer READDIRPLUS: the guest then looks entries up one by one (never offered
    /// under --cache never, as in virtiofsd)
    #[arg(long)]
    pub no_readdirplus: bool,

    /// Let the guest make idmapped mounts of the share (FUSE_ALLOW_IDMAP; virtiofsd always
    /// offers it). The guest then names the caller only when it creates a node: a write
    /// by root drops set-id bits too unless --killpriv-v2 is also given (docs/features.md)
    #[arg(long)]
    pub allow_idmap: bool,

    /// After the frontend disconnects, serve the next one on the same socket (a VMM that
    /// restarts, a guest booted again), each from a clean state, instead of exiting
    #[arg(long)]
    pub keep_listening: bool,

    /// Keep the guest's O_NOATIME on host opens (by default it is dropped: it gives EPERM on
    /// files the daemon does not own)
    #[arg(long)]
    pub preserve_noatime: bool,

    /// Negotiate FUSE_HANDLE_KILLPRIV_V2 (off by default, as in virtiofsd): the guest
    /// kernel then leaves clearing set-user-ID and set-group-ID bits and file capabilities
    /// on writes, truncates and O_TRUNC opens to vfsd, and keeps its cached mode meanwhile
    #[arg(long, overrides_with = "no_killpriv_v2")]
    pub killpriv_v2: bool,

    /// Do not negotiate FUSE_HANDLE_KILLPRIV_V2 (the default): the guest kernel clears the
    /// bits with a SETATTR. vfsd still clears them for non-root writers on every path
    #[arg(long, overrides_with = "killpriv_v2")]
    pub no_killpriv_v2: bool,

    /// Do not forward POSIX (fcntl byte-range and OFD) locks to the host: the guest kernel
    /// then arbitrates them alone, invisible to other guests and host processes
    #[arg(long)]
    pub no_posix_lock: bool,

    /// Do not forward flock locks to the host (as --no-posix-lock, for flock)
    #[arg(long)]
    pub no_flock: bool,

    /// Zero-message open: file opens and closes stay in the guest (no OPEN, RELEASE or,
    /// with --no-posix-lock, FLUSH), and I/O goes through one host fd per file. File data
    /// then stays in the guest's page cache across opens, flock stays in the guest, and
    /// O_APPEND writes land at the guest's end of file (docs/features.md). Needs
    /// --cache=auto or always
    #[arg(long)]
    pub no_open: bool,

    /// Under --no-open, milliseconds a file's host fd for writing stays open with no write
    /// through it (for tests)
    #[arg(long, hide = true, value_name = "MS",
          default_value_t = crate::passthrough::node_handle::WRITE_IDLE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub no_open_write_idle_ms: u64,

    /// Byte ranges a guest may hold locked at once; past it, lock requests get ENOLCK
    /// (the host kernel's lock records are not charged to memory cgroups)
    #[arg(long, value_name = "N", default_value_t = 65536)]
    pub max_locks: usize,

    /// Byte ranges a guest may hold locked on one file; past it, ENOLCK (the host walks
    /// every lock of a file at each lock call on it, and a migration's destination places
    /// them all again while the VM is paused)
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_locks_per_file: usize,

    /// Blocking lock requests (SETLKW) that may wait at once, each on a small thread of its
    /// own rather than a request worker; past it, ENOLCK
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_lock_waiters: usize,

    /// Seconds after which a blocking POSIX lock request (SETLKW) whose every holder in the
    /// guest has sent no lock request or close for as long, and waits for nothing, is
    /// answered EDEADLK: the guest can't kill a process waiting for a lock through vfsd
    /// (virtio-fs has no FUSE_INTERRUPT), so a holder that waits for the waiter (a parent
    /// that kills its child and waits for it) would hang both for good. 0: never
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = parse_stall_timeout)]
    pub lock_stall_timeout: u64,

    /// Label new files, directories, symlinks and nodes with the security context (e.g.
    /// SELinux) the guest sends with the create (negotiates FUSE_SECURITY_CTX; implies --xattr)
    #[arg(long)]
    pub security_label: bool,

    /// POSIX ACLs: the guest checks permissions against system.posix_acl_* ACLs kept on
    /// the host, default ACLs are inherited (implies --xattr)
    #[arg(long)]
    pub posix_acl: bool,

    /// Let the guest mmap files it opened for direct I/O (--cache never or metadata) with
    /// MAP_SHARED (negotiates FUSE_DIRECT_IO_ALLOW_MMAP)
    #[arg(long)]
    pub allow_mmap: bool,

    /// Let the guest change a file's project id and project inheritance (FUSE_IOCTL's
    /// FS_IOC_FSSETXATTR, FS_IOC_SETFLAGS). Off by default: a project id is a host-side
    /// quota boundary, and a guest could move files out of the project that caps its share
    #[arg(long)]
    pub allow_project_id: bool,

    /// Do not set FOPEN_PARALLEL_DIRECT_WRITES on direct-I/O opens (for comparisons)
    #[arg(long)]
    pub no_parallel_direct_writes: bool,

    /// Sandbox mode
    #[arg(long, value_enum, default_value = "namespace")]
    pub sandbox: Sandbox,

    /// What to do on a syscall outside vfsd's allowlist
    #[arg(long, value_enum, default_value = "kill")]
    pub seccomp: crate::seccomp::SeccompMode,

    /// Change the kept capabilities when running as root, e.g. +sys_admin:-mknod
    #[arg(long, value_name = "CAPS", allow_hyphen_values = true)]
    pub modcaps: Option<String>,

    /// Find known inodes again by file handle (prefer: where the host can reopen handles,
    /// else by parent and name; mandatory: refuse to start without; never: by name only).
    /// Either way the O_PATH fds nodes hold stay within half the fd limit (at most 65,536)
    #[arg(long, value_enum, default_value = "prefer")]
    pub inode_file_handles: InodeFileHandles,

    /// Map namespace uids onto host uids in the namespace sandbox's user namespace, as
    /// :namespace_uid:host_uid:count: (repeatable; must map uid 0; libvirt passes it when
    /// unprivileged; ranges beyond your own uid need newuidmap and /etc/subuid)
    #[arg(long, value_name = "MAP", value_parser = crate::idmap::parse)]
    pub uid_map: Vec<crate::idmap::IdRange>,

    /// Like --uid-map, for gids (/etc/subgid, newgidmap)
    #[arg(long, value_name = "MAP", value_parser = crate::idmap::parse)]
    pub gid_map: Vec<crate::idmap::IdRange>,

    /// Translate uids between guest and host inside vfsd, as virtiofsd: map:GUEST:HOST:COUNT,
    /// guest:GUEST:HOST:COUNT, host:HOST:GUEST:COUNT, squash-guest:GUEST:HOST:COUNT,
    /// squash-host:HOST:GUEST:COUNT or forbid-guest:GUEST:COUNT (repeatable; see
    /// docs/translate.md)
    #[arg(long, value_name = "RULE")]
    pub translate_uid: Vec<String>,

    /// Like --translate-uid, for gids
    #[arg(long, value_name = "RULE")]
    pub translate_gid: Vec<String>,

    /// Limit on open files, soft and hard (0 leaves it unchanged). Default: 1,000,000, or
    /// fs.nr_open if lower, unless the soft limit is already higher
    #[arg(long, value_name = "N")]
    pub rlimit_nofile: Option<u64>,

    /// Log to syslog (facility daemon) instead of stderr
    #[arg(long)]
    pub syslog: bool,

    /// Log level (RUST_LOG works too)
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: LogLevel,

    /// Write run-time statistics (JSON) to this file every --stats-interval and on SIGUSR1
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,

    /// Seconds between statistics writes
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub stats_interval: f64,

    /// Serve Prometheus metrics over HTTP at ADDR: a unix socket path, or a loopback
    /// host:port (127.0.0.1:9100). Off by default; see docs/metrics.md
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,

    /// Print the vhost-user backend capabilities (JSON) and exit
    #[arg(long)]
    pub print_capabilities: bool,

    /// Legacy comma-separated options (source=DIR,cache=…,xattr,…), as older libvirt passes
    #[arg(short = 'o', value_name = "OPTIONS", id = "compat_options")]
    pub compat_options: Vec<String>,

    /// Debug logging (same as --log-level debug)
    #[arg(short = 'd')]
    pub debug: bool,

    /// Stay in the foreground (always the case; accepted for compatibility)
    #[arg(short = 'f')]
    pub foreground: bool,

    /// How the device state names the files the guest knows when it migrates (find-paths:
    /// by path in the share; file-handles: by file handle, which needs the same file
    /// system on both sides and CAP_DAC_READ_SEARCH on the destination)
    #[arg(long, value_enum, default_value = "find-paths")]
    pub migration_mode: MigrationMode,

    /// What the migration destination does with a file it can't find again (abort: fail
    /// the load, so the source goes on; guest-error: load the rest, the guest gets errors
    /// for that file). Ignored on the source
    #[arg(long, value_enum, default_value = "abort")]
    pub migration_on_error: MigrationOnError,

    /// find-paths only: send each file's handle along with its path, and have the
    /// destination check that the path opens that very file (same file system on both
    /// sides)
    #[arg(long)]
    pub migration_verify_handles: bool,

    /// find-paths only: check every path again at switch-over, while both sides are
    /// stopped, and look up the current path of a file that moved
    #[arg(long)]
    pub migration_confirm_paths: bool,

    /// virtiofsd options vfsd does not implement: parsed so that using one gives a clear
    /// error instead of an unknown-option message.
    #[command(flatten)]
    pub unsupported: Unsupported,
}

/// virtiofsd options without an implementation in vfsd (hidden from --help): parsed so
/// that one gives a clear error instead of an unknown-option message. None today.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Unsupported {}

impl Unsupported {
    /// The first unsupported option given, with what to do instead.
    fn first(&self) -> Option<&'static str> {
        None
    }
}

impl Opt {
    /// Refuses virtiofsd options vfsd does not implement, with one line saying which.
    pub fn check_supported(&self) -> Result<(), String> {
        if let Some(msg) = self.unsupported.first() {
            return Err(msg.to_string());
        }
        if self.migration_mode == MigrationMode::FileHandles
            && (self.migration_verify_handles || self.migration_confirm_paths)
        {
            return Err(
                "--migration-verify-handles and --migration-confirm-paths need --migration-mode find-paths"
                    .into(),
            );
        }
        self.id_translate()?;
        if let Some(rules) = &self.xattrmap {
            crate::passthrough::xattrmap::XattrMap::parse(rules)
                .map_err(|e| format!("--xattrmap: {e}"))?;
        }
        if self.uid_map.is_empty() != self.gid_map.is_empty() {
            return Err("--uid-map and --gid-map go together".into());
        }
        let maps_zero = |m: &[crate::idmap::IdRange]| m.iter().any(|r| r.inside == 0);
        let zero_mapped = maps_zero(&self.uid_map) && maps_zero(&self.gid_map);
        if !self.uid_map.is_empty() && !zero_mapped {
            return Err(
                "--uid-map and --gid-map must map namespace id 0 (the daemon runs as it)".into(),
            );
        }
        Ok(())
    }

    /// `--translate-uid` / `--translate-gid` as the filesystem applies them. Parsed here
    /// rather than by clap so that a bad rule, like an overlap, is one line of error.
    pub fn id_translate(&self) -> Result<IdTranslate, String> {
        let table = |opt: &str, specs: &[String]| {
            let rules = specs
                .iter()
                .map(|s| s.parse::<Rule>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{opt} {e}"))?;
            IdTranslation::new(&rules).map_err(|e| format!("{opt} {e}"))
        };
        Ok(IdTranslate {
            uid: table("--translate-uid", &self.translate_uid)?,
            gid: table("--translate-gid", &self.translate_gid)?,
        })
    }

    /// The id maps for the namespace sandbox, if any were given.
    pub fn id_maps(&self) -> Option<(Vec<crate::idmap::IdRange>, Vec<crate::idmap::IdRange>)> {
        (!self.uid_map.is_empty()).then(|| (self.uid_map.clone(), self.gid_map.clone()))
    }

    /// Folds `-o key=value,…` options into the regular fields.
    pub fn apply_compat_options(&mut self) -> Result<(), String> {
        for group in std::mem::take(&mut self.compat_options) {
            for opt in split_escaped(&group) {
                let (key, value) = match opt.split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (opt.clone(), None),
                };
                let need = |v: Option<String>| v.ok_or_else(|| format!("-o {key} needs a value"));
                match key.as_str() {
                    "source" => self.shared_dir = Some(PathBuf::from(need(value)?)),
                    "cache" => {
                        self.cache = Cache::from_str(&need(value)?, true).map_err(|_| {
                            "-o cache: expected auto, always, never or metadata".to_string()
                        })?
                    }
                    "sandbox" => {
                        self.sandbox = Sandbox::from_str(&need(value)?, true).map_err(|_| {
                            "-o sandbox: expected none, namespace or chroot".to_string()
                        })?
                    }
                    "log_level" => {
                        self.log_level = LogLevel::from_str(&need(value)?, true).map_err(|_| {
                            "-o log_level: expected error, warn, info, debug or trace".to_string()
                        })?
                    }
                    "xattr" => self.xattr = true,
                    "xattrmap" => self.xattrmap = Some(need(value)?),
                    "no_xattr" => self.xattr = false,
                    "writeback" => self.writeback = true,
                    "no_writeback" => self.writeback = false,
                    "announce_submounts" => self.announce_submounts = true,
                    "allow_direct_io" => self.allow_direct_io = true,
                    "no_allow_direct_io" => self.allow_direct_io = false,
                    "readonly" => self.readonly = true,
                    "readdirplus" => self.no_readdirplus = false,
                    "no_readdirplus" => self.no_readdirplus = true,
                    "killpriv_v2" => {
                        self.killpriv_v2 = true;
                        self.no_killpriv_v2 = false;
                    }
                    "no_killpriv_v2" => {
                        self.killpriv_v2 = false;
                        self.no_killpriv_v2 = true;
                    }
                    "security_label" => self.security_label = true,
                    "no_security_label" => self.security_label = false,
                    "posix_acl" => self.posix_acl = true,
                    "no_posix_acl" => self.posix_acl = false,
                    "allow_mmap" => self.allow_mmap = true,
                    "no_allow_mmap" => self.allow_mmap = false,
                    "allow_project_id" => self.allow_project_id = true,
                    "posix_lock" => self.no_posix_lock = false,
                    "no_posix_lock" => self.no_posix_lock = true,
                    "flock" => self.no_flock = false,
                    "no_flock" => self.no_flock = true,
                    _ => return Err(format!("unknown option '-o {opt}'")),
                }
            }
        }
        Ok(())
    }
}

/// Enough workers that requests queued together on one queue run together: max(8, 2 ×
/// CPUs). On a 2-core host 8 beat 0, 2 and 4 for writes and metadata with the load
/// generator (docs/design.md, "Parallel direct writes"); workers mostly wait on the host, so
/// twice the CPUs.
/// `--lock-stall-timeout`: whole seconds, up to a day (0: off).
fn parse_stall_timeout(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n <= 86_400 => Ok(n),
        _ => Err("expected whole seconds from 0 (never) to 86400".into()),
    }
}

pub fn default_pool_size() -> usize {
    std::thread::available_parallelism()
        .map_or(8, |n| n.get() * 2)
        .max(8)
}

/// Splits on commas, where ",," stands for a literal comma (libvirt's escaping).
fn split_escaped(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                out.last_mut().unwrap().push(',');
            } else {
                out.push(String::new());
            }
        } else {
            out.last_mut().unwrap().push(c);
        }
    }
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// What `--print-capabilities` prints (QEMU's vhost-user.json conventions).
///
/// `migrate-precopy` lets libvirt migrate and save the domain. Not `separate-options`:
/// libvirt 11 refuses `<lock posix= flock=>` for a binary that lists it ("locking options
/// are not supported by this virtiofsd", as virtiofsd keeps locks in the guest), and
/// passes them only in the `-o` form (`-o source=D,flock,posix_lock`), which vfsd
/// parses; every other option libvirt passes (fd, thread pool, open-file limit, id maps,
/// cache, sandbox, xattr) works the same in both forms (docs/libvirt.md).
pub fn capabilities() -> serde_json::Value {
    serde_json::json!({
        "type": "fs",
        "features": ["migrate-precopy"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_stall_timeout_takes_whole_seconds_and_names_what_it_expects() {
        let parse = |v: &str| {
            let arg = format!("--lock-stall-timeout={v}");
            Opt::try_parse_from(["vfsd", "--fd=3", "--shared-dir", "/a", &arg])
        };
        assert_eq!(parse("0").unwrap().lock_stall_timeout, 0);
        assert_eq!(parse("5").unwrap().lock_stall_timeout, 5);
        let none = Opt::try_parse_from(["vfsd", "--fd=3", "--shared-dir", "/a"]).unwrap();
        assert_eq!(none.lock_stall_timeout, 30);
        for bad in ["soon", "-1", "1.5", "86401"] {
            let e = parse(bad).unwrap_err().to_string();
            let first = e.lines().next().unwrap();
            assert!(
                first.contains("--lock-stall-timeout") && first.contains("whole seconds"),
                "{e}"
            );
        }
    }

    #[test]
    fn compat_options_map_to_flags() {
        let mut o = Opt::try_parse_from([
            "vfsd",
            "--socket-path",
            "/s",
            "-o",
            "source=/a,,b,cache=always,xattr",
        ])
        .unwrap();
        o.apply_compat_options().unwrap();
        assert_eq!(o.shared_dir.as_deref(), Some(std::path::Path::new("/a,b")));
        assert_eq!(o.cache, Cache::Always);
        assert!(o.xattr);
    }

    #[test]
    fn unknown_compat_option_is_an_error() {
        let mut o =
            Opt::try_parse_from(["vfsd", "--socket-path", "/s", "-o", "source=/a,bogus"]).unwrap();
        assert!(o.apply_compat_options().unwrap_err().contains("bogus"));
    }

    #[test]
    fn libvirt_command_lines_parse() {
        // What libvirt runs: the -o form (older) and the separate options.
        let mut o = Opt::try_parse_from([
            "vfsd",
            "--syslog",
            "--fd=3",
            "-o",
            "source=/a,cache=none,xattr,no_flock,no_posix_lock,no_readdirplus",
        ])
        .unwrap();
        o.apply_compat_options().unwrap();
        assert!(o.syslog && o.xattr && o.no_readdirplus);
        // The C virtiofsd's spelling, which older libvirt writes.
        assert_eq!(o.cache, Cache::Never);
        o.check_supported().unwrap();
        let o = Opt::try_parse_from([
            "vfsd",
            "--fd=3",
            "--shared-dir",
            "/a",
            "--cache",
            "never",
            "--sandbox",
            "chroot",
            "--xattr",
            "--thread-pool-size=4",
            "--rlimit-nofile=4096",
            "--log-level",
            "debug",
        ])
        .unwrap();
        o.check_supported().unwrap();
        assert_eq!(o.thread_pool_size, 4);
    }

    #[test]
    fn poll_takes_its_four_modes_defaults_to_auto_and_names_them_on_a_bad_value() {
        use crate::device::PollMode;
        let with = |v: &str| Opt::try_parse_from(["vfsd", "--fd=3", "--shared-dir", "/a", v]);
        let o = Opt::try_parse_from(["vfsd", "--fd=3", "--shared-dir", "/a"]).unwrap();
        assert_eq!(o.poll, Poll::Auto);
        for (v, mode) in [
            ("--poll=off", PollMode::Off),
            ("--poll=adaptive", PollMode::Adaptive),
            ("--poll=on", PollMode::On),
        ] {
            assert_eq!(PollMode::from(with(v).unwrap().poll), mode, "{v}");
        }
        let e = with("--poll=fast").unwrap_err().to_string();
        assert!(
            e.lines()
                .next()
                .unwrap()
                .contains("expected auto, off, adaptive or on"),
            "{e}"
        );
        assert_eq!(PollMode::for_host(2), PollMode::Off);
        assert_eq!(PollMode::for_host(64), PollMode::Adaptive);
    }

    #[test]
    fn unimplemented_virtiofsd_options_give_one_clear_error() {
        // --uid-map/--gid-map are supported, in pairs that map namespace id 0.
        let o = Opt::try_parse_from([
            "vfsd",
            "--fd=3",
            "--shared-dir",
            "/a",
            "--uid-map=:0:1000:1:",
            "--gid-map=:0:1000:1:",
            "--uid-map=:1:100000:65536:",
            "--gid-map=:1:100000:65536:",
        ])
        .unwrap();
        o.check_supported().unwrap();
        assert_eq!(o.id_maps().unwrap().0.len(), 2);
        let o = Opt::try_parse_from(["vfsd", "--fd=3", "--shared-dir", "/a", "--uid-map=:0:1:1:"])
            .unwrap();
        assert!(o.check_supported().unwrap_err().contains("--gid-map"));
        let o = Opt::try_parse_from([
            "vfsd",
            "--fd=3",
            "--shared-dir",
            "/a",
            "--uid-map=:1:1:1:",
            "--gid-map=:1:1:1:",
        ])
        .unwrap();
        assert!(o.check_supported().unwrap_err().contains("id 0"));
        assert!(Opt::try_parse_from(["vfsd", "--fd=3", "--uid-map=0:1000:1"]).is_err());
        let o = Opt::try_parse_from([
            "vfsd",
            "--fd=3",
            "--shared-dir",
            "/a",
            "--xattrmap",
            ":ok:all:::",
        ])
        .unwrap();
        o.check_supported().unwrap();
        let mut o =
            Opt::try_parse_from(["vfsd", "--fd=3", "-o", "source=/a,xattrmap=:ok:al:::"]).unwrap();
        o.apply_compat_options().unwrap();
        let e = o.check_supported().unwrap_err();
        assert!(
            e.starts_with("--xattrmap: rule 1: unknown scope 'al'"),
            "{e}"
        );
        // Negations of what vfsd does anyway are fine.
        let o = Opt::try_parse_from([
            "vfsd",
            "--socket",
            "/s",
            "--shared-dir",
            "/a",
            "--no-killpriv-v2",
            "--no-announce-submounts",
            "--preserve-noatime",
        ])
        .unwrap();
        o.check_supported().unwrap();
        assert!(!o.announce_submounts && o.preserve_noatime);
        assert_eq!(o.socket_path.as_deref(), Some(std::path::Path::new("/s")));
    }

    #[test]
    fn translate_options_repeat_and_bad_rules_give_one_line() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["vfsd", "--fd=3", "--shared-dir", "/a"];
            args.extend_from_slice(extra);
            Opt::try_parse_from(args).unwrap()
        };
        let o = parse(&[
            "--translate-uid=map:1000:2000:10",
            "--translate-uid",
            "squash-host:0:0:1000",
            "--translate-gid=forbid-guest:0:100",
        ]);
        o.check_supported().unwrap();
        let t = o.id_translate().unwrap();
        assert_eq!(t.uid.to_host(1001).unwrap(), 2001);
        assert_eq!(t.uid.to_guest(500), 0);
        assert!(t.gid.to_host(5).is_err());
        for (arg, want) in [
            (
                "--translate-uid=map:1:2",
                "--translate-uid 'map:1:2': map takes 3",
            ),
            (
                "--translate-gid=squash:1:2:3",
                "--translate-gid 'squash:1:2:3': unknown type",
            ),
            (
                "--translate-uid=map:1:0:4294967295",
                "--translate-uid map:1:0:4294967295",
            ),
        ] {
            let e = parse(&[arg]).check_supported().unwrap_err();
            assert!(e.starts_with(want), "{arg}: {e}");
            assert_eq!(e.lines().count(), 1);
        }
        let e = parse(&["--translate-uid=map:0:0:10", "--translate-uid=guest:5:0:1"])
            .check_supported()
            .unwrap_err();
        assert!(e.contains("guest:5:0:1") && e.contains("overlaps"), "{e}");
        // Not a -o option in virtiofsd either.
        let mut o =
            Opt::try_parse_from(["vfsd", "--fd=3", "-o", "source=/a,translate_uid=map:0:0:1"])
                .unwrap();
        assert!(o
            .apply_compat_options()
            .unwrap_err()
            .contains("translate_uid"));
    }

    #[test]
    fn fd_and_socket_path_conflict() {
        assert!(Opt::try_parse_from([
            "vfsd",
            "--socket-path",
            "/s",
            "--fd",
            "3",
            "--shared-dir",
            "/"
        ])
        .is_err());
    }
}
