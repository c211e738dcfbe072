//! The device state a migration carries (VHOST_USER_PROTOCOL_F_DEVICE_STATE): what the
//! destination needs to go on serving the same guest without a new INIT.
//!
//! - the INIT flags of the session;
//! - every node the guest knows (its id, its lookup count, how to find its file again),
//!   and the forgotten directories their names go through;
//! - every open handle (its number, its node, its open flags, the flock held through it);
//! - every POSIX/OFD lock owner with its byte ranges;
//! - the requests the guest still waits on (a SETLKW whose wait the ring stop suspended),
//!   for the destination to answer on the same descriptors (`InFlight`).
//!
//! How files are found again is `--migration-mode`: find-paths sends each node's name in
//! its parent (the destination opens it with `openat(O_NOFOLLOW)` from the parent it
//! restored first, so no path can leave the share), file-handles sends file handles (the
//! destination checks that what a handle opens lies inside the share). The stream is
//! `MAGIC`, a version, a length and a postcard body, at most `MAX_STATE` bytes; anything
//! else is refused with a `StateError`, never a panic. A load that fails leaves the
//! destination empty (a fresh session), and with `--migration-on-error abort` reports the
//! failure to the VMM, which then resumes the source.
//!
//! Locks: on one host the destination takes the source's own descriptions (`handover`),
//! which hold them already. Otherwise (two hosts over a distributed file system) it takes
//! each again on its own host descriptions; while the source still holds one, it waits for
//! it on a thread of its own, blocked in the host's lock call (flock, F_OFD_SETLKW), so
//! the file system queues it and grants it the lock as the source lets go. The guest keeps
//! its lock the whole time, held first by the source and then by the destination; a third
//! party already queued before the destination can still come first (docs/migration.md).
//!
//! The parts: `format` (the stream and what it carries), `save` (the source's side),
//! `restore` (the destination's, and the take-over after a crash), `find` (finding each
//! node's file again), `retake` (the threads that wait for locks the source still holds).

mod find;
mod format;
mod restore;
mod retake;
mod save;
#[cfg(test)]
mod tests;

use std::io;

use serde::{Deserialize, Serialize};

use crate::filesystem::InFlight;
pub use format::{
    parse_header, HEADER_LEN, MAGIC, MAX_HANDLES, MAX_IN_FLIGHT_REQUEST, MAX_NODES, MAX_STATE,
    VERSION,
};
pub use restore::LoadReport;

/// `--migration-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    #[default]
    FindPaths,
    FileHandles,
}

/// `--migration-on-error`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    #[default]
    Abort,
    GuestError,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct MigrationConfig {
    pub mode: Mode,
    pub on_error: OnError,
    pub verify_handles: bool,
    pub confirm_paths: bool,
}

/// Why a state could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("not a vfsd device state")]
    BadMagic,
    #[error("device state format {0}; this vfsd reads format {VERSION}")]
    Version(u32),
    #[error("device state of {0} bytes is over the limit of {MAX_STATE}")]
    TooLarge(u64),
    #[error("{0} nodes, over the {MAX_NODES} a destination loads")]
    TooManyNodes(usize),
    #[error("device state truncated: {got} of {want} bytes")]
    Truncated { got: usize, want: usize },
    #[error("malformed device state: {0}")]
    Malformed(String),
    #[error("the session enabled INIT flags {0:#x} this vfsd does not offer with its options")]
    Flags(u64),
    #[error("node {node}: {why}")]
    Node {
        node: u64,
        #[source]
        why: ItemError,
    },
    #[error("handle {fh}: {why}")]
    Handle {
        fh: u64,
        #[source]
        why: ItemError,
    },
    #[error("lock owner {owner:#x} of node {node}: {why}")]
    Lock {
        node: u64,
        owner: u64,
        #[source]
        why: ItemError,
    },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Why one node, handle or lock owner of a state was left out, or a node could not be
/// described: what is wrong with it, or the host call that failed.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// What the state, or the file found for it, says is wrong.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A host call failed; `what` says which, or on what.
    #[error("{what}: {source}")]
    Call {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl From<String> for ItemError {
    fn from(why: String) -> Self {
        ItemError::Refused(why)
    }
}

impl From<&str> for ItemError {
    fn from(why: &str) -> Self {
        ItemError::Refused(why.to_string())
    }
}

/// Turns a host call's error into an `ItemError` saying `what` failed.
fn call(what: impl Into<String>) -> impl FnOnce(io::Error) -> ItemError {
    move |source| ItemError::Call {
        what: what.into(),
        source,
    }
}

fn malformed(why: impl Into<String>) -> StateError {
    StateError::Malformed(why.into())
}
