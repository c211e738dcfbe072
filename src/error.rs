//! The error a daemon's start-up ends with: what went wrong, by the step that failed, so
//! a caller (a test, an embedding program) can tell a bad option from a sandbox that could
//! not be set up. Each carries the error that caused it, if any, as its `source`; `main`
//! prints the whole chain as one line a user can act on (`Chain`) and exits 1.

use std::error::Error;
use std::fmt;
use std::io;

/// The cause a start-up step carries when it is not one of the crate's own errors.
pub type Cause = Box<dyn Error + Send + Sync + 'static>;

/// Why vfsd could not start (or, for `Device`, could not go on serving). Each variant
/// holds the error of the step that failed: one of the crate's own, an OS error with
/// what was being done (`WithContext`), or a message that says all.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// An option is missing, malformed, out of range or not supported.
    #[error(transparent)]
    Option(Cause),
    /// The shared directory is missing, not a directory, or can't be opened.
    #[error(transparent)]
    SharedDir(Cause),
    /// The vhost-user socket: its path is in use, it can't be bound, or `--fd` is bad.
    #[error(transparent)]
    Socket(Cause),
    /// Confinement: namespaces, chroot, uid/gid maps, fds, capabilities, rlimits.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// The seccomp filter could not be built or installed.
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    /// The device, its threads, the statistics file or the vhost-user connection.
    #[error(transparent)]
    Device(Cause),
}

/// What was being done, and the error that stopped it.
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct WithContext {
    pub context: String,
    #[source]
    pub source: Cause,
}

fn with_context(context: impl Into<String>, source: impl Into<Cause>) -> Cause {
    Box::new(WithContext {
        context: context.into(),
        source: source.into(),
    })
}

impl StartupError {
    /// A bad option, the message saying all.
    pub fn option(message: impl Into<String>) -> Self {
        StartupError::Option(message.into().into())
    }

    /// A bad option, for the reason `source` gives.
    pub fn option_from(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        StartupError::Option(with_context(context, source))
    }

    /// The shared directory, the message saying all.
    pub fn shared_dir(message: impl Into<String>) -> Self {
        StartupError::SharedDir(message.into().into())
    }

    /// The shared directory, for the reason `source` gives.
    pub fn shared_dir_from(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        StartupError::SharedDir(with_context(context, source))
    }

    /// The socket, the message saying all.
    pub fn socket(message: impl Into<String>) -> Self {
        StartupError::Socket(message.into().into())
    }

    /// The socket, for the reason `source` gives.
    pub fn socket_from(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        StartupError::Socket(with_context(context, source))
    }

    /// The device, the message saying all.
    pub fn device(message: impl Into<String>) -> Self {
        StartupError::Device(message.into().into())
    }

    /// The device, for the reason `source` gives.
    pub fn device_from(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        StartupError::Device(with_context(context, source))
    }
}

/// An error and its causes on one line, each after the one it explains: `a: b: c`.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// What an OS call failed at, and its error.
#[derive(Debug, thiserror::Error)]
#[error("{context}")]
pub struct IoContext {
    pub context: String,
    #[source]
    pub source: io::Error,
}

/// `map_err` for an `io::Result`: the error with what was being done.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, IoContext>;
}

impl<T> Context<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, IoContext> {
        self.map_err(|source| IoContext {
            context: what(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_one_line_of_each_cause_after_what_it_explains() {
        let e = StartupError::shared_dir_from(
            "shared directory '/x'",
            io::Error::from_raw_os_error(libc::ENOENT),
        );
        let line = Chain(&e).to_string();
        assert!(
            line.starts_with("shared directory '/x': No such file"),
            "{line}"
        );
        assert!(e.source().is_some());
        let e = StartupError::Socket(Box::new(crate::sandbox::PathError::NulInName));
        assert_eq!(Chain(&e).to_string(), "NUL in file name");
        assert_eq!(Chain(&StartupError::option("bad")).to_string(), "bad");
    }
}
