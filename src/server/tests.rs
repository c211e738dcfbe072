//! The server's decoding and replies over a fake filesystem: no host directory, and
//! every call the server makes of the filesystem recorded.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{EntryOut, ForgetIn, GetattrIn, InHeader, MkdirIn, OutHeader};
use fuse_backend_rs::api::filesystem::{Context, Entry};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::wire::descs::mock_chain;
use super::{Deferred, FuseServer, GuestMem, Opcode, Popped};
use crate::filesystem::{CreateExt, FileSystem, NoLockWait};

const MEM: u64 = 0x10000;
const REQ_AT: u64 = 0x4000;
const REPLY_AT: u64 = 0x8000;
const HDR: usize = size_of::<OutHeader>();

/// Answers LOOKUP, GETATTR, MKDIR and FORGET; GETATTR of node 13 panics. Records each
/// call.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<String>>,
}

impl Fake {
    fn saw(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn entry(inode: u64) -> Entry {
    Entry {
        inode,
        generation: 7,
        attr_timeout: Duration::from_secs(2),
        entry_timeout: Duration::from_millis(3500),
        ..Default::default()
    }
}

impl FileSystem for Fake {
    type LockWait = NoLockWait;

    fn negotiate(&self) -> u64 {
        0
    }

    fn start_session(&self, _enabled: u64) {}

    fn enabled(&self, _flag: u64) -> bool {
        false
    }

    fn destroy(&self) {}

    fn lookup(&self, _ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        self.saw(format!("lookup {parent} {}", name.to_str().unwrap()));
        Ok(entry(42))
    }

    fn forget(&self, _ctx: &Context, node: u64, count: u64) {
        self.saw(format!("forget {node} {count}"));
    }

    fn getattr(
        &self,
        _ctx: &Context,
        node: u64,
        _fh: Option<u64>,
    ) -> io::Result<(libc::stat64, Duration)> {
        self.saw(format!("getattr {node}"));
        assert_ne!(node, 13, "the fake's panic");
        // SAFETY: stat64 is plain integers, for which zero is a value.
        Ok((unsafe { std::mem::zeroed() }, Duration::ZERO))
    }

    fn mkdir(
        &self,
        _ctx: &Context,
        parent: u64,
        name: &CStr,
        _mode: u32,
        _umask: u32,
        _ext: &CreateExt,
    ) -> io::Result<Entry> {
        self.saw(format!("mkdir {parent} {}", name.to_str().unwrap()));
        Ok(entry(43))
    }
}

fn server() -> (Arc<Fake>, FuseServer<Fake>) {
    let fs = Arc::new(Fake::default());
    (fs.clone(), FuseServer::new(fs))
}

/// A request of `opcode` for `nodeid` with `args` after its header; `len` overrides the
/// header's length.
fn request(opcode: u32, nodeid: u64, args: &[u8], len: Option<u32>) -> Vec<u8> {
    let hdr = InHeader {
        len: len.unwrap_or((size_of::<InHeader>() + args.len()) as u32),
        opcode,
        unique: 9,
        nodeid,
        ..Default::default()
    };
    [hdr.as_slice(), args].concat()
}

/// Serves `req` from one readable descriptor with `room` bytes of reply buffer: the used
/// length and the guest memory after it.
fn serve(server: &FuseServer<Fake>, req: &[u8], room: u32) -> (u32, GuestMem) {
    let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
    mem.write_slice(req, GuestAddress(REQ_AT)).unwrap();
    let descs = [(REQ_AT, req.len() as u32, false), (REPLY_AT, room, true)];
    let popped = Popped::new(&mem, mock_chain(&mem, &descs));
    let mut defer = || -> Option<Box<dyn Deferred>> { None };
    let len = server
        .handle(&mem, popped, &mut defer)
        .expect("answered now");
    (len, mem)
}

fn out_header(mem: &GuestMem) -> OutHeader {
    mem.read_obj(GuestAddress(REPLY_AT)).unwrap()
}

#[test]
fn a_lookup_reply_is_a_header_and_the_entry() {
    let (fs, server) = server();
    let (len, mem) = serve(
        &server,
        &request(Opcode::Lookup as u32, 1, b"f\0", None),
        4096,
    );
    assert_eq!(fs.calls(), ["lookup 1 f"]);
    assert_eq!(len as usize, HDR + size_of::<EntryOut>());
    let h = out_header(&mem);
    assert_eq!((h.len, h.error, h.unique), (len, 0, 9));
    let e: EntryOut = mem.read_obj(GuestAddress(REPLY_AT + HDR as u64)).unwrap();
    assert_eq!((e.nodeid, e.generation), (42, 7));
    assert_eq!((e.entry_valid, e.entry_valid_nsec), (3, 500_000_000));
    assert_eq!((e.attr_valid, e.attr_valid_nsec), (2, 0));
}

#[test]
fn a_body_shorter_than_its_arguments_is_einval_and_never_reaches_the_filesystem() {
    let (fs, server) = server();
    let args = GetattrIn::default();
    let short = &args.as_slice()[..4];
    let (len, mem) = serve(
        &server,
        &request(Opcode::Getattr as u32, 5, short, None),
        4096,
    );
    assert_eq!(len as usize, HDR);
    assert_eq!(out_header(&mem).error, -libc::EINVAL);
    // A header claiming more than was sent, the same.
    let full = GetattrIn::default();
    let req = request(Opcode::Getattr as u32, 5, full.as_slice(), Some(200));
    let (len, mem) = serve(&server, &req, 4096);
    assert_eq!(len as usize, HDR);
    assert_eq!(out_header(&mem).error, -libc::EINVAL);
    // A name without its NUL.
    let (_, mem) = serve(
        &server,
        &request(Opcode::Lookup as u32, 1, b"f", None),
        4096,
    );
    assert_eq!(out_header(&mem).error, -libc::EINVAL);
    assert!(fs.calls().is_empty(), "{:?}", fs.calls());
    assert_eq!(server.stats().count(Opcode::Getattr as u32), 2);
}

#[test]
fn a_create_whose_reply_would_not_fit_is_refused_before_the_filesystem_acts() {
    let (fs, server) = server();
    let mut args = MkdirIn::default().as_slice().to_vec();
    args.extend_from_slice(b"d\0");
    let req = request(Opcode::Mkdir as u32, 1, &args, None);
    // Room for the header and half the entry.
    let room = (HDR + size_of::<EntryOut>() / 2) as u32;
    let (len, mem) = serve(&server, &req, room);
    assert_eq!(len as usize, HDR);
    assert_eq!(out_header(&mem).error, -libc::EINVAL);
    assert!(
        fs.calls().is_empty(),
        "the filesystem made {:?}",
        fs.calls()
    );
    // With room for it, the directory is made.
    let (len, _) = serve(&server, &req, 4096);
    assert_eq!(len as usize, HDR + size_of::<EntryOut>());
    assert_eq!(fs.calls(), ["mkdir 1 d"]);
}

#[test]
fn unknown_and_unserved_opcodes_are_enosys() {
    let (fs, server) = server();
    // 19 is not an opcode; SYNCFS is one the fake does not serve.
    for op in [19, 4096, Opcode::Syncfs as u32] {
        let (len, mem) = serve(&server, &request(op, 1, &[0; 8], None), 4096);
        assert_eq!(len as usize, HDR, "opcode {op}");
        let h = out_header(&mem);
        assert_eq!((h.error, h.unique), (-libc::ENOSYS, 9), "opcode {op}");
    }
    assert!(fs.calls().is_empty());
}

#[test]
fn a_panic_in_the_filesystem_is_answered_eio() {
    let (fs, server) = server();
    let args = GetattrIn::default();
    let (len, mem) = serve(
        &server,
        &request(Opcode::Getattr as u32, 13, args.as_slice(), None),
        4096,
    );
    assert_eq!(fs.calls(), ["getattr 13"]);
    assert_eq!(len as usize, HDR);
    assert_eq!(out_header(&mem).error, -libc::EIO);
    assert_eq!(server.stats().panics.load(Ordering::Relaxed), 1);
    // The server goes on.
    let (len, mem) = serve(
        &server,
        &request(Opcode::Getattr as u32, 5, args.as_slice(), None),
        4096,
    );
    assert_eq!(out_header(&mem).error, 0);
    assert!(len as usize > HDR);
}

#[test]
fn a_forget_reaches_the_filesystem_and_gets_no_reply() {
    let (fs, server) = server();
    let args = ForgetIn { nlookup: 3 };
    let (len, mem) = serve(
        &server,
        &request(Opcode::Forget as u32, 42, args.as_slice(), None),
        4096,
    );
    assert_eq!(len, 0);
    assert_eq!(out_header(&mem).unique, 0, "nothing written");
    assert_eq!(fs.calls(), ["forget 42 3"]);
}
