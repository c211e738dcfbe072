//! vfsd's integration tests, in one test binary (`it`) so that the daemon and its test
//! frontend are linked once, not once per file. Each module is one feature, seen through
//! the real `vfsd` binary and its vhost-user socket (`common::Daemon`); the shared
//! helpers are in `common`.
//!
//! Run one feature with a filter on its module path, e.g.
//! `cargo test --release --test it -- locks::`. Tests that need root are
//! `#[ignore = "needs root"]` (`common::require_root`); `scripts/test.sh` runs them as root
//! (`-- --include-ignored`).

mod common;

mod acl;
mod busy_poll;
mod confinement;
mod crash;
mod create_ext;
mod credentials;
mod faults;
mod fuse_host;
mod fuzz_regressions;
mod hostile_requests;
mod idmap;
mod init;
mod ioctl;
mod keep_listening;
mod killpriv;
mod locks;
mod metrics;
mod migration;
mod newer_ops;
mod no_open;
mod opcodes;
mod packaging;
mod parallel_writes;
mod placement;
mod read_path;
mod ring_reset;
mod sandbox;
mod seccomp;
mod supervisor;
mod takeover;
mod translate;
mod upgrade;
mod virtiofsd_compat;
mod xattrmap;
