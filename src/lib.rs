//! vfsd: a virtio-fs device backend (vhost-user-fs) with parallel direct writes.
//!
//! Layers, top to bottom: `cli` → `device` (vhost-user queues and workers) → `server`
//! (FUSE decoding, dispatch and replies, statistics) → `filesystem` (the trait between the
//! server and a filesystem) → `passthrough` (the host directory) → `sys` (thin syscall
//! helpers).

pub mod abi;
pub mod caps;
pub mod cli;
pub mod daemon;
pub mod device;
pub mod dirty_log;
pub mod error;
pub mod filesystem;
#[cfg(feature = "test-frontend")]
pub mod frontend;
pub mod idmap;
pub mod metrics;
pub mod passthrough;
pub mod recovery;
pub mod sandbox;
pub mod seccomp;
pub mod server;
pub mod stats;
pub mod supervisor;
pub mod sys;
pub mod syslog;
