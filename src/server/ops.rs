//! The opcodes vfsd decodes for the passthrough filesystem's `FileSystem` methods: the
//! namespace, attributes, open/release, xattrs and the rest that need nothing but their
//! arguments. Each takes the request's header and body (the bytes after the header, its
//! extensions cut off) and gives the reply's payload, or an errno; READ, READDIR and
//! READDIRPLUS write their data straight into the chain's buffers (`read`, `readdir`).
//! The ABI structs and their conversions are fuse-backend-rs's; the decoding is vfsd's,
//! and a short or malformed body is EINVAL, as the crate answered it.

use std::ffi::CStr;
use std::io::{self, Write};
use std::mem::size_of;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{
    AccessIn, AttrOut, BatchForgetIn, BmapIn, BmapOut, Dirent, EntryOut, FallocateIn, FlushIn,
    ForgetIn, ForgetOne, FsyncIn, GetattrIn, GetxattrIn, GetxattrOut, InHeader, Kstatfs, LinkIn,
    LseekIn, LseekOut, OpenIn, OpenOut, OutHeader, PollIn, PollOut, ReadIn, ReleaseIn, Rename2In,
    RenameIn, SetattrIn, SetattrValid, SetxattrIn, FATTR_FH, GETATTR_FH, READ_LOCKOWNER,
    RELEASE_FLOCK_UNLOCK, RELEASE_FLUSH,
};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, GetxattrReply, ListxattrReply, ZeroCopyWriter,
};
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;
use smallvec::SmallVec;
use vm_memory::{Address, ByteValued, GuestAddress, GuestMemory};

use super::request::decode;
use super::{GuestMem, Opcode, Outcome};
use crate::passthrough::{OpenWait, PassthroughFs};

fn inval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// The arguments `T` at the start of `body`, and what follows them.
fn split<T: ByteValued + Default>(body: &[u8]) -> io::Result<(T, &[u8])> {
    let a = decode::<T>(body).ok_or_else(inval)?;
    Ok((a, &body[size_of::<T>()..]))
}

fn args<T: ByteValued + Default>(body: &[u8]) -> io::Result<T> {
    decode::<T>(body).ok_or_else(inval)
}

/// A NUL-terminated name at the start of `b` (anything after the first NUL is ignored).
fn name(b: &[u8]) -> io::Result<&CStr> {
    CStr::from_bytes_until_nul(b).map_err(|_| inval())
}

/// Two NUL-terminated names, one after the other (RENAME, SYMLINK).
fn two_names(b: &[u8]) -> io::Result<(&CStr, &CStr)> {
    let first = name(b)?;
    let rest = &b[first.to_bytes_with_nul().len()..];
    if rest.is_empty() {
        return Err(inval());
    }
    Ok((first, name(rest)?))
}

fn none() -> Vec<u8> {
    Vec::new()
}

fn entry(e: Entry) -> Vec<u8> {
    EntryOut::from(e).as_slice().to_vec()
}

/// A LOOKUP's "no such name" that the guest may cache for `timeout` (node id 0; a bare
/// ENOENT is never cached, so every lookup of a missing name would come back).
fn negative_entry(timeout: Duration) -> Vec<u8> {
    EntryOut {
        entry_valid: timeout.as_secs(),
        entry_valid_nsec: timeout.subsec_nanos(),
        ..Default::default()
    }
    .as_slice()
    .to_vec()
}

fn attr((st, timeout): (libc::stat64, Duration)) -> Vec<u8> {
    AttrOut {
        attr_valid: timeout.as_secs(),
        attr_valid_nsec: timeout.subsec_nanos(),
        dummy: 0,
        attr: st.into(),
    }
    .as_slice()
    .to_vec()
}

fn xattr_count(size: u32) -> Vec<u8> {
    GetxattrOut { size, padding: 0 }.as_slice().to_vec()
}

/// Serves `op` (one of those that `handles` says are here but READ, READDIR and
/// READDIRPLUS) from its header and body.
/// OPEN, which under `OpenWait::Never` fails with `nowait::would_wait()` rather than wait
/// for a host lease break.
pub fn open(
    fs: &PassthroughFs,
    hdr: &InHeader,
    body: &[u8],
    wait: OpenWait,
) -> io::Result<Vec<u8>> {
    let a: OpenIn = args(body)?;
    let (fh, opts) = fs.open_file(&Context::from(hdr), hdr.nodeid, a.flags, a.fuse_flags, wait)?;
    Ok(OpenOut {
        fh,
        open_flags: opts.bits(),
        passthrough: 0,
    }
    .as_slice()
    .to_vec())
}

pub fn serve(fs: &PassthroughFs, op: Opcode, hdr: &InHeader, body: &[u8]) -> Outcome {
    let ctx = Context::from(hdr);
    let ctx = &ctx;
    let node = hdr.nodeid;
    let r = || -> io::Result<Vec<u8>> {
        Ok(match op {
            Opcode::Lookup => match fs.lookup(ctx, node, name(body)?) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match fs.negative_timeout() {
                    t if t.is_zero() => return Err(e),
                    t => negative_entry(t),
                },
                r => entry(r?),
            },
            Opcode::Getattr => {
                let a: GetattrIn = args(body)?;
                let fh = (a.flags & GETATTR_FH != 0).then_some(a.fh);
                attr(fs.getattr(ctx, node, fh)?)
            }
            Opcode::Setattr => {
                let a: SetattrIn = args(body)?;
                let fh = (a.valid & FATTR_FH != 0).then_some(a.fh);
                let valid = SetattrValid::from_bits_truncate(a.valid);
                attr(fs.setattr(ctx, node, a.into(), fh, valid)?)
            }
            Opcode::Readlink => fs.readlink(ctx, node)?,
            Opcode::Unlink => {
                fs.unlink(ctx, node, name(body)?)?;
                none()
            }
            Opcode::Rmdir => {
                fs.rmdir(ctx, node, name(body)?)?;
                none()
            }
            Opcode::Rename => {
                let (a, names): (RenameIn, _) = split(body)?;
                let (old, new) = two_names(names)?;
                fs.rename(ctx, node, old, a.newdir, new, 0)?;
                none()
            }
            Opcode::Rename2 => {
                let (a, names): (Rename2In, _) = split(body)?;
                let (old, new) = two_names(names)?;
                let flags = a.flags
                    & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE | libc::RENAME_WHITEOUT);
                fs.rename(ctx, node, old, a.newdir, new, flags)?;
                none()
            }
            Opcode::Link => {
                let (a, n): (LinkIn, _) = split(body)?;
                entry(fs.link(ctx, a.oldnodeid, node, name(n)?)?)
            }
            Opcode::Opendir => {
                let a: OpenIn = args(body)?;
                let (fh, opts) = fs.opendir(ctx, node, a.flags)?;
                OpenOut {
                    fh: fh.unwrap_or(0),
                    open_flags: opts.bits(),
                    passthrough: 0,
                }
                .as_slice()
                .to_vec()
            }
            Opcode::Statfs => Kstatfs::from(fs.statfs(ctx, node)?).as_slice().to_vec(),
            Opcode::Release => {
                let a: ReleaseIn = args(body)?;
                let flush = a.release_flags & RELEASE_FLUSH != 0;
                let flock = a.release_flags & RELEASE_FLOCK_UNLOCK != 0;
                let owner = (flush || flock).then_some(a.lock_owner);
                fs.release(ctx, node, a.flags, a.fh, flush, flock, owner)?;
                none()
            }
            Opcode::Releasedir => {
                let a: ReleaseIn = args(body)?;
                fs.releasedir(ctx, node, a.flags, a.fh)?;
                none()
            }
            Opcode::Fsync | Opcode::Fsyncdir => {
                let a: FsyncIn = args(body)?;
                let datasync = a.fsync_flags & 1 != 0;
                if op == Opcode::Fsync {
                    fs.fsync(ctx, node, datasync, a.fh)?;
                } else {
                    fs.fsyncdir(ctx, node, datasync, a.fh)?;
                }
                none()
            }
            Opcode::Setxattr => {
                // The extended form (SETXATTR_EXT) is `xattr`'s.
                let (a, rest): (SetxattrIn, _) = split(body)?;
                let n = name(rest)?;
                let value = &rest[n.to_bytes_with_nul().len()..];
                if a.size as usize != value.len() {
                    return Err(inval());
                }
                fs.setxattr(ctx, node, n, value, a.flags)?;
                none()
            }
            Opcode::Getxattr => {
                let (a, n): (GetxattrIn, _) = split(body)?;
                match fs.getxattr(ctx, node, name(n)?, a.size)? {
                    GetxattrReply::Value(v) => v,
                    GetxattrReply::Count(c) => xattr_count(c),
                }
            }
            Opcode::Listxattr => {
                let a: GetxattrIn = args(body)?;
                match fs.listxattr(ctx, node, a.size)? {
                    ListxattrReply::Names(v) => v,
                    ListxattrReply::Count(c) => xattr_count(c),
                }
            }
            Opcode::Removexattr => {
                fs.removexattr(ctx, node, name(body)?)?;
                none()
            }
            Opcode::Flush => {
                let a: FlushIn = args(body)?;
                fs.flush(ctx, node, a.fh, a.lock_owner)?;
                none()
            }
            Opcode::Access => {
                let a: AccessIn = args(body)?;
                fs.access(ctx, node, a.mask)?;
                none()
            }
            Opcode::Bmap => {
                let a: BmapIn = args(body)?;
                let block = fs.bmap(ctx, node, a.block, a.blocksize)?;
                BmapOut { block }.as_slice().to_vec()
            }
            Opcode::Poll => {
                let a: PollIn = args(body)?;
                let revents = fs.poll(ctx, node, a.fh, a.kh, a.flags, a.events)?;
                PollOut {
                    revents,
                    padding: 0,
                }
                .as_slice()
                .to_vec()
            }
            Opcode::Fallocate => {
                let a: FallocateIn = args(body)?;
                fs.fallocate(ctx, node, a.fh, a.mode, a.offset, a.length)?;
                none()
            }
            Opcode::Lseek => {
                let a: LseekIn = args(body)?;
                let offset = fs.lseek(ctx, node, a.fh, a.offset, a.whence)?;
                LseekOut { offset }.as_slice().to_vec()
            }
            _ => return Err(io::Error::from_raw_os_error(libc::ENOSYS)),
        })
    };
    match op {
        Opcode::Forget => {
            if let Some(a) = decode::<ForgetIn>(body) {
                fs.forget(ctx, node, a.nlookup);
            }
            Outcome::NoReply { malformed: false }
        }
        Opcode::BatchForget => {
            if let Ok((a, items)) = split::<BatchForgetIn>(body) {
                // Only as many as the body holds: a count past it is a malformed request.
                let n = a.count as usize;
                if items.len() / size_of::<ForgetOne>() >= n {
                    let forgets = items
                        .chunks_exact(size_of::<ForgetOne>())
                        .take(n)
                        .filter_map(decode::<ForgetOne>)
                        .map(|f| (f.nodeid, f.nlookup))
                        .collect();
                    fs.batch_forget(ctx, forgets);
                }
            }
            Outcome::NoReply { malformed: false }
        }
        _ => Outcome::Reply(r()),
    }
}

/// Where READ's data and READDIR's entries go: a chain's writable buffers after the reply
/// header, as the request's one reading of its descriptors found them
/// (`chain::Descs::writable_bufs`, at most `chain::MAX_DESCS`: at the pop, or when a
/// parked request is served), the reading the effect check used too. The chain is not
/// walked again, so a guest that rewrote its descriptor table since has no say in where
/// the reply goes.
struct ReplyData<'a> {
    mem: &'a GuestMem,
    /// The room's pieces (guest address, length), in order, each in one memory region
    /// (checked by `new`); those before `next` are filled, and `next` itself from where
    /// its entry now starts.
    left: SmallVec<[(GuestAddress, usize); 8]>,
    next: usize,
    written: usize,
}

impl<'a> ReplyData<'a> {
    /// The room in `bufs` after a reply header; EINVAL if any buffer lies outside guest
    /// memory or across two of its regions, or there is no room for the header.
    fn new(mem: &'a GuestMem, bufs: &[(GuestAddress, u32)]) -> io::Result<ReplyData<'a>> {
        let mut header = size_of::<OutHeader>();
        let mut left = SmallVec::new();
        for &(addr, len) in bufs {
            let len = len as usize;
            if len == 0 {
                continue;
            }
            mem.get_slice(addr, len).map_err(|_| inval())?;
            let skip = header.min(len);
            header -= skip;
            if skip < len {
                // Within the buffer just checked.
                left.push((addr.unchecked_add(skip as u64), len - skip));
            }
        }
        if header > 0 {
            return Err(inval());
        }
        Ok(ReplyData {
            mem,
            left,
            next: 0,
            written: 0,
        })
    }

    fn available_bytes(&self) -> usize {
        self.left[self.next..].iter().map(|&(_, len)| len).sum()
    }

    fn bytes_written(&self) -> usize {
        self.written
    }

    /// The first `count` bytes of the room, as pieces; an error if there are fewer.
    fn room_for(&self, count: usize) -> io::Result<SmallVec<[(GuestAddress, usize); 8]>> {
        let mut want = count;
        let mut out = SmallVec::new();
        for &(addr, len) in &self.left[self.next..] {
            if want == 0 {
                break;
            }
            let n = len.min(want);
            out.push((addr, n));
            want -= n;
        }
        if want > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{count} bytes for {} of room", self.available_bytes()),
            ));
        }
        Ok(out)
    }

    /// Marks the first `n` bytes of the room written.
    fn consume(&mut self, mut n: usize) {
        self.written += n;
        while n > 0 {
            let (addr, len) = &mut self.left[self.next];
            if n < *len {
                *addr = addr.unchecked_add(n as u64);
                *len -= n;
                return;
            }
            n -= *len;
            self.next += 1;
        }
    }
}

impl ZeroCopyWriter for ReplyData<'_> {
    fn write_from(
        &mut self,
        f: &mut dyn FileReadWriteVolatile,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let pieces = self.room_for(count)?;
        let slices = pieces
            .iter()
            .map(|&(addr, len)| self.mem.get_slice(addr, len).map_err(|_| inval()))
            .collect::<io::Result<SmallVec<[_; 8]>>>()?;
        let files: SmallVec<[FileVolatileSlice; 8]> = slices
            .iter()
            .map(FileVolatileSlice::from_volatile_slice)
            .collect();
        let n = f.read_vectored_at_volatile(&files, off)?;
        // The file wrote past vm-memory, which logs its own writes only.
        let mut logged = n;
        for &(addr, len) in &pieces {
            let len = len.min(logged);
            if len == 0 {
                break;
            }
            super::log_guest_write(self.mem, addr, len);
            logged -= len;
        }
        self.consume(n);
        Ok(n)
    }

    fn available_bytes(&self) -> usize {
        ReplyData::available_bytes(self)
    }
}

impl io::Write for ReplyData<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        for (addr, len) in self.room_for(buf.len())? {
            super::chain::write_guest(self.mem, &buf[done..done + len], addr)
                .map_err(|e| io::Error::other(e.to_string()))?;
            done += len;
        }
        self.consume(done);
        Ok(done)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes the header of a reply whose `len` data bytes are in its buffers already; gives
/// the used length.
fn finish(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    len: usize,
) -> io::Result<u32> {
    let out = OutHeader {
        len: (size_of::<OutHeader>() + len) as u32,
        error: 0,
        unique: hdr.unique,
    };
    super::write_into(mem, bufs, &[out.as_slice()])?;
    Ok(out.len)
}

/// READ (the general path: the queue thread's no-wait READ is `fast_read`). Ok: the used
/// length (the reply written); Err: the errno to answer with.
pub fn read(
    fs: &PassthroughFs,
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    body: &[u8],
) -> io::Result<u32> {
    let a: ReadIn = args(body)?;
    let mut data = ReplyData::new(mem, bufs)?;
    let owner = (a.read_flags & READ_LOCKOWNER != 0).then_some(a.lock_owner);
    let n = fs.read(
        &Context::from(hdr),
        hdr.nodeid,
        a.fh,
        &mut data,
        a.size,
        a.offset,
        owner,
        a.flags,
    )?;
    finish(mem, bufs, hdr, n)
}

/// One directory entry (with its node's entry for READDIRPLUS) into the reply, padded to
/// 8 bytes; 0 when it doesn't fit in `max` (the filesystem stops there).
fn add_dirent(
    w: &mut ReplyData<'_>,
    max: usize,
    d: DirEntry,
    e: Option<Entry>,
) -> io::Result<usize> {
    let overflow = || io::Error::from_raw_os_error(libc::EOVERFLOW);
    let namelen = u32::try_from(d.name.len()).map_err(|_| overflow())?;
    let len = size_of::<Dirent>() + d.name.len();
    let padded = len.checked_next_multiple_of(8).ok_or_else(overflow)?;
    let total = padded + e.map_or(0, |_| size_of::<EntryOut>());
    if max.saturating_sub(w.bytes_written()) < total {
        return Ok(0);
    }
    if let Some(e) = e {
        w.write_all(EntryOut::from(e).as_slice())?;
    }
    let dirent = Dirent {
        ino: d.ino,
        off: d.offset,
        namelen,
        type_: d.type_,
    };
    w.write_all(dirent.as_slice())?;
    w.write_all(d.name)?;
    w.write_all(&[0u8; 8][..padded - len])?;
    Ok(total)
}

/// READDIR and READDIRPLUS. Ok: the used length (the reply written); Err: the errno to
/// answer with.
pub fn readdir(
    fs: &PassthroughFs,
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    body: &[u8],
    plus: bool,
) -> io::Result<u32> {
    let a: ReadIn = args(body)?;
    let mut data = ReplyData::new(mem, bufs)?;
    // As the crate's writer counted it: the header's room too.
    let room = size_of::<OutHeader>() + data.available_bytes();
    if room < a.size as usize {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    // Never an entry cut off by the end of the buffers.
    let max = (a.size as usize).min(data.available_bytes());
    let ctx = Context::from(hdr);
    if plus {
        fs.readdirplus(&ctx, hdr.nodeid, a.fh, a.size, a.offset, &mut |d, e| {
            add_dirent(&mut data, max, d, Some(e))
        })?;
    } else {
        fs.readdir(&ctx, hdr.nodeid, a.fh, a.size, a.offset, &mut |d| {
            add_dirent(&mut data, max, d, None)
        })?;
    }
    let n = data.bytes_written();
    finish(mem, bufs, hdr, n)
}
