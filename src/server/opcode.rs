//! The FUSE opcodes vfsd knows (the kernel's `enum fuse_opcode`, up to STATX), and for
//! each who serves it: the one list `FuseServer::serve` matches on.

use num_enum::TryFromPrimitive;

/// A request's opcode. Numbers not here (0, 7, 19, 53 and up) are answered ENOSYS.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive)]
pub enum Opcode {
    Lookup = 1,
    Forget = 2,
    Getattr = 3,
    Setattr = 4,
    Readlink = 5,
    Symlink = 6,
    Mknod = 8,
    Mkdir = 9,
    Unlink = 10,
    Rmdir = 11,
    Rename = 12,
    Link = 13,
    Open = 14,
    Read = 15,
    Write = 16,
    Statfs = 17,
    Release = 18,
    Fsync = 20,
    Setxattr = 21,
    Getxattr = 22,
    Listxattr = 23,
    Removexattr = 24,
    Flush = 25,
    Init = 26,
    Opendir = 27,
    Readdir = 28,
    Releasedir = 29,
    Fsyncdir = 30,
    Getlk = 31,
    Setlk = 32,
    Setlkw = 33,
    Access = 34,
    Create = 35,
    Interrupt = 36,
    Bmap = 37,
    Destroy = 38,
    Ioctl = 39,
    Poll = 40,
    NotifyReply = 41,
    BatchForget = 42,
    Fallocate = 43,
    Readdirplus = 44,
    Rename2 = 45,
    Lseek = 46,
    CopyFileRange = 47,
    Setupmapping = 48,
    Removemapping = 49,
    Syncfs = 50,
    Tmpfile = 51,
    Statx = 52,
}

/// Who answers an opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// vfsd decodes and answers it (the reason is in `Opcode::about`).
    Vfsd,
    /// fuse-backend-rs 0.14 (FUSE 7.33) decodes it from vfsd's copy of the request and
    /// calls the passthrough filesystem; vfsd first cuts off any request extensions.
    Crate,
    /// Not served: ENOSYS (the guest then stops sending it).
    Enosys,
}

use Opcode::*;
use Side::*;

impl Opcode {
    pub const ALL: [Opcode; 50] = [
        Lookup,
        Forget,
        Getattr,
        Setattr,
        Readlink,
        Symlink,
        Mknod,
        Mkdir,
        Unlink,
        Rmdir,
        Rename,
        Link,
        Open,
        Read,
        Write,
        Statfs,
        Release,
        Fsync,
        Setxattr,
        Getxattr,
        Listxattr,
        Removexattr,
        Flush,
        Init,
        Opendir,
        Readdir,
        Releasedir,
        Fsyncdir,
        Getlk,
        Setlk,
        Setlkw,
        Access,
        Create,
        Interrupt,
        Bmap,
        Destroy,
        Ioctl,
        Poll,
        NotifyReply,
        BatchForget,
        Fallocate,
        Readdirplus,
        Rename2,
        Lseek,
        CopyFileRange,
        Setupmapping,
        Removemapping,
        Syncfs,
        Tmpfile,
        Statx,
    ];

    /// The opcode of a request header, if vfsd knows it.
    pub fn of(op: u32) -> Option<Opcode> {
        Opcode::try_from(op).ok()
    }

    /// Its name in the kernel's `enum fuse_opcode` (without `FUSE_`), who serves it,
    /// and why vfsd does when it does.
    pub fn about(self) -> (&'static str, Side, &'static str) {
        const EXT: &str = "its extensions passed as a parameter (create.rs)";
        const LOCKS: &str = "host OFD/flock locks (locks.rs)";
        match self {
            Lookup => ("LOOKUP", Crate, ""),
            Forget => ("FORGET", Crate, ""),
            Getattr => ("GETATTR", Crate, ""),
            Setattr => ("SETATTR", Crate, ""),
            Readlink => ("READLINK", Crate, ""),
            Symlink => ("SYMLINK", Vfsd, EXT),
            Mknod => ("MKNOD", Vfsd, EXT),
            Mkdir => ("MKDIR", Vfsd, EXT),
            Unlink => ("UNLINK", Crate, ""),
            Rmdir => ("RMDIR", Crate, ""),
            Rename => ("RENAME", Crate, ""),
            Link => ("LINK", Crate, ""),
            Open => ("OPEN", Crate, ""),
            Read => (
                "READ",
                Crate,
                "the usual shape on the queue thread (fast_read.rs)",
            ),
            Write => ("WRITE", Vfsd, "data straight from guest memory (write.rs)"),
            Statfs => ("STATFS", Crate, ""),
            Release => ("RELEASE", Crate, ""),
            Fsync => ("FSYNC", Crate, ""),
            Setxattr => ("SETXATTR", Crate, "vfsd with SETXATTR_EXT (xattr.rs)"),
            Getxattr => ("GETXATTR", Crate, ""),
            Listxattr => ("LISTXATTR", Crate, ""),
            Removexattr => ("REMOVEXATTR", Crate, ""),
            Flush => ("FLUSH", Crate, ""),
            Init => ("INIT", Vfsd, "64-bit flags, protocol 7.40 (init.rs)"),
            Opendir => ("OPENDIR", Crate, ""),
            Readdir => ("READDIR", Crate, ""),
            Releasedir => ("RELEASEDIR", Crate, ""),
            Fsyncdir => ("FSYNCDIR", Crate, ""),
            Getlk => ("GETLK", Vfsd, LOCKS),
            Setlk => ("SETLK", Vfsd, LOCKS),
            Setlkw => (
                "SETLKW",
                Vfsd,
                "waits on a waiter thread, not a worker (locks.rs)",
            ),
            Access => ("ACCESS", Crate, ""),
            Create => ("CREATE", Vfsd, EXT),
            Interrupt => ("INTERRUPT", Vfsd, "cancels a waiting SETLKW (locks.rs)"),
            Bmap => ("BMAP", Crate, ""),
            Destroy => (
                "DESTROY",
                Vfsd,
                "the crate reports its reply as 0 bytes long",
            ),
            Ioctl => ("IOCTL", Vfsd, "reply data made per request (create.rs)"),
            Poll => ("POLL", Crate, ""),
            NotifyReply => (
                "NOTIFY_REPLY",
                Vfsd,
                "takes no reply (the crate writes one)",
            ),
            BatchForget => ("BATCH_FORGET", Crate, ""),
            Fallocate => ("FALLOCATE", Crate, ""),
            Readdirplus => ("READDIRPLUS", Crate, ""),
            Rename2 => ("RENAME2", Crate, ""),
            Lseek => ("LSEEK", Crate, ""),
            CopyFileRange => ("COPY_FILE_RANGE", Vfsd, "newer than the crate's ABI"),
            Setupmapping => ("SETUPMAPPING", Enosys, "no DAX window"),
            Removemapping => ("REMOVEMAPPING", Enosys, "no DAX window"),
            Syncfs => ("SYNCFS", Vfsd, "newer than the crate's ABI"),
            Tmpfile => ("TMPFILE", Vfsd, "newer than the crate's ABI (newer.rs)"),
            Statx => ("STATX", Vfsd, "newer than the crate's ABI (newer.rs)"),
        }
    }

    pub fn name(self) -> &'static str {
        self.about().0
    }

    pub fn side(self) -> Side {
        self.about().1
    }

    /// Never answered (FUSE spec).
    pub fn takes_no_reply(self) -> bool {
        matches!(self, Forget | BatchForget | Interrupt | NotifyReply)
    }

    /// Served with one or two quick host calls: a queue thread may serve it itself when
    /// nothing else is in flight on its queue (`FuseServer::is_short`). Not OPEN and
    /// CREATE: a host lease holds an open for up to fs.lease-break-time (45 s), and the
    /// queue would wait with it; nor what may wait long by design (FSYNC, FALLOCATE,
    /// locks, COPY_FILE_RANGE, SETATTR's truncate).
    pub fn is_short(self) -> bool {
        matches!(
            self,
            Lookup
                | Getattr
                | Read
                | Write
                | Release
                | Getxattr
                | Opendir
                | Readdir
                | Releasedir
                | Access
                | Readdirplus
                | Statx
        )
    }
}

/// The opcode's name, or "unknown" for a number vfsd doesn't know.
pub fn name(op: u32) -> &'static str {
    Opcode::of(op).map_or("unknown", Opcode::name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_is_listed_once_and_converts_back() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(Opcode::of(*op as u32), Some(*op));
            assert!(Opcode::ALL[..i].iter().all(|o| o != op), "{op:?} twice");
        }
        let known = (0..=u16::MAX as u32).filter(|&n| Opcode::of(n).is_some());
        assert_eq!(known.count(), Opcode::ALL.len());
    }

    #[test]
    fn vfsd_serves_what_the_crate_does_not_know() {
        // fuse-backend-rs 0.14's Opcode enum stops at LSEEK (46), and has no 7 or 19.
        for op in Opcode::ALL {
            if op as u32 > 46 {
                assert_ne!(op.side(), Crate, "{} is newer than the crate", op.name());
            }
        }
        for n in [0, 7, 19, 53, 4096, u32::MAX] {
            assert_eq!(Opcode::of(n), None);
        }
    }

    #[test]
    fn short_opcodes_exclude_those_that_may_wait() {
        assert!(Write.is_short() && !Fsync.is_short());
        assert!(
            !Open.is_short() && !Create.is_short(),
            "a lease may hold them"
        );
        assert!(!Setlkw.is_short() && !Fallocate.is_short() && !Setattr.is_short());
    }

    #[test]
    fn names_are_the_kernels() {
        assert_eq!(CopyFileRange.name(), "COPY_FILE_RANGE");
        assert_eq!(Rename2.name(), "RENAME2");
        assert_eq!(name(7), "unknown");
    }
}
