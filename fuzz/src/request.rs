//! The `fuse_request` target: arbitrary bytes become FUSE requests.
//!
//! Input format (every byte string decodes; missing bytes read as zero):
//!
//! ```text
//! cfg: u8                      filesystem configuration (see `Fixture::new`)
//! record*                      up to MAX_RECORDS, served in order against one server
//!   flags: u8                  see `flag`
//!   req_len: u16 le            readable bytes (InHeader + body), at most 65535
//!   reply_len: u32 le          writable bytes, taken modulo REPLY_SPAN + 1 (so some
//!                              replies run past the data regions or guest memory)
//!   req: [u8; req_len]         the request as the guest wrote it (shorter at input end)
//! ```
//!
//! The request bytes are not interpreted by the harness (unless `FIX_LEN` asks it to set
//! `InHeader.len` to the real length), so truncated headers, lengths that disagree with the
//! buffers, unknown opcodes and huge sizes all reach the server as a guest would send them.

use fuse_backend_rs::abi::fuse_abi::*;
use vfsd::server::GuestMem;
use virtio_queue::QueueT;
use vm_memory::{ByteValued, Bytes, GuestAddress};

use crate::*;

pub mod flag {
    /// Header and body in separate descriptors (as the Linux driver sends them).
    pub const SPLIT_HEADER: u8 = 0x01;
    /// Out header and payload in separate writable descriptors.
    pub const SPLIT_REPLY: u8 = 0x02;
    /// Put the reply buffer across the boundary of two memory regions.
    pub const STRADDLE: u8 = 0x04;
    /// Send the chain through an indirect descriptor table.
    pub const INDIRECT: u8 = 0x08;
    /// Set `InHeader.len` to the real readable length.
    pub const FIX_LEN: u8 = 0x10;
    /// No writable descriptor at all.
    pub const NO_REPLY_BUF: u8 = 0x20;
    /// Zero-length readable and writable descriptors in front.
    pub const ZERO_LEN: u8 = 0x40;
    /// Writable descriptors before the readable ones (a spec violation).
    pub const WRITABLE_FIRST: u8 = 0x80;
}

pub const MAX_RECORDS: usize = 64;
pub const REQ_MAX: usize = 0xffff;
/// Replies start 64 KiB into the data region (after the largest request).
pub const REPLY_AT: u64 = DATA_BASE + 0x1_0000;
/// Reply sizes range up to a little past the end of guest memory.
pub const REPLY_SPAN: u32 = (DATA_SIZE - 0x1_0000 + TAIL_SIZE + 0x1000) as u32;
/// Queue size used for this target (the chain is at most 6 descriptors).
const QSIZE: u16 = 256;

#[derive(Clone, Debug)]
pub struct Record {
    pub flags: u8,
    pub reply_len: u32,
    pub bytes: Vec<u8>,
}

impl Record {
    pub fn new(flags: u8, reply_len: u32, bytes: Vec<u8>) -> Record {
        Record {
            flags,
            reply_len,
            bytes,
        }
    }
}

pub fn parse(data: &[u8]) -> (u8, Vec<Record>) {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return (0, Vec::new());
    };
    let mut recs = Vec::new();
    while !rest.is_empty() && recs.len() < MAX_RECORDS {
        let mut h = [0u8; 7];
        let n = rest.len().min(7);
        h[..n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
        let req_len = u16::from_le_bytes([h[1], h[2]]) as usize;
        let reply_len = u32::from_le_bytes([h[3], h[4], h[5], h[6]]);
        let take = req_len.min(rest.len());
        recs.push(Record::new(h[0], reply_len, rest[..take].to_vec()));
        rest = &rest[take..];
    }
    (cfg, recs)
}

pub fn encode(cfg: u8, recs: &[Record]) -> Vec<u8> {
    let mut v = vec![cfg];
    for r in recs {
        assert!(r.bytes.len() <= REQ_MAX);
        v.push(r.flags);
        v.extend_from_slice(&(r.bytes.len() as u16).to_le_bytes());
        v.extend_from_slice(&r.reply_len.to_le_bytes());
        v.extend_from_slice(&r.bytes);
    }
    v
}

/// The fuzz target body.
pub fn run(data: &[u8]) {
    init();
    let (cfg, recs) = parse(data);
    no_fd_leak(|| {
        let f = Fixture::new(cfg);
        let mem = guest_memory();
        for r in &recs {
            serve_one(&f, &mem, r);
        }
        f.settle();
        drop(f);
    });
}

/// Lays one request out as a descriptor chain, pops it from a queue as the device does,
/// serves it and checks the reply. Returns the used length.
pub fn serve_one(f: &Fixture, mem: &GuestMem, r: &Record) -> u32 {
    let fl = r.flags;
    let n = r.bytes.len().min(REQ_MAX);
    let mut req = r.bytes[..n].to_vec();
    if fl & flag::FIX_LEN != 0 && n >= 4 {
        req[..4].copy_from_slice(&(n as u32).to_le_bytes());
    }
    mem.write_slice(&req, GuestAddress(DATA_BASE)).unwrap();

    let mut readable: Vec<(u64, u32)> = Vec::new();
    if fl & flag::ZERO_LEN != 0 {
        readable.push((DATA_BASE, 0));
    }
    if fl & flag::SPLIT_HEADER != 0 && n > IN_HEADER_LEN {
        readable.push((DATA_BASE, IN_HEADER_LEN as u32));
        readable.push((DATA_BASE + IN_HEADER_LEN as u64, (n - IN_HEADER_LEN) as u32));
    } else {
        readable.push((DATA_BASE, n as u32));
    }

    let reply_len = r.reply_len % (REPLY_SPAN + 1);
    let reply_at = if fl & flag::STRADDLE != 0 {
        TAIL_BASE - (reply_len / 2) as u64
    } else {
        REPLY_AT
    };
    let mut writable: Vec<(u64, u32)> = Vec::new();
    if fl & flag::NO_REPLY_BUF == 0 {
        if fl & flag::ZERO_LEN != 0 {
            writable.push((reply_at, 0));
        }
        if fl & flag::SPLIT_REPLY != 0 && reply_len > OUT_HEADER_LEN as u32 {
            writable.push((reply_at, OUT_HEADER_LEN as u32));
            writable.push((
                reply_at + OUT_HEADER_LEN as u64,
                reply_len - OUT_HEADER_LEN as u32,
            ));
        } else {
            writable.push((reply_at, reply_len));
        }
    }
    // Stale bytes from an earlier reply must not pass for this one.
    let _ = mem.write_slice(
        &[0u8; 64][..(reply_len as usize).min(64)],
        GuestAddress(reply_at),
    );

    let mut descs: Vec<Desc> = Vec::new();
    let r_descs = readable.iter().map(|&(a, l)| Desc {
        addr: a,
        len: l,
        flags: 0,
        next: 0,
    });
    let w_descs = writable.iter().map(|&(a, l)| Desc {
        addr: a,
        len: l,
        flags: VRING_DESC_F_WRITE,
        next: 0,
    });
    if fl & flag::WRITABLE_FIRST != 0 {
        descs.extend(w_descs.chain(r_descs));
    } else {
        descs.extend(r_descs.chain(w_descs));
    }
    let count = descs.len();
    for (i, d) in descs.iter_mut().enumerate() {
        if i + 1 < count {
            d.flags |= VRING_DESC_F_NEXT;
            d.next = i as u16 + 1;
        }
    }
    if fl & flag::INDIRECT != 0 {
        for (i, d) in descs.iter().enumerate() {
            write_desc(mem, INDIRECT_BASE, i as u16, *d);
        }
        write_desc(
            mem,
            DESC_TABLE,
            0,
            Desc {
                addr: INDIRECT_BASE,
                len: 16 * count as u32,
                flags: VRING_DESC_F_INDIRECT,
                next: 0,
            },
        );
    } else {
        for (i, d) in descs.iter().enumerate() {
            write_desc(mem, DESC_TABLE, i as u16, *d);
        }
    }

    if readable.iter().all(|&(a, l)| in_one_region(a, l)) {
        clamp_fallocate(mem, &readable);
        mem.read_slice(&mut req, GuestAddress(DATA_BASE)).unwrap();
    }
    let mut q = new_queue(QSIZE, false, 0);
    write_avail(mem, QSIZE, 1, 0, &[0]);
    let chain = q
        .pop_descriptor_chain(mem)
        .expect("the harness offered one chain");
    let served = serve_chain(&f.server, mem, chain);

    // Checks.
    let capacity: u64 = writable.iter().map(|&(_, l)| l as u64).sum();
    let readable_ok = readable.iter().all(|&(a, l)| in_one_region(a, l));
    let writable_ok = writable.iter().all(|&(a, l)| in_one_region(a, l));
    let hdr = (readable_ok && n >= IN_HEADER_LEN).then(|| {
        let mut h = InHeader::default();
        h.as_mut_slice().copy_from_slice(&req[..IN_HEADER_LEN]);
        h
    });
    // A valid request that expects a reply, with room for one.
    let must_reply = hdr
        .as_ref()
        .is_some_and(|h| writable_ok && capacity >= OUT_HEADER_LEN as u64 && !no_reply(h.opcode));
    let used = match served {
        Served::Now(used) => used,
        Served::Later(later) => {
            // Answered (or suspended) by its waiter thread; checked at the input's end.
            f.expect_later(Expected {
                later,
                hdr,
                writable,
                check: true,
                must_reply,
            });
            return 0;
        }
    };
    q.add_used(mem, 0, used).expect("add_used");
    let reply = gather(mem, &writable, OUT_HEADER_LEN);
    check_reply(hdr.as_ref(), used, capacity, &reply);
    if must_reply {
        assert!(
            used > 0,
            "opcode {} got no reply although the guest left room for one",
            hdr.map_or(0, |h| h.opcode)
        );
    }
    used
}

// ---- seeds ---------------------------------------------------------------------------

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
}

/// Builds a request sequence for seeds.
pub struct Seq {
    cfg: u8,
    recs: Vec<Record>,
    unique: u64,
}

impl Seq {
    pub fn new(cfg: u8) -> Seq {
        Seq {
            cfg,
            recs: Vec::new(),
            unique: 0,
        }
    }

    /// A well-formed request with a 64 KiB reply buffer.
    pub fn req(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> &mut Self {
        self.req_with(0, 0x1_0000, opcode, nodeid, body)
    }

    pub fn req_with(
        &mut self,
        flags: u8,
        reply_len: u32,
        opcode: u32,
        nodeid: u64,
        body: &[u8],
    ) -> &mut Self {
        self.unique += 1;
        let bytes = hdr(opcode, nodeid, self.unique, body);
        self.recs.push(Record::new(flags, reply_len, bytes));
        self
    }

    pub fn raw(&mut self, flags: u8, reply_len: u32, bytes: Vec<u8>) -> &mut Self {
        self.recs.push(Record::new(flags, reply_len, bytes));
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        encode(self.cfg, &self.recs)
    }

    /// The requests, to serve them directly (the migration target's seeds).
    pub fn records(&self) -> &[Record] {
        &self.recs
    }
}

/// INIT's body; with FUSE_INIT_EXT (bit 30) the second flags word follows.
fn init_in(minor: u32, flags: u32) -> Vec<u8> {
    let mut v = obj(InitIn {
        major: 7,
        minor,
        max_readahead: 0x2_0000,
        flags,
    });
    if flags & (1 << 30) != 0 {
        v.extend_from_slice(&obj(InitIn2 {
            flags2: 0xffff_ffff,
            unused: [0; 11],
        }));
    }
    v
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use op::*;
    let mut out = Vec::new();
    const RDWR: u32 = libc::O_RDWR as u32;

    // File I/O on an existing file, then forget; once with the defaults, once with nodes
    // named by file handles and direct I/O (cache=never: parallel direct writes).
    for (name, cfg) in [("file_io", 0u8), ("file_io_handles_direct", 0x80 | 0x10)] {
        let mut s = Seq::new(cfg);
        s.req(INIT, 0, &init_in(38, 0x7fff_ffff))
            .req(LOOKUP, 1, &cstr("f"))
            .req(GETATTR, 2, &obj(GetattrIn::default()))
            .req(
                OPEN,
                2,
                &obj(OpenIn {
                    flags: RDWR,
                    fuse_flags: 0,
                }),
            )
            .req(
                READ,
                2,
                &obj(ReadIn {
                    fh: 1,
                    size: 4096,
                    ..Default::default()
                }),
            )
            .req(
                WRITE,
                2,
                &body(&[
                    &obj(WriteIn {
                        fh: 1,
                        offset: 100,
                        size: 5,
                        ..Default::default()
                    }),
                    b"hello",
                ]),
            )
            .req(
                FLUSH,
                2,
                &obj(FlushIn {
                    fh: 1,
                    ..Default::default()
                }),
            )
            .req(
                FSYNC,
                2,
                &obj(FsyncIn {
                    fh: 1,
                    ..Default::default()
                }),
            )
            .req(
                FALLOCATE,
                2,
                &obj(FallocateIn {
                    fh: 1,
                    offset: 0,
                    length: 65536,
                    mode: 0,
                    padding: 0,
                }),
            )
            .req(
                LSEEK,
                2,
                &obj(LseekIn {
                    fh: 1,
                    offset: 0,
                    whence: 3,
                    padding: 0,
                }),
            )
            .req(
                SETATTR,
                2,
                &obj(SetattrIn {
                    valid: 8 | 1,
                    size: 10,
                    mode: 0o600,
                    ..Default::default()
                }),
            )
            .req(
                RELEASE,
                2,
                &obj(ReleaseIn {
                    fh: 1,
                    ..Default::default()
                }),
            )
            .req(FORGET, 2, &obj(ForgetIn { nlookup: 1 }))
            .req(GETATTR, 2, &obj(GetattrIn::default()));
        out.push((name, s.bytes()));
    }

    // Names: mkdir, create, rename, link, symlink, mknod, readdir, unlink, rmdir (nodes
    // named by file handles).
    let mut s = Seq::new(0x80);
    s.req(INIT, 0, &init_in(31, 0))
        .req(
            MKDIR,
            1,
            &body(&[
                &obj(MkdirIn {
                    mode: 0o755,
                    umask: 0o22,
                }),
                &cstr("x"),
            ]),
        )
        .req(
            CREATE,
            2,
            &body(&[
                &obj(CreateIn {
                    flags: RDWR | libc::O_CREAT as u32,
                    mode: 0o100644,
                    umask: 0,
                    fuse_flags: 0,
                }),
                &cstr("y"),
            ]),
        )
        .req(
            WRITE,
            3,
            &body(&[
                &obj(WriteIn {
                    fh: 1,
                    offset: 0,
                    size: 3,
                    ..Default::default()
                }),
                b"abc",
            ]),
        )
        .req(
            RENAME,
            2,
            &body(&[&obj(RenameIn { newdir: 1 }), &cstr("y"), &cstr("z")]),
        )
        .req(
            RENAME2,
            1,
            &body(&[
                &obj(Rename2In {
                    newdir: 2,
                    flags: 1,
                    padding: 0,
                }),
                &cstr("z"),
                &cstr("w"),
            ]),
        )
        .req(
            LINK,
            1,
            &body(&[&obj(LinkIn { oldnodeid: 3 }), &cstr("hard")]),
        )
        .req(SYMLINK, 1, &body(&[&cstr("s"), &cstr("f")]))
        .req(READLINK, 4, &[])
        .req(
            MKNOD,
            1,
            &body(&[
                &obj(MknodIn {
                    mode: libc::S_IFIFO | 0o644,
                    rdev: 0,
                    umask: 0,
                    padding: 0,
                }),
                &cstr("q"),
            ]),
        )
        .req(OPENDIR, 1, &obj(OpenIn::default()))
        .req_with(
            0,
            4096,
            READDIRPLUS,
            1,
            &obj(ReadIn {
                fh: 2,
                size: 4096,
                ..Default::default()
            }),
        )
        .req_with(
            0,
            316,
            READDIR,
            1,
            &obj(ReadIn {
                fh: 2,
                size: 300,
                ..Default::default()
            }),
        )
        .req(
            FSYNCDIR,
            1,
            &obj(FsyncIn {
                fh: 2,
                ..Default::default()
            }),
        )
        .req(
            RELEASEDIR,
            1,
            &obj(ReleaseIn {
                fh: 2,
                ..Default::default()
            }),
        )
        .req(
            RELEASE,
            3,
            &obj(ReleaseIn {
                fh: 1,
                ..Default::default()
            }),
        )
        .req(UNLINK, 1, &cstr("hard"))
        .req(RMDIR, 1, &cstr("x"))
        .req(STATFS, 1, &[])
        .req(
            ACCESS,
            1,
            &obj(AccessIn {
                mask: 7,
                padding: 0,
            }),
        );
    out.push(("names", s.bytes()));

    // Extended attributes (xattr on).
    let mut s = Seq::new(0x01);
    s.req(INIT, 0, &init_in(38, 0))
        .req(
            SETXATTR,
            1,
            &body(&[
                &obj(SetxattrIn { size: 3, flags: 0 }),
                &cstr("user.a"),
                b"val",
            ]),
        )
        .req(
            GETXATTR,
            1,
            &body(&[
                &obj(GetxattrIn {
                    size: 0,
                    padding: 0,
                }),
                &cstr("user.a"),
            ]),
        )
        .req(
            GETXATTR,
            1,
            &body(&[
                &obj(GetxattrIn {
                    size: 64,
                    padding: 0,
                }),
                &cstr("user.a"),
            ]),
        )
        .req(
            LISTXATTR,
            1,
            &obj(GetxattrIn {
                size: 0,
                padding: 0,
            }),
        )
        .req(
            LISTXATTR,
            1,
            &obj(GetxattrIn {
                size: 64,
                padding: 0,
            }),
        )
        .req(REMOVEXATTR, 1, &cstr("user.a"));
    out.push(("xattr", s.bytes()));

    // Requests before INIT, escapes, special files, and opcodes vfsd answers itself.
    let mut s = Seq::new(0x08 | 0x20);
    s.req(LOOKUP, 1, &cstr(".."))
        .req(LOOKUP, 1, &cstr("up"))
        .req(LOOKUP, 1, &cstr("abs"))
        .req(LOOKUP, 1, &cstr("p"))
        .req(
            OPEN,
            2,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(LOOKUP, 1, &cstr("l"))
        .req(OPEN, 3, &obj(OpenIn::default()))
        .req(LOOKUP, 1, &cstr("f"))
        .req(LOOKUP, 1, &cstr("e"))
        .req(
            OPEN,
            4,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(
            OPEN,
            5,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(
            COPY_FILE_RANGE,
            4,
            &obj(CopyFileRangeIn {
                fh_in: 1,
                offset_in: 0,
                nodeid_out: 5,
                fh_out: 2,
                offset_out: 0,
                len: 8192,
                flags: 0,
            }),
        )
        .req(SYNCFS, 1, &[0u8; 8])
        .req(0, 1, &[])
        .req(19, 1, &[])
        .req(100, 1, &[])
        .req(u32::MAX, 1, &[])
        .req(SETUPMAPPING, 4, &[0u8; 40])
        .req(REMOVEMAPPING, 4, &[0u8; 24])
        .req(GETLK, 4, &[0u8; 48])
        .req(SETLKW, 4, &[0u8; 48])
        .req(BMAP, 4, &[0u8; 16])
        .req(IOCTL, 4, &[0u8; 32])
        .req(POLL, 4, &[0u8; 24])
        .req(INTERRUPT, 0, &obj(ForgetIn { nlookup: 3 }))
        .req(
            BATCH_FORGET,
            0,
            &body(&[
                &obj(BatchForgetIn { count: 2, dummy: 0 }),
                &obj(ForgetOne {
                    nodeid: 4,
                    nlookup: 1,
                }),
                &obj(ForgetOne {
                    nodeid: 5,
                    nlookup: 1,
                }),
            ]),
        )
        .req(DESTROY, 0, &[])
        .req(INIT, 0, &init_in(38, 0x4000_0000))
        .req(GETATTR, 1, &obj(GetattrIn::default()));
    out.push(("no_init_special", s.bytes()));

    // Locks: POSIX locks of two owners and flocks of two handles of one file, so that a
    // SETLKW waits on a waiter thread: one granted when the holder unlocks, one still
    // waiting when the input ends (stopped as a ring stop stops it).
    let lk = |fh: u64, owner: u64, typ: i32, flock: bool| {
        obj(LkIn {
            fh,
            owner,
            lk: FileLock {
                start: 0,
                end: 99,
                type_: typ as u32,
                pid: owner as u32,
            },
            lk_flags: flock as u32,
            padding: 0,
        })
    };
    let mut s = Seq::new(0);
    s.req(INIT, 0, &init_in(38, 0))
        .req(LOOKUP, 1, &cstr("f"))
        .req(
            OPEN,
            2,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(
            OPEN,
            2,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req(SETLK, 2, &lk(1, 1, libc::F_WRLCK, false))
        .req(GETLK, 2, &lk(2, 2, libc::F_RDLCK, false))
        .req(SETLKW, 2, &lk(2, 2, libc::F_RDLCK, false))
        .req(SETLK, 2, &lk(1, 1, libc::F_UNLCK, false))
        .req(SETLK, 2, &lk(1, 1, libc::F_WRLCK, true))
        .req(SETLKW, 2, &lk(2, 2, libc::F_WRLCK, true))
        .req_with(
            flag::ZERO_LEN,
            0x1_0000,
            SETLKW,
            2,
            &lk(2, 3, libc::F_WRLCK, false),
        );
    out.push(("locks", s.bytes()));

    // Malformed shapes: truncated headers, lying lengths, odd buffers.
    let mut s = Seq::new(0x10);
    let getattr = hdr(GETATTR, 1, 7, &obj(GetattrIn::default()));
    let mut lying = getattr.clone();
    lying[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    s.raw(0, 4096, getattr[..10].to_vec())
        .raw(0, 4096, Vec::new())
        .raw(0, 4096, lying)
        .raw(0, 8, getattr.clone())
        .raw(0, 0, getattr.clone())
        .raw(flag::NO_REPLY_BUF, 0, getattr.clone())
        .raw(flag::STRADDLE, 4096, getattr.clone())
        .raw(
            flag::INDIRECT | flag::SPLIT_HEADER | flag::SPLIT_REPLY,
            4096,
            getattr.clone(),
        )
        .raw(flag::ZERO_LEN | flag::WRITABLE_FIRST, 4096, getattr.clone())
        .raw(0, REPLY_SPAN, getattr)
        .req(LOOKUP, 1, &cstr("f"))
        .req(
            OPEN,
            2,
            &obj(OpenIn {
                flags: RDWR,
                fuse_flags: 0,
            }),
        )
        .req_with(
            0,
            0x1_0000,
            READ,
            2,
            &obj(ReadIn {
                fh: 1,
                size: u32::MAX,
                ..Default::default()
            }),
        )
        .req(
            WRITE,
            2,
            &body(&[
                &obj(WriteIn {
                    fh: 1,
                    offset: u64::MAX - 2,
                    size: 0x10_0000,
                    ..Default::default()
                }),
                b"xy",
            ]),
        )
        .req(
            BATCH_FORGET,
            0,
            &obj(BatchForgetIn {
                count: u32::MAX,
                dummy: 0,
            }),
        )
        .req(LOOKUP, 1, b"no-nul")
        .req(
            SETXATTR,
            1,
            &body(&[
                &obj(SetxattrIn {
                    size: u32::MAX,
                    flags: 0,
                }),
                &cstr("user.b"),
            ]),
        );
    out.push(("malformed", s.bytes()));

    out
}
