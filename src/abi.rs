//! Parts of the FUSE ABI newer than fuse-backend-rs 0.14 (FUSE 7.33), named as in the
//! kernel's `fuse.h`. Shared by the server, which negotiates and decodes them, and the
//! passthrough filesystem, which says which features it wants.

/// INIT flags (`fuse_init_in.flags` | `flags2 << 32`), named as in the FUSE spec.
pub mod flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
}

/// The uid and gid of a request whose caller the guest does not name: with FUSE_ALLOW_IDMAP
/// the kernel sends the caller's ids only with the requests that create a node (mapped
/// through the mount's idmapping), and this in every other request.
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;
