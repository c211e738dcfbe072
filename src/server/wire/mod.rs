//! The wire format: a request's descriptor chain read once (`descs`, `chain`), its readable
//! part copied once (`request`), decoded (`codec`, `ext`, `init`), and replies written into
//! its writable buffers (`reply`). Nothing here knows a filesystem.
//!
//! Each module imports only those listed before it: `codec`, `guest`, `init`, `descs`,
//! `request`, `ext`, `chain`, `reply`.

pub mod chain;
pub mod codec;
pub mod descs;
pub mod ext;
pub mod guest;
pub mod init;
pub mod reply;
pub mod request;
