//! The FUSE wire format as the guest driver speaks it: opcodes and flags, requests laid
//! out with their header, replies checked against theirs, directory entries, and the
//! errors a call can end in.

use std::ffi::CStr;
use std::fmt;
use std::io;

use fuse_backend_rs::abi::fuse_abi::*;
use vm_memory::ByteValued;

use crate::server::Opcode;

pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_GETLK: u32 = 31;
pub const FUSE_SETLK: u32 = 32;
pub const FUSE_SETLKW: u32 = 33;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_INTERRUPT: u32 = 36;
pub const INIT_POSIX_LOCKS: u32 = 1 << 1;
pub const INIT_FLOCK_LOCKS: u32 = 1 << 10;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_LSEEK: u32 = 46;
pub const FUSE_COPY_FILE_RANGE: u32 = Opcode::CopyFileRange as u32;
pub const FUSE_SYNCFS: u32 = Opcode::Syncfs as u32;

/// INIT flags the Linux guest offers (a subset that matters here).
pub const INIT_BIG_WRITES: u32 = 1 << 5;
pub const INIT_MAX_PAGES: u32 = 1 << 22;
pub const INIT_DO_READDIRPLUS: u32 = 1 << 13;
pub const INIT_PARALLEL_DIROPS: u32 = 1 << 18;
pub const INIT_ASYNC_DIO: u32 = 1 << 15;
pub const INIT_WRITEBACK_CACHE: u32 = 1 << 16;

pub const FOPEN_DIRECT_IO: u32 = 1;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

pub const FATTR_MODE: u32 = 1;
pub const FATTR_UID: u32 = 2;
pub const FATTR_GID: u32 = 4;
pub const FATTR_SIZE: u32 = 8;
pub const FATTR_ATIME: u32 = 16;
pub const FATTR_MTIME: u32 = 32;
pub const FATTR_FH: u32 = 64;
pub const FATTR_ATIME_NOW: u32 = 128;
pub const FATTR_MTIME_NOW: u32 = 256;
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;
/// WRITE's `write_flags`: the writer lacks CAP_FSETID (FUSE_WRITE_KILL_SUIDGID).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// OPEN/CREATE `open_flags`: an O_TRUNC open by a caller without CAP_FSETID.
pub const FUSE_OPEN_KILL_SUIDGID: u32 = 1;

#[derive(Debug)]
pub enum FuseError {
    /// The daemon answered with this errno (positive).
    Errno(i32),
    /// The transport failed (timeout, bad used length, …).
    Io(io::Error),
    /// The reply does not decode.
    Proto(String),
}

impl FuseError {
    pub fn errno(&self) -> Option<i32> {
        match self {
            FuseError::Errno(e) => Some(*e),
            _ => None,
        }
    }
}

impl fmt::Display for FuseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FuseError::Errno(e) => write!(f, "errno {e} ({})", io::Error::from_raw_os_error(*e)),
            FuseError::Io(e) => write!(f, "transport: {e}"),
            FuseError::Proto(s) => write!(f, "protocol: {s}"),
        }
    }
}

impl std::error::Error for FuseError {}

impl From<io::Error> for FuseError {
    fn from(e: io::Error) -> Self {
        FuseError::Io(e)
    }
}

pub type FResult<T> = Result<T, FuseError>;

/// A decoded reply.
#[derive(Debug)]
pub struct Reply {
    pub unique: u64,
    pub error: i32,
    pub data: Vec<u8>,
}

impl Reply {
    pub fn ok(self) -> FResult<Vec<u8>> {
        if self.error != 0 {
            Err(FuseError::Errno(-self.error))
        } else {
            Ok(self.data)
        }
    }
}

/// Decodes a `T` from the front of `b`.
pub fn decode<T: ByteValued>(b: &[u8]) -> FResult<T> {
    T::from_slice(b.get(..std::mem::size_of::<T>()).ok_or_else(|| {
        FuseError::Proto(format!(
            "reply of {} bytes, expected {}",
            b.len(),
            std::mem::size_of::<T>()
        ))
    })?)
    .copied()
    .ok_or_else(|| FuseError::Proto("misaligned".into()))
}

/// Decodes a reply that is exactly a `T`.
pub(super) fn exact<T: ByteValued>(b: Vec<u8>) -> FResult<T> {
    if b.len() != std::mem::size_of::<T>() {
        return Err(FuseError::Proto(format!(
            "reply of {} bytes, expected {}",
            b.len(),
            std::mem::size_of::<T>()
        )));
    }
    decode(&b)
}

pub(super) fn cstr(name: &str) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

/// One directory entry from READDIR/READDIRPLUS.
#[derive(Debug, Clone)]
pub struct DirEnt {
    pub ino: u64,
    pub off: u64,
    pub typ: u32,
    pub name: Vec<u8>,
    pub entry: Option<EntryOut>,
}

/// A lock request: inclusive byte range (end `i64::MAX` runs to EOF), F_RDLCK/F_WRLCK/
/// F_UNLCK, the guest pid, and whether it is a whole-file flock.
#[derive(Clone, Copy, Debug)]
pub struct Lock {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
    pub flock: bool,
}

impl Lock {
    pub fn range(start: u64, end: u64, typ: i32, pid: u32) -> Lock {
        Lock {
            start,
            end,
            typ,
            pid,
            flock: false,
        }
    }

    pub fn flock(typ: i32) -> Lock {
        Lock {
            start: 0,
            end: i64::MAX as u64,
            typ,
            pid: 1,
            flock: true,
        }
    }
}

/// The guest caller a request is sent for (the header's uid, gid and pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    pub const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };
}

/// A FUSE request as the guest driver lays it out: an `InHeader` whose `len` covers `parts`,
/// then `parts` (sent by root, pid 1).
pub fn request_bytes(op: u32, nodeid: u64, unique: u64, parts: &[&[u8]]) -> Vec<u8> {
    request_bytes_as(Caller::ROOT, op, nodeid, unique, parts)
}

/// As `request_bytes`, sent by `caller`.
pub fn request_bytes_as(
    caller: Caller,
    op: u32,
    nodeid: u64,
    unique: u64,
    parts: &[&[u8]],
) -> Vec<u8> {
    let body: usize = parts.iter().map(|p| p.len()).sum();
    let hdr = InHeader {
        len: (std::mem::size_of::<InHeader>() + body) as u32,
        opcode: op,
        unique,
        nodeid,
        uid: caller.uid,
        gid: caller.gid,
        pid: caller.pid,
        padding: 0,
    };
    let mut v = hdr.as_slice().to_vec();
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Checks a reply's header, read from the first bytes `head` of a reply the used ring
/// says is `len` bytes long, against the request's `unique`; gives the error field.
pub fn check_head(head: &[u8], len: usize, unique: u64) -> FResult<i32> {
    let h: OutHeader = decode(head)?;
    check_header(&h, len, unique)?;
    Ok(h.error)
}

fn check_header(h: &OutHeader, len: usize, unique: u64) -> FResult<()> {
    if h.len as usize != len {
        return Err(FuseError::Proto(format!(
            "header says {} bytes, used ring says {len}",
            h.len
        )));
    }
    if h.unique != unique {
        return Err(FuseError::Proto(format!(
            "reply to {} for request {unique}",
            h.unique
        )));
    }
    if h.error > 0 || h.error < -4095 {
        return Err(FuseError::Proto(format!("bad error value {}", h.error)));
    }
    Ok(())
}

/// Checks a raw reply against its header and returns it decoded.
pub fn parse_reply(raw: &[u8], unique: u64) -> FResult<Reply> {
    let h: OutHeader = decode(raw)?;
    check_header(&h, raw.len(), unique)?;
    Ok(Reply {
        unique: h.unique,
        error: h.error,
        data: raw[std::mem::size_of::<OutHeader>()..].to_vec(),
    })
}

pub(super) fn parse_dirents(mut b: &[u8], plus: bool) -> FResult<Vec<DirEnt>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (entry, rest) = if plus {
            let e: EntryOut = decode(b)?;
            (Some(e), &b[std::mem::size_of::<EntryOut>()..])
        } else {
            (None, b)
        };
        let d: Dirent = decode(rest)?;
        let hdr = std::mem::size_of::<Dirent>();
        let name = rest
            .get(hdr..hdr + d.namelen as usize)
            .ok_or_else(|| FuseError::Proto("dirent name past the buffer".into()))?
            .to_vec();
        let reclen = (hdr + d.namelen as usize).div_ceil(8) * 8;
        let consumed = b.len() - rest.len() + reclen;
        b = b.get(consumed..).unwrap_or(&[]);
        out.push(DirEnt {
            ino: d.ino,
            off: d.off,
            typ: d.type_,
            name,
            entry,
        });
    }
    Ok(out)
}

/// A NUL-terminated name as bytes, for hand-built requests.
pub fn name_bytes(name: &CStr) -> Vec<u8> {
    name.to_bytes_with_nul().to_vec()
}

pub const FUSE_IOCTL: u32 = 39;
/// FUSE_IOCTL flags: the request is for a directory; the guest is 32-bit.
pub const FUSE_IOCTL_DIR: u32 = 1 << 4;
pub const FUSE_IOCTL_32BIT: u32 = 1 << 3;
