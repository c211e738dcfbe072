//! READ on the queue thread without fuse-backend-rs's `Reader`/`Writer`.
//!
//! The queue thread's no-wait READ (see `passthrough::nowait`) costs a few µs, and a good
//! part of that went into the crate's general machinery: three descriptor walks into
//! heap-allocated buffer lists, a dispatch, and a writer split per request. For the common
//! shape of a READ (header and arguments in 80 readable bytes, room for the reply) this
//! decodes the request itself and reads straight into the guest's buffers. Anything
//! unusual is `NotHandled`: the general path (which also answers malformed requests) takes
//! it from the start, with nothing changed.

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader, ReadIn};
use vm_memory::{Address, ByteValued, Bytes, GuestMemory};

use super::chain::Descs;
use super::request::Request;
use super::GuestMem;
use super::Opcode;
use crate::passthrough::PassthroughFs;

const IN_LEN: usize = std::mem::size_of::<InHeader>() + std::mem::size_of::<ReadIn>();
const OUT_LEN: usize = std::mem::size_of::<OutHeader>();
/// The crate's limit; larger READs get its error reply.
const MAX_READ: usize = 1 << 20;
/// Reply segments handled here: a 1 MiB read in separate 4 KiB pages, plus the header.
const MAX_SEGS: usize = MAX_READ / 4096 + 2;

pub enum FastRead {
    /// Answered: the used length.
    Served(u32),
    /// It would have blocked: hand it to the pool.
    WouldBlock,
    /// Not a shape handled here: try the general path.
    NotHandled,
}

pub fn read(
    fs: &PassthroughFs,
    mem: &GuestMem,
    req: &Request,
    descs: &Descs,
    panic_nodeid: Option<u64>,
) -> FastRead {
    match try_read(fs, mem, req, descs, panic_nodeid) {
        Some(r) => r,
        None => FastRead::NotHandled,
    }
}

fn try_read(
    fs: &PassthroughFs,
    mem: &GuestMem,
    req: &Request,
    descs: &Descs,
    panic_nodeid: Option<u64>,
) -> Option<FastRead> {
    // The request: exactly InHeader + ReadIn in the readable descriptors before the first
    // writable one (the guest driver puts them in two), and no readable one after.
    let all = descs.all();
    let first_out = all.iter().position(|d| d.is_write_only())?;
    let mut got = 0usize;
    for d in &all[..first_out] {
        got = got.checked_add(d.len() as usize)?;
        if got > IN_LEN {
            return None;
        }
    }
    if got != IN_LEN || req.bytes.len() != IN_LEN {
        return None;
    }
    let hdr = req.hdr;
    let mut args = ReadIn::default();
    args.as_mut_slice()
        .copy_from_slice(&req.bytes[std::mem::size_of::<InHeader>()..]);
    let size = args.size as usize;
    if hdr.opcode != Opcode::Read as u32 || hdr.len as usize != IN_LEN || size > MAX_READ {
        return None;
    }
    if Some(hdr.nodeid) == panic_nodeid {
        panic!("VFSD_TEST_PANIC_NODEID: READ of node {}", hdr.nodeid);
    }

    // The reply: OutHeader in the first writable descriptor, then `size` bytes of data.
    let out = &all[first_out];
    if (out.len() as usize) < OUT_LEN {
        return None;
    }
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_SEGS];
    // Where each iovec lands in guest memory, for the dirty-page log.
    let mut at = [(vm_memory::GuestAddress(0), 0usize); MAX_SEGS];
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
        if n == MAX_SEGS {
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
    let Some(count) = (unsafe { fs.read_nowait(hdr.nodeid, args.fh, args.offset, &iov[..n]) })
    else {
        return Some(FastRead::WouldBlock);
    };
    // preadv wrote past vm-memory, which logs its own writes: log these by hand.
    let mut left = count;
    for &(addr, len) in &at[..n] {
        let len = len.min(left);
        if len == 0 {
            break;
        }
        super::log_guest_write(mem, addr, len);
        left -= len;
    }
    let reply = OutHeader {
        len: (OUT_LEN + count) as u32,
        error: 0,
        unique: hdr.unique,
    };
    mem.write_obj(reply, out.addr()).ok()?;
    Some(FastRead::Served(reply.len))
}
