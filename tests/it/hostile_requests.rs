//! A hostile guest's requests: a header rewritten
//! while the daemon serves it, a request that makes a worker panic, and READDIRPLUS entries
//! whose lookup fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, dir_names, errno, require_root, Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::InHeader;
use vfsd::frontend::fuse::*;
use vm_memory::{Bytes, GuestAddress};

/// Item 7: the guest flips the opcode of its pending requests between GETATTR and
/// COPY_FILE_RANGE as fast as it can. Each request must be served as one or the other,
/// decided once: GETATTR's reply or COPY_FILE_RANGE's EINVAL (its arguments are too short).
/// A daemon that reads the header twice lets fuse-backend-rs see COPY_FILE_RANGE after vfsd
/// decided on GETATTR, and the crate (FUSE 7.33) answers ENOSYS.
#[test]
fn a_header_rewritten_mid_request_is_served_as_one_opcode() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = Arc::new(d.client());
    let slots: Vec<u64> = {
        let q = c.fe.queues[1].lock().unwrap();
        (0..q.slots()).map(|s| q.slot_addrs(s).0).collect()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut op = FUSE_GETATTR;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                op = if op == FUSE_GETATTR {
                    FUSE_COPY_FILE_RANGE
                } else {
                    FUSE_GETATTR
                };
                for &a in &slots {
                    c.fe.mem.write_obj(op, GuestAddress(a + 4)).unwrap();
                }
                n += 1;
                if n.is_multiple_of(64) {
                    std::thread::yield_now();
                }
            }
        })
    };
    let (mut getattr, mut einval, mut enosys, mut other) = (0, 0, 0, 0);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        let tickets: Vec<Ticket> = (0..8)
            .map(|_| {
                c.submit(1, FUSE_GETATTR, ROOT, &[&[0u8; 16]], 4096)
                    .unwrap()
            })
            .collect();
        for tk in tickets {
            match c.wait(tk).unwrap().error {
                0 => getattr += 1,
                e if e == -libc::EINVAL => einval += 1,
                e if e == -libc::ENOSYS => enosys += 1,
                _ => other += 1,
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    eprintln!("getattr {getattr}, einval {einval}, enosys {enosys}, other {other}");
    assert!(
        getattr > 0 && einval > 0,
        "the flips must have raced the daemon"
    );
    assert_eq!(
        enosys, 0,
        "a request was dispatched on two different opcodes"
    );
    assert_eq!(other, 0);
    c.getattr(ROOT).unwrap();
}

/// Item 8: a request whose handler panics is answered with EIO and counted, and its worker
/// goes on serving. VFSD_TEST_PANIC_NODEID makes every request for one node panic (in a
/// build with the `test-hooks` feature).
#[cfg(feature = "test-hooks")]
#[test]
fn a_panicking_request_gets_eio_and_the_workers_live_on() {
    std::env::set_var("VFSD_TEST_PANIC_NODEID", "2");
    let d = Daemon::start(&["--thread-pool-size", "2"]);
    std::env::remove_var("VFSD_TEST_PANIC_NODEID");
    std::fs::write(d.path("victim"), b"x").unwrap();
    std::fs::write(d.path("other"), b"fine").unwrap();
    let mut c = d.client();
    c.timeout = Duration::from_secs(5);
    let v = c.lookup(ROOT, "victim").unwrap();
    assert_eq!(v.nodeid, 2, "the first node looked up is node 2");
    // More panics than workers: a pool that lost its threads would stop answering.
    for _ in 0..6 {
        assert_eq!(errno(c.getattr(v.nodeid)), libc::EIO);
    }
    let o = c.lookup(ROOT, "other").unwrap();
    let h = c.open(o.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(c.read(o.nodeid, h.fh, 0, 4).unwrap(), b"fine");
    // A READ of the panicking node (queue thread first, then the pool) gets EIO too.
    let (u, req) = c.read_req(v.nodeid, 1, 0, 4);
    let t = c.submit_bytes(1, &req, 4096, u).unwrap();
    assert_eq!(c.wait(t).unwrap().error, -libc::EIO);
    assert_eq!(c.getattr(o.nodeid).unwrap().attr.size, 4);
    assert!(d.stats()["panics"].as_u64().unwrap() >= 7);
}

/// Item 9: a READDIRPLUS entry whose lookup fails keeps its name (a plain entry, node id 0,
/// which the guest looks up itself later), and the entries around it keep theirs.
#[test]
#[ignore = "needs root"]
fn readdirplus_never_loses_a_name_whose_lookup_fails() {
    require_root("needs root to mount");
    let share = tempfile::tempdir().unwrap();
    for n in ["a", "b", "mnt", "y", "z"] {
        std::fs::create_dir(share.path().join(n)).unwrap();
    }
    // ramfs has no file handles: with --inode-file-handles mandatory its root can't be
    // looked up.
    let st = std::process::Command::new("mount")
        .args(["-t", "ramfs", "none"])
        .arg(share.path().join("mnt"))
        .status()
        .unwrap();
    assert!(st.success());
    let _umount = common::BindMount::adopt(&share.path().join("mnt"));
    let d = Daemon::start_on(share.path(), &["--inode-file-handles", "mandatory"]);
    let c = d.client();
    assert_eq!(errno(c.lookup(ROOT, "mnt")), libc::EOPNOTSUPP);
    let plain = dir_names(&c, ROOT);
    let plus = c.readdir_all(ROOT, true).unwrap();
    let names: Vec<Vec<u8>> = plus.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names, plain, "READDIRPLUS lists what READDIR lists");
    for e in &plus {
        let id = e.entry.as_ref().map_or(0, |x| x.nodeid);
        match e.name.as_slice() {
            b"mnt" => assert_eq!(id, 0, "no entry for the name that failed"),
            b"." | b".." => {}
            n => {
                assert_ne!(id, 0, "{}", String::from_utf8_lossy(n));
                // Its lookup count is real: one FORGET drops it, and the node is gone.
                c.forget(id, 1).unwrap();
                assert_eq!(errno(c.getattr(id)), libc::EBADF);
            }
        }
    }
}

/// Item 7, the logger: no RUST_LOG spelling turns fuse-backend-rs's trace path on (it
/// transmutes guest opcodes into an enum).
#[test]
fn no_rust_log_spelling_enables_the_crates_trace_path() {
    for spec in [
        "trace",
        "fuse_backend_rs=trace",
        "fuse_backend_rs::api::server=trace",
        "vfsd=trace",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s");
        let log = dir.path().join("log");
        let mut child = std::process::Command::new(common::vfsd_bin())
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(dir.path())
            .env("RUST_LOG", spec)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        common::wait_for_socket(&sock);
        {
            let c = FuseClient::new(
                vfsd::frontend::Frontend::connect(&sock, Default::default()).unwrap(),
            );
            c.init().unwrap();
            c.getattr(ROOT).unwrap();
            c.lookup(ROOT, "nothing").unwrap_err();
        }
        let _ = child.wait();
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.lines().any(|l| l.contains("TRACE")),
            "RUST_LOG={spec} let trace lines through:\n{text}"
        );
    }
}

/// Sends `op` with its arguments in a readable descriptor outside guest memory (the header
/// in its own descriptor before it) and returns the reply's error.
fn error_for_args_outside_memory(c: &FuseClient, op: u32, nodeid: u64, args: &[u8]) -> i32 {
    use vfsd::frontend::virtq::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use vfsd::frontend::RawDesc;
    use vm_memory::GuestMemory;
    let past_end = c.fe.mem.last_addr().0 + 1 + 0x1000;
    let (unique, req) = c.build(op, nodeid, &[args]);
    let hdr = std::mem::size_of::<InHeader>() as u32;
    let t = submit_chain(c, unique, &req, |req_at, resp_at| {
        vec![
            RawDesc {
                addr: req_at,
                len: hdr,
                flags: VRING_DESC_F_NEXT,
                next: 1,
            },
            RawDesc {
                addr: past_end,
                len: req.len() as u32 - hdr,
                flags: VRING_DESC_F_NEXT,
                next: 2,
            },
            RawDesc {
                addr: resp_at,
                len: 4096,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            },
        ]
    });
    c.wait(t).expect("a reply with a FUSE header").error
}

/// Submits request `req` (its `unique`) on queue 1 in a free slot, as the chain `descs`
/// makes from the slot's request and reply addresses (the request is written at the
/// first).
fn submit_chain(
    c: &FuseClient,
    unique: u64,
    req: &[u8],
    descs: impl FnOnce(u64, u64) -> Vec<vfsd::frontend::RawDesc>,
) -> Ticket {
    let mut q = c.fe.queues[1].lock().unwrap();
    q.reap(&c.fe.mem).unwrap();
    let slot = q.free_slot().unwrap();
    let (req_at, resp_at) = q.slot_addrs(slot);
    c.fe.mem.write_slice(req, GuestAddress(req_at)).unwrap();
    q.submit_raw(&c.fe.mem, slot, &descs(req_at, resp_at), false)
        .unwrap();
    q.notify().unwrap();
    Ticket {
        queue: 1,
        slot,
        unique,
    }
}

/// The readable descriptor of request `req` at `req_at`, chained to the next one.
fn request_desc(req_at: u64, req: &[u8]) -> vfsd::frontend::RawDesc {
    vfsd::frontend::RawDesc {
        addr: req_at,
        len: req.len() as u32,
        flags: vfsd::frontend::virtq::VRING_DESC_F_NEXT,
        next: 1,
    }
}

/// A request whose header is readable but whose later readable descriptor lies outside
/// guest memory still gets a reply: EFAULT, under its own `unique`. Dropped without a
/// reply, it would leave the guest's request waiting forever.
#[test]
fn a_bad_descriptor_after_the_header_gets_efault() {
    for pool in ["2", "0"] {
        let d = Daemon::start(&["--thread-pool-size", pool]);
        std::fs::write(d.path("f"), b"data").unwrap();
        let c = d.client();
        let e = c.lookup(ROOT, "f").unwrap();
        let h = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
        let efault = -libc::EFAULT;
        assert_eq!(
            error_for_args_outside_memory(&c, FUSE_GETATTR, ROOT, &[0u8; 16]),
            efault
        );
        // READ is tried on the queue thread first.
        let (_, read) = c.read_req(e.nodeid, h.fh, 0, 4);
        let args = &read[std::mem::size_of::<InHeader>()..];
        assert_eq!(
            error_for_args_outside_memory(&c, FUSE_READ, e.nodeid, args),
            efault
        );
        // The queue goes on serving.
        assert_eq!(c.read(e.nodeid, h.fh, 0, 4).unwrap(), b"data");
    }
}

/// NOTIFY_REPLY answers a retrieve notification, which vfsd never sends; like FORGET it
/// takes no reply, even when the guest offers room for one.
#[test]
fn notify_reply_gets_no_reply() {
    const FUSE_NOTIFY_REPLY: u32 = 41;
    let d = Daemon::start(&[]);
    let c = d.client();
    // struct fuse_notify_retrieve_in's size, then some data.
    let t = c
        .submit(1, FUSE_NOTIFY_REPLY, ROOT, &[&[0u8; 40], b"data"], 4096)
        .unwrap();
    assert_eq!(c.wait_no_reply(t).unwrap(), 0);
    c.getattr(ROOT).unwrap();
}

/// CREATE with flags a kernel never sends (O_PATH, O_TMPFILE's bit): they are dropped, so
/// O_PATH can't turn an exclusive create of an existing name into a "success" (O_PATH
/// ignores O_CREAT and O_EXCL), nor, with `--security-label`, have the cleanup of a failed
/// label remove the file that was already there.
#[test]
fn create_ignores_o_path_and_keeps_o_excl_exclusive() {
    for extra in [&[][..], &["--security-label"][..]] {
        let d = Daemon::start(extra);
        std::fs::write(d.path("there"), b"keep me").unwrap();
        let c = d.client();
        for flags in [
            libc::O_RDWR | libc::O_EXCL | libc::O_PATH,
            libc::O_RDONLY | libc::O_EXCL | libc::O_PATH,
        ] {
            assert_eq!(
                errno(c.create(ROOT, "there", flags as u32, 0o644)),
                libc::EEXIST,
                "{extra:?} flags {flags:#o}"
            );
        }
        assert_eq!(std::fs::read(d.path("there")).unwrap(), b"keep me");
        // A new name with O_PATH in the flags: a real, readable and writable file.
        let (e, o) = c
            .create(ROOT, "new", (libc::O_RDWR | libc::O_PATH) as u32, 0o644)
            .unwrap();
        assert_eq!(c.write(e.nodeid, o.fh, 0, b"data").unwrap(), 4);
        assert_eq!(c.read(e.nodeid, o.fh, 0, 4).unwrap(), b"data");
    }
}

/// A guest that sets the hiprio queue's avail index past what the ring can hold (virtio-queue
/// refuses to pop from it) breaks that queue only. The hiprio queue shares its thread with
/// the first request queue, and that thread must go on serving requests.
#[test]
fn a_bad_avail_index_on_the_hiprio_queue_leaves_requests_served() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    c.timeout = Duration::from_secs(5);
    std::fs::write(d.path("f"), b"").unwrap();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    {
        let q = c.fe.queues[0].lock().unwrap();
        let bad = q.geo.size.wrapping_add(7);
        c.fe.mem
            .write_obj(bad, GuestAddress(q.geo.avail + 2))
            .unwrap();
        q.notify().unwrap();
    }
    // Let the thread take the kick first: it is served before any later request.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let t = c
            .submit(1, FUSE_GETATTR, node, &[&[0u8; 16]], 4096)
            .unwrap();
        assert_eq!(c.wait(t).unwrap().error, 0);
    }
}

/// A CREATE whose reply buffers are long enough but lie partly outside guest memory (the
/// header's 16 bytes in memory, the rest past its end) is refused with EINVAL before
/// anything is made: served, it would make the file and open a handle, and the reply that
/// tells the guest of them could not be written.
#[test]
fn a_create_whose_reply_room_lies_outside_memory_makes_nothing() {
    use fuse_backend_rs::abi::fuse_abi::CreateIn;
    use vfsd::frontend::virtq::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use vfsd::frontend::RawDesc;
    use vm_memory::{ByteValued, GuestMemory};
    let d = Daemon::start(&[]);
    let c = d.client();
    let past_end = c.fe.mem.last_addr().0 + 1 + 0x1000;
    let args = CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        ..Default::default()
    };
    let (unique, req) = c.build(FUSE_CREATE, ROOT, &[args.as_slice(), b"made\0"]);
    let out_header = std::mem::size_of::<fuse_backend_rs::abi::fuse_abi::OutHeader>() as u32;
    let t = submit_chain(&c, unique, &req, |req_at, resp_at| {
        vec![
            request_desc(req_at, &req),
            RawDesc {
                addr: resp_at,
                len: out_header,
                flags: VRING_DESC_F_WRITE | VRING_DESC_F_NEXT,
                next: 2,
            },
            RawDesc {
                addr: past_end,
                len: 4096,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            },
        ]
    });
    let reply = c.wait(t).expect("a reply with a FUSE header");
    assert_eq!(reply.error, -libc::EINVAL);
    assert!(!d.path("made").exists(), "the file was made on the host");
    // The queue goes on serving.
    c.getattr(ROOT).unwrap();
}

/// A chain of more descriptors than any request needs (its header, then an indirect table
/// of its reply buffer and zero-length writable ones: 513, where the largest request needs
/// about 260) is answered EINVAL and not served, on the queue thread and in the pool. One
/// descriptor fewer is served. Kept whole, such chains (a guest can name one from every
/// slot of its ring, each of up to 64 Ki descriptors) would each cost the host a list of up
/// to a megabyte while they wait.
#[test]
fn a_chain_of_more_descriptors_than_any_request_needs_gets_einval() {
    use vfsd::frontend::virtq::{
        write_desc, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use vfsd::frontend::RawDesc;
    for pool in ["2", "0"] {
        let d = Daemon::start(&["--thread-pool-size", pool]);
        let c = d.client();
        for (entries, want) in [(512u16, -libc::EINVAL), (511, 0)] {
            let (unique, req) = c.build(FUSE_GETATTR, ROOT, &[&[0u8; 16]]);
            let t = submit_chain(&c, unique, &req, |req_at, resp_at| {
                // The table in the request's own buffer, past the request.
                let table = req_at + 4096;
                for i in 0..entries {
                    let last = i == entries - 1;
                    let d = RawDesc {
                        addr: resp_at,
                        len: if i == 0 { 4096 } else { 0 },
                        flags: VRING_DESC_F_WRITE | if last { 0 } else { VRING_DESC_F_NEXT },
                        next: i + 1,
                    };
                    write_desc(&c.fe.mem, table + 16 * i as u64, &d).unwrap();
                }
                vec![
                    request_desc(req_at, &req),
                    RawDesc {
                        addr: table,
                        len: 16 * entries as u32,
                        flags: VRING_DESC_F_INDIRECT,
                        next: 0,
                    },
                ]
            });
            let reply = c.wait(t).expect("a reply with a FUSE header");
            assert_eq!(
                (reply.error, reply.unique),
                (want, unique),
                "pool {pool}: {} descriptors",
                entries + 1
            );
        }
    }
}

/// A guest that names one chain in every avail slot and raises its avail index by the
/// ring's size whenever the device has caught up (`avail_event`), never taking a used
/// entry, can't make the device hold more requests than the ring has entries: popped
/// regardless, each would wait for a worker in the pool's queue, and with the pool busy
/// (here its one worker waits on a host lease) that queue grew without bound until the
/// daemon ran out of memory. The requests left in the ring are served once replies make
/// room, so none is lost.
#[test]
fn a_guest_reposting_one_chain_never_has_more_requests_in_flight_than_its_ring_holds() {
    use vfsd::frontend::FrontendConfig;
    let d = Daemon::start(&["--thread-pool-size", "1"]);
    let mut c = d.client_with(FrontendConfig {
        slots: 4,
        descs_per_slot: 4,
        ..Default::default()
    });
    c.timeout = Duration::from_secs(20);
    std::fs::write(d.path("f"), b"data").unwrap();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let lease = common::HostLease::take(&d.path("f"));
    // An OPEN for writing waits on the lease in the pool's only worker.
    let t = c.submit_open(node, libc::O_WRONLY as u32).unwrap();
    lease.wait_broken();
    let (size, avail, used, head) = {
        let q = c.fe.queues[1].lock().unwrap();
        (q.geo.size, q.geo.avail, q.geo.used, t.slot as u16 * 4)
    };
    let mem = &c.fe.mem;
    let avail_idx = || mem.read_obj::<u16>(GuestAddress(avail + 2)).unwrap();
    // With EVENT_IDX the device writes the avail index it has popped up to after the
    // used ring's entries.
    let avail_event = || {
        mem.read_obj::<u16>(GuestAddress(used + 4 + 8 * u64::from(size)))
            .unwrap()
    };
    const ROUNDS: usize = 8;
    let mut raised = 0;
    for _ in 0..ROUNDS {
        let idx = avail_idx();
        let t0 = Instant::now();
        while avail_event() != idx && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if avail_event() != idx {
            break;
        }
        for i in 0..size {
            let slot = avail + 4 + 2 * u64::from(idx.wrapping_add(i) % size);
            mem.write_obj(head, GuestAddress(slot)).unwrap();
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        mem.write_obj(idx.wrapping_add(size), GuestAddress(avail + 2))
            .unwrap();
        c.fe.queues[1].lock().unwrap().notify().unwrap();
        raised += 1;
    }
    // The first raise put one more than the ring's size in flight: the device stops at
    // its size, short of catching up, so the guest can't raise again.
    assert_eq!(
        raised, 1,
        "the device caught up {raised} times with one OPEN already in flight"
    );
    // Left in the ring, the rest waits without the queue thread spinning on it: read
    // syscalls (the kick eventfd's among them) stay few while nothing completes.
    let pid = common::serving_pid(d.pid());
    let reads = || -> u64 {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("syscr: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = reads();
    std::thread::sleep(Duration::from_millis(500));
    let during = reads() - before;
    assert!(
        during < 100,
        "{during} read syscalls in 500 ms with the ring waiting for room"
    );
    drop(lease);
    // Every request the guest made available is served, the one left in the ring too.
    let want = 1 + raised as u64 * u64::from(size);
    let t0 = Instant::now();
    loop {
        let s = d.stats();
        let n = s["opcodes"]["OPEN"]["count"].as_u64().unwrap_or(0);
        if n == want {
            break;
        }
        assert!(
            n < want && t0.elapsed() < Duration::from_secs(20),
            "{n} OPENs served of the {want} made available: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
