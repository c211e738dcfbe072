//! The syscall allowlist applied with `--seccomp` (default: kill on anything else, as
//! virtiofsd does). Built from the syscalls the daemon makes on every request path (traced
//! under the integration and guest suites), plus what Rust's runtime needs.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

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
    libc::SYS_umask,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    // Acting as the guest caller when creating files.
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
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
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_ioctl,
    // Memory and threads.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_clone,
    libc::SYS_clone3,
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
    libc::SYS_prctl,
    libc::SYS_prlimit64,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_restart_syscall,
    // Signals (SIGTERM/SIGUSR1 handling, panics).
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_kill,
];

/// Applies the filter to every thread of the process (TSYNC); threads started later
/// inherit it.
pub fn apply(mode: SeccompMode) -> Result<(), String> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(()),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, vec![])).collect();
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(|e| format!("seccomp: {e}"))?;
    let prog: BpfProgram = filter.try_into().map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter_all_threads(&prog).map_err(|e| format!("seccomp: {e}"))
}
