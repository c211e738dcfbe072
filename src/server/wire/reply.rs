//! Writing replies into a chain's writable buffers (`Descs::writable_bufs`, read once),
//! straight into guest memory: a header and payload (`reply_sent`), an errno
//! (`answer_errno`), or READ's data and READDIR's entries (`ReplyData`) and then their
//! header (`finish`).

use std::io;
use std::mem::size_of;

use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader};
use fuse_backend_rs::api::filesystem::ZeroCopyWriter;
use fuse_backend_rs::file_buf::FileVolatileSlice;
use fuse_backend_rs::file_traits::FileReadWriteVolatile;
use log::{debug, warn};
use smallvec::SmallVec;
use vm_memory::{Address, ByteValued, GuestAddress, GuestMemory};

use super::codec::{errno, inval};
use super::guest::{in_memory, log_guest_write, write_guest, GuestMem};
use crate::server::opcode::Opcode;

/// A reply's header.
pub const OUT_HDR: usize = size_of::<OutHeader>();

/// Opcodes that never get a reply (FUSE spec).
fn no_reply(op: u32) -> bool {
    Opcode::of(op).is_some_and(Opcode::takes_no_reply)
}

/// The reply to a request that failed before its handler could answer it: `errno`,
/// unless the opcode takes no reply (then nothing is written, and the length is 0).
pub fn answer_errno(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    errno: i32,
) -> u32 {
    if no_reply(hdr.opcode) {
        return 0;
    }
    reply_into(mem, bufs, hdr, Err(io::Error::from_raw_os_error(errno)))
}

/// Writes a reply (header plus `payload`, or an errno) into a chain's writable buffers
/// (`Descs::writable_bufs`, read once: a guest may point its buffers at its descriptor
/// table, and the room checked must be the room written). Straight into guest memory:
/// the crate's writer would first gather every writable descriptor into a heap list of
/// 64 slices, for one reply of a few dozen bytes.
pub fn reply_into(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    r: io::Result<Vec<u8>>,
) -> u32 {
    reply_sent(mem, bufs, hdr, r).0
}

/// `reply_into`, with the errno the reply carries (0 for none): EIO for an error without
/// one, EINVAL for a reply that did not fit.
pub fn reply_sent(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    hdr: &InHeader,
    r: io::Result<Vec<u8>>,
) -> (u32, i32) {
    let (mut error, mut payload) = match r {
        Ok(p) => (0, p),
        Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO), Vec::new()),
    };
    // At most u32::MAX: the chain's iterator ends where its lengths would sum past that.
    let room: usize = bufs.iter().map(|&(_, len)| len as usize).sum();
    let header = std::mem::size_of::<OutHeader>();
    if room < header {
        warn!("no room for a reply header in the guest's buffers; dropping the reply");
        return (0, 0);
    }
    if header + payload.len() > room {
        // The guest left room for a header but not for this reply: an errno still tells
        // it the request is done (as for a request the crate can't answer).
        debug!(
            "reply of {} bytes does not fit; answering EINVAL",
            payload.len()
        );
        (error, payload) = (-libc::EINVAL, Vec::new());
    }
    let out = OutHeader {
        len: (header + payload.len()) as u32,
        error,
        unique: hdr.unique,
    };
    if let Err(e) = write_into(mem, bufs, &[out.as_slice(), &payload]) {
        warn!("reply does not fit the guest's buffers ({e}); dropping it");
        return (0, 0);
    }
    (out.len, -error)
}

/// Writes `parts`, one after the other, into `bufs` (writable descriptors, in order).
/// Err, with nothing written, if they don't all fit or a byte of them would fall outside
/// guest memory; bytes of `bufs` past the parts are never looked at.
pub fn write_into(mem: &GuestMem, bufs: &[(GuestAddress, u32)], parts: &[&[u8]]) -> io::Result<()> {
    let pieces = reply_pieces(mem, bufs, parts.iter().map(|p| p.len()).sum())?;
    // The pieces hold exactly the parts' bytes, so each piece finds its bytes.
    let mut parts = parts.iter().copied().filter(|p| !p.is_empty());
    let mut part: &[u8] = &[];
    for (addr, n) in pieces {
        let mut off = 0;
        while off < n {
            if part.is_empty() {
                part = parts.next().ok_or_else(|| errno(libc::EIO))?;
            }
            let k = part.len().min(n - off);
            // Within the range `reply_pieces` found in guest memory.
            let at = addr.unchecked_add(off as u64);
            write_guest(mem, &part[..k], at).map_err(|e| io::Error::other(e.to_string()))?;
            (off, part) = (off + k, &part[k..]);
        }
    }
    Ok(())
}

/// The pieces of `bufs` that the first `len` bytes of a reply fill (address, length), each
/// checked to lie in guest memory. Err if `bufs` are too short (ENOSPC) or a piece is not
/// in guest memory (EFAULT).
pub fn reply_pieces(
    mem: &GuestMem,
    bufs: &[(GuestAddress, u32)],
    len: usize,
) -> io::Result<SmallVec<[(GuestAddress, usize); 4]>> {
    let mut left = len;
    let mut pieces = SmallVec::new();
    for &(addr, buf_len) in bufs {
        if left == 0 {
            break;
        }
        let n = left.min(buf_len as usize);
        if n == 0 {
            continue;
        }
        if !in_memory(mem, addr, n) {
            return Err(errno(libc::EFAULT));
        }
        pieces.push((addr, n));
        left -= n;
    }
    if left > 0 {
        return Err(errno(libc::ENOSPC));
    }
    Ok(pieces)
}

/// Where a reply header goes: the first writable buffer, if it has room for one.
pub fn reply_address(bufs: &[(GuestAddress, u32)]) -> Option<GuestAddress> {
    bufs.first()
        .filter(|&&(_, len)| len as usize >= std::mem::size_of::<OutHeader>())
        .map(|&(addr, _)| addr)
}

/// Where READ's data and READDIR's entries go: a chain's writable buffers after the reply
/// header, as the request's one reading of its descriptors found them
/// (`Descs::writable_bufs`, at most `MAX_DESCS`: at the pop, or when a
/// parked request is served), the reading the effect check used too. The chain is not
/// walked again, so a guest that rewrote its descriptor table since has no say in where
/// the reply goes.
pub struct ReplyData<'a> {
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
    pub fn new(mem: &'a GuestMem, bufs: &[(GuestAddress, u32)]) -> io::Result<ReplyData<'a>> {
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

    pub fn available_bytes(&self) -> usize {
        self.left[self.next..].iter().map(|&(_, len)| len).sum()
    }

    pub fn bytes_written(&self) -> usize {
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
            log_guest_write(self.mem, addr, len);
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
            write_guest(self.mem, &buf[done..done + len], addr)
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
pub fn finish(
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
    write_into(mem, bufs, &[out.as_slice()])?;
    Ok(out.len)
}

/// OPEN's and OPENDIR's reply payload (and CREATE's second half): the handle and the
/// options it was opened with.
pub fn opened(fh: u64, opts: fuse_backend_rs::api::filesystem::OpenOptions) -> Vec<u8> {
    fuse_backend_rs::abi::fuse_abi::OpenOut {
        fh,
        open_flags: opts.bits(),
        passthrough: 0,
    }
    .as_slice()
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::wire::codec::decode;
    use crate::server::wire::descs::mock_chain;
    use crate::server::wire::descs::Descs;
    use vm_memory::Bytes;

    const MEM: u64 = 0x10000;
    const HDR: usize = std::mem::size_of::<OutHeader>();
    const W: bool = true;
    const R: bool = false;

    /// The used length of `r` as the reply to a request (unique 9) whose chain is
    /// `descs` (address, length, writable) in guest memory of `regions`, and that memory
    /// after it. Readable buffers are filled with 0xee first.
    fn reply_in(
        regions: &[(u64, usize)],
        descs: &[(u64, u32, bool)],
        r: io::Result<Vec<u8>>,
    ) -> (u32, GuestMem) {
        let ranges: Vec<_> = regions.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        let mem = GuestMem::from_ranges(&ranges).unwrap();
        for &(a, l, _) in descs.iter().filter(|d| !d.2) {
            mem.write_slice(&vec![0xee; l as usize], GuestAddress(a))
                .unwrap();
        }
        let chain = mock_chain(&mem, descs);
        let hdr = InHeader {
            unique: 9,
            ..Default::default()
        };
        let bufs = Descs::read(&chain).writable_bufs();
        (reply_into(&mem, &bufs, &hdr, r), mem)
    }

    /// `reply_in` with one readable descriptor, then writable ones (address, length).
    fn reply_to_writable(writable: &[(u64, u32)], r: io::Result<Vec<u8>>) -> (u32, GuestMem) {
        let descs: Vec<_> = std::iter::once((0x4000, 40, R))
            .chain(writable.iter().map(|&(a, l)| (a, l, W)))
            .collect();
        reply_in(&[(0, MEM as usize)], &descs, r)
    }

    fn bytes_at(mem: &GuestMem, at: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        b
    }

    fn out_header(mem: &GuestMem, at: u64) -> OutHeader {
        mem.read_obj(GuestAddress(at)).unwrap()
    }

    #[test]
    fn a_reply_split_over_writable_descriptors_is_written_in_order() {
        let payload: Vec<u8> = (1..=40).collect();
        // 5 bytes of the header, the rest of it and 3 payload bytes, then the rest.
        let descs = [(0x8000, 5), (0x9000, HDR as u32 - 5 + 3), (0xa000, 100)];
        let (len, mem) = reply_to_writable(&descs, Ok(payload.clone()));
        assert_eq!(len as usize, HDR + payload.len());
        let mut got = bytes_at(&mem, 0x8000, 5);
        got.extend(bytes_at(&mem, 0x9000, HDR - 5 + 3));
        got.extend(bytes_at(&mem, 0xa000, payload.len() - 3));
        let hdr: OutHeader = decode(&got).unwrap();
        assert_eq!((hdr.len, hdr.error, hdr.unique), (len, 0, 9));
        assert_eq!(&got[HDR..], &payload[..]);
        // Nothing past the reply: the last descriptor's byte after it is untouched.
        assert_eq!(bytes_at(&mem, 0xa000 + payload.len() as u64 - 3, 1), [0]);
    }

    #[test]
    fn a_reply_goes_only_into_writable_descriptors_between_readable_ones() {
        // Readable, writable, readable, writable: the kernel never sends this shape, but
        // a guest may; the reply skips the readable buffers and leaves them as they were.
        let descs = [
            (0x4000, 40, R),
            (0x8000, 10, W),
            (0x5000, 16, R),
            (0x9000, 64, W),
        ];
        let (len, mem) = reply_in(&[(0, MEM as usize)], &descs, Ok(vec![0x11; 20]));
        assert_eq!(len as usize, HDR + 20);
        assert_eq!(bytes_at(&mem, 0x4000, 40), vec![0xee; 40]);
        assert_eq!(bytes_at(&mem, 0x5000, 16), vec![0xee; 16]);
        let mut got = bytes_at(&mem, 0x8000, 10);
        got.extend(bytes_at(&mem, 0x9000, HDR + 20 - 10));
        assert_eq!(decode::<OutHeader>(&got).unwrap().unique, 9);
        assert_eq!(&got[HDR..], &[0x11; 20]);
    }

    #[test]
    fn a_reply_across_two_memory_regions_is_written_whole() {
        let regions = [(0, 0x8000), (0x8000, 0x8000)];
        let descs = [(0x4000, 40, R), (0x7ff8, 64, W)];
        let (len, mem) = reply_in(&regions, &descs, Ok(vec![0x22; 24]));
        assert_eq!(len as usize, HDR + 24);
        let got = bytes_at(&mem, 0x7ff8, HDR + 24);
        assert_eq!(decode::<OutHeader>(&got).unwrap().len, len);
        assert_eq!(&got[HDR..], &[0x22; 24]);
    }

    #[test]
    fn an_errno_reply_and_a_reply_too_long_for_the_buffers() {
        let (len, mem) = reply_to_writable(&[(0x8000, 64)], Err(errno(libc::ENOENT)));
        assert_eq!(len as usize, HDR);
        let h = out_header(&mem, 0x8000);
        assert_eq!((h.len as usize, h.error, h.unique), (HDR, -libc::ENOENT, 9));
        // Room for the header only: EINVAL, so the guest still hears the request is done.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32 + 3)], Ok(vec![7; 4]));
        assert_eq!(len as usize, HDR);
        assert_eq!(out_header(&mem, 0x8000).error, -libc::EINVAL);
        // Not even that, or no writable descriptor at all: nothing is written.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32 - 1)], Ok(vec![]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, 0x8000, HDR), vec![0; HDR]);
        assert_eq!(reply_to_writable(&[], Err(errno(libc::EIO))).0, 0);
    }

    #[test]
    fn zero_length_writable_descriptors_are_skipped_even_outside_memory() {
        let descs = [
            (0x8000, 0),
            (MEM + 0x1000, 0),
            (0x8000, 5),
            (u64::MAX - 3, 0),
            (0x9000, 64),
        ];
        let (len, mem) = reply_to_writable(&descs, Ok(vec![1; 8]));
        assert_eq!(len as usize, HDR + 8);
        let mut got = bytes_at(&mem, 0x8000, 5);
        got.extend(bytes_at(&mem, 0x9000, HDR + 8 - 5));
        assert_eq!(decode::<OutHeader>(&got).unwrap().unique, 9);
        assert_eq!(&got[HDR..], &[1; 8]);
    }

    #[test]
    fn a_reply_that_exactly_fills_its_buffers_and_one_a_byte_too_long() {
        let (len, _) = reply_to_writable(&[(0x8000, HDR as u32), (0x9000, 8)], Ok(vec![2; 8]));
        assert_eq!(len as usize, HDR + 8);
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32), (0x9000, 7)], Ok(vec![2; 8]));
        assert_eq!(len as usize, HDR);
        assert_eq!(out_header(&mem, 0x8000).error, -libc::EINVAL);
    }

    #[test]
    fn a_reply_that_would_reach_outside_guest_memory_writes_nothing() {
        // The whole header outside, or its second half past the end of memory.
        assert_eq!(
            reply_to_writable(&[(MEM + 0x1000, 64)], Ok(vec![1; 8])).0,
            0
        );
        let (len, mem) = reply_to_writable(&[(MEM - 8, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, MEM - 8, 8), vec![0; 8]);
        // The payload's buffer outside, or past the end of the address space.
        let (len, mem) = reply_to_writable(&[(0x8000, HDR as u32), (MEM, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        assert_eq!(bytes_at(&mem, 0x8000, HDR), vec![0; HDR]);
        let (len, _) = reply_to_writable(&[(0x8000, 8), (u64::MAX - 3, 64)], Ok(vec![1; 8]));
        assert_eq!(len, 0);
        // A bad buffer the reply doesn't reach is never looked at.
        let (len, _) = reply_to_writable(&[(0x8000, 64), (MEM + 0x1000, 64)], Ok(vec![1; 8]));
        assert_eq!(len as usize, HDR + 8);
    }
}
