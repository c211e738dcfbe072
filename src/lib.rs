//! vfsd: a virtio-fs device backend (vhost-user-fs) with parallel direct writes.
//!
//! Layers, top to bottom: `cli` → `device` (vhost-user queues and workers) → `server`
//! (FUSE dispatch on fuse-backend-rs, statistics) → `passthrough` (the filesystem) → `sys`
//! (thin syscall helpers).

pub mod abi;
pub mod caps;
pub mod cli;
pub mod daemon;
pub mod device;
pub mod dirty_log;
pub mod error;
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
