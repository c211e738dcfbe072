//! A request's readable part, copied out of guest memory once.

use fuse_backend_rs::abi::fuse_abi::{InHeader, WriteIn};
use vm_memory::Address;

use super::codec::{decode, errno, inval};
use super::descs::Descs;
use super::guest::{read_guest, GuestMem};
use crate::server::opcode::Opcode;

/// The largest request the crate accepts (its MAX_BUFFER_SIZE plus a header page); a
/// longer readable part is not copied past this.
pub const MAX_REQUEST: usize = (1 << 20) + 4096;
pub const HDR_LEN: usize = std::mem::size_of::<InHeader>();
/// WRITE's header and arguments; its data stays in guest memory.
pub const WRITE_IN_LEN: usize = HDR_LEN + std::mem::size_of::<WriteIn>();

/// What a request's copy holds at its pop (`copy_head`): all of most requests, and
/// enough of any to place it (READ's and COPY_FILE_RANGE's arguments). The rest is copied
/// by the thread that serves it (`finish`), so a pop's requests waiting for a worker hold
/// no more than this each.
pub const HEAD: usize = 256;

#[derive(Debug, Clone)]
pub struct Request {
    pub hdr: InHeader,
    /// The header and what follows it, as the guest sent them (for WRITE only the
    /// header and WriteIn).
    pub bytes: Vec<u8>,
    /// Whether `bytes` holds all the copy will (the readable part, or up to its limit).
    pub(super) whole: bool,
}

impl Request {
    /// The bytes after the header.
    pub fn args(&self) -> &[u8] {
        &self.bytes[HDR_LEN..]
    }
}

/// A request's body: the bytes after its header, as long as the header says. Too long a
/// request is ENOMEM (the kernel's FUSE never sends one), a header claiming more than was
/// sent EINVAL.
pub fn body(req: &Request) -> std::io::Result<&[u8]> {
    let len = req.hdr.len as usize;
    if len > MAX_REQUEST {
        return Err(errno(libc::ENOMEM));
    }
    req.bytes.get(HDR_LEN..len).ok_or_else(inval)
}

/// A request that can't be copied whole.
#[derive(Debug)]
pub struct BadRequest {
    /// Its header, if that much was readable: the guest still gets an errno reply.
    pub hdr: Option<InHeader>,
    pub why: String,
}

/// Copies the readable descriptors of a chain (up to the crate's limit) out of guest
/// memory: `copy_head`, then `finish`.
#[cfg(test)]
pub fn copy(mem: &GuestMem, descs: &Descs) -> Result<Request, BadRequest> {
    let mut r = copy_head(mem, descs)?;
    finish(mem, descs, &mut r)?;
    Ok(r)
}

/// The first `HEAD` bytes of the copy (the header and most requests whole).
pub fn copy_head(mem: &GuestMem, descs: &Descs) -> Result<Request, BadRequest> {
    // Room for most requests other than a SETXATTR's value, so the copy grows once.
    let mut bytes = Vec::with_capacity(HEAD);
    let ran_out = fill(mem, descs, &mut bytes, HEAD).map_err(|why| BadRequest {
        hdr: decode(&bytes),
        why,
    })?;
    let hdr: InHeader = decode(&bytes).ok_or_else(|| BadRequest {
        hdr: None,
        why: "request shorter than a FUSE header".into(),
    })?;
    let whole = ran_out || hdr.opcode == Opcode::Write as u32;
    Ok(Request { hdr, bytes, whole })
}

/// Copies the rest of `req` (`copy_head` copied its start from the same chain).
pub fn finish(mem: &GuestMem, descs: &Descs, req: &mut Request) -> Result<(), BadRequest> {
    if req.whole {
        return Ok(());
    }
    fill(mem, descs, &mut req.bytes, MAX_REQUEST).map_err(|why| BadRequest {
        hdr: Some(req.hdr),
        why,
    })?;
    req.whole = true;
    Ok(())
}

/// Where the copy of a request whose copy starts with `b` ends, once its header is there:
/// at its header's length (what a request is, `body`; never inside the header),
/// for WRITE at its header and arguments (its data stays in guest memory).
fn request_end(b: &[u8]) -> Option<usize> {
    let h = decode::<InHeader>(b)?;
    let end = (h.len as usize).max(HDR_LEN);
    Some(if h.opcode == Opcode::Write as u32 {
        end.min(WRITE_IN_LEN)
    } else {
        end
    })
}

/// Appends the readable bytes of `descs` after the `bytes.len()` already copied, up to
/// the request's end (`request_end`) and `limit` in all. Ok(true) if the copy reached the
/// request's end or the readable part ended first. On an error, `bytes` holds what was
/// read before it.
fn fill(mem: &GuestMem, descs: &Descs, bytes: &mut Vec<u8>, limit: usize) -> Result<bool, String> {
    let mut end = request_end(bytes);
    let mut skip = bytes.len();
    for d in descs.readable() {
        let len = d.len() as usize;
        let mut off = skip.min(len);
        skip -= off;
        while off < len {
            if end.is_some_and(|e| bytes.len() >= e) {
                return Ok(true);
            }
            if bytes.len() >= limit {
                return Ok(false);
            }
            // Stop at the header's end first: its length and opcode decide how much more
            // is worth copying (never a WRITE's data, even when one descriptor holds it
            // all, nor what a guest put after its request).
            let stop = end.map_or(HDR_LEN, |e| e.min(limit));
            let take = (len - off).min(stop - bytes.len());
            let at = bytes.len();
            let Some(addr) = d.addr().checked_add(off as u64) else {
                return Err("readable descriptor past the end of the address space".into());
            };
            bytes.resize(at + take, 0);
            if let Err(e) = read_guest(mem, &mut bytes[at..], addr) {
                bytes.truncate(at);
                return Err(format!("bad readable descriptor: {e}"));
            }
            off += take;
            if end.is_none() {
                end = request_end(bytes);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{ByteValued, Bytes, GuestAddress};

    const MEM: u64 = 0x10000;

    /// Copies the request of one chain made of readable descriptors (address, length).
    fn copy_chain(mem: &GuestMem, descs: &[(u64, u32)]) -> Result<Request, BadRequest> {
        let descs: Vec<_> = descs.iter().map(|&(a, l)| (a, l, false)).collect();
        let chain = crate::server::wire::descs::mock_chain(mem, &descs);
        copy(mem, &Descs::read(&chain))
    }

    fn header(opcode: u32, len: u32) -> Vec<u8> {
        let h = InHeader {
            len,
            opcode,
            unique: 7,
            nodeid: 1,
            ..Default::default()
        };
        h.as_slice().to_vec()
    }

    #[test]
    fn header_split_across_descriptors_is_joined() {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let mut req = header(Opcode::Open as u32, HDR_LEN as u32 + 16);
        req.extend((0..16u8).map(|i| i + 1));
        // 10 bytes, then the rest of the header with the arguments.
        mem.write_slice(&req[..10], GuestAddress(0x8000)).unwrap();
        mem.write_slice(&req[10..], GuestAddress(0x9000)).unwrap();
        let r = copy_chain(&mem, &[(0x8000, 10), (0x9000, req.len() as u32 - 10)]).unwrap();
        assert_eq!(r.bytes, req);
        assert_eq!(r.hdr.opcode, Opcode::Open as u32);
        assert_eq!(r.args(), &req[HDR_LEN..]);
    }

    #[test]
    fn write_data_in_the_header_descriptor_is_not_copied() {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let data = 0x2000u32;
        let mut req = header(Opcode::Write as u32, WRITE_IN_LEN as u32 + data);
        let w = WriteIn {
            fh: 3,
            size: data,
            ..Default::default()
        };
        req.extend_from_slice(w.as_slice());
        req.resize(WRITE_IN_LEN + data as usize, 0xab);
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        let r = copy_chain(&mem, &[(0x8000, req.len() as u32)]).unwrap();
        assert_eq!(r.bytes, &req[..WRITE_IN_LEN]);
        // The data is never read here: a descriptor whose data part runs past the end of
        // guest memory still yields the header and arguments (WRITE itself then answers
        // EFAULT when it maps the data).
        let at = MEM - WRITE_IN_LEN as u64;
        mem.write_slice(&req[..WRITE_IN_LEN], GuestAddress(at))
            .unwrap();
        let r = copy_chain(&mem, &[(at, WRITE_IN_LEN as u32 + data)]).unwrap();
        assert_eq!(r.bytes, &req[..WRITE_IN_LEN]);
    }

    #[test]
    fn other_requests_copy_the_whole_readable_part_up_to_the_limit() {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let mut req = header(Opcode::Setxattr as u32, HDR_LEN as u32 + 0x1000);
        req.resize(HDR_LEN + 0x1000, 0x5a);
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        let r = copy_chain(&mem, &[(0x8000, req.len() as u32)]).unwrap();
        assert_eq!(r.bytes, req);
        // A readable descriptor outside guest memory is an error, not a short copy; the
        // header before it is kept for the errno reply.
        let e = copy_chain(&mem, &[(0x8000, HDR_LEN as u32), (MEM, 0x100)]).unwrap_err();
        assert_eq!(e.hdr.map(|h| h.opcode), Some(Opcode::Setxattr as u32));
        // The header itself outside guest memory, or shorter than a header: no header.
        let e = copy_chain(&mem, &[(0x8000, 8), (MEM, 0x100)]).unwrap_err();
        assert!(e.hdr.is_none());
        assert!(copy_chain(&mem, &[(0x8000, 8)]).unwrap_err().hdr.is_none());
    }

    #[test]
    fn the_copy_ends_where_the_header_says_the_request_does() {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        // 16 bytes of arguments, then 32 KiB more of readable bytes the header leaves out.
        let mut req = header(Opcode::Open as u32, HDR_LEN as u32 + 16);
        req.resize(HDR_LEN + 16 + 0x8000, 0x5a);
        mem.write_slice(&req, GuestAddress(0x1000)).unwrap();
        let r = copy_chain(&mem, &[(0x1000, req.len() as u32)]).unwrap();
        assert_eq!(r.bytes, &req[..HDR_LEN + 16]);
        // The same past HEAD, over several descriptors: the copy stops inside the second.
        let n = HEAD + 100;
        let mut req = header(Opcode::Setxattr as u32, n as u32);
        req.resize(0x4000, 0x33);
        mem.write_slice(&req, GuestAddress(0x1000)).unwrap();
        let r = copy_chain(&mem, &[(0x1000, 200), (0x10c8, 0x4000 - 200)]).unwrap();
        assert_eq!(r.bytes, &req[..n]);
        // The copy at the pop holds no more than the request either.
        let descs: Vec<_> = [(0x1000, 0x4000, false)].to_vec();
        let chain = crate::server::wire::descs::mock_chain(&mem, &descs);
        let r = copy_head(&mem, &Descs::read(&chain)).unwrap();
        assert_eq!(r.bytes.len(), HEAD);
        assert!(!r.whole);
        // A header claiming less than itself still yields the header (the server answers
        // EINVAL from it).
        let mut req = header(Opcode::Getattr as u32, 3);
        req.resize(HDR_LEN + 64, 0);
        mem.write_slice(&req, GuestAddress(0x1000)).unwrap();
        let r = copy_chain(&mem, &[(0x1000, req.len() as u32)]).unwrap();
        assert_eq!(r.bytes.len(), HDR_LEN);
    }
}
