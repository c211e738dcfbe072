//! Regressions found while fuzzing the request path (docs/fuzzing.md). Each test replays
//! its input the way the fuzz harness does: a descriptor chain in guest memory, popped from a
//! virtqueue and served by `FuseServer::handle`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfsd::passthrough::{Config, PassthroughFs};
use vfsd::server::{FuseServer, GuestMem};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

const DESC_TABLE: u64 = 0x0;
const AVAIL_RING: u64 = 0x1000;
const USED_RING: u64 = 0x2000;
const REQUEST: u64 = 0x1_0000;
const REPLY: u64 = 0x2_0000;

/// Serves one request (an `InHeader` plus body) with a `reply_len`-byte writable buffer;
/// returns the reply the device wrote (used length bytes).
fn call(server: &FuseServer<PassthroughFs>, request: &[u8], reply_len: u32) -> Vec<u8> {
    let mem: GuestMem = GuestMem::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
    mem.write_slice(request, GuestAddress(REQUEST)).unwrap();
    let desc = |addr: u64, len: u32, flags: u16, next: u16| {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        d
    };
    // NEXT = 1, WRITE = 2.
    mem.write_slice(
        &desc(REQUEST, request.len() as u32, 1, 1),
        GuestAddress(DESC_TABLE),
    )
    .unwrap();
    mem.write_slice(&desc(REPLY, reply_len, 2, 0), GuestAddress(DESC_TABLE + 16))
        .unwrap();
    // avail: flags 0, idx 1, ring[0] = head 0.
    mem.write_slice(&[0, 0, 1, 0, 0, 0], GuestAddress(AVAIL_RING))
        .unwrap();

    let mut q = Queue::new(256).unwrap();
    q.set_size(16);
    q.set_desc_table_address(Some(DESC_TABLE as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL_RING as u32), Some(0));
    q.set_used_ring_address(Some(USED_RING as u32), Some(0));
    q.set_ready(true);
    let chain = q.pop_descriptor_chain(&mem).expect("one chain offered");
    struct Never;
    impl vfsd::server::Deferred for Never {
        fn finish(self: Box<Self>, _write: &mut dyn FnMut(&vfsd::server::GuestMem) -> u32) {
            unreachable!("no request here waits");
        }
        fn on_stop(&self, _cancel: Box<dyn Fn() + Send + Sync>) -> bool {
            unreachable!("no request here waits");
        }
        fn slot(&self) -> vfsd::server::Slot {
            unreachable!("no request here waits");
        }
        fn suspend(self: Box<Self>) {
            unreachable!("no request here waits");
        }
    }
    let used = server
        .handle(&mem, vfsd::server::Popped::new(&mem, chain), &mut || {
            Some(Box::new(Never))
        })
        .expect("answered at once");
    let mut reply = vec![0u8; used as usize];
    mem.read_slice(&mut reply, GuestAddress(REPLY)).unwrap();
    reply
}

/// `InHeader` (40 bytes) followed by `body`.
fn request(opcode: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(40 + body.len() as u32).to_le_bytes());
    v.extend_from_slice(&opcode.to_le_bytes());
    v.extend_from_slice(&1u64.to_le_bytes()); // unique
    v.extend_from_slice(&nodeid.to_le_bytes());
    v.extend_from_slice(&[0u8; 16]); // uid, gid, pid, padding
    v.extend_from_slice(body);
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn error_of(reply: &[u8]) -> i32 {
    i32::from_le_bytes(reply[4..8].try_into().unwrap())
}

/// LOOKUP + OPEN(O_RDWR) of `name` in the root: (nodeid, fh).
fn open(server: &FuseServer<PassthroughFs>, name: &str) -> (u64, u64) {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    let e = call(server, &request(1, 1, &n), 4096);
    assert_eq!(error_of(&e), 0, "LOOKUP {name}");
    let nodeid = u64_at(&e, 16);
    let mut open_in = (libc::O_RDWR as u32).to_le_bytes().to_vec();
    open_in.extend_from_slice(&[0u8; 4]);
    let o = call(server, &request(14, nodeid, &open_in), 4096);
    assert_eq!(error_of(&o), 0, "OPEN {name}");
    (nodeid, u64_at(&o, 16))
}

/// Two requests copying between the same two files in opposite directions, served at the
/// same time by two workers (as the device's thread pool does), must not deadlock.
///
/// Found by a two-worker check alongside the fuzzers. `PassthroughFs::copy_file_range`
/// (src/passthrough/file.rs) takes the destination's I/O lock exclusively and the
/// source's shared. Taken destination first, worker 1 (a -> b) would hold b and wait for a
/// while worker 2 (b -> a) held a and waited for b, and every later request that needs
/// either file's lock would hang with them; so the two locks are taken in one order, by
/// address, whichever mode each is taken in.
#[test]
fn copy_file_range_in_opposite_directions_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), vec![1u8; 4096]).unwrap();
    std::fs::write(dir.path().join("b"), vec![2u8; 4096]).unwrap();
    let server = Arc::new(FuseServer::new(Arc::new(
        PassthroughFs::new(Config::new(dir.path())).unwrap(),
    )));
    let (a, fa) = open(&server, "a");
    let (b, fb) = open(&server, "b");

    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (nin, fin, nout, fout) in [(a, fa, b, fb), (b, fb, a, fa)] {
        let (server, progress, stop) = (server.clone(), progress.clone(), stop.clone());
        workers.push(std::thread::spawn(move || {
            // CopyFileRangeIn: fh_in, off_in, nodeid_out, fh_out, off_out, len, flags.
            let mut body = Vec::new();
            for v in [fin, 0, nout, fout, 0, 4096, 0] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            let req = request(47, nin, &body);
            while !stop.load(Ordering::Relaxed) {
                let r = call(&server, &req, 4096);
                assert_eq!(error_of(&r), 0, "COPY_FILE_RANGE");
                progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // Copy for 3 s; no progress for 5 s means both workers are stuck.
    let start = Instant::now();
    let mut last = (0, Instant::now());
    while start.elapsed() < Duration::from_secs(3) || !workers.iter().all(|w| w.is_finished()) {
        if start.elapsed() >= Duration::from_secs(3) {
            stop.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(50));
        let p = progress.load(Ordering::Relaxed);
        if p != last.0 {
            last = (p, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(5) || workers.iter().all(|w| w.is_finished()),
            "COPY_FILE_RANGE a->b and b->a deadlocked after {p} copies"
        );
    }
    for w in workers {
        w.join().unwrap();
    }
}

/// `fuzz/regressions/fuse_request/init-reply-too-small.bin`: an INIT (7.38, so its reply
/// is 64 bytes after the header) with only 56 bytes of reply room. The reply did not fit,
/// was dropped, and the guest was left waiting. A reply that does not fit is answered with
/// an errno in the header, which always fits.
#[test]
fn a_reply_too_large_for_the_guests_buffer_is_answered_with_an_errno() {
    let input = include_bytes!("../../fuzz/regressions/fuse_request/init-reply-too-small.bin");
    // The harness's format (fuzz/src/request.rs): cfg, then flags, req_len u16, reply_len
    // u32, request bytes (shorter at the input's end).
    let req_len = u16::from_le_bytes([input[2], input[3]]) as usize;
    let reply_len = u32::from_le_bytes(input[4..8].try_into().unwrap());
    let req = &input[8..(8 + req_len).min(input.len())];
    assert_eq!(
        u32::from_le_bytes(req[4..8].try_into().unwrap()),
        26,
        "an INIT"
    );
    let dir = tempfile::tempdir().unwrap();
    let server = FuseServer::new(Arc::new(
        PassthroughFs::new(Config::new(dir.path())).unwrap(),
    ));
    let reply = call(&server, req, reply_len);
    assert_eq!(reply.len(), 16, "an errno reply, header only");
    assert_eq!(
        u64_at(&reply, 8),
        u64_at(req, 8),
        "under the request's unique"
    );
    assert!(error_of(&reply) < 0);
    // A GETATTR whose reply (16 + 104 bytes) has 40 bytes of room: the same.
    let reply = call(&server, &request(3, 1, &[0u8; 16]), 40);
    assert_eq!(reply.len(), 16);
    assert!(error_of(&reply) < 0);
}

/// A request that changes something (CREATE, MKDIR, WRITE...) with too little reply room
/// for its reply is refused before it acts: otherwise the file is made, or the node and
/// handle taken, and the guest never learns of them.
#[test]
fn a_request_whose_reply_cannot_fit_is_refused_before_it_acts() {
    let dir = tempfile::tempdir().unwrap();
    let server = FuseServer::new(Arc::new(
        PassthroughFs::new(Config::new(dir.path())).unwrap(),
    ));
    // CreateIn: flags, mode, umask, open_flags; then the name.
    let mut create = Vec::new();
    for v in [(libc::O_RDWR | libc::O_CREAT) as u32, 0o644, 0, 0] {
        create.extend_from_slice(&v.to_le_bytes());
    }
    create.extend_from_slice(b"made\0");
    let reply = call(&server, &request(35, 1, &create), 16 + 100);
    assert_eq!((reply.len(), error_of(&reply)), (16, -libc::EINVAL));
    assert!(!dir.path().join("made").exists(), "CREATE acted anyway");
    // MkdirIn: mode, umask; then the name.
    let mut mkdir = Vec::new();
    for v in [0o755u32, 0] {
        mkdir.extend_from_slice(&v.to_le_bytes());
    }
    mkdir.extend_from_slice(b"sub\0");
    let reply = call(&server, &request(9, 1, &mkdir), 16);
    assert_eq!((reply.len(), error_of(&reply)), (16, -libc::EINVAL));
    assert!(!dir.path().join("sub").exists(), "MKDIR acted anyway");
    // With room for the reply, both work.
    assert_eq!(error_of(&call(&server, &request(35, 1, &create), 4096)), 0);
    assert_eq!(error_of(&call(&server, &request(9, 1, &mkdir), 4096)), 0);
}
