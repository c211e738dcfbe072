//! Confining the daemon before it serves a guest, with virtiofsd's modes:
//! - `namespace`: new mount, pid and net namespaces (plus a user namespace when not root, or
//!   with `--uid-map`/`--gid-map`, see `idmap`),
//!   a fresh /proc for the pid namespace, then pivot_root into the shared directory, so
//!   nothing outside the share is even nameable. The process forks: the parent waits for
//!   the sandboxed child and relays signals to it.
//! - `chroot`: chroot into the shared directory (needs root); it forks the same way.
//! - `none`: nothing.
//!
//! Every mode first closes every fd the daemon does not need. The confined daemon keeps
//! no directory outside the share (an fd of one is a way out: `openat(fd, "..")`): the
//! statistics file is kept as the file's own fd, the socket's name is removed by the
//! parent, which never serves the guest, after the daemon exits, and the lock handover's
//! runtime directory is a detached copy of that one directory's mount, whose `..` leads
//! nowhere (`passthrough::RuntimeDir`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::cli::Sandbox;
use crate::idmap::IdRange;
use crate::sys::{self, cvt};

/// What the filesystem needs from the sandbox: where the share is now, and /proc/self/fd.
pub struct Confined {
    pub root: PathBuf,
    pub proc_self_fd: OwnedFd,
    /// The socket's name, for the daemon to remove itself: only without a sandbox (with
    /// one, the supervising parent removes it).
    pub socket: Option<SocketName>,
    /// The private runtime directory for a migration's lock handover, if there is one.
    pub runtime_dir: Option<crate::passthrough::RuntimeDir>,
}

/// Opens the runtime directory `path` (prepared before), logging once why there is none.
fn runtime_dir(path: Option<&Path>, confined: bool) -> Option<crate::passthrough::RuntimeDir> {
    let path = path?;
    crate::passthrough::RuntimeDir::open(path, confined)
        .map_err(|e| {
            log::info!(
                "no lock handover on migration (runtime directory {}: {e}); locks are taken again",
                path.display()
            )
        })
        .ok()
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A step of setting it up failed.
    #[error("sandbox: {step}")]
    Step {
        step: String,
        #[source]
        source: io::Error,
    },
    /// The options ask for confinement this process can't have.
    #[error("{0}")]
    Refused(String),
    /// A resource limit could not be set (`daemon`'s `--rlimit-nofile`).
    #[error("{context}")]
    Limit {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    IdMap(#[from] crate::idmap::IdMapError),
    #[error(transparent)]
    Caps(#[from] crate::caps::CapsError),
}

/// A path the sandbox, a socket's name or the statistics file can't use.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("path '{}' contains NUL", .0.display())]
    Nul(PathBuf),
    #[error("'{}' has no file name", .0.display())]
    NoFileName(PathBuf),
    #[error("NUL in file name")]
    NulInName,
    /// Opening or checking it failed; the context names it.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn err(what: &str, e: io::Error) -> SandboxError {
    SandboxError::Step {
        step: what.to_string(),
        source: e,
    }
}

fn refused(why: &str) -> SandboxError {
    SandboxError::Refused(why.to_string())
}

fn cpath(p: &Path) -> Result<CString, PathError> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| PathError::Nul(p.to_path_buf()))
}

/// Closes every fd but stdio and `keep`.
pub fn close_other_fds(keep: &[RawFd]) -> Result<(), SandboxError> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| err("list open fds", e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: closing an fd nothing in this single-threaded start-up still uses; the
            // directory iterator's own fd is already closed (fds was collected first).
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

fn open_proc_self_fd() -> Result<OwnedFd, SandboxError> {
    sys::openat(
        libc::AT_FDCWD,
        c"/proc/self/fd",
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .map_err(|e| err("open /proc/self/fd", e))
}

/// Enters the sandbox. Must run before any thread is started (namespace and chroot modes
/// fork). `socket` is the listening socket's name, removed once the daemon is done.
pub fn enter(
    mode: Sandbox,
    shared_dir: &Path,
    id_maps: Option<(Vec<IdRange>, Vec<IdRange>)>,
    socket: Option<SocketName>,
    runtime: Option<&Path>,
    keeper: Option<Keeper>,
) -> Result<Confined, SandboxError> {
    if id_maps.is_some() && mode != Sandbox::Namespace {
        return Err(refused("--uid-map/--gid-map need --sandbox namespace"));
    }
    if let Some(k) = keeper {
        // The child shares the parent's fd table: a socket's directory, held by the
        // parent, would be the child's way out. The supervisor holds the names instead.
        if socket.is_some() {
            return Err(refused(
                "a keeper with the socket's name in the sandbox's parent",
            ));
        }
        KEEPER
            .set(k)
            .map_err(|_| refused("the sandbox entered twice"))?;
    }
    match mode {
        Sandbox::None => {
            // The process that outlives the serving one holds its fds (`recovery`).
            if keeper.is_some() {
                fork_supervised(None, || Ok(()))?;
            }
            Ok(Confined {
                root: shared_dir.to_path_buf(),
                proc_self_fd: open_proc_self_fd()?,
                socket,
                runtime_dir: runtime_dir(runtime, false),
            })
        }
        Sandbox::Chroot => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(refused(
                    "--sandbox chroot needs root; use --sandbox namespace or none",
                ));
            }
            // A chrooted process holding a directory outside its root walks out through
            // it, so the socket's directory stays with a parent that never serves.
            fork_supervised(socket, || Ok(()))?;
            let proc_self_fd = open_proc_self_fd()?;
            let runtime_dir = runtime_dir(runtime, true);
            let dir = cpath(shared_dir)?;
            // SAFETY: plain syscalls with a NUL-terminated path.
            cvt(unsafe { libc::chroot(dir.as_ptr()) }).map_err(|e| err("chroot", e))?;
            cvt(unsafe { libc::chdir(c"/".as_ptr()) }).map_err(|e| err("chdir /", e))?;
            Ok(Confined {
                root: PathBuf::from("/"),
                proc_self_fd,
                socket: None,
                runtime_dir,
            })
        }
        Sandbox::Namespace => namespace(shared_dir, id_maps, socket, runtime),
    }
}

/// A pipe across a fork that tells the child whether its parent still lives: the parent
/// keeps the write end (never written) and the child polls the read end, which reports a
/// hang-up once the parent's end is closed by its death. A parent that died before the
/// child set its parent-death signal sent none, and across pid namespaces getppid can't
/// tell.
struct ParentWatch {
    read: OwnedFd,
    write: OwnedFd,
}

impl ParentWatch {
    fn new() -> Result<Self, SandboxError> {
        let (read, write) = sys::pipe().map_err(|e| err("pipe", e))?;
        Ok(ParentWatch { read, write })
    }

    /// In the parent: the write end, to be held while the child should live.
    fn keep_in_parent(self) -> OwnedFd {
        self.write
    }

    /// In the child: sets its parent-death signal (SIGTERM), then exits if the parent is
    /// already gone.
    fn die_with_parent(self) {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
        drop(self.write);
        let mut p = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no waiting (timeout 0).
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n > 0 && p.revents & libc::POLLHUP != 0 {
            std::process::exit(1);
        }
    }
}

/// Forks; the parent becomes the supervisor (`supervise`, never returns) and the child
/// runs `take_ids` (a change of ids), then returns, set to die with it. `socket` stays with
/// the parent only. The ids change first because changing them clears the parent-death
/// signal. With a keeper (`recovery::keeper`) the child shares the parent's fd table, so
/// the parent still holds every fd the child opened when the child dies.
fn fork_supervised(
    socket: Option<SocketName>,
    take_ids: impl FnOnce() -> Result<(), SandboxError>,
) -> Result<(), SandboxError> {
    // The termination signals stay blocked across the fork: one arriving before the
    // parent's relay is in place waits for it instead of killing the parent alone.
    // (So the parent can't die of one before the child below has set its death signal;
    // getppid can't tell, as the parent may be outside the child's pid namespace.)
    let blocked = block_relayed_signals();
    let shared = KEEPER.get().is_some();
    let watch = if shared {
        Watch::Pidfd(own_pidfd()?)
    } else {
        Watch::Pipe(ParentWatch::new()?)
    };
    let pid = if shared {
        // SAFETY: a fork-like clone (no CLONE_VM: the child runs on its own copy of this
        // stack and memory) that shares only the fd table; no other thread exists, so the
        // child's copy of the process is consistent. The raw syscall skips glibc's fork
        // handlers, which matter only with other threads.
        cvt(unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::CLONE_FILES | libc::SIGCHLD,
                0,
                0,
                0,
                0,
            )
        } as libc::c_int)
    } else {
        // SAFETY: no other thread exists yet, so the child's copy is consistent.
        cvt(unsafe { libc::fork() })
    }
    .map_err(|e| err("fork", e))?;
    if pid > 0 {
        let _alive = match watch {
            Watch::Pipe(w) => Some(w.keep_in_parent()),
            Watch::Pidfd(_) => None,
        };
        supervise(pid, blocked, socket);
    }
    // Child: the socket's directory is the parent's business (closing it here).
    drop(socket);
    // On failure the child just exits (with the signals still blocked and no death
    // signal): the supervisor reports its status and removes the socket's name.
    take_ids()?;
    match watch {
        Watch::Pipe(w) => w.die_with_parent(),
        Watch::Pidfd(p) => die_with(p),
    }
    // In namespace mode the child is its pid namespace's init, which the kernel spares
    // every signal it has no handler for, even from outside: a SIGTERM relayed before the
    // daemon's own handlers exist would be dropped. It inherited `remember_early_signals`'s
    // handler, which catches it instead (and the flag, if one came before the fork).
    restore_signal_mask(&blocked);
    Ok(())
}

/// How a sandboxed child learns that its parent is gone: a pipe's hang-up, or (sharing
/// the fd table, where the child can't close the parent's end) the parent's pidfd.
enum Watch {
    Pipe(ParentWatch),
    Pidfd(OwnedFd),
}

/// The process's which the child of a shared-table fork watches (`die_with`).
fn own_pidfd() -> Result<OwnedFd, SandboxError> {
    // SAFETY: pidfd_open of this process; getpid has no preconditions.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return Err(err("pidfd_open", io::Error::last_os_error()));
    }
    // SAFETY: a new fd nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// In the child of a shared-table fork: its parent-death signal, then an exit if the
/// parent (whose pidfd is `parent`) is already gone. The pidfd is closed after: in the
/// shared table it would let the confined daemon signal its parent.
fn die_with(parent: OwnedFd) {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    let mut p = libc::pollfd {
        fd: parent.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; no waiting (timeout 0).
    let gone = unsafe { libc::poll(&mut p, 1, 0) } > 0;
    drop(parent);
    if gone {
        std::process::exit(1);
    }
}

/// The fds the process that outlives a serving one keeps for the next (`recovery`): its
/// end of the supervisor's keeper channel and the crash record.
#[derive(Clone, Copy, Debug)]
pub struct Keeper {
    pub channel: RawFd,
    pub record: RawFd,
}

static KEEPER: std::sync::OnceLock<Keeper> = std::sync::OnceLock::new();

fn write_file(path: &str, data: &str) -> Result<(), SandboxError> {
    std::fs::write(path, data).map_err(|e| err(&format!("write {path}"), e))
}

fn namespace(
    shared_dir: &Path,
    id_maps: Option<(Vec<IdRange>, Vec<IdRange>)>,
    socket: Option<SocketName>,
    runtime: Option<&Path>,
) -> Result<Confined, SandboxError> {
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET;
    if uid != 0 || id_maps.is_some() {
        flags |= libc::CLONE_NEWUSER;
    }
    let helper = id_maps
        .map(|(u, g)| crate::idmap::MapHelper::fork(u, g))
        .transpose()?;
    // SAFETY: unshare only changes this (single-threaded) process's namespaces.
    cvt(unsafe { libc::unshare(flags) }).map_err(|e| {
        err(
            "unshare (namespaces unavailable? try --sandbox chroot as root, or --sandbox none)",
            e,
        )
    })?;
    let mapped = helper.is_some();
    if let Some(h) = helper {
        h.map()?;
    } else if uid != 0 {
        // Be root inside the user namespace (for mount and pivot_root), the caller outside.
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("0 {uid} 1"))?;
        write_file("/proc/self/gid_map", &format!("0 {gid} 1"))?;
    }
    // The new pid namespace applies to children: fork, and let the parent wait. The parent
    // keeps the caller's host ids, so it can still remove the socket's name from a
    // directory only the caller may write to.
    fork_supervised(socket, || {
        if mapped {
            // Become the namespace's root (its uid and gid 0 are mapped, see cli), so files
            // the daemon creates belong to what 0 maps to on the host.
            // SAFETY: plain id syscalls; we hold CAP_SETUID/CAP_SETGID in our namespace.
            unsafe {
                cvt(libc::setresgid(0, 0, 0))
                    .map_err(|e| err("setresgid in the user namespace", e))?;
                // Fails (EPERM) where setgroups was denied for an unprivileged gid map.
                libc::setgroups(0, std::ptr::null());
                cvt(libc::setresuid(0, 0, 0))
                    .map_err(|e| err("setresuid in the user namespace", e))?;
            }
        }
        Ok(())
    })?;
    // In the new mount namespace, where this process may clone a mount.
    let runtime_dir = runtime_dir(runtime, true);

    let mount = |src: Option<&CString>, target: &CString, fstype: Option<&CString>, flags: u64| {
        // SAFETY: all pointers are NUL-terminated strings or null.
        cvt(unsafe {
            libc::mount(
                src.map_or(std::ptr::null(), |s| s.as_ptr()),
                target.as_ptr(),
                fstype.map_or(std::ptr::null(), |s| s.as_ptr()),
                flags,
                std::ptr::null(),
            )
        })
    };
    let root = CString::new("/").unwrap();
    // Keep our mounts from propagating back to the host.
    mount(None, &root, None, libc::MS_SLAVE | libc::MS_REC)
        .map_err(|e| err("make / a slave mount", e))?;
    let proc_ = CString::new("proc").unwrap();
    mount(
        Some(&proc_),
        &CString::new("/proc").unwrap(),
        Some(&proc_),
        libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOSUID | libc::MS_RELATIME,
    )
    .map_err(|e| err("mount /proc", e))?;
    let proc_self_fd = open_proc_self_fd()?;
    let mut dir = cpath(shared_dir)?;
    if dir.as_bytes() == b"/" {
        // pivot_root can't make the current root mount the new root (EBUSY): bind a copy
        // of it below a private tmpfs (over /proc, whose fd is already open) and pivot
        // into that.
        let stage = CString::new("/proc").unwrap();
        let tmpfs = CString::new("tmpfs").unwrap();
        mount(
            Some(&tmpfs),
            &stage,
            Some(&tmpfs),
            libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOSUID,
        )
        .map_err(|e| err("mount a staging tmpfs", e))?;
        let copy = CString::new("/proc/root").unwrap();
        // SAFETY: NUL-terminated path.
        cvt(unsafe { libc::mkdir(copy.as_ptr(), 0o755) })
            .map_err(|e| err("make the staging directory", e))?;
        mount(Some(&dir), &copy, None, libc::MS_BIND | libc::MS_REC)
            .map_err(|e| err("bind-mount the shared dir", e))?;
        dir = copy;
    } else {
        mount(Some(&dir), &dir, None, libc::MS_BIND | libc::MS_REC)
            .map_err(|e| err("bind-mount the shared dir", e))?;
    }
    // The daemon never opens a device node for the guest; with nodev on the whole share a
    // bug that tried would get EACCES from the host instead of a host device.
    set_nodev_recursive(&dir).map_err(|e| err("mount the shared dir nodev", e))?;
    // SAFETY: plain syscalls with NUL-terminated paths. pivot_root(".", ".") stacks the old
    // root on top of the new one, and the detach unmounts it.
    unsafe {
        cvt(libc::chdir(dir.as_ptr())).map_err(|e| err("chdir into the shared dir", e))?;
        cvt(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as i32)
            .map_err(|e| err("pivot_root", e))?;
        cvt(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))
            .map_err(|e| err("detach the old root", e))?;
        cvt(libc::chdir(c"/".as_ptr())).map_err(|e| err("chdir /", e))?;
    }
    Ok(Confined {
        root: PathBuf::from("/"),
        proc_self_fd,
        socket: None,
        runtime_dir,
    })
}

/// Adds MS_NODEV to the mount at `dir` and every mount below it, keeping their other
/// flags (which a user namespace may have locked).
fn set_nodev_recursive(dir: &CString) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `dir` is NUL-terminated and `attr` a live mount_attr of the size passed.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            dir.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        ) as i32
    })
    .map(drop)
}

/// What the namespace sandbox's parent passes on to the daemon.
const RELAYED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1];

/// Installs `handler` for `signals`. It must be async-signal-safe (both used here only
/// store an atomic or call kill).
fn install_handler(signals: &[libc::c_int], handler: extern "C" fn(libc::c_int)) {
    for &sig in signals {
        // SAFETY: `handler` is async-signal-safe, as required above.
        unsafe { libc::signal(sig, handler as *const () as libc::sighandler_t) };
    }
}

/// The relayed signals as a set.
fn relayed_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, set up by sigemptyset/sigaddset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in RELAYED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks the relayed signals; gives the previous mask.
fn block_relayed_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigprocmask writes the old mask into it.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &relayed_set(), &mut old);
        old
    }
}

fn restore_signal_mask(old: &libc::sigset_t) {
    // SAFETY: `old` came from sigprocmask.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// Undoes what exec kept of a launcher's signal state that vfsd depends on. An ignored
/// SIGCHLD has the kernel reap vfsd's children itself, so waitpid can't give their status:
/// every child (the id-map helper, the sandboxed daemon, a `--keep-listening` frontend's)
/// must stay ours to wait for. A blocked SIGTERM, SIGINT, SIGHUP or SIGUSR1 would never
/// reach vfsd's handlers nor be relayed to a sandboxed child.
pub fn reset_inherited_signals() {
    // SAFETY: restoring a default disposition, and unblocking a set built by relayed_set.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_UNBLOCK, &relayed_set(), std::ptr::null_mut());
    }
}

/// A termination signal that reached the sandboxed daemon before its handlers existed.
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn remember_signal(sig: libc::c_int) {
    if sig == libc::SIGTERM || sig == libc::SIGINT {
        EARLY_SIGNAL.store(sig, std::sync::atomic::Ordering::Relaxed);
    }
}

/// From the start of start-up until the daemon's own handlers exist, SIGTERM and SIGINT
/// are only noted (`early_signal`), whatever the sandbox mode: the daemon then exits the
/// way it always does on them, removing its socket, instead of dying half set up (or, as
/// a pid namespace's init, ignoring them).
pub fn remember_early_signals() {
    // SIGUSR1 (a statistics dump) is noted and dropped; SIGHUP keeps its default.
    install_handler(
        &[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1],
        remember_signal,
    );
}

/// SIGTERM or SIGINT if one came during start-up; the daemon acts on it once its own
/// handlers are in place.
pub fn early_signal() -> Option<libc::c_int> {
    match EARLY_SIGNAL.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        sig => Some(sig),
    }
}

static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn relay_signal(sig: libc::c_int) {
    let child = CHILD.load(std::sync::atomic::Ordering::Relaxed);
    if child > 0 {
        // SAFETY: kill is async-signal-safe; `child` is our own child process.
        unsafe { libc::kill(child, sig) };
    }
}

/// The parent of a namespace or chroot sandbox: relays termination signals to the child,
/// removes the socket's name once the child is gone (however it ended), and exits with its
/// status. (It can't start threads: after unshare(CLONE_NEWPID) clone of a thread fails,
/// so a plain signal handler does the relaying.)
fn supervise(child: libc::pid_t, blocked: libc::sigset_t, socket: Option<SocketName>) -> ! {
    CHILD.store(child, std::sync::atomic::Ordering::Relaxed);
    install_handler(&RELAYED, relay_signal);
    // Signals that came meanwhile are delivered (and relayed) now.
    restore_signal_mask(&blocked);
    let status = wait_status(child);
    // Reaped: its pid may go to another process now, which a relayed signal must miss.
    CHILD.store(0, std::sync::atomic::Ordering::Relaxed);
    if let Some(k) = KEEPER.get() {
        if libc::WIFSIGNALED(status) {
            // SAFETY: the channel is the supervisor's fd, given for this and held by
            // nothing else in this process.
            let ctl = std::mem::ManuallyDrop::new(unsafe {
                <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(k.channel)
            });
            crate::recovery::keeper::serve(&ctl, k.record, status);
        }
    }
    exit_as(status, socket, "sandboxed daemon")
}

/// Waits for `child`, through interruptions; its wait status. Exits 1 if it can't be
/// waited for.
fn wait_status(child: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            return status;
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            std::process::exit(1);
        }
    }
}

/// Removes the socket's name and exits as the child's wait `status` says: with its exit
/// status, or 128 + the signal that killed `what`.
fn exit_as(status: libc::c_int, socket: Option<SocketName>, what: &str) -> ! {
    if let Some(s) = socket {
        s.remove();
    }
    if libc::WIFEXITED(status) {
        std::process::exit(libc::WEXITSTATUS(status));
    }
    let sig = libc::WTERMSIG(status);
    log::error!("{what} killed by signal {sig}");
    std::process::exit(128 + sig);
}

/// `SIGKILL` for 9: the name of signal `sig`, or its number.
pub(crate) fn signal_name(sig: libc::c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// The listening sockets' names (the vhost-user socket's, and `--metrics`'s when it is a
/// path): each its directory's fd, kept only by a process that never serves the guest (or
/// by an unconfined daemon), and the socket file's identity, so that a socket another
/// daemon has bound there since is left alone.
pub struct SocketName {
    names: Vec<(OwnedFd, CString, (u64, u64))>,
}

impl SocketName {
    /// For the socket just bound at `path`.
    pub fn new(path: &Path) -> Result<Self, PathError> {
        let mut s = SocketName { names: Vec::new() };
        s.add(path)?;
        Ok(s)
    }

    /// Another socket just bound, at `path`, removed with the others.
    pub fn add(&mut self, path: &Path) -> Result<(), PathError> {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .ok_or_else(|| PathError::NoFileName(path.to_path_buf()))?;
        let name = CString::new(name.as_encoded_bytes()).map_err(|_| PathError::NulInName)?;
        let fail = |e: io::Error| PathError::Io {
            context: format!("'{}'", path.display()),
            source: e,
        };
        let dir = sys::openat(
            libc::AT_FDCWD,
            &cpath(parent)?,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )
        .map_err(fail)?;
        let id = Self::identity(&dir, &name).map_err(fail)?;
        self.names.push((dir, name, id));
        Ok(())
    }

    fn identity(dir: &OwnedFd, name: &CStr) -> io::Result<(u64, u64)> {
        let st = sys::statx(dir.as_raw_fd(), name, libc::AT_SYMLINK_NOFOLLOW)?;
        Ok((st.st.st_dev, st.st.st_ino))
    }

    /// The names as fds by number, names and identities, for the supervisor's state
    /// across its exec.
    pub fn export(&self) -> Vec<(RawFd, Vec<u8>, (u64, u64))> {
        (self.names.iter())
            .map(|(dir, name, id)| (dir.as_raw_fd(), name.as_bytes().to_vec(), *id))
            .collect()
    }

    /// The names `export` gave, in the process its exec became.
    ///
    /// # Safety
    /// Each fd must be open and owned by nothing else in this process.
    pub unsafe fn import(names: Vec<(RawFd, Vec<u8>, (u64, u64))>) -> Self {
        SocketName {
            names: (names.into_iter())
                .filter_map(|(fd, name, id)| {
                    let name = CString::new(name).ok()?;
                    // SAFETY: the caller vouches that each fd is open and ours alone; the
                    // fcntl only sets its close-on-exec flag.
                    let dir = unsafe {
                        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                        std::os::fd::FromRawFd::from_raw_fd(fd)
                    };
                    Some((dir, name, id))
                })
                .collect(),
        }
    }

    pub fn dir_fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.names.iter().map(|(dir, _, _)| dir.as_raw_fd())
    }

    /// Unlinks each name that is still our socket.
    pub fn remove(&self) {
        for (dir, name, id) in &self.names {
            if Self::identity(dir, name).ok() == Some(*id) {
                // SAFETY: NUL-terminated name relative to our dir fd.
                unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
            }
        }
    }
}

/// The `--stats` file, held by its own fd (not its directory's) and rewritten in place.
/// Each dump is one write at offset 0, padded with trailing blanks to the previous
/// dump's length (still valid JSON), so the file never ends in a stale tail.
pub struct StatsFile {
    file: std::sync::Mutex<(std::fs::File, usize)>,
}

impl StatsFile {
    pub fn create(path: &Path) -> Result<Self, PathError> {
        let fail = |e: io::Error| PathError::Io {
            context: format!("--stats '{}'", path.display()),
            source: e,
        };
        // O_NOFOLLOW: a symlink planted there is refused rather than followed; O_NONBLOCK:
        // a FIFO there can't stall start-up before the file-type check below.
        let fd = sys::openat(
            libc::AT_FDCWD,
            &cpath(path)?,
            libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0o644,
        )
        .map_err(fail)?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(fail)?;
        if !meta.is_file() {
            return Err(fail(io::Error::other("not a regular file")));
        }
        file.set_len(0).map_err(fail)?;
        Ok(StatsFile {
            file: std::sync::Mutex::new((file, 0)),
        })
    }

    /// The file the supervisor opened (`--stats-fd`).
    pub fn from_fd(fd: OwnedFd) -> Self {
        StatsFile {
            file: std::sync::Mutex::new((std::fs::File::from(fd), 0)),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.file.lock().unwrap().0.as_raw_fd()
    }

    /// Replaces the contents with `data`.
    pub fn replace(&self, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut g = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = data.to_vec();
        // Over the longest dump so far: this process's, or another's (the child of an
        // earlier frontend under --keep-listening wrote the same file).
        let on_disk = g.0.metadata().map_or(0, |m| m.len() as usize);
        buf.resize(buf.len().max(g.1.max(on_disk).saturating_sub(1)), b' ');
        buf.push(b'\n');
        g.0.write_all_at(&buf, 0)?;
        g.1 = buf.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shorter_stats_dump_leaves_no_stale_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let f = StatsFile::create(&path).unwrap();
        f.replace(br#"{"a": 1234567890, "b": [1, 2, 3]}"#).unwrap();
        f.replace(br#"{"a": 1}"#).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"a": 1}));
    }

    #[test]
    fn a_symlink_at_the_stats_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        assert!(StatsFile::create(&path).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
