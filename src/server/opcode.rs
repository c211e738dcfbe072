//! The FUSE opcodes vfsd knows (the kernel's `enum fuse_opcode`, up to STATX), and what
//! the server needs to know of each before it serves it: the one list
//! `FuseServer::dispatch` matches on.

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

use Opcode::*;

impl Opcode {
    /// Every opcode, for the tests' checks of the list.
    #[cfg(test)]
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

    /// Its name in the kernel's `enum fuse_opcode` (without `FUSE_`), and where it is
    /// served.
    pub fn about(self) -> (&'static str, &'static str) {
        const ENTRY: &str = "entry.rs";
        const EXT: &str = "entry.rs, its extensions passed as a parameter";
        const DATA: &str = "data.rs";
        const DIR: &str = "dir.rs";
        const XATTR: &str = "xattr.rs";
        const LOCKS: &str = "locks.rs, host OFD/flock locks";
        match self {
            Lookup => ("LOOKUP", ENTRY),
            Forget => ("FORGET", ENTRY),
            Getattr => ("GETATTR", ENTRY),
            Setattr => ("SETATTR", ENTRY),
            Readlink => ("READLINK", ENTRY),
            Symlink => ("SYMLINK", EXT),
            Mknod => ("MKNOD", EXT),
            Mkdir => ("MKDIR", EXT),
            Unlink => ("UNLINK", ENTRY),
            Rmdir => ("RMDIR", ENTRY),
            Rename => ("RENAME", ENTRY),
            Link => ("LINK", ENTRY),
            Open => ("OPEN", DATA),
            Read => ("READ", "data.rs, on the queue thread if it need not block"),
            Write => ("WRITE", "data.rs, data straight from guest memory"),
            Statfs => ("STATFS", ENTRY),
            Release => ("RELEASE", DATA),
            Fsync => ("FSYNC", DATA),
            Setxattr => ("SETXATTR", "xattr.rs, with SETXATTR_EXT too"),
            Getxattr => ("GETXATTR", XATTR),
            Listxattr => ("LISTXATTR", XATTR),
            Removexattr => ("REMOVEXATTR", XATTR),
            Flush => ("FLUSH", DATA),
            Init => (
                "INIT",
                "session.rs and wire/init.rs, 64-bit flags, protocol 7.40",
            ),
            Opendir => ("OPENDIR", DIR),
            Readdir => ("READDIR", DIR),
            Releasedir => ("RELEASEDIR", DIR),
            Fsyncdir => ("FSYNCDIR", DIR),
            Getlk => ("GETLK", LOCKS),
            Setlk => ("SETLK", LOCKS),
            Setlkw => ("SETLKW", "locks.rs, waits on a waiter thread of its own"),
            Access => ("ACCESS", ENTRY),
            Create => ("CREATE", EXT),
            Interrupt => ("INTERRUPT", "locks.rs, cancels a waiting SETLKW"),
            Bmap => ("BMAP", DATA),
            Destroy => ("DESTROY", "session.rs, ends the session"),
            Ioctl => ("IOCTL", "data.rs, reply data made per request"),
            Poll => ("POLL", DATA),
            NotifyReply => (
                "NOTIFY_REPLY",
                "session.rs, takes no reply (vfsd sends no retrieve)",
            ),
            BatchForget => ("BATCH_FORGET", ENTRY),
            Fallocate => ("FALLOCATE", DATA),
            Readdirplus => ("READDIRPLUS", DIR),
            Rename2 => ("RENAME2", ENTRY),
            Lseek => ("LSEEK", DATA),
            CopyFileRange => (
                "COPY_FILE_RANGE",
                "data.rs, with the newer ABI's 64-bit flags",
            ),
            Setupmapping => ("SETUPMAPPING", "data.rs, ENOSYS: no DAX window"),
            Removemapping => ("REMOVEMAPPING", "data.rs, ENOSYS: no DAX window"),
            Syncfs => ("SYNCFS", "session.rs, newer than the crate's ABI"),
            Tmpfile => ("TMPFILE", "entry.rs, newer than the crate's ABI"),
            Statx => ("STATX", "entry.rs, newer than the crate's ABI"),
        }
    }

    pub fn name(self) -> &'static str {
        self.about().0
    }

    pub fn served_in(self) -> &'static str {
        self.about().1
    }

    /// The reply payload size of an opcode that changes something (a file, a node's
    /// lookup count, a handle) before it replies: its reply's room is checked before the
    /// filesystem is called.
    pub fn effect_reply_size(self) -> Option<usize> {
        use fuse_backend_rs::abi::fuse_abi::{AttrOut, EntryOut, OpenOut, WriteOut};
        use std::mem::size_of;
        Some(match self {
            Lookup | Symlink | Mknod | Mkdir | Link => size_of::<EntryOut>(),
            Create | Tmpfile => size_of::<EntryOut>() + size_of::<OpenOut>(),
            Open | Opendir => size_of::<OpenOut>(),
            Write | CopyFileRange => size_of::<WriteOut>(),
            Setattr => size_of::<AttrOut>(),
            _ => return None,
        })
    }

    /// Never answered (FUSE spec).
    pub fn takes_no_reply(self) -> bool {
        matches!(self, Forget | BatchForget | Interrupt | NotifyReply)
    }

    /// Served with one or two quick host calls: a queue thread may serve it itself when
    /// nothing else is in flight on its queue (`device::route`). The namespace and
    /// attribute changes are here too (untar, `cp -a` and `rm -rf` send one at a time,
    /// and a quarter of their requests paid the hand-off to a worker): SETATTR's truncate
    /// waits at most on the file's writes in flight, and a FLUSH on the host's close.
    /// Not OPEN and CREATE: a host lease holds an open for up to fs.lease-break-time
    /// (45 s), so they are tried without waiting (`opens_without_waiting`); nor what may
    /// wait long by design (FSYNC, FALLOCATE, locks, COPY_FILE_RANGE: `device::route` serves
    /// a lone one of at most `SHORT_COPY` bytes on the queue thread, by its length).
    pub fn is_short(self) -> bool {
        self.is_quick_metadata()
            || matches!(
                self,
                Read | Write
                    | Release
                    | Setattr
                    | Symlink
                    | Mknod
                    | Mkdir
                    | Unlink
                    | Rmdir
                    | Rename
                    | Rename2
                    | Link
                    | Setxattr
                    | Removexattr
                    | Flush
                    | Lseek
            )
    }

    /// Whether the opcode may open a file, which waits only for a host lease break: OPEN
    /// and CREATE, and under `--no-open` a READ, WRITE, LSEEK, truncating SETATTR or
    /// COPY_FILE_RANGE that needs a node's fd (the host filesystem's node handles). A queue thread
    /// tries it with O_NONBLOCK and hands it to the pool if it would wait
    /// (`FuseServer::handle_unless_it_waits`); each takes its fd before it changes anything.
    pub fn opens_without_waiting(self) -> bool {
        matches!(
            self,
            Open | Create | Read | Write | Lseek | Setattr | CopyFileRange
        )
    }

    /// Whether the opcode is a short request that only reads metadata or directories
    /// (and OPENDIR/RELEASEDIR around them): what a tree walk sends, several at a time
    /// (git status's parallel lstat, find, ls -lR). A queue thread serves these itself
    /// even beside other requests in flight (`device::route`): a hand-off costs more
    /// than they do. Not READ and WRITE: parallel data goes to the pool; nor what
    /// changes the tree, which a guest's parallel work may send beside its CREATEs.
    pub fn is_quick_metadata(self) -> bool {
        matches!(
            self,
            Lookup
                | Getattr
                | Readlink
                | Statfs
                | Getxattr
                | Listxattr
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
    fn numbers_the_kernel_never_sends_are_unknown() {
        for n in [0, 7, 19, 53, 4096, u32::MAX] {
            assert_eq!(Opcode::of(n), None);
        }
        assert!(Opcode::ALL.iter().all(|o| !o.served_in().is_empty()));
    }

    #[test]
    fn short_opcodes_exclude_those_that_may_wait() {
        assert!(Write.is_short() && !Fsync.is_short());
        assert!(
            !Open.is_short() && !Create.is_short(),
            "a lease may hold them"
        );
        assert!(!Setlkw.is_short() && !Fallocate.is_short() && !CopyFileRange.is_short());
        assert!(Setattr.is_short() && Unlink.is_short() && Flush.is_short());
    }

    #[test]
    fn quick_metadata_is_short_and_leaves_the_data_path_and_release_out() {
        assert!(Lookup.is_quick_metadata() && Getattr.is_quick_metadata());
        assert!(Statx.is_quick_metadata() && Readdirplus.is_quick_metadata());
        assert!(!Read.is_quick_metadata() && !Write.is_quick_metadata());
        assert!(
            !Unlink.is_quick_metadata() && !Setattr.is_quick_metadata(),
            "changes to the tree go to the pool beside others in flight"
        );
        assert!(
            !Release.is_quick_metadata(),
            "a close may flush on a network share"
        );
        for op in Opcode::ALL {
            assert!(!op.is_quick_metadata() || op.is_short(), "{op:?}");
        }
    }

    #[test]
    fn names_are_the_kernels() {
        assert_eq!(CopyFileRange.name(), "COPY_FILE_RANGE");
        assert_eq!(Rename2.name(), "RENAME2");
        assert_eq!(name(7), "unknown");
    }
}
