//! A request still in flight when its ring stopped, as the device state carries it
//! across a migration.

use serde::{Deserialize, Serialize};

/// A request popped from a ring and not answered when the ring stopped (a SETLKW still
/// waiting for its lock): the guest still waits for its reply, in the descriptors it gave.
/// Carried as is for the server layer, which checks it again before it answers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub queue: u16,
    /// The head of its descriptor chain, the id its used entry gives back.
    pub head: u16,
    /// Its position in the avail ring.
    pub position: u16,
    /// The guest address of the reply's header.
    pub reply_at: u64,
    /// The request: its `fuse_in_header` and arguments.
    pub request: Vec<u8>,
}
