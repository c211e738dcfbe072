//! Start-up and shutdown: checks the options, builds the layers, serves one frontend.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use log::{error, info};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use vhost::vhost_user::Listener;
use vhost_user_backend::{Error as DaemonError, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::cli::{Opt, Sandbox};
use crate::device::{DeviceConfig, FsDevice};
use crate::passthrough::{Config, PassthroughFs};
use crate::server::FuseServer;

/// Sets up logging. fuse-backend-rs is never allowed trace level: its trace path transmutes
/// guest opcodes into an enum (undefined behaviour for unknown ones).
pub fn init_logging(opt: &Opt) {
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
    let crate_level = level.min(log::LevelFilter::Debug);
    b.filter_module("fuse_backend_rs", crate_level);
    b.format_timestamp_millis();
    let _ = b.try_init();
}

fn check_shared_dir(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!(
            "shared directory '{}' is not a directory",
            dir.display()
        )),
        Err(e) => Err(format!("shared directory '{}': {e}", dir.display())),
    }
}

/// Whether some process is listening on the unix socket `path`. Read from
/// /proc/net/unix rather than by connecting: a connection would look like a frontend
/// to the daemon that owns the socket.
fn socket_listening(path: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return false;
    };
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num RefCount Protocol Flags Type St Inode Path; flag 0x10000 = __SO_ACCEPTCON.
        f.len() >= 8
            && u32::from_str_radix(f[3], 16).is_ok_and(|fl| fl & 0x10000 != 0)
            && (Path::new(f[7]) == path || Path::new(f[7]) == abs)
    })
}

/// Binds the socket path, refusing one another process is listening on.
fn bind(path: &Path) -> Result<Listener, String> {
    if socket_listening(path) {
        return Err(format!(
            "socket path '{}' is in use by another process",
            path.display()
        ));
    }
    // A stale socket from an earlier run is replaced, as virtiofsd does.
    Listener::new(path, true).map_err(|e| format!("cannot listen on '{}': {e}", path.display()))
}

fn write_stats(path: &Path, server: &FuseServer) {
    let snap = server.stats.snapshot(server.fs());
    let tmp = path.with_extension("tmp");
    let r = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(serde_json::to_string_pretty(&snap).unwrap().as_bytes()))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        error!("cannot write statistics to '{}': {e}", path.display());
    }
}

pub fn run(mut opt: Opt) -> Result<(), String> {
    opt.apply_compat_options()?;
    init_logging(&opt);
    if opt.sandbox != Sandbox::None {
        return Err(format!(
            "--sandbox {:?} is not supported yet; use --sandbox none",
            opt.sandbox
        )
        .to_lowercase());
    }
    let shared_dir = opt.shared_dir.clone().ok_or("--shared-dir is required")?;
    check_shared_dir(&shared_dir)?;
    if opt.stats_interval <= 0.0 || !opt.stats_interval.is_finite() {
        return Err("--stats-interval must be a positive number of seconds".into());
    }

    let mut listener = match (&opt.socket_path, opt.fd) {
        (Some(p), _) => bind(p)?,
        (None, Some(fd)) => {
            // SAFETY: the user hands us this fd as a listening socket (as with virtiofsd's
            // --fd); it is not used anywhere else in the process.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(format!("--fd {fd}: not an open file descriptor"));
            }
            // SAFETY: see above; the listener takes ownership of the fd.
            unsafe { Listener::from_raw_fd(fd) }
        }
        (None, None) => return Err("one of --socket-path or --fd is required".into()),
    };

    let mut cfg = Config::new(shared_dir.clone());
    cfg.cache = opt.cache;
    cfg.xattr = opt.xattr;
    cfg.readonly = opt.readonly;
    cfg.writeback = opt.writeback;
    cfg.allow_direct_io = opt.allow_direct_io;
    cfg.parallel_direct_writes = !opt.no_parallel_direct_writes;
    cfg.announce_submounts = opt.announce_submounts;
    let fs = PassthroughFs::new(cfg)
        .map_err(|e| format!("shared directory '{}': {e}", shared_dir.display()))?;
    let server = Arc::new(FuseServer::new(Arc::new(fs)));
    let device = Arc::new(
        FsDevice::new(
            server.clone(),
            DeviceConfig {
                request_queues: opt.request_queues,
                tag: opt.tag.clone(),
                thread_pool_size: opt.thread_pool_size,
            },
        )
        .map_err(|e| e.to_string())?,
    );

    spawn_signal_thread(server.clone(), opt.stats.clone(), opt.socket_path.clone())?;
    if let Some(path) = opt.stats.clone() {
        let server = server.clone();
        let every = Duration::from_secs_f64(opt.stats_interval);
        std::thread::Builder::new()
            .name("vfsd-stats".into())
            .spawn(move || loop {
                write_stats(&path, &server);
                std::thread::sleep(every);
            })
            .map_err(|e| e.to_string())?;
    }

    let mut daemon = VhostUserDaemon::new(
        "vfsd".to_string(),
        device.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(|e| format!("cannot create the vhost-user device: {e}"))?;

    info!(
        "sharing '{}' on {}; waiting for the vhost-user frontend",
        shared_dir.display(),
        opt.socket_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| format!("fd {}", opt.fd.unwrap_or(-1)))
    );
    daemon
        .start(&mut listener)
        .map_err(|e| format!("vhost-user connection failed: {e}"))?;
    info!("frontend connected");
    let result = daemon.wait();
    for h in daemon.get_epoll_handlers() {
        h.send_exit_event();
    }
    if let Some(path) = &opt.stats {
        write_stats(path, &server);
    }
    match result {
        Ok(())
        | Err(DaemonError::HandleRequest(vhost::vhost_user::Error::Disconnected))
        | Err(DaemonError::HandleRequest(vhost::vhost_user::Error::PartialMessage)) => {
            info!("frontend disconnected; exiting");
            Ok(())
        }
        Err(e) => Err(format!("vhost-user connection failed: {e}")),
    }
}

fn spawn_signal_thread(
    server: Arc<FuseServer>,
    stats: Option<PathBuf>,
    socket: Option<PathBuf>,
) -> Result<(), String> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGUSR1])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("vfsd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGUSR1 {
                    let snap = server.stats.snapshot(server.fs());
                    info!("statistics: {snap}");
                    if let Some(p) = &stats {
                        write_stats(p, &server);
                    }
                    continue;
                }
                info!(
                    "received {}; exiting",
                    if sig == SIGTERM { "SIGTERM" } else { "SIGINT" }
                );
                if let Some(p) = &stats {
                    write_stats(p, &server);
                }
                if let Some(s) = &socket {
                    let _ = std::fs::remove_file(s);
                }
                std::process::exit(0);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}
