//! Start-up and shutdown: checks the options, builds the layers, serves one frontend.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use log::{error, info};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use vhost::vhost_user::Listener;
use vhost_user_backend::{Error as DaemonError, VhostUserDaemon};
use vm_memory::GuestMemoryAtomic;

use crate::cli::Opt;
use crate::device::{DeviceConfig, FsDevice};
use crate::error::{Chain, StartupError};
use crate::passthrough::{Config, PassthroughFs};
use crate::sandbox::SandboxError;
use crate::sandbox::{self, SocketName, StatsFile};
use crate::server::{FuseServer, GuestMem};

/// Sets up logging, to stderr or (`--syslog`) to syslog; gives the syslog socket's fd, which
/// must survive the sandbox's fd clean-up. Nothing is ever logged at trace level:
/// fuse-backend-rs's trace path transmutes guest opcodes into an enum (undefined behaviour
/// for unknown ones; vfsd keeps those from the crate, but doesn't rely on it alone).
pub fn init_logging(opt: &Opt) -> Option<RawFd> {
    let level = if opt.debug {
        log::LevelFilter::Debug
    } else {
        opt.log_level.filter()
    };
    let mut b = env_logger::Builder::new();
    b.filter_level(level);
    if let Ok(spec) = std::env::var("RUST_LOG") {
        b.parse_filters(&spec);
    }
    // Its own error lines fire on ordinary errno replies (a guest can flood them): only
    // shown when debugging.
    let crate_level = if level >= log::LevelFilter::Debug {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Off
    };
    b.filter_module("fuse_backend_rs", crate_level);
    let mut syslog_fd = None;
    let mut syslog_err = None;
    if opt.syslog {
        match crate::syslog::SyslogWriter::connect() {
            Ok(w) => {
                syslog_fd = Some(w.fd());
                let pid = std::process::id();
                b.format(move |buf, r| {
                    use std::io::Write;
                    let pri = crate::syslog::priority(r.level());
                    write!(buf, "<{pri}>vfsd[{pid}]: {}", r.args())
                });
                b.target(env_logger::Target::Pipe(Box::new(w)));
            }
            // No syslog here (a container, say): keep logging to stderr, and say so.
            Err(e) => syslog_err = Some(e),
        }
    }
    if syslog_fd.is_none() {
        b.format_timestamp_millis();
    }
    if b.try_init().is_ok() {
        // The per-module cap above loses to a more specific RUST_LOG directive (say
        // `fuse_backend_rs::api::server=trace`), and a trace level anywhere makes every
        // `trace!` evaluate its arguments, the crate's included. vfsd logs nothing at trace
        // level, so the cap holds for every spelling by never letting trace on at all.
        log::set_max_level(log::max_level().min(log::LevelFilter::Debug));
    }
    if let Some(e) = syslog_err {
        log::warn!("{}; logging to stderr instead", Chain(&e));
    }
    syslog_fd
}

fn check_shared_dir(dir: &Path) -> Result<(), StartupError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(StartupError::shared_dir(format!(
            "shared directory '{}' is not a directory",
            dir.display()
        ))),
        Err(e) => Err(StartupError::shared_dir_from(
            format!("shared directory '{}'", dir.display()),
            e,
        )),
    }
}

/// Whether a live socket is bound to the socket file at `path`: one a process is listening
/// on, or one bound and not listening yet (another daemon between its bind and its
/// listen), from any network namespace. A stale socket file, whose socket is gone, has
/// none; neither has a socket bound at the same name in another mount namespace, which
/// is another file.
///
/// The kernel is asked by a datagram connect to the path: it resolves the path as vfsd
/// sees it and looks the socket up by the file's inode, in every network namespace,
/// answering ECONNREFUSED when none is bound to it and EPROTOTYPE for a stream socket
/// before anything is queued, so the owner of a listening socket never sees a
/// connection (a stream connect would look like a frontend to it). A socket file vfsd
/// may not write to can't be asked about: an error, rather than a guess.
fn socket_bound(path: &Path) -> Result<bool, StartupError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {}
        // Nothing there, or no socket for one to be bound to.
        _ => return Ok(false),
    }
    // The error goes inside the sentence, which ends with what to do.
    let cannot_tell = |e: std::io::Error| {
        StartupError::socket(format!(
            "socket path '{}': cannot tell whether a socket is bound to it ({e}); remove it if it is stale",
            path.display()
        ))
    };
    let probe = std::os::unix::net::UnixDatagram::unbound().map_err(cannot_tell)?;
    match probe.connect(path) {
        // A bound datagram socket.
        Ok(()) => Ok(true),
        Err(e) => match e.raw_os_error() {
            Some(libc::ECONNREFUSED | libc::ENOENT) => Ok(false),
            // A bound stream or seqpacket socket; a datagram socket connected elsewhere.
            Some(libc::EPROTOTYPE | libc::EPERM) => Ok(true),
            _ => Err(cannot_tell(e)),
        },
    }
}

/// Binds the socket path, refusing one a live socket is bound to.
fn bind(path: &Path) -> Result<UnixListener, StartupError> {
    if socket_bound(path)? {
        return Err(StartupError::socket(format!(
            "socket path '{}' is in use by another process",
            path.display()
        )));
    }
    // A stale socket from an earlier run is replaced, as virtiofsd does.
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
        .map_err(|e| StartupError::socket_from(format!("cannot listen on '{}'", path.display()), e))
}

/// `--socket-group`: the socket belongs to GROUP (a name or a number), which may connect.
/// The socket is opened O_PATH|O_NOFOLLOW and changed through that fd, so a symlink put in
/// its place (in a directory others can write) is never followed.
fn set_socket_group(path: &Path, group: &str) -> Result<(), StartupError> {
    let gid = match group.parse::<libc::gid_t>() {
        Ok(g) => g,
        Err(_) => crate::sys::group_id(group)
            .map_err(|e| StartupError::socket_from(format!("--socket-group '{group}'"), e))?
            .ok_or_else(|| {
                StartupError::socket(format!("--socket-group '{group}': no such group"))
            })?,
    };
    let fail = |e: std::io::Error| {
        StartupError::socket_from(format!("--socket-group '{group}': {}", path.display()), e)
    };
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| StartupError::socket("--socket-group: the socket path contains a NUL byte"))?;
    let fd = crate::sys::openat(
        libc::AT_FDCWD,
        &cpath,
        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    )
    .map_err(fail)?;
    let st =
        crate::sys::statx(fd.as_raw_fd(), crate::sys::EMPTY, libc::AT_EMPTY_PATH).map_err(fail)?;
    if st.st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(fail(std::io::Error::other("not a socket")));
    }
    // SAFETY: fchownat on an fd we own, with an empty path (AT_EMPTY_PATH).
    crate::sys::cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            crate::sys::EMPTY.as_ptr(),
            u32::MAX,
            gid,
            libc::AT_EMPTY_PATH,
        )
    })
    .map_err(fail)?;
    // chmod has no AT_EMPTY_PATH; /proc/self/fd/N names exactly the inode the fd holds.
    let mode = (st.st.st_mode & 0o7777) | 0o060;
    let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&via, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

fn write_stats(sink: &StatsFile, server: &FuseServer<PassthroughFs>) {
    let snap = server.stats_snapshot();
    if let Err(e) = sink.replace(serde_json::to_string_pretty(&snap).unwrap().as_bytes()) {
        error!("cannot write statistics: {e}");
    }
}

/// Raises (or sets) RLIMIT_NOFILE, as virtiofsd does: every inode the guest knows may
/// hold an O_PATH fd. Without a value: 1,000,000 (at most fs.nr_open) unless the soft
/// limit is already higher, falling back to the hard limit if that can't be set; 0
/// leaves the limit alone; any other value sets soft and hard limits to it.
fn set_rlimit_nofile(want: Option<u64>) -> Result<(), SandboxError> {
    const DEFAULT_NOFILE: u64 = 1_000_000;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(SandboxError::Limit {
            context: "RLIMIT_NOFILE".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // Without /proc (a bare container) there is no cap to check: setrlimit will say.
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let target = match want {
        Some(0) => return Ok(()),
        Some(n) if n > nr_open => {
            return Err(SandboxError::Refused(format!(
                "--rlimit-nofile {n}: it cannot be raised above fs.nr_open ({nr_open})"
            )))
        }
        Some(n) => n,
        None if lim.rlim_cur >= DEFAULT_NOFILE => return Ok(()),
        None => DEFAULT_NOFILE.min(nr_open),
    };
    let set = |n: u64| {
        let new = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: `new` is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    match set(target) {
        Ok(()) => Ok(()),
        Err(source) if want.is_some() => Err(SandboxError::Limit {
            context: format!("--rlimit-nofile {target}"),
            source,
        }),
        // Not allowed to raise the hard limit (no CAP_SYS_RESOURCE): use it as it is.
        // Logged at debug only: running at the hard limit is the ordinary case then.
        Err(e) => {
            log::debug!(
                "RLIMIT_NOFILE {target}: {e}; using the hard limit ({})",
                lim.rlim_max
            );
            set(lim.rlim_max).map_err(|source| SandboxError::Limit {
                context: format!("RLIMIT_NOFILE {}", lim.rlim_max),
                source,
            })
        }
    }
}

/// An fd vfsd's supervisor passed (`--serve-fd` and the like), checked to be open; if it
/// is not, the error `kind` makes of the message.
fn inherited_fd(
    opt: &str,
    fd: i32,
    kind: fn(String) -> StartupError,
) -> Result<OwnedFd, StartupError> {
    // SAFETY: F_GETFD only inspects the fd.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(kind(format!("--{opt} {fd}: not an open file descriptor")));
    }
    // SAFETY: the supervisor passed this fd for this use alone; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain fcntl on an fd we own: no serving process's child inherits it.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(fd)
}

pub fn run(mut opt: Opt) -> Result<(), StartupError> {
    use StartupError as E;
    // The binary an upgrade starts: the file at the path vfsd was started from, as it is
    // then (a package upgrade replaces the file). The kernel gives it resolved; resolving
    // it again would need search access to every directory above it, which a daemon
    // started as another user may lack.
    let exe = std::env::current_exe();
    let serving = opt.serve_fd.is_some();
    if serving {
        // The supervisor answers for the socket and for every frontend after this one.
        opt.keep_listening = false;
        // SIGUSR2 is the supervisor's: one sent here by mistake changes nothing.
        // SAFETY: setting a signal's disposition to ignored.
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
    }
    // The handlers first: a termination signal the supervisor relays at once (one sent
    // to vfsd the moment its socket exists) waits blocked across the exec until here.
    sandbox::remember_early_signals();
    sandbox::reset_inherited_signals();
    opt.apply_compat_options().map_err(E::option)?;
    opt.check_supported().map_err(E::option)?;
    let syslog_fd = init_logging(&opt);
    // A request that panics is answered EIO and the worker goes on (server::handle); the
    // panic itself goes to the log. The default hook would also look for a backtrace
    // setting and the working directory, which the seccomp filter rightly forbids.
    std::panic::set_hook(Box::new(|info| log::error!("{info}")));
    crate::server::install_wake_handler();
    let shared_dir =
        (opt.shared_dir.clone()).ok_or_else(|| E::option("--shared-dir is required"))?;
    check_shared_dir(&shared_dir)?;
    let shared_dir = std::fs::canonicalize(&shared_dir).map_err(|e| {
        E::shared_dir_from(format!("shared directory '{}'", shared_dir.display()), e)
    })?;
    if opt.stats_interval <= 0.0 || !opt.stats_interval.is_finite() {
        return Err(E::option(
            "--stats-interval must be a positive number of seconds",
        ));
    }
    let mut modcaps = opt
        .modcaps
        .as_deref()
        .map(crate::caps::parse_modcaps)
        .transpose()
        .map_err(E::option)?
        .unwrap_or_default();
    if opt.inode_file_handles != crate::cli::InodeFileHandles::Never {
        // open_by_handle_at needs it.
        modcaps.insert(0, (true, ::caps::Capability::CAP_DAC_READ_SEARCH));
    }
    // Before the socket exists: a frontend that connects finds the limit in place.
    set_rlimit_nofile(opt.rlimit_nofile)?;
    // Opened now: the sandbox hides its path (and keeps no directory outside the share).
    let stats_sink = match (opt.stats_fd, opt.stats.as_deref()) {
        (Some(fd), _) => Some(StatsFile::from_fd(inherited_fd("stats-fd", fd, E::device)?)),
        (None, p) => (p.map(StatsFile::create).transpose()).map_err(|e| E::Device(e.into()))?,
    };

    let metrics_addr = (opt.metrics.as_deref().map(crate::metrics::parse_addr))
        .transpose()
        .map_err(E::option)?;
    if let (Some(crate::metrics::MetricsAddr::Unix(m)), Some(s)) = (&metrics_addr, &opt.socket_path)
    {
        if std::path::absolute(m).ok() == std::path::absolute(s).ok() {
            return Err(E::option(
                "--metrics and --socket-path name the same socket",
            ));
        }
    }
    // Bound now, outside the sandbox (which hides the path and, with namespaces, the
    // network), and first, so that a failure leaves no vhost-user socket behind; served
    // from inside the sandbox.
    // The sockets' names: removed if start-up fails before the sandbox takes them over.
    let mut socket_name: Option<SocketName> = None;
    let metrics = match &metrics_addr {
        Some(_) if opt.metrics_fd.is_some() => {
            let fd = inherited_fd("metrics-fd", opt.metrics_fd.unwrap_or(-1), E::socket)?;
            Some(crate::metrics::MetricsListener::from_fd(fd).map_err(|e| E::Socket(e.into()))?)
        }
        Some(addr) => {
            let l = crate::metrics::MetricsListener::bind(addr).map_err(|e| E::Socket(e.into()))?;
            if let crate::metrics::MetricsAddr::Unix(p) = addr {
                socket_name = Some(SocketName::new(p).map_err(|e| E::Socket(e.into()))?);
            }
            Some(l)
        }
        None => None,
    };
    let abandon = |names: &Option<SocketName>, e: StartupError| {
        if let Some(n) = names {
            n.remove();
        }
        e
    };

    if let Some(fd) = opt.serve_fd {
        let fd = inherited_fd("serve-fd", fd, E::socket)?;
        let listener = Listener::from(UnixListener::from(fd));
        return serve(
            opt, shared_dir, modcaps, listener, metrics, stats_sink, syslog_fd,
        );
    }
    let listener = match (&opt.socket_path, opt.fd) {
        (Some(p), _) => {
            let l = bind(p).map_err(|e| abandon(&socket_name, e))?;
            let named = match &mut socket_name {
                Some(n) => n.add(p),
                None => SocketName::new(p).map(|n| socket_name = Some(n)),
            };
            named.map_err(|e| abandon(&socket_name, E::Socket(e.into())))?;
            if let Some(g) = &opt.socket_group {
                set_socket_group(p, g).map_err(|e| abandon(&socket_name, e))?;
            }
            l
        }
        (None, Some(fd)) => {
            // SAFETY: F_GETFD only inspects the fd.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                let e = E::socket(format!("--fd {fd}: not an open file descriptor"));
                return Err(abandon(&socket_name, e));
            }
            // SAFETY: the user hands us this fd as a listening socket (as with virtiofsd's
            // --fd); nothing else in the process uses it, and the listener now owns it.
            unsafe { UnixListener::from_raw_fd(fd) }
        }
        (None, None) => {
            let e = E::option("one of --socket-path or --fd is required");
            return Err(abandon(&socket_name, e));
        }
    };
    let exe = exe.map_err(|e| abandon(&socket_name, E::option_from("vfsd's own path", e)))?;
    let mut inherited: Vec<(&'static str, OwnedFd)> = Vec::new();
    let dup = |fd: RawFd| {
        // SAFETY: `fd` is open and ours for as long as this borrow; the dup is owned.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
    };
    if let Some(m) = &metrics {
        let fd =
            dup(m.fd()).map_err(|e| abandon(&socket_name, E::socket_from("--metrics: dup", e)))?;
        inherited.push(("metrics-fd", fd));
    }
    if let Some(s) = &stats_sink {
        let fd =
            dup(s.fd()).map_err(|e| abandon(&socket_name, E::device_from("--stats: dup", e)))?;
        inherited.push(("stats-fd", fd));
    }
    drop(metrics);
    drop(stats_sink);
    // The supervisor logs through its own syslog socket (`syslog_fd`) too.
    let sup = crate::supervisor::Supervisor {
        exe,
        args: std::env::args_os().skip(1).collect(),
        listener,
        inherited,
        socket: socket_name,
        keep_listening: opt.keep_listening,
    };
    crate::supervisor::run(sup).map_err(|e| E::Device(e.into()))
}

/// The serving process: confines itself and serves the one frontend its supervisor
/// queued on `listener`.
fn serve(
    opt: Opt,
    shared_dir: std::path::PathBuf,
    modcaps: Vec<(bool, ::caps::Capability)>,
    mut listener: Listener,
    metrics: Option<crate::metrics::MetricsListener>,
    stats_sink: Option<StatsFile>,
    syslog_fd: Option<RawFd>,
) -> Result<(), StartupError> {
    use StartupError as E;
    let socket_name: Option<SocketName> = None;

    // Confinement, before any thread exists (the namespace sandbox forks).
    let mut keep = vec![listener.as_raw_fd()];
    keep.extend(metrics.iter().map(|m| m.fd()));
    keep.extend(stats_sink.iter().map(|s| s.fd()));
    // Until the sandbox hands it to its supervising parent (or, without one, back).
    keep.extend(socket_name.iter().flat_map(|s| s.dir_fds()));
    keep.extend(syslog_fd);
    // Crash survival (`recovery`): the supervisor's channel to this process's keeper, the
    // crash record made for it, and, taking over from one that died, that one's keeper.
    // Never closed: in the fd table the keeper shares, a close here would be its too.
    let keeper = opt
        .keeper_fd
        .map(|fd| inherited_fd("keeper-fd", fd, E::device))
        .transpose()?
        .map(|c| c.into_raw_fd());
    // Without a record (no memfd, an address-space limit below its mapping) the
    // daemon serves as before, and a crash ends the session.
    let record_fd = match keeper {
        Some(_) => match crate::recovery::record::create() {
            Ok(fd) => Some(fd.into_raw_fd()),
            Err(e) => {
                log::warn!("no crash record ({e}): a crash of this process will end the session");
                None
            }
        },
        None => None,
    };
    let recover = opt
        .recover_fd
        .map(|fd| inherited_fd("recover-fd", fd, E::device))
        .transpose()?;
    keep.extend(keeper);
    keep.extend(record_fd);
    keep.extend(recover.as_ref().map(|f| f.as_raw_fd()));
    sandbox::close_other_fds(&keep)?;
    // Before the sandbox: the fds taken come into the table the new keeper shares.
    let inherited = match recover {
        Some(fd) => Some(
            crate::recovery::collect(std::os::unix::net::UnixStream::from(fd)).map_err(|e| {
                E::device_from("cannot take over from the serving process that died", e)
            })?,
        ),
        None => None,
    };
    // The lock handover's private directory, outside the share (`passthrough::handover`).
    let runtime = match crate::passthrough::RuntimeDir::path() {
        Some(p) => crate::passthrough::RuntimeDir::prepare(&p)
            .map(|()| p.clone())
            .map_err(|e| {
                info!(
                    "no lock handover on migration (runtime directory {}: {e}); locks are taken again",
                    p.display()
                )
            })
            .ok(),
        None => {
            info!("no lock handover on migration (no $XDG_RUNTIME_DIR); locks are taken again");
            None
        }
    };
    let mut confined = sandbox::enter(
        opt.sandbox,
        &shared_dir,
        opt.id_maps(),
        socket_name,
        runtime.as_deref(),
        keeper
            .zip(record_fd)
            .map(|(channel, record)| sandbox::Keeper { channel, record }),
    )?;
    let record = match record_fd {
        Some(fd) => {
            // SAFETY: the record's fd stays open for the process's life (above); this
            // borrow only dups it.
            let dup = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
                .try_clone_to_owned()
                .map_err(|e| E::device_from("crash record", e))?;
            match crate::recovery::record::Record::map(dup, true) {
                Ok(r) => Some(Arc::new(r)),
                Err(e) => {
                    log::warn!(
                        "cannot map the crash record ({e}): a crash of this process will end the session"
                    );
                    None
                }
            }
        }
        None => None,
    };
    crate::caps::drop_to(&modcaps).map_err(SandboxError::from)?;

    let mut cfg = Config::new(confined.root.clone());
    cfg.runtime_dir = confined.runtime_dir.take().map(Arc::new);
    cfg.crash_record = record.clone();
    cfg.cache = opt.cache.into();
    cfg.xattr = opt.xattr;
    cfg.readonly = opt.readonly;
    cfg.writeback = opt.writeback;
    cfg.allow_direct_io = opt.allow_direct_io;
    cfg.parallel_direct_writes = !opt.no_parallel_direct_writes;
    cfg.announce_submounts = opt.announce_submounts;
    cfg.inode_file_handles = opt.inode_file_handles.into();
    // As virtiofsd: a guest that caches no entries (`never`) would only have each one
    // looked up for nothing.
    cfg.readdirplus = !opt.no_readdirplus && cfg.cache != crate::passthrough::CachePolicy::Never;
    cfg.preserve_noatime = opt.preserve_noatime;
    cfg.allow_idmap = opt.allow_idmap;
    // Off unless asked for, as in virtiofsd: with it the guest kernel leaves clearing the
    // set-id bits to the daemon and keeps its cached mode, so a guest stat after a write
    // that cleared them showed them still set (xfstests generic/355). vfsd clears them for
    // non-root writers either way.
    cfg.killpriv_v2 = opt.killpriv_v2 && !opt.no_killpriv_v2;
    cfg.posix_lock = !opt.no_posix_lock;
    cfg.flock = !opt.no_flock;
    if opt.no_open {
        use crate::passthrough::CachePolicy as C;
        if matches!(cfg.cache, C::Never | C::Metadata) {
            return Err(E::option(
                "--no-open keeps file data in the guest's page cache across opens: \
                 use it with --cache=auto or --cache=always",
            ));
        }
        cfg.no_open = true;
        cfg.no_open_write_idle = std::time::Duration::from_millis(opt.no_open_write_idle_ms);
        if cfg.flock || cfg.posix_lock {
            log::info!(
                "--no-open: flock and fcntl locks stay in the guest (no RELEASE could release one)"
            );
        }
    }
    if opt.max_locks == 0 || opt.max_locks_per_file == 0 || opt.max_lock_waiters == 0 {
        return Err(E::option(
            "--max-locks, --max-locks-per-file and --max-lock-waiters must be at least 1",
        ));
    }
    cfg.max_locks = opt.max_locks;
    cfg.max_locks_per_file = opt.max_locks_per_file;
    cfg.max_lock_waiters = opt.max_lock_waiters;
    cfg.lock_stall_timeout = std::time::Duration::from_secs(opt.lock_stall_timeout);
    cfg.allow_mmap = opt.allow_mmap;
    cfg.allow_project_id = opt.allow_project_id;
    cfg.posix_acl = opt.posix_acl;
    // ACLs are extended attributes: --posix-acl implies --xattr, as in virtiofsd.
    cfg.xattr |= opt.posix_acl;
    cfg.security_label = opt.security_label;
    cfg.xattr |= opt.security_label;
    cfg.id_translate = opt.id_translate().map_err(E::option)?;
    cfg.migration = crate::passthrough::migration::MigrationConfig {
        mode: match opt.migration_mode {
            crate::cli::MigrationMode::FindPaths => crate::passthrough::migration::Mode::FindPaths,
            crate::cli::MigrationMode::FileHandles => {
                crate::passthrough::migration::Mode::FileHandles
            }
        },
        on_error: match opt.migration_on_error {
            crate::cli::MigrationOnError::Abort => crate::passthrough::migration::OnError::Abort,
            crate::cli::MigrationOnError::GuestError => {
                crate::passthrough::migration::OnError::GuestError
            }
        },
        verify_handles: opt.migration_verify_handles,
        confirm_paths: opt.migration_confirm_paths,
    };
    if let Some(rules) = &opt.xattrmap {
        // check_supported has parsed it already.
        cfg.xattrmap = crate::passthrough::xattrmap::XattrMap::parse(rules)
            .map_err(|e| E::option_from("--xattrmap", e))?;
    }
    let fs = PassthroughFs::with_proc_fd(cfg, confined.proc_self_fd).map_err(|e| {
        E::shared_dir_from(format!("shared directory '{}'", shared_dir.display()), e)
    })?;
    let server = Arc::new(FuseServer::new(Arc::new(fs)));
    let device = Arc::new(
        FsDevice::new(
            server.clone(),
            DeviceConfig {
                request_queues: opt.request_queues,
                tag: opt.tag.clone(),
                thread_pool_size: opt.thread_pool_size,
                poll: opt.poll.into(),
            },
        )
        // Its errors are bad option values (the message is the whole of them).
        .map_err(|e| E::option(e.to_string()))?
        .with_record_opt(record),
    );
    if let Some(inh) = inherited {
        let rings = inh.rings;
        match server.fs().take_over(inh.fs) {
            Ok(r) => info!(
                "took over from the serving process that died: {} nodes, {} handles, {} lock owners ({} lost)",
                r.nodes, r.handles, r.owners, r.failed
            ),
            Err(e) => {
                return Err(E::device_from(
                    "cannot take over from the serving process that died",
                    e,
                ))
            }
        }
        device.take_over_rings(rings);
    }

    if let Some(m) = metrics {
        m.spawn(device.clone())
            .map_err(|e| E::device_from("--metrics: cannot start serving", e))?;
    }
    let stats_sink = stats_sink.map(Arc::new);
    let socket_entry = confined.socket.take().map(Arc::new);
    spawn_signal_thread(server.clone(), stats_sink.clone(), socket_entry.clone())?;
    if let Some(sig) = sandbox::early_signal() {
        // SAFETY: raise has no preconditions; the handlers just installed take it.
        unsafe { libc::raise(sig) };
    }
    if let Some(sink) = stats_sink.clone() {
        let server = server.clone();
        let every = Duration::from_secs_f64(opt.stats_interval);
        std::thread::Builder::new()
            .name("vfsd-stats".into())
            .spawn(move || loop {
                write_stats(&sink, &server);
                std::thread::sleep(every);
            })
            .map_err(|e| E::device_from("cannot start the statistics thread", e))?;
    }

    let mut daemon = VhostUserDaemon::new(
        "vfsd".to_string(),
        device.clone(),
        GuestMemoryAtomic::new(GuestMem::new()),
    )
    // Its error is not Sync (a thread's panic payload): carried as its message.
    .map_err(|e| E::device_from("cannot create the vhost-user device", e.to_string()))?;
    crate::seccomp::apply(
        opt.seccomp,
        opt.inode_file_handles != crate::cli::InodeFileHandles::Never
            || opt.migration_mode == crate::cli::MigrationMode::FileHandles,
    )?;

    info!(
        "sharing '{}' on {} (sandbox {:?}, seccomp {:?}); waiting for the vhost-user frontend",
        shared_dir.display(),
        opt.socket_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("fd {}", opt.fd.unwrap_or(-1))),
        opt.sandbox,
        opt.seccomp
    );
    daemon
        .start(&mut listener)
        .map_err(|e| E::device_from("vhost-user connection failed", e.to_string()))?;
    info!("frontend connected");
    // The listener's Drop would unlink its path, which inside the sandbox names something
    // else (and is not in the seccomp allowlist): the socket is removed through its
    // directory's fd instead, by the sandbox's parent or (without a sandbox) below.
    std::mem::forget(listener);
    let result = daemon.wait();
    if let Some(s) = &socket_entry {
        s.remove();
    }
    for h in daemon.get_epoll_handlers() {
        h.send_exit_event();
    }
    if let Some(sink) = &stats_sink {
        write_stats(sink, &server);
    }
    // Dropping the daemon joins the queue threads, and one may be stuck in a host call
    // that never returns (a lone request on a hung network file system): the process
    // exits next, which ends threads in killable waits (NFS, a FUSE request its server
    // has not read yet). A FUSE request the server has read waits until it is answered.
    std::mem::forget(daemon);
    match result {
        Ok(())
        | Err(DaemonError::HandleRequest(vhost::vhost_user::Error::Disconnected))
        | Err(DaemonError::HandleRequest(vhost::vhost_user::Error::PartialMessage)) => {
            info!("frontend disconnected; exiting");
            Ok(())
        }
        // A frontend that broke the protocol ends its own session only: the next one is
        // served (the parent goes on after a clean exit).
        Err(e) if opt.keep_listening => {
            log::error!("vhost-user connection failed: {e}; listening for the next frontend");
            Ok(())
        }
        Err(e) => Err(E::device_from(
            "vhost-user connection failed",
            e.to_string(),
        )),
    }
}

fn spawn_signal_thread(
    server: Arc<FuseServer<PassthroughFs>>,
    stats: Option<Arc<StatsFile>>,
    socket: Option<Arc<SocketName>>,
) -> Result<(), StartupError> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .map_err(|e| StartupError::device_from("cannot install signal handlers", e))?;
    std::thread::Builder::new()
        .name("vfsd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGUSR1 {
                    let snap = server.stats_snapshot();
                    info!("statistics: {snap}");
                    if let Some(s) = &stats {
                        write_stats(s, &server);
                    }
                    continue;
                }
                info!(
                    "received {}; exiting",
                    if sig == SIGTERM { "SIGTERM" } else { "SIGINT" }
                );
                if let Some(s) = &stats {
                    write_stats(s, &server);
                }
                if let Some(s) = &socket {
                    s.remove();
                }
                std::process::exit(0);
            }
        })
        .map_err(|e| StartupError::device_from("cannot start the signal thread", e))?;
    Ok(())
}
