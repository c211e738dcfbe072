//! A popped request as the server sees it: its descriptor chain, the chain's descriptors
//! read once (`descs`), and the one copy of its readable part (`request`).

use std::ops::Deref;

use virtio_queue::DescriptorChain;

use super::descs::Descs;
use super::guest::GuestMem;
use super::request::{self, BadRequest, Request, HDR_LEN};
use crate::server::opcode::Opcode;

/// A request popped from a queue, read once (`Popped::new`).
pub struct Popped<M> {
    pub(crate) chain: DescriptorChain<M>,
    /// The descriptors, read at the pop; None once parked (`park`) until the thread that
    /// serves it reads them again.
    descs: Option<Descs>,
    /// The copy: its head from the pop, the rest from the thread that serves it
    /// (`request::finish`). Placed and served by the same header.
    pub(crate) copy: Result<Request, BadRequest>,
}

impl<M> Popped<M>
where
    M: Deref<Target = GuestMem> + Clone,
{
    /// Reads `chain`'s descriptors and copies the head of its readable part.
    pub fn new(mem: &GuestMem, chain: DescriptorChain<M>) -> Popped<M> {
        let mut descs = Descs::read(&chain);
        let copy = request::copy_head(mem, &descs);
        descs.keep_only_the_reply_room();
        Popped {
            chain,
            descs: Some(descs),
            copy,
        }
    }

    /// Lets go of a descriptor list that outgrew the stack before the request waits for a
    /// worker (or behind a pop's other requests past a budget): what waits stays small,
    /// whatever the guest's chains are like. The thread that serves it reads the list
    /// again. An overlong chain's list (`Descs::overlong`) always fits, and stays.
    pub fn park(&mut self) {
        if self.descs.as_ref().is_some_and(|d| d.heap_bytes() > 0) {
            self.descs = None;
        }
    }

    /// The heap its descriptor list takes while it waits unparked.
    pub fn heap_bytes(&self) -> usize {
        self.descs.as_ref().map_or(0, Descs::heap_bytes)
    }

    /// The chain's descriptors (read again if the request was parked) and the copy,
    /// finished (`request::finish`) from those descriptors.
    pub(crate) fn parts(&mut self, mem: &GuestMem) -> (&Descs, &Result<Request, BadRequest>) {
        let descs = self.descs.get_or_insert_with(|| Descs::read(&self.chain));
        match &mut self.copy {
            // Refused whole (EINVAL): nothing more of it is read.
            Ok(_) if descs.overlong => {}
            Ok(r) => {
                if let Err(e) = request::finish(mem, descs, r) {
                    self.copy = Err(e);
                }
            }
            Err(_) => {}
        }
        (descs, &self.copy)
    }

    /// The chain's head, for the used ring.
    pub fn head_index(&self) -> u16 {
        self.chain.head_index()
    }

    /// The guest memory the chain was popped from.
    pub fn memory(&self) -> &GuestMem {
        self.chain.memory()
    }

    /// The request's opcode, from its copy: None for one vfsd doesn't know, a chain
    /// without a readable header, or one too long to serve.
    pub fn opcode(&self) -> Option<Opcode> {
        match (&self.copy, &self.descs) {
            (_, Some(d)) if d.overlong => None,
            (Ok(r), _) => Opcode::of(r.hdr.opcode),
            _ => None,
        }
    }

    /// A READ's `size`, from its copy (None for another opcode or a request too short
    /// for one).
    pub fn read_size(&self) -> Option<u32> {
        use fuse_backend_rs::abi::fuse_abi::ReadIn;
        match &self.copy {
            Ok(r) if r.hdr.opcode == Opcode::Read as u32 => {
                super::codec::decode::<ReadIn>(r.bytes.get(HDR_LEN..)?).map(|a| a.size)
            }
            _ => None,
        }
    }

    /// A COPY_FILE_RANGE's `len`, from its copy (None for a request too short for one).
    pub fn copy_len(&self) -> Option<u64> {
        use fuse_backend_rs::abi::fuse_abi::CopyFileRangeIn;
        match &self.copy {
            Ok(r) => super::codec::decode::<CopyFileRangeIn>(&r.bytes[HDR_LEN..]).map(|a| a.len),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::wire::descs::mock_chain;
    use crate::server::wire::descs::MAX_DESCS;
    use crate::server::wire::guest::{in_memory, read_guest, write_guest};
    use fuse_backend_rs::abi::fuse_abi::{CopyFileRangeIn, InHeader};
    use vm_memory::ByteValued;
    use vm_memory::{Bytes, GuestAddress};

    const MEM: u64 = 0x10000;

    fn mem() -> GuestMem {
        GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
    }

    /// Pops the one chain made of `descs` (address, length, writable) and reads it.
    fn pop<'a>(mem: &'a GuestMem, descs: &[(u64, u32, bool)]) -> Popped<&'a GuestMem> {
        Popped::new(mem, mock_chain(mem, descs))
    }

    /// A COPY_FILE_RANGE of `len` bytes, header and arguments.
    fn copy_file_range(len: u64) -> Vec<u8> {
        let args = CopyFileRangeIn {
            len,
            ..Default::default()
        };
        let hdr = InHeader {
            len: (HDR_LEN + args.as_slice().len()) as u32,
            opcode: Opcode::CopyFileRange as u32,
            unique: 3,
            ..Default::default()
        };
        [hdr.as_slice(), args.as_slice()].concat()
    }

    #[test]
    fn a_chain_is_read_into_its_readable_and_writable_parts_in_order() {
        let mem = mem();
        let req = copy_file_range(4096);
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        let n = req.len() as u32;
        let p = pop(
            &mem,
            &[
                (0x8000, 40, false),
                (0x9000, 16, true),
                (0x8000 + 40, n - 40, false),
                (0xa000, 0, true),
                (0xb000, 24, true),
            ],
        );
        assert_eq!(p.descs.as_ref().unwrap().all().len(), 5);
        let readable: Vec<_> = p
            .descs
            .as_ref()
            .unwrap()
            .readable()
            .map(|d| d.addr().0)
            .collect();
        assert_eq!(readable, [0x8000, 0x8000 + 40]);
        let w: Vec<_> = p
            .descs
            .as_ref()
            .unwrap()
            .writable_bufs()
            .into_iter()
            .map(|(a, l)| (a.0, l))
            .collect();
        assert_eq!(w, [(0x9000, 16), (0xa000, 0), (0xb000, 24)]);
        // The copy joins the readable parts, whatever lies between them.
        assert_eq!(p.copy.as_ref().unwrap().bytes, req);
    }

    #[test]
    fn the_opcode_and_copy_length_come_from_the_copy_even_when_the_header_is_split() {
        let mem = mem();
        let req = copy_file_range(12345);
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        // 7-byte pieces: no descriptor holds the opcode or `len` whole.
        let mut descs: Vec<_> = (0..req.len() as u64)
            .step_by(7)
            .map(|o| (0x8000 + o, 7.min(req.len() as u64 - o) as u32, false))
            .collect();
        descs.push((0x9000, 16, true));
        let p = pop(&mem, &descs);
        assert_eq!(p.opcode(), Some(Opcode::CopyFileRange));
        assert_eq!(p.copy_len(), Some(12345));
        assert_eq!(p.head_index(), 0);
        // A header outside guest memory: no copy, so no opcode, and no length either.
        let p = pop(&mem, &[(MEM, 40, false), (0x9000, 16, true)]);
        assert!(matches!(p.copy, Err(BadRequest { hdr: None, .. })));
        assert_eq!((p.opcode(), p.copy_len()), (None, None));
        // A request too short for COPY_FILE_RANGE's arguments has no length.
        let p = pop(&mem, &[(0x8000, 48, false), (0x9000, 16, true)]);
        assert_eq!(p.opcode(), Some(Opcode::CopyFileRange));
        assert_eq!(p.copy_len(), None);
    }

    #[test]
    fn a_reads_size_comes_from_the_copy_and_only_for_a_read() {
        use fuse_backend_rs::abi::fuse_abi::ReadIn;
        let mem = mem();
        let args = ReadIn {
            size: 1 << 20,
            ..Default::default()
        };
        let hdr = InHeader {
            len: (HDR_LEN + args.as_slice().len()) as u32,
            opcode: Opcode::Read as u32,
            unique: 4,
            ..Default::default()
        };
        mem.write_slice(
            &[hdr.as_slice(), args.as_slice()].concat(),
            GuestAddress(0x8000),
        )
        .unwrap();
        let p = pop(&mem, &[(0x8000, 80, false), (0x9000, 16, true)]);
        assert_eq!(p.read_size(), Some(1 << 20));
        // Too short for ReadIn: no size.
        let p = pop(&mem, &[(0x8000, 48, false), (0x9000, 16, true)]);
        assert_eq!(p.read_size(), None);
        // Another opcode: no size, whatever its arguments say.
        let req = copy_file_range(1 << 20);
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        let p = pop(
            &mem,
            &[(0x8000, req.len() as u32, false), (0x9000, 16, true)],
        );
        assert_eq!(p.read_size(), None);
    }

    #[test]
    fn guest_reads_and_writes_cross_regions_and_refuse_memory_outside_them() {
        // Two regions with no gap, and a hole after them.
        let mem =
            GuestMem::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
                .unwrap();
        let data: Vec<u8> = (0..32u8).collect();
        write_guest(&mem, &data, GuestAddress(0x1000 - 16)).unwrap();
        let mut back = [0u8; 32];
        read_guest(&mem, &mut back, GuestAddress(0x1000 - 16)).unwrap();
        assert_eq!(&back[..], &data[..]);
        assert!(in_memory(&mem, GuestAddress(0x1000 - 16), 32));
        // Past the end: refused (a write may have filled the part inside, as vm-memory's
        // does: the reply path checks `in_memory` before it writes anything).
        assert!(!in_memory(&mem, GuestAddress(0x2000 - 16), 32));
        assert!(write_guest(&mem, &data, GuestAddress(0x2000 - 16)).is_err());
        assert!(read_guest(&mem, &mut back, GuestAddress(0x2000 - 16)).is_err());
        // Nothing at all is in memory anywhere, and always is.
        assert!(in_memory(&mem, GuestAddress(0x5000), 0));
    }

    /// A chain of `n` zero-length readable descriptors after a GETATTR header, and a
    /// reply buffer.
    fn long_chain(mem: &GuestMem, n: usize) -> Popped<&GuestMem> {
        let hdr = InHeader {
            len: HDR_LEN as u32 + 16,
            opcode: Opcode::Getattr as u32,
            unique: 5,
            ..Default::default()
        };
        mem.write_slice(hdr.as_slice(), GuestAddress(0x8000))
            .unwrap();
        mem.write_slice(&[0u8; 16], GuestAddress(0x8000 + HDR_LEN as u64))
            .unwrap();
        let mut descs = vec![(0x8000, 56, false)];
        descs.extend(std::iter::repeat_n((0x8100, 0, false), n));
        descs.push((0x9000, 256, true));
        pop(mem, &descs)
    }

    #[test]
    fn a_chain_longer_than_max_descs_is_read_no_further_and_not_placed() {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), 0x40000)]).unwrap();
        let mut p = long_chain(&mem, MAX_DESCS + 100);
        let d = p.descs.as_ref().unwrap();
        assert!(d.overlong());
        // Its reply buffer is not among the first MAX_DESCS: nothing is kept, and the
        // header was copied for the log.
        assert_eq!(d.all().len(), 0);
        assert_eq!(p.copy.as_ref().unwrap().hdr.unique, 5);
        // Placed nowhere special: the pool answers it (EINVAL, `FuseServer::handle`).
        assert_eq!(p.opcode(), None);
        // Nothing to park: it stays refused, and is never read again.
        p.park();
        assert!(p.descs.is_some());
        let (d, copy) = p.parts(&mem);
        assert!(d.overlong() && copy.is_ok());
        // A reply buffer among the first MAX_DESCS is all an overlong chain keeps.
        let hdr = InHeader {
            len: HDR_LEN as u32 + 16,
            opcode: Opcode::Getattr as u32,
            unique: 6,
            ..Default::default()
        };
        mem.write_slice(hdr.as_slice(), GuestAddress(0x8000))
            .unwrap();
        let mut descs = vec![(0x8000, 56, false), (0x9000, 256, true)];
        descs.extend(std::iter::repeat_n((0x9000, 0, true), MAX_DESCS));
        let p = pop(&mem, &descs);
        let d = p.descs.as_ref().unwrap();
        assert!(d.overlong() && d.heap_bytes() == 0);
        let w: Vec<_> = d
            .writable_bufs()
            .into_iter()
            .map(|(a, l)| (a.0, l))
            .collect();
        assert_eq!(w, [(0x9000, 256)]);
        assert_eq!(p.copy.as_ref().unwrap().hdr.unique, 6);
        // The longest chain allowed is read whole.
        let p = long_chain(&mem, MAX_DESCS - 2);
        let d = p.descs.as_ref().unwrap();
        assert!(!d.overlong());
        assert_eq!(d.all().len(), MAX_DESCS);
        assert_eq!(p.opcode(), Some(Opcode::Getattr));
    }

    #[test]
    fn a_pop_copies_the_head_and_the_serving_thread_the_rest() {
        let mem = mem();
        // A SETXATTR with a 4 KiB value: longer than the head.
        let total = HDR_LEN + 4096;
        let hdr = InHeader {
            len: total as u32,
            opcode: Opcode::Setxattr as u32,
            unique: 8,
            ..Default::default()
        };
        let mut req = hdr.as_slice().to_vec();
        req.extend((0..4096u32).map(|i| i as u8));
        mem.write_slice(&req, GuestAddress(0x8000)).unwrap();
        let mut p = pop(&mem, &[(0x8000, total as u32, false), (0x9000, 16, true)]);
        assert_eq!(p.copy.as_ref().unwrap().bytes, &req[..request::HEAD]);
        p.park();
        let (_, copy) = p.parts(&mem);
        assert_eq!(copy.as_ref().unwrap().bytes, req);
        // In 12 pieces, the list outgrows the stack: parked, it is read again, and the
        // rest copied after the head's 256 bytes, mid-descriptor.
        let pieces: Vec<_> = (0..12u64)
            .map(|i| {
                let len = if i == 11 {
                    total as u64 - 11 * 345
                } else {
                    345
                };
                (0x8000 + i * 345, len as u32, false)
            })
            .chain([(0x9000, 16, true)])
            .collect();
        let mut p = pop(&mem, &pieces);
        assert!(p.heap_bytes() > 0);
        p.park();
        assert!(p.descs.is_none() && p.heap_bytes() == 0);
        let (d, copy) = p.parts(&mem);
        assert_eq!(d.all().len(), 13);
        assert_eq!(copy.as_ref().unwrap().bytes, req);
        // Small requests are whole at the pop.
        let p = pop(&mem, &[(0x8000, 100, false), (0x9000, 16, true)]);
        let r = p.copy.as_ref().unwrap();
        assert!(r.whole && r.bytes == req[..100]);
        // The rest outside guest memory: EFAULT's header is the head's.
        let mut p = pop(
            &mem,
            &[(0x8000, 300, false), (MEM, 100, false), (0x9000, 16, true)],
        );
        assert!(p.copy.is_ok());
        let (_, copy) = p.parts(&mem);
        assert!(matches!(copy, Err(BadRequest { hdr: Some(h), .. }) if h.unique == 8));
    }
}
