//! The supervisor's errors: why it could not start or go on after its exec
//! (`SupervisorError`), and why a step of setting up, taking over or handing over a
//! serving process failed (`StepError`, logged, never fatal to the supervisor).

use std::io;

use crate::error::Chain;

/// Why the supervisor could not start, or go on after its exec of a new binary.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("signalfd")]
    SignalFd(#[source] io::Error),
    #[error("cannot start the serving process")]
    Spawn(#[source] io::Error),
    #[error("cannot read the supervisor's state")]
    ReadImage(#[source] ImageError),
    #[error("the supervisor's state is version {found}, this binary reads {reads}")]
    ImageVersion { found: u32, reads: u32 },
    /// The serving process the previous image ran can't be watched.
    #[error("the serving process {pid}")]
    ServingProcess {
        pid: libc::pid_t,
        #[source]
        source: io::Error,
    },
}

/// The supervisor's image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Decode(#[from] postcard::Error),
}

/// Why a step with a serving process failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    /// The process being set up died meanwhile: its keeper reported, and the report is
    /// left for `read_death`.
    #[error("it died")]
    Died,
    #[error("no answer")]
    NoAnswer,
    #[error("it exited")]
    Exited,
    #[error("answer {got} to request {asked}")]
    WrongAnswer { got: u32, asked: u32 },
    /// SET_DEVICE_STATE_FD was refused.
    #[error("refused")]
    Refused,
    /// CHECK_DEVICE_STATE said the transfer failed.
    #[error("the transfer failed (its log says why)")]
    TransferFailed,
    #[error("a short GET_VRING_BASE answer")]
    ShortBase,
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Why the session can't be taken or handed over, the message saying all.
    #[error("{0}")]
    Cannot(String),
    /// What was being done when `source` failed.
    #[error("{context}")]
    In {
        context: String,
        #[source]
        source: Box<StepError>,
    },
    /// A hand-over failed (`failed`), and the old process could not take its rings
    /// back (`source`).
    #[error("{}; and the old process could not go on", Chain(&**.failed))]
    NotResumed {
        failed: Box<StepError>,
        #[source]
        source: Box<StepError>,
    },
}

impl StepError {
    pub(super) fn cannot(why: impl Into<String>) -> Self {
        StepError::Cannot(why.into())
    }

    /// This error, said to have happened while doing `context`.
    pub(super) fn in_step(self, context: impl Into<String>) -> Self {
        StepError::In {
            context: context.into(),
            source: Box::new(self),
        }
    }
}

/// `map_err` that says what was being done.
pub(super) trait StepContext<T> {
    fn step(self, context: impl FnOnce() -> String) -> Result<T, StepError>;
}

impl<T, E: Into<StepError>> StepContext<T> for Result<T, E> {
    fn step(self, context: impl FnOnce() -> String) -> Result<T, StepError> {
        self.map_err(|e| StepError::In {
            context: context(),
            source: Box::new(e.into()),
        })
    }
}
