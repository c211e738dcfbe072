//! Open files: OPEN, READ, WRITE, FLUSH, RELEASE, FSYNC, FALLOCATE, LSEEK,
//! COPY_FILE_RANGE, IOCTL, POLL and BMAP.
//!
//! READ's data goes straight from the host file into the guest's buffers, WRITE's
//! straight from them to the host file (pwritev). A READ of the usual shape is served on
//! the queue thread if it can be without blocking (`try_handle_without_blocking`), with
//! none of the general path's machinery.

use std::ops::Deref;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use fuse_backend_rs::abi::fuse_abi::{
    BmapIn, BmapOut, CopyFileRangeIn, FallocateIn, FlushIn, FsyncIn, InHeader, IoctlIn, IoctlOut,
    LseekIn, LseekOut, OpenIn, OutHeader, PollIn, PollOut, ReadIn, ReleaseIn, WriteIn, WriteOut,
    READ_LOCKOWNER, RELEASE_FLOCK_UNLOCK, RELEASE_FLUSH, WRITE_KILL_PRIV,
};
use log::error;
use smallvec::SmallVec;
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemory};

use super::wire::codec::{args, decode, errno};
use super::wire::guest::{log_guest_write, GuestMem};
use super::wire::reply::{finish, opened, ReplyData};
use super::wire::request::{HDR_LEN, WRITE_IN_LEN};
use super::{Call, FuseServer, Opcode, Popped, Reply};
use crate::filesystem::FileSystem;

/// The crate's limit, which INIT's max_write (1 MiB) keeps the guest within.
const MAX_WRITE: usize = 1 << 20;
/// WRITE's data segments accepted: 1 MiB in separate 4 KiB pages, plus partial pages at
/// the ends.
const MAX_WRITE_SEGS: usize = MAX_WRITE / 4096 + 2;

const READ_IN_LEN: usize = HDR_LEN + std::mem::size_of::<ReadIn>();
const OUT_LEN: usize = std::mem::size_of::<OutHeader>();
/// The crate's limit; larger READs get its error reply.
const MAX_READ: usize = 1 << 20;
/// Reply segments of a READ on the queue thread: 1 MiB in separate 4 KiB pages, plus the
/// header.
const MAX_READ_SEGS: usize = MAX_READ / 4096 + 2;

fn none() -> Vec<u8> {
    Vec::new()
}

/// WRITE's and COPY_FILE_RANGE's reply.
fn write_out(n: usize) -> Vec<u8> {
    WriteOut {
        size: n as u32,
        padding: 0,
    }
    .as_slice()
    .to_vec()
}

/// What the queue thread's READ came to (`FuseServer::try_handle_without_blocking`).
enum DirectRead {
    /// Answered: the used length.
    Served(u32),
    /// It would have blocked: hand it to the pool.
    WouldBlock,
}

impl<F: FileSystem> FuseServer<F> {
    /// OPEN, which under `OpenWait::Never` fails with an error the filesystem's
    /// `is_would_wait` knows rather than wait for a host lease break.
    pub(super) fn open(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: OpenIn = args(b)?;
            let (fh, opts) = self
                .fs
                .open(&c.ctx, c.hdr.nodeid, a.flags, a.fuse_flags, c.wait)?;
            Ok(opened(fh, opts))
        })
    }

    /// READ (the general path: the queue thread's no-wait READ is
    /// `try_handle_without_blocking`), its data written straight into the chain.
    pub(super) fn read(&self, c: &Call) -> Reply {
        let b = match c.body() {
            Ok(b) => b,
            Err(e) => return Reply::Malformed(e),
        };
        Reply::written(args::<ReadIn>(b).and_then(|a| {
            let mut data = ReplyData::new(c.mem, c.bufs)?;
            let owner = (a.read_flags & READ_LOCKOWNER != 0).then_some(a.lock_owner);
            let n = self.fs.read(
                &c.ctx,
                c.hdr.nodeid,
                a.fh,
                &mut data,
                a.size,
                a.offset,
                owner,
                a.flags,
            )?;
            finish(c.mem, c.bufs, &c.hdr, n)
        }))
    }

    /// WRITE: header and arguments from the request's copy, the data straight from the
    /// guest's buffers. A request whose data is not where its arguments say is malformed.
    pub(super) fn write(&self, c: &Call) -> Reply {
        match self.write_from_guest(c) {
            Ok(r) => {
                if let Ok(out) = &r {
                    let n = u32::from_le_bytes(out[..4].try_into().unwrap());
                    self.stats
                        .bytes_written
                        .fetch_add(n.into(), Ordering::Relaxed);
                }
                Reply::Payload(r)
            }
            Err(bad) => Reply::Malformed(errno(bad)),
        }
    }

    /// Ok is the reply (an errno or a WriteOut); Err(errno) marks the request as
    /// malformed, answered with that errno.
    fn write_from_guest(&self, c: &Call) -> Result<std::io::Result<Vec<u8>>, i32> {
        let (mem, req) = (c.mem, c.req);
        let args: WriteIn = decode(&req.bytes[HDR_LEN..]).ok_or(libc::EINVAL)?;
        let size = args.size as usize;
        if size > MAX_WRITE {
            return Err(libc::EINVAL);
        }
        // The data: the readable bytes after header and arguments, `size` of them.
        // On the stack for a guest's usual WRITE (up to 32 KiB in pages, or any size in one
        // buffer).
        let mut iov: SmallVec<[libc::iovec; 8]> = SmallVec::new();
        let mut skip = WRITE_IN_LEN;
        let mut want = size;
        for d in c.descs.readable() {
            if want == 0 {
                break;
            }
            let mut len = d.len() as usize;
            let mut addr = d.addr();
            if skip > 0 {
                let s = skip.min(len);
                skip -= s;
                len -= s;
                addr = addr.checked_add(s as u64).ok_or(libc::EINVAL)?;
            }
            let take = len.min(want);
            if take == 0 {
                continue;
            }
            if iov.len() == MAX_WRITE_SEGS {
                return Err(libc::EINVAL);
            }
            let s = mem.get_slice(addr, take).map_err(|_| libc::EFAULT)?;
            // The pointer outlives its guard: GuestMem's regions stay mapped as long as
            // `mem` (held by our caller) lives; the guard only matters for Xen mappings.
            iov.push(libc::iovec {
                iov_base: s.ptr_guard().as_ptr() as *mut libc::c_void,
                iov_len: take,
            });
            want -= take;
        }
        // A write of nothing has no data to skip to (the chain may end at WriteIn).
        if want != 0 || (skip != 0 && size > 0) {
            // Fewer data bytes than the arguments promise.
            return Err(libc::EINVAL);
        }
        let hdr = req.hdr;
        // As write(2): writing nothing leaves the set-id bits alone.
        let kill = self
            .fs
            .kill_privs(
                hdr.uid,
                hdr.gid,
                Some(args.fuse_flags & WRITE_KILL_PRIV != 0),
            )
            .filter(|_| size > 0);
        // SAFETY: each iovec spans mapped guest memory (get_slice checked the bounds) that
        // stays mapped while `mem` lives, for the whole call; pwritev only reads it.
        let r = unsafe {
            self.fs
                .write_iov(hdr.nodeid, args.fh, args.offset, &iov, kill, args.flags)
        };
        Ok(r.map(write_out))
    }

    pub(super) fn flush(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: FlushIn = args(b)?;
            self.fs.flush(&c.ctx, c.hdr.nodeid, a.fh, a.lock_owner)?;
            Ok(none())
        })
    }

    pub(super) fn release(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: ReleaseIn = args(b)?;
            let flush = a.release_flags & RELEASE_FLUSH != 0;
            let flock = a.release_flags & RELEASE_FLOCK_UNLOCK != 0;
            let owner = (flush || flock).then_some(a.lock_owner);
            let node = c.hdr.nodeid;
            self.fs
                .release(&c.ctx, node, a.flags, a.fh, flush, flock, owner)?;
            Ok(none())
        })
    }

    pub(super) fn fsync(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: FsyncIn = args(b)?;
            let datasync = a.fsync_flags & 1 != 0;
            self.fs.fsync(&c.ctx, c.hdr.nodeid, datasync, a.fh)?;
            Ok(none())
        })
    }

    pub(super) fn fallocate(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: FallocateIn = args(b)?;
            let node = c.hdr.nodeid;
            self.fs
                .fallocate(&c.ctx, node, a.fh, a.mode, a.offset, a.length)?;
            Ok(none())
        })
    }

    pub(super) fn lseek(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: LseekIn = args(b)?;
            let offset = self
                .fs
                .lseek(&c.ctx, c.hdr.nodeid, a.fh, a.offset, a.whence)?;
            Ok(LseekOut { offset }.as_slice().to_vec())
        })
    }

    /// COPY_FILE_RANGE, with the newer ABI's 64-bit flags.
    pub(super) fn copy_file_range(&self, c: &Call) -> Reply {
        let hdr = &c.hdr;
        let r = args::<CopyFileRangeIn>(c.args).and_then(|a| {
            // The reply carries a u32 count; keep within it (as the kernel does).
            let len = a.len.min(u32::MAX as u64 & !0xfff);
            self.fs.copy_file_range(
                self.fs.kill_privs(hdr.uid, hdr.gid, None),
                hdr.nodeid,
                a.fh_in,
                a.offset_in,
                a.nodeid_out,
                a.fh_out,
                a.offset_out,
                len,
                a.flags,
            )
        });
        Reply::Payload(r.map(write_out))
    }

    /// IOCTL: `IoctlIn`, then `in_size` bytes of input; the reply is `IoctlOut` and the
    /// out data. Input shorter than `in_size` says is ENOTTY, as the crate answered it.
    pub(super) fn ioctl(&self, c: &Call) -> Reply {
        let r = args::<IoctlIn>(c.args).and_then(|a| {
            let input = &c.args[std::mem::size_of::<IoctlIn>()..];
            let n = a.in_size as usize;
            if n > input.len() {
                return Err(errno(libc::ENOTTY));
            }
            let data = (n > 0).then(|| &input[..n]);
            let (result, out) =
                self.fs
                    .ioctl(&c.ctx, c.hdr.nodeid, a.fh, a.cmd, data, a.out_size)?;
            let mut reply = IoctlOut {
                result,
                ..Default::default()
            }
            .as_slice()
            .to_vec();
            reply.extend_from_slice(&out);
            Ok(reply)
        });
        Reply::Payload(r)
    }

    pub(super) fn poll(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: PollIn = args(b)?;
            let node = c.hdr.nodeid;
            let revents = self.fs.poll(&c.ctx, node, a.fh, a.kh, a.flags, a.events)?;
            Ok(PollOut {
                revents,
                padding: 0,
            }
            .as_slice()
            .to_vec())
        })
    }

    pub(super) fn bmap(&self, c: &Call) -> Reply {
        c.reply(|b| {
            let a: BmapIn = args(b)?;
            let block = self.fs.bmap(&c.ctx, c.hdr.nodeid, a.block, a.blocksize)?;
            Ok(BmapOut { block }.as_slice().to_vec())
        })
    }

    /// SETUPMAPPING and REMOVEMAPPING: ENOSYS, there is no DAX window.
    pub(super) fn no_dax_window(&self, _: &Call) -> Reply {
        Reply::Payload(Err(errno(libc::ENOSYS)))
    }

    /// Serves `popped`, a READ by its opcode (callers sort requests by it first), on the
    /// calling thread if it can be answered without blocking (`FileSystem::read_nowait`);
    /// None leaves it unanswered for `handle`. This is the one no-wait entry point: only
    /// the usual READ shape is tried (header and arguments in 80 readable bytes, room for
    /// the reply), anything else goes to the pool, with nothing changed.
    pub fn try_handle_without_blocking<M>(
        &self,
        mem: &GuestMem,
        popped: &mut Popped<M>,
    ) -> Option<u32>
    where
        M: Deref<Target = GuestMem> + Clone,
    {
        let (descs, Ok(req)) = popped.parts(mem) else {
            return None;
        };
        #[cfg(feature = "test-hooks")]
        super::test_hooks::crash(super::test_hooks::When::Popped, req.hdr.opcode);
        #[cfg(feature = "test-hooks")]
        let op = req.hdr.opcode;
        if descs.overlong() {
            return None;
        }
        let start = Instant::now();
        let tried = panic::catch_unwind(AssertUnwindSafe(|| {
            self.read_without_blocking(mem, &req.hdr, &req.bytes, descs.all())
        }));
        let len = match tried {
            Ok(Some(DirectRead::Served(len))) => len,
            Ok(Some(DirectRead::WouldBlock) | None) => return None,
            Err(_) => {
                // The general path serves it again (on this thread or in the pool), and
                // answers EIO if it panics there too.
                self.stats.panics.fetch_add(1, Ordering::Relaxed);
                error!("a READ panicked on the direct path; serving it the general way");
                return None;
            }
        };
        self.stats
            .record(Opcode::Read as u32, start.elapsed(), false, 0);
        self.count_read(len);
        self.stats.reads_direct.fetch_add(1, Ordering::Relaxed);
        self.stats
            .reads_on_queue_thread
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "test-hooks")]
        super::test_hooks::crash(super::test_hooks::When::Served, op);
        Some(len)
    }

    /// The queue thread's READ; None for a shape not handled here (the general path
    /// takes it from the start).
    fn read_without_blocking(
        &self,
        mem: &GuestMem,
        hdr: &InHeader,
        bytes: &[u8],
        all: &[virtio_queue::desc::split::Descriptor],
    ) -> Option<DirectRead> {
        // The request: exactly InHeader + ReadIn in the readable descriptors before the
        // first writable one (the guest driver puts them in two), and no readable one after.
        let first_out = all.iter().position(|d| d.is_write_only())?;
        let mut got = 0usize;
        for d in &all[..first_out] {
            got = got.checked_add(d.len() as usize)?;
            if got > READ_IN_LEN {
                return None;
            }
        }
        if got != READ_IN_LEN || bytes.len() != READ_IN_LEN {
            return None;
        }
        let mut args = ReadIn::default();
        args.as_mut_slice().copy_from_slice(&bytes[HDR_LEN..]);
        let size = args.size as usize;
        if hdr.opcode != Opcode::Read as u32 || hdr.len as usize != READ_IN_LEN || size > MAX_READ {
            return None;
        }
        #[cfg(feature = "test-hooks")]
        super::test_hooks::panic_for(hdr.nodeid, hdr.opcode);

        // The reply: OutHeader in the first writable descriptor, then `size` bytes of data.
        let out = &all[first_out];
        if (out.len() as usize) < OUT_LEN {
            return None;
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_READ_SEGS];
        // Where each iovec lands in guest memory, for the dirty-page log.
        let mut at = [(GuestAddress(0), 0usize); MAX_READ_SEGS];
        let mut n = 0usize;
        let mut want = size;
        let first = (
            out.addr().checked_add(OUT_LEN as u64)?,
            out.len() as usize - OUT_LEN,
            true,
        );
        let rest = all[first_out + 1..]
            .iter()
            .map(|d| (d.addr(), d.len() as usize, d.is_write_only()));
        for (addr, len, writable) in std::iter::once(first).chain(rest) {
            if want == 0 {
                break;
            }
            if !writable {
                return None;
            }
            let take = len.min(want);
            if take == 0 {
                continue;
            }
            if n == MAX_READ_SEGS {
                return None;
            }
            let s = mem.get_slice(addr, take).ok()?;
            // The pointer outlives its guard: GuestMem's regions stay mapped as long
            // as `mem` (held by our caller) lives; the guard only matters for Xen mappings.
            iov[n] = libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: take,
            };
            at[n] = (addr, take);
            n += 1;
            want -= take;
        }
        if want != 0 {
            return None; // no room for the reply: the general path answers that
        }

        // SAFETY: each iovec spans mapped guest memory (get_slice checked the bounds) that
        // stays mapped while `mem` lives, for the whole call.
        let Some(count) = (unsafe {
            self.fs
                .read_nowait(hdr.nodeid, args.fh, args.offset, &iov[..n])
        }) else {
            return Some(DirectRead::WouldBlock);
        };
        // preadv wrote past vm-memory, which logs its own writes: log these by hand.
        let mut left = count;
        for &(addr, len) in &at[..n] {
            let len = len.min(left);
            if len == 0 {
                break;
            }
            log_guest_write(mem, addr, len);
            left -= len;
        }
        let reply = OutHeader {
            len: (OUT_LEN + count) as u32,
            error: 0,
            unique: hdr.unique,
        };
        mem.write_obj(reply, out.addr()).ok()?;
        Some(DirectRead::Served(reply.len))
    }
}
