//! Which side serves each FUSE opcode: vfsd's own code in this module's siblings, or
//! fuse-backend-rs 0.14 (FUSE 7.33) calling the passthrough filesystem. This table is
//! the one place that says so; `FuseServer::serve` routes by it.

/// Who answers an opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// vfsd decodes and answers it (the reason is in the table).
    Vfsd,
    /// The crate decodes it from vfsd's copy of the request and calls the filesystem;
    /// vfsd first cuts off any request extensions (see `ext`).
    Crate,
    /// Not served: ENOSYS (the guest then stops sending it), or no reply for opcodes
    /// that take none.
    Enosys,
}

use Side::*;

/// (opcode, name as in the kernel's `enum fuse_opcode`, side, why vfsd serves it).
pub const TABLE: &[(u32, &str, Side, &str)] = &[
    (1, "LOOKUP", Crate, ""),
    (2, "FORGET", Crate, ""),
    (3, "GETATTR", Crate, ""),
    (4, "SETATTR", Crate, ""),
    (5, "READLINK", Crate, ""),
    (
        6,
        "SYMLINK",
        Vfsd,
        "its extensions passed as a parameter (create.rs)",
    ),
    (
        8,
        "MKNOD",
        Vfsd,
        "its extensions passed as a parameter (create.rs)",
    ),
    (
        9,
        "MKDIR",
        Vfsd,
        "its extensions passed as a parameter (create.rs)",
    ),
    (10, "UNLINK", Crate, ""),
    (11, "RMDIR", Crate, ""),
    (12, "RENAME", Crate, ""),
    (13, "LINK", Crate, ""),
    (14, "OPEN", Crate, ""),
    (
        15,
        "READ",
        Crate,
        "the usual shape on the queue thread (fast_read.rs)",
    ),
    (
        16,
        "WRITE",
        Vfsd,
        "data straight from guest memory (write.rs)",
    ),
    (17, "STATFS", Crate, ""),
    (18, "RELEASE", Crate, ""),
    (20, "FSYNC", Crate, ""),
    (21, "SETXATTR", Crate, "vfsd with SETXATTR_EXT (xattr.rs)"),
    (22, "GETXATTR", Crate, ""),
    (23, "LISTXATTR", Crate, ""),
    (24, "REMOVEXATTR", Crate, ""),
    (25, "FLUSH", Crate, ""),
    (26, "INIT", Vfsd, "64-bit flags, protocol 7.40 (init.rs)"),
    (27, "OPENDIR", Crate, ""),
    (28, "READDIR", Crate, ""),
    (29, "RELEASEDIR", Crate, ""),
    (30, "FSYNCDIR", Crate, ""),
    (31, "GETLK", Vfsd, "host OFD/flock locks (locks.rs)"),
    (32, "SETLK", Vfsd, "host OFD/flock locks (locks.rs)"),
    (
        33,
        "SETLKW",
        Vfsd,
        "waits on a waiter thread, not a worker (locks.rs)",
    ),
    (34, "ACCESS", Crate, ""),
    (
        35,
        "CREATE",
        Vfsd,
        "its extensions passed as a parameter (create.rs)",
    ),
    (36, "INTERRUPT", Vfsd, "cancels a waiting SETLKW (locks.rs)"),
    (37, "BMAP", Crate, ""),
    (
        38,
        "DESTROY",
        Vfsd,
        "the crate reports its reply as 0 bytes long",
    ),
    (39, "IOCTL", Vfsd, "reply data made per request (create.rs)"),
    (40, "POLL", Crate, ""),
    (41, "NOTIFY_REPLY", Crate, ""),
    (42, "BATCH_FORGET", Crate, ""),
    (43, "FALLOCATE", Crate, ""),
    (44, "READDIRPLUS", Crate, ""),
    (45, "RENAME2", Crate, ""),
    (46, "LSEEK", Crate, ""),
    (47, "COPY_FILE_RANGE", Vfsd, "newer than the crate's ABI"),
    (48, "SETUPMAPPING", Enosys, "no DAX window"),
    (49, "REMOVEMAPPING", Enosys, "no DAX window"),
    (50, "SYNCFS", Vfsd, "newer than the crate's ABI"),
    (51, "TMPFILE", Vfsd, "newer than the crate's ABI (newer.rs)"),
    (52, "STATX", Vfsd, "newer than the crate's ABI (newer.rs)"),
];

/// The side that serves `op`; opcodes not in the table (0, 7, 19, 53 and up) get ENOSYS
/// and never reach the crate, whose trace logging would turn them into its `Opcode`
/// enum (undefined behaviour).
pub fn side(op: u32) -> Side {
    entry(op).map_or(Enosys, |e| e.2)
}

/// The opcode's name, or its number for one the table doesn't know.
pub fn name(op: u32) -> &'static str {
    entry(op).map_or("unknown", |e| e.1)
}

/// Opcodes served with one or two quick host calls: a queue thread may serve them itself
/// when nothing else is in flight on its queue (see `FuseServer::is_short`). Not OPEN and
/// CREATE: a host lease holds an open for up to fs.lease-break-time (45 s), and the queue
/// would wait with it.
const SHORT: &[&str] = &[
    "LOOKUP",
    "GETATTR",
    "READ",
    "WRITE",
    "RELEASE",
    "GETXATTR",
    "OPENDIR",
    "READDIR",
    "RELEASEDIR",
    "ACCESS",
    "READDIRPLUS",
    "STATX",
];

pub fn short(op: u32) -> bool {
    entry(op).is_some_and(|e| SHORT.contains(&e.1))
}

fn entry(op: u32) -> Option<&'static (u32, &'static str, Side, &'static str)> {
    TABLE.iter().find(|e| e.0 == op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_opcodes_are_named_in_the_table() {
        for n in SHORT {
            assert!(TABLE.iter().any(|e| e.1 == *n), "{n}");
        }
        assert!(short(16) && !short(20), "WRITE is short, FSYNC is not");
        assert!(
            !short(14) && !short(35),
            "OPEN and CREATE may wait on a lease"
        );
    }

    #[test]
    fn opcodes_are_unique_and_sorted() {
        assert!(TABLE.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn vfsd_serves_what_the_crate_does_not_know() {
        // fuse-backend-rs 0.14's Opcode enum stops at LSEEK (46), and has no 7 or 19.
        for &(op, name, side, _) in TABLE {
            if op > 46 {
                assert_ne!(side, Crate, "{name} is newer than the crate");
            }
        }
        for op in [0, 7, 19, 53, 4096, u32::MAX] {
            assert_eq!(side(op), Enosys);
        }
    }
}
