//! WRITE, served by vfsd: header and arguments from the request's copy, the data straight
//! from the guest's buffers to the host file (pwritev), as the crate's zero-copy path did.

use fuse_backend_rs::abi::fuse_abi::{WriteIn, WriteOut, WRITE_KILL_PRIV};
use smallvec::SmallVec;
use vm_memory::{Address, ByteValued, GuestMemory};

use super::chain::Descs;
use super::request::{decode, Request, HDR_LEN, WRITE_IN_LEN};
use super::GuestMem;
use crate::passthrough::PassthroughFs;

/// The crate's limit, which INIT's max_write (1 MiB) keeps the guest within.
const MAX_WRITE: usize = 1 << 20;
/// Data segments accepted: 1 MiB in separate 4 KiB pages, plus partial pages at the ends.
const MAX_SEGS: usize = MAX_WRITE / 4096 + 2;

/// Serves a WRITE: Ok is the reply (an errno or a WriteOut); Err(errno) marks the request
/// as malformed, answered with that errno.
pub fn write(
    fs: &PassthroughFs,
    mem: &GuestMem,
    descs: &Descs,
    req: &Request,
) -> Result<std::io::Result<Vec<u8>>, i32> {
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
    for d in descs.readable() {
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
        if iov.len() == MAX_SEGS {
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
    let kill = fs
        .kill_privs(
            hdr.uid,
            hdr.gid,
            Some(args.fuse_flags & WRITE_KILL_PRIV != 0),
        )
        .filter(|_| size > 0);
    // SAFETY: each iovec spans mapped guest memory (get_slice checked the bounds) that
    // stays mapped while `mem` lives, for the whole call; pwritev only reads it.
    let r = unsafe { fs.write_iov(hdr.nodeid, args.fh, args.offset, &iov, kill, args.flags) };
    Ok(r.map(|n| {
        WriteOut {
            size: n as u32,
            padding: 0,
        }
        .as_slice()
        .to_vec()
    }))
}
