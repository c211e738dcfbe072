//! The syscall allowlist applied with `--seccomp` (default: kill on anything else, as
//! virtiofsd does). Built from the syscalls the daemon makes on every request path (traced
//! under the integration and guest suites), plus what Rust's runtime needs.
//!
//! The filter is applied at the end of start-up, after the sandbox, the capability drop and
//! the logger's set-up, and only in the process that serves the guest (the sandbox's
//! supervising parent never gets one: it only relays signals and waits). From then on the
//! daemon only starts threads, names them, and may signal itself; the calls that could do
//! more are allowed with those arguments only (`rules`).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// No filter.
    None,
    /// Kill the process on a syscall outside the allowlist.
    Kill,
    /// Allow it but have the kernel log it (audit log / dmesg).
    Log,
    /// Send SIGSYS to the thread.
    Trap,
}

/// Allowed with any arguments.
const ALLOWED: &[libc::c_long] = &[
    // I/O on host files and guest memory.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_lseek,
    libc::SYS_copy_file_range,
    libc::SYS_fallocate,
    libc::SYS_ftruncate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    // Guest flock locks, forwarded to the host.
    libc::SYS_flock,
    libc::SYS_syncfs,
    // Names and attributes, always relative to a directory fd.
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_getdents64,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_readlinkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_fgetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_flistxattr,
    libc::SYS_fremovexattr,
    // Xattrs of every node, never opened for them: the *xattrat calls on a /proc/self/fd
    // name, or where those are missing or refused the path calls from a thread's own
    // working directory (fchdir; unshare: see `rules`).
    crate::sys::SYS_GETXATTRAT,
    crate::sys::SYS_SETXATTRAT,
    crate::sys::SYS_LISTXATTRAT,
    crate::sys::SYS_REMOVEXATTRAT,
    libc::SYS_getxattr,
    libc::SYS_setxattr,
    libc::SYS_listxattr,
    libc::SYS_removexattr,
    libc::SYS_fchdir,
    libc::SYS_umask,
    libc::SYS_name_to_handle_at,
    // open_by_handle_at: only with file handles, see `rules`.
    // Acting as the guest caller when creating files.
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    // The caller's supplementary group for a create (FUSE_CREATE_SUPP_GROUP), per thread.
    libc::SYS_setgroups,
    libc::SYS_getgroups,
    libc::SYS_geteuid,
    libc::SYS_getegid,
    libc::SYS_getuid,
    libc::SYS_getgid,
    // vhost-user socket, eventfds, epoll.
    libc::SYS_accept4,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_ppoll,
    // A migration's lock handover: a unix socket in the private runtime directory
    // (`passthrough::handover`; socket: AF_UNIX only, see `rules`).
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_connect,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    // No ioctl: see `rules`.
    // Memory and threads (clone, clone3 and prctl: see `rules`).
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_set_tid_address,
    libc::SYS_rseq,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getrandom,
    libc::SYS_prlimit64,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_restart_syscall,
    // Signals (SIGTERM/SIGUSR1 handling, panics). kill and tgkill: see `rules`.
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
];

/// The same, where the architecture has them (aarch64 only has the newer forms:
/// ppoll, epoll_pwait). pause(2): Rust's std parks a thread that calls exit while another
/// thread is exiting in it (glibc makes it ppoll where there is no pause syscall).
#[cfg(target_arch = "x86_64")]
const ALLOWED_ARCH: &[libc::c_long] = &[libc::SYS_poll, libc::SYS_epoll_wait, libc::SYS_pause];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_ARCH: &[libc::c_long] = &[];

/// What a thread shares with the process: glibc's pthread_create passes all of these (and
/// more), a fork none.
const THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD) as u64;
/// Never for a thread of the daemon: new namespaces.
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// The ioctl requests allowed: Rust's std sets O_NONBLOCK and FD_CLOEXEC with them, and
/// FUSE_IOCTL gets and sets file attributes with the rest (`passthrough::ioctl`; the daemon
/// makes no other ioctl once confined: traced under the test and guest suites).
const IOCTLS: [u64; 6] = [
    libc::FIONBIO,
    libc::FIOCLEX,
    crate::passthrough::ioctl::HOST_REQUESTS[0] as u64,
    crate::passthrough::ioctl::HOST_REQUESTS[1] as u64,
    crate::passthrough::ioctl::HOST_REQUESTS[2] as u64,
    crate::passthrough::ioctl::HOST_REQUESTS[3] as u64,
];

/// The seccomp filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp")]
    Build(#[from] seccompiler::BackendError),
    #[error("seccomp")]
    Install(#[from] seccompiler::Error),
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(arg, len, op, value)?)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    Ok(SeccompRule::new(conds)?)
}

/// Every allowed syscall, with the conditions on its arguments (none: any). `pid` is the
/// daemon's own pid (in its pid namespace).
fn rules(
    file_handles: bool,
    pid: libc::pid_t,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED
        .iter()
        .chain(ALLOWED_ARCH)
        .map(|&nr| (nr, vec![]))
        .collect();
    // Threads only: all the sharing flags, no new namespace. (clone3 is answered ENOSYS by
    // the other filter: its flags are in memory, out of a filter's reach; glibc then falls
    // back to clone.)
    rules.insert(
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            Len::Qword,
            Op::MaskedEq(THREAD_FLAGS | NAMESPACE_FLAGS),
            THREAD_FLAGS,
        )?])?],
    );
    rules.insert(libc::SYS_clone3, vec![]);
    // Threads name themselves (std::thread::Builder::name).
    rules.insert(
        libc::SYS_prctl,
        vec![rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::PR_SET_NAME as u64,
        )?])?],
    );
    // The request is an unsigned int to the kernel: compare its low 32 bits.
    rules.insert(
        libc::SYS_ioctl,
        IOCTLS
            .iter()
            .map(|&req| rule(vec![cond(1, Len::Dword, Op::Eq, req)?]))
            .collect::<Result<_, _>>()?,
    );
    // Signals to itself only (abort's SIGABRT, raise): never to the supervising parent,
    // the process group (0) or anyone else.
    let own = |nr| -> Result<(i64, Vec<SeccompRule>), SeccompError> {
        Ok((
            nr,
            vec![rule(vec![cond(0, Len::Dword, Op::Eq, pid as u64)?])?],
        ))
    };
    rules.extend([own(libc::SYS_kill)?, own(libc::SYS_tgkill)?]);
    if file_handles {
        rules.insert(libc::SYS_open_by_handle_at, vec![]);
    }
    // Unix sockets only (the lock handover).
    rules.insert(
        libc::SYS_socket,
        vec![rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::AF_UNIX as u64,
        )?])?],
    );
    // A thread's own working directory (sys::in_dir) and nothing else.
    rules.insert(
        libc::SYS_unshare,
        vec![rule(vec![cond(
            0,
            Len::Qword,
            Op::Eq,
            libc::CLONE_FS as u64,
        )?])?],
    );
    Ok(rules)
}

fn arch() -> Result<TargetArch, SeccompError> {
    Ok(TargetArch::try_from(std::env::consts::ARCH)?)
}

fn compile(
    filter: Result<SeccompFilter, seccompiler::BackendError>,
) -> Result<BpfProgram, SeccompError> {
    Ok(filter?.try_into()?)
}

/// The filters for `mode`, in the order they are installed: clone3 answered ENOSYS (and
/// everything else passed on), then the allowlist. Stacked filters all run and the
/// strictest answer wins, so clone3 gets ENOSYS even though the allowlist lets it by.
fn filters(mode: SeccompMode, file_handles: bool) -> Result<Vec<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(vec![]),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let no_clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    );
    let allow = SeccompFilter::new(
        rules(file_handles, pid)?,
        mismatch,
        SeccompAction::Allow,
        arch()?,
    );
    Ok(vec![compile(no_clone3)?, compile(allow)?])
}

/// Applies the filters to every thread of the process (TSYNC); threads started later
/// inherit them. `file_handles`: whether the daemon opens files by handle
/// (`--inode-file-handles` other than `never`).
pub fn apply(mode: SeccompMode, file_handles: bool) -> Result<(), SeccompError> {
    // The allowlist goes last: it does not allow seccomp itself.
    for prog in filters(mode, file_handles)? {
        seccompiler::apply_filter_all_threads(&prog)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a forked child that applied vfsd's filter (`--seccomp kill`) and then ran
    /// `call` ended: `Ok(errno or 0)` if it lived, `Err(signal)` if killed.
    fn under_filter(file_handles: bool, call: fn() -> i32) -> Result<i32, i32> {
        // SAFETY: the child only builds and applies the filter (glibc's malloc is safe
        // after fork) and makes raw syscalls before _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match apply(SeccompMode::Kill, file_handles) {
                Ok(()) => call(),
                Err(_) => 255,
            };
            // SAFETY: ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our own child; `status` is a valid out pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            let code = libc::WEXITSTATUS(status);
            assert_ne!(code, 255, "the filter did not apply");
            Ok(code)
        }
    }

    /// 0 for success, else errno (below 255).
    fn ret(r: libc::c_long) -> i32 {
        if r < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        } else {
            0
        }
    }

    const KILLED: Result<i32, i32> = Err(libc::SIGSYS);

    #[test]
    fn xattrs_of_unopened_files_are_allowed_and_unshare_only_detaches_the_cwd() {
        // Answered by the kernel (EFAULT, or ENOSYS before 6.13), not killed.
        let r = under_filter(false, || {
            // SAFETY: a bad fd and null pointers: the kernel refuses before reading.
            ret(unsafe { libc::syscall(crate::sys::SYS_LISTXATTRAT, -1, 0usize, 0, 0usize, 0) })
        });
        assert!(matches!(r, Ok(e) if e != 0), "{r:?}");
        // The fallback for kernels without *xattrat: a thread cwd and the path calls.
        let r = under_filter(false, || {
            let Ok(dir) = crate::sys::openat(
                libc::AT_FDCWD,
                c"/proc/self/fd",
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            ) else {
                return 1;
            };
            let mut buf = [0u8; 64];
            let fd = std::os::fd::AsRawFd::as_raw_fd(&dir);
            // SAFETY: NUL-terminated path; the kernel writes at most 64 bytes.
            let mut list =
                || unsafe { libc::listxattr(c"0".as_ptr(), buf.as_mut_ptr().cast(), 64) };
            match crate::sys::in_dir(fd, || list() as i64) {
                Ok(_) => 0,
                Err(e) => e.raw_os_error().unwrap_or(1),
            }
        });
        assert_ne!(r, KILLED);
        assert_eq!(
            // SAFETY: detaches only this (single-threaded) child's fs information.
            under_filter(false, || ret(unsafe {
                libc::syscall(libc::SYS_unshare, libc::CLONE_FS)
            })),
            Ok(0)
        );
        assert_eq!(
            under_filter(false, || {
                // SAFETY: refused by the filter before the kernel sees it.
                ret(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_FS | libc::CLONE_NEWNS) })
            }),
            KILLED
        );
    }

    /// Two threads exiting at once (SIGTERM's thread and the main thread on the frontend's
    /// disconnect): Rust's std parks the second in pause(2) until the first has exited. A
    /// filter without pause killed the daemon with SIGSYS in the middle of the first
    /// thread's exit (its stats file and socket clean-up).
    #[test]
    fn a_second_exit_waits_for_the_first_instead_of_killing_the_daemon() {
        extern "C" fn exit_from_another_thread() {
            std::thread::spawn(|| std::process::exit(7));
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let r = under_filter(false, || {
            // SAFETY: registers a plain function, run by this child's exit.
            unsafe { libc::atexit(exit_from_another_thread) };
            std::process::exit(0)
        });
        assert_eq!(r, Ok(0));
    }

    #[test]
    fn threads_start_through_clone_and_clone3_says_enosys() {
        // std's spawn: glibc tries clone3, gets ENOSYS, falls back to clone.
        assert_eq!(
            under_filter(false, || {
                std::thread::spawn(|| ()).join().map_or(1, |_| 0)
            }),
            Ok(0)
        );
        assert_eq!(
            under_filter(false, || {
                // SAFETY: clone3 with a null argument: refused before anything is read.
                ret(unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) })
            }),
            Ok(libc::ENOSYS)
        );
    }

    #[test]
    fn no_process_is_forked() {
        // SAFETY: if it were allowed the child would _exit at once.
        assert_eq!(
            under_filter(false, || match unsafe { libc::fork() } {
                0 => unsafe { libc::_exit(0) },
                r => ret(r as libc::c_long),
            }),
            KILLED
        );
        // A thread's flags with a new namespace.
        assert_eq!(
            under_filter(false, || {
                let flags = THREAD_FLAGS | libc::CLONE_NEWUSER as u64;
                // SAFETY: refused (or EINVAL) before any thread would exist.
                ret(unsafe {
                    libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize)
                })
            }),
            KILLED
        );
    }

    #[test]
    fn prctl_only_names_threads() {
        assert_eq!(
            under_filter(false, || {
                // SAFETY: a NUL-terminated name of at most 16 bytes.
                ret(unsafe { libc::prctl(libc::PR_SET_NAME, c"named".as_ptr()) } as _)
            }),
            Ok(0)
        );
        assert_eq!(
            under_filter(false, || {
                // SAFETY: integer arguments only.
                ret(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) } as _)
            }),
            KILLED
        );
    }

    #[test]
    fn ioctl_only_sets_fd_flags() {
        assert_eq!(
            under_filter(false, || {
                let on: libc::c_int = 1;
                // SAFETY: an eventfd of our own (an allowed way to get a fresh fd);
                // FIONBIO reads one int.
                unsafe {
                    let fd = libc::eventfd(0, 0);
                    ret(libc::ioctl(fd, libc::FIONBIO, &on) as _)
                        + ret(libc::ioctl(fd, libc::FIOCLEX) as _)
                }
            }),
            Ok(0)
        );
        assert_eq!(
            under_filter(false, || {
                let mut t: libc::termios = unsafe { std::mem::zeroed() };
                // SAFETY: TCGETS writes one termios.
                ret(unsafe { libc::ioctl(0, libc::TCGETS, &mut t) } as _)
            }),
            KILLED
        );
    }

    #[test]
    fn ioctl_gets_and_sets_file_attributes() {
        use crate::passthrough::ioctl::HOST_REQUESTS;
        // Each request vfsd makes passes the filter (never SIGSYS), whatever the host
        // filesystem answers: the flags and fsxattr read from a file are set back unchanged.
        let r = under_filter(false, || {
            let mut flags = [0u32; 7];
            let mut fsx = [0u32; 7];
            // SAFETY: an fd of our own; each request reads or writes at most the 28 bytes
            // of its argument.
            unsafe {
                let fd = libc::open(c"/proc/self/exe".as_ptr(), libc::O_RDONLY);
                libc::ioctl(fd, HOST_REQUESTS[0] as _, flags.as_mut_ptr());
                libc::ioctl(fd, HOST_REQUESTS[2] as _, fsx.as_mut_ptr());
                libc::ioctl(fd, HOST_REQUESTS[1] as _, flags.as_ptr());
                libc::ioctl(fd, HOST_REQUESTS[3] as _, fsx.as_ptr());
            }
            0
        });
        assert_eq!(r, Ok(0));
        // Other file ioctls stay refused: FS_IOC_GETVERSION.
        assert_eq!(
            under_filter(false, || {
                let mut v = 0u64;
                // SAFETY: the request writes at most 8 bytes at `v`.
                ret(unsafe { libc::ioctl(0, 0x8008_7601u64 as _, &mut v) } as _)
            }),
            KILLED
        );
    }

    #[test]
    fn signals_go_only_to_the_daemon_itself() {
        // Signal 0 only checks the target exists.
        assert_eq!(
            under_filter(false, || unsafe {
                // SAFETY: signal 0 to ourselves.
                ret(libc::kill(libc::getpid(), 0) as _)
                    + ret(libc::syscall(
                        libc::SYS_tgkill,
                        libc::getpid(),
                        libc::gettid(),
                        0,
                    ))
            }),
            Ok(0)
        );
        for call in [
            // SAFETY (all three): signal 0 checks the target exists and sends nothing.
            (|| ret(unsafe { libc::kill(libc::getppid(), 0) } as _)) as fn() -> i32,
            || ret(unsafe { libc::kill(0, 0) } as _),
            || ret(unsafe { libc::syscall(libc::SYS_tgkill, libc::getppid(), libc::getppid(), 0) }),
        ] {
            assert_eq!(under_filter(false, call), KILLED);
        }
    }

    #[test]
    fn open_by_handle_at_only_with_file_handles() {
        fn call() -> i32 {
            // SAFETY: a bad fd and a null handle: EBADF or EFAULT, nothing opened.
            ret(unsafe { libc::syscall(libc::SYS_open_by_handle_at, -1, 0usize, 0) })
        }
        assert_eq!(under_filter(false, call), KILLED);
        assert!(matches!(under_filter(true, call), Ok(e) if e != 0));
    }

    #[test]
    fn no_filter_without_seccomp() {
        assert!(filters(SeccompMode::None, true).unwrap().is_empty());
        assert_eq!(filters(SeccompMode::Log, true).unwrap().len(), 2);
    }
}
