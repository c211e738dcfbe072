//! The error a daemon's start-up ends with: what went wrong, by the step that failed, so
//! a caller (a test, an embedding program) can tell a bad option from a sandbox that could
//! not be set up. Each says one line a user can act on; `main` prints it and exits 1.

/// Why vfsd could not start (or, for `Device`, could not go on serving).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// An option is missing, malformed, out of range or not supported.
    #[error("{0}")]
    Option(String),
    /// The shared directory is missing, not a directory, or can't be opened.
    #[error("{0}")]
    SharedDir(String),
    /// The vhost-user socket: its path is in use, it can't be bound, or `--fd` is bad.
    #[error("{0}")]
    Socket(String),
    /// Confinement: namespaces, chroot, uid/gid maps, fds, capabilities, rlimits.
    #[error("{0}")]
    Sandbox(String),
    /// The seccomp filter could not be built or installed.
    #[error("{0}")]
    Seccomp(String),
    /// The device, its threads, the statistics file or the vhost-user connection.
    #[error("{0}")]
    Device(String),
}
