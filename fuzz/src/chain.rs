//! The `descriptor_chain` target: the guest controls the descriptor table, the avail ring,
//! indirect tables and buffer contents; the harness pops chains from a `Queue` exactly as
//! `FsDevice::process_queue` does and serves each through `FuseServer::handle`.
//!
//! Input format (every byte string decodes; missing bytes read as zero):
//!
//! ```text
//! cfg: u8             bits 0-3: queue size 1 << min(v, 10); bit 4: EVENT_IDX
//! next_avail: u16     the device's position in the avail ring
//! delta: u16          avail.idx = next_avail + delta (more than the queue size is invalid)
//! n: u8, desc[n]      main descriptor table, entries 0..n (n capped at the queue size)
//! n: u8, u16[n]       avail ring entries from slot next_avail % size on
//! n: u8 (mod 9)       indirect tables, each `m: u8, desc[m]`, at INDIRECT_BASE + i * 64 KiB
//! n: u8 (mod 17)      blobs written into guest memory afterwards, each:
//!   kind: u8, at: u32     bit 0: 0 = FUSE request, 1 = raw bytes;
//!                         bit 7: into the indirect-table area instead of the data regions
//!   request: opcode u8, nodeid u8, body_len u16, body   (InHeader.len is correct)
//!   raw:     len u16, bytes
//!
//! desc := k: u8, addr, len, flags, next
//!   addr by k & 3:  0 data region + u32 offset;  1 indirect slot u8 + u16 offset;
//!                   2 raw u64;  3 boundary u8 (region edges, end of memory, 2^32, u64::MAX)
//!                   + i16 delta
//!   len by (k >> 2) & 3:  0 u8;  1 u16;  2 raw u32;  3 u8 * 16 (an indirect table size)
//!   flags: k & 0x40 ? raw u16 : u8 & 7 (NEXT | WRITE | INDIRECT)
//!   next:  k & 0x80 ? raw u16 : u8
//! ```

use std::ops::Deref;

use fuse_backend_rs::abi::fuse_abi::InHeader;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};

use crate::*;

/// Bounds the device loop mirror: more rounds than this means `process_queue` would spin.
const MAX_ROUNDS: usize = 64;

pub struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    pub fn new(d: &'a [u8]) -> Self {
        Cursor(d)
    }
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = self.0.len().min(N);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

const BOUNDARIES: [u64; 10] = [
    0,
    REGION0_SIZE as u64,
    DATA_BASE,
    TAIL_BASE,
    MEM_END,
    1 << 32,
    u64::MAX,
    AVAIL_RING,
    USED_RING,
    INDIRECT_BASE,
];

fn desc(c: &mut Cursor) -> Desc {
    let k = c.u8();
    let addr = match k & 3 {
        0 => DATA_BASE + c.u32() as u64 % (DATA_SIZE + TAIL_SIZE) as u64,
        1 => INDIRECT_BASE + (c.u8() as u64 % INDIRECT_TABLES) * INDIRECT_SLOT + c.u16() as u64,
        2 => c.u64(),
        _ => {
            let b = BOUNDARIES[c.u8() as usize % BOUNDARIES.len()];
            b.wrapping_add(c.u16() as i16 as i64 as u64)
        }
    };
    let len = match (k >> 2) & 3 {
        0 => c.u8() as u32,
        1 => c.u16() as u32,
        2 => c.u32(),
        _ => c.u8() as u32 * 16,
    };
    let flags = if k & 0x40 != 0 {
        c.u16()
    } else {
        (c.u8() & 7) as u16
    };
    let next = if k & 0x80 != 0 {
        c.u16()
    } else {
        c.u8() as u16
    };
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

/// The fuzz target body.
pub fn run(data: &[u8]) {
    init();
    no_fd_leak(|| {
        let f = Fixture::new(0x01);
        serve(&f, data);
        f.settle();
        drop(f);
    });
}

/// Decodes `data` into guest memory and serves every chain the queue yields.
pub fn serve(f: &Fixture, data: &[u8]) {
    let mem = guest_memory();
    let mut c = Cursor::new(data);
    let cfg = c.u8();
    let size: u16 = 1 << (cfg & 0x0f).min(10);
    let event_idx = cfg & 0x10 != 0;
    let next_avail = c.u16();
    let delta = c.u16();

    let n = (c.u8() as u16).min(size);
    for i in 0..n {
        write_desc(&mem, DESC_TABLE, i, desc(&mut c));
    }
    let n = c.u8();
    let ring: Vec<u16> = (0..n).map(|_| c.u16()).collect();
    write_avail(
        &mem,
        size,
        next_avail.wrapping_add(delta),
        next_avail,
        &ring,
    );
    let tables = c.u8() as u64 % (INDIRECT_TABLES + 1);
    for t in 0..tables {
        let m = c.u8();
        for i in 0..m {
            write_desc(
                &mem,
                INDIRECT_BASE + t * INDIRECT_SLOT,
                i as u16,
                desc(&mut c),
            );
        }
    }
    let blobs = c.u8() % 17;
    for _ in 0..blobs {
        let kind = c.u8();
        let at = c.u32() as u64;
        let addr = if kind & 0x80 != 0 {
            INDIRECT_BASE + at % (INDIRECT_TABLES * INDIRECT_SLOT)
        } else {
            DATA_BASE + at % (DATA_SIZE + TAIL_SIZE) as u64
        };
        let bytes = if kind & 1 == 0 {
            let opcode = c.u8() as u32;
            let nodeid = c.u8() as u64;
            let len = c.u16() as usize;
            hdr(opcode, nodeid, at, c.bytes(len))
        } else {
            let len = c.u16() as usize;
            c.bytes(len).to_vec()
        };
        let _ = mem.write_slice(&bytes, GuestAddress(addr));
    }

    let mut q = new_queue(size, event_idx, next_avail);
    let atomic = GuestMemoryAtomic::new(mem);
    let m = atomic.memory();
    // A mirror of FsDevice::process_queue (single-threaded path).
    for _ in 0..MAX_ROUNDS {
        if event_idx {
            let _ = q.disable_notification(m.deref());
        }
        let chains: Vec<_> = match q.iter(m.clone()) {
            Ok(it) => it.collect(),
            Err(_) => return,
        };
        for chain in chains {
            let head = chain.head_index();
            let segs: Vec<Desc> = chain
                .clone()
                .map(|d| Desc {
                    addr: d.addr().0,
                    len: d.len(),
                    flags: d.flags(),
                    next: d.next(),
                })
                .collect();
            let writable: Vec<(u64, u32)> = segs
                .iter()
                .filter(|d| d.flags & VRING_DESC_F_WRITE != 0)
                .map(|d| (d.addr, d.len))
                .collect();
            let readable: Vec<(u64, u32)> = segs
                .iter()
                .filter(|d| d.flags & VRING_DESC_F_WRITE == 0)
                .map(|d| (d.addr, d.len))
                .collect();
            let capacity: u64 = writable.iter().map(|&(_, l)| l as u64).sum();
            let disjoint = pairwise_disjoint(&segs);
            let hdr = (disjoint && readable.iter().all(|&(a, l)| in_one_region(a, l)))
                .then(|| gather(m.deref(), &readable, IN_HEADER_LEN))
                .filter(|b| b.len() == IN_HEADER_LEN)
                .map(|b| {
                    let mut h = InHeader::default();
                    h.as_mut_slice().copy_from_slice(&b);
                    h
                });

            if readable.iter().all(|&(a, l)| in_one_region(a, l)) {
                clamp_fallocate(m.deref(), &readable);
            }
            let used = match serve_chain(&f.server, m.deref(), chain) {
                Served::Now(used) => used,
                Served::Later(later) => {
                    // Answered by its waiter thread later; checked at the input's end.
                    f.expect_later(Expected {
                        later,
                        hdr,
                        writable,
                        check: disjoint,
                        must_reply: false,
                    });
                    continue;
                }
            };

            let reply = gather(m.deref(), &writable, OUT_HEADER_LEN);
            if disjoint {
                check_reply(hdr.as_ref(), used, capacity, &reply);
            } else {
                assert!(
                    used as u64 <= capacity,
                    "used length {used} exceeds the chain's {capacity} writable bytes"
                );
            }
            let _ = q.add_used(m.deref(), head, used);
            let _ = q.needs_notification(m.deref());
        }
        if !event_idx {
            return;
        }
        match q.enable_notification(m.deref()) {
            Ok(true) => continue,
            _ => return,
        }
    }
    panic!("the device's queue loop did not stop after {MAX_ROUNDS} rounds");
}

/// Whether no two descriptors (nor the queue structures) share bytes: only then can the
/// reply header be read back unchanged.
fn pairwise_disjoint(segs: &[Desc]) -> bool {
    let mut spans: Vec<(u64, u64)> = segs
        .iter()
        .filter(|d| d.len > 0)
        .map(|d| (d.addr, d.addr.saturating_add(d.len as u64)))
        .collect();
    spans.push((DESC_TABLE, INDIRECT_BASE + INDIRECT_TABLES * INDIRECT_SLOT));
    spans.sort();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}

// ---- seeds ---------------------------------------------------------------------------

/// Encodes inputs for this target (seeds).
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn header(size_log2: u8, event_idx: bool, next_avail: u16, delta: u16) -> Enc {
        let mut e = Enc(vec![size_log2 | if event_idx { 0x10 } else { 0 }]);
        e.0.extend_from_slice(&next_avail.to_le_bytes());
        e.0.extend_from_slice(&delta.to_le_bytes());
        e
    }
    /// A descriptor with a raw address and length.
    pub fn desc(&mut self, d: Desc) {
        self.0.push(2 | (2 << 2) | 0x40 | 0x80);
        self.0.extend_from_slice(&d.addr.to_le_bytes());
        self.0.extend_from_slice(&d.len.to_le_bytes());
        self.0.extend_from_slice(&d.flags.to_le_bytes());
        self.0.extend_from_slice(&d.next.to_le_bytes());
    }
    pub fn descs(&mut self, ds: &[Desc]) {
        self.0.push(ds.len() as u8);
        for d in ds {
            self.desc(*d);
        }
    }
    pub fn ring(&mut self, heads: &[u16]) {
        self.0.push(heads.len() as u8);
        for h in heads {
            self.0.extend_from_slice(&h.to_le_bytes());
        }
    }
    pub fn tables(&mut self, tables: &[&[Desc]]) {
        self.0.push(tables.len() as u8);
        for t in tables {
            self.descs(t);
        }
    }
    /// Blobs: (data-region offset, opcode, nodeid, body) requests.
    pub fn requests(&mut self, reqs: &[(u32, u8, u8, &[u8])]) {
        self.0.push(reqs.len() as u8);
        for (at, op, node, body) in reqs {
            self.0.push(0);
            self.0.extend_from_slice(&at.to_le_bytes());
            self.0.push(*op);
            self.0.push(*node);
            self.0.extend_from_slice(&(body.len() as u16).to_le_bytes());
            self.0.extend_from_slice(body);
        }
    }
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> Desc {
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::request::op;
    const N: u16 = VRING_DESC_F_NEXT;
    const W: u16 = VRING_DESC_F_WRITE;
    const I: u16 = VRING_DESC_F_INDIRECT;
    let req = DATA_BASE;
    let reply = DATA_BASE + 0x1_0000;
    let getattr_body = [0u8; 16];
    let lookup_body = cstr("f");
    let mut out = Vec::new();

    // Two well-formed chains: GETATTR (header + body + reply) and LOOKUP.
    let mut e = Enc::header(4, false, 0, 2);
    e.descs(&[
        d(req, 56, N, 1),
        d(reply, 4096, W, 0),
        d(req + 0x1000, 42, N, 3),
        d(reply + 0x1000, 16, W | N, 4),
        d(reply + 0x2000, 4096, W, 0),
    ]);
    e.ring(&[0, 2]);
    e.tables(&[]);
    e.requests(&[
        (0, op::GETATTR as u8, 1, &getattr_body),
        (0x1000, op::LOOKUP as u8, 1, &lookup_body),
    ]);
    out.push(("two_chains", e.0));

    // An indirect table holding the chain, with EVENT_IDX.
    let mut e = Enc::header(3, true, 5, 1);
    e.descs(&[d(INDIRECT_BASE, 32, I, 0)]);
    e.ring(&[0]);
    e.tables(&[&[d(req, 56, N, 1), d(reply, 4096, W, 0)]]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("indirect", e.0));

    // A loop: 0 -> 1 -> 0.
    let mut e = Enc::header(4, false, 0, 1);
    e.descs(&[d(req, 56, N, 1), d(reply, 4096, W | N, 0)]);
    e.ring(&[0]);
    e.tables(&[]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("loop", e.0));

    // Nested indirect tables and an indirect entry mid-chain.
    let mut e = Enc::header(4, false, 0, 2);
    e.descs(&[
        d(INDIRECT_BASE, 32, I, 0),
        d(req, 56, N, 2),
        d(INDIRECT_BASE + INDIRECT_SLOT, 16, I, 0),
    ]);
    e.ring(&[0, 1]);
    e.tables(&[
        &[
            d(INDIRECT_BASE + INDIRECT_SLOT, 16, I | N, 1),
            d(reply, 64, W, 0),
        ],
        &[d(reply, 4096, W, 0)],
    ]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("nested_indirect", e.0));

    // Out-of-memory and overflowing addresses, a buffer across two regions, zero-length
    // and too-small reply buffers, an out-of-range head, and an avail index too far ahead.
    let mut e = Enc::header(2, false, 0xfffe, 4);
    e.descs(&[
        d(MEM_END - 8, 56, N, 1),
        d(u64::MAX - 8, 4096, W, 0),
        d(req, 56, N, 3),
        d(TAIL_BASE - 8, 16, W, 0),
    ]);
    e.ring(&[0, 2, 9, 3]);
    e.tables(&[]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("bad_addresses", e.0));

    let mut e = Enc::header(1, false, 0, 2);
    e.descs(&[d(req, 56, N, 1), d(reply, 0, W, 0)]);
    e.ring(&[0, 0]);
    e.tables(&[]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("zero_reply", e.0));

    let mut e = Enc::header(1, false, 0, 1);
    e.descs(&[d(req, 56, N, 1), d(reply, 8, W, 0)]);
    e.ring(&[0]);
    e.tables(&[]);
    e.requests(&[(0, op::GETATTR as u8, 1, &getattr_body)]);
    out.push(("small_reply", e.0));

    let mut e = Enc::header(3, false, 0, 9);
    e.descs(&[d(req, 56, 0, 0)]);
    e.ring(&[0]);
    out.push(("avail_too_far", e.0));

    out
}
