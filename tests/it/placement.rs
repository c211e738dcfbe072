//! Where the device serves metadata requests when the guest keeps several in flight
//! (`device::route`, design.md "Quick metadata beside others in flight").

use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use crate::common::{Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::SetattrIn;
use vfsd::frontend::fuse::{
    FResult, FuseClient, Ticket, FATTR_MODE, FATTR_MTIME, FATTR_MTIME_NOW, FATTR_SIZE,
    FUSE_GETATTR, FUSE_SETATTR,
};

/// `rounds` times, `at_once` GETATTRs of the root submitted one after another, then all
/// their replies collected (each must succeed).
fn getattrs_in_rounds(c: &FuseClient, rounds: u64, at_once: u64) {
    for _ in 0..rounds {
        let tickets: Vec<_> = (0..at_once)
            .map(|_| {
                c.submit(1, FUSE_GETATTR, ROOT, &[&[0u8; 16]], 4096)
                    .unwrap()
            })
            .collect();
        for t in tickets {
            assert_eq!(c.wait(t).unwrap().error, 0);
        }
    }
}

/// The stats once the daemon has counted `count` requests of `op`.
fn stats_after(d: &Daemon, op: &str, count: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let s = d.stats();
        if s["opcodes"][op]["count"].as_u64().unwrap_or(0) >= count {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "stats never showed {count} {op}: {s}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn getattrs_two_at_a_time_are_served_inline_on_the_queue_thread() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const PAIRS: u64 = 50;
    getattrs_in_rounds(&c, PAIRS, 2);
    let s = stats_after(&d, "GETATTR", 2 * PAIRS);
    let n = |k: &str| s[k].as_u64().unwrap();
    // A loaded host may slow some past route::SLOW_INLINE, which hands them to the pool;
    // at 2 in flight the queue is not alone, so these are not `served_alone` ones.
    assert!(n("served_inline") > 0, "{s}");
    assert!(
        n("served_inline") + n("served_alone") <= 2 * PAIRS + 1,
        "{s}"
    );
}

#[test]
fn changes_to_the_tree_one_at_a_time_are_served_alone_on_the_queue_thread() {
    // What untar, cp -a and rm -rf send, one request in flight: none of it goes to a
    // worker once the queue is seen to be alone (route::LONE_POPS lone pops in a row).
    let d = Daemon::start(&["--thread-pool-size", "4", "--xattr"]);
    let c = d.client();
    for _ in 0..32 {
        c.getattr(ROOT).unwrap();
    }
    let before = stats_after(&d, "GETATTR", 32)["served_alone"]
        .as_u64()
        .unwrap();
    const FILES: u64 = 20;
    for i in 0..FILES {
        let dir = c.mkdir(ROOT, &format!("d{i}"), 0o755).unwrap().nodeid;
        c.symlink(dir, "l", "target").unwrap();
        let chmod = SetattrIn {
            valid: FATTR_MODE,
            mode: 0o700,
            ..Default::default()
        };
        c.setattr(dir, &chmod).unwrap();
        c.setxattr(dir, "user.a", b"1", 0).unwrap();
        c.rename(dir, "l", dir, "m").unwrap();
        c.unlink(dir, "m").unwrap();
        c.rmdir(ROOT, &format!("d{i}")).unwrap();
    }
    let s = stats_after(&d, "RMDIR", FILES);
    let alone = s["served_alone"].as_u64().unwrap() - before;
    // MKDIR, SYMLINK, SETATTR, SETXATTR, RENAME, UNLINK, RMDIR: 7 per file. A loaded
    // host may see a request arrive while one is served and count the queue busy again
    // for LONE_POPS pops, so not every one, but most.
    assert!(
        alone >= 7 * FILES / 2,
        "{alone} of {} served alone: {s}",
        7 * FILES
    );
}

#[test]
fn on_a_small_host_a_large_pop_of_getattrs_is_served_inline() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus > 2 {
        // route::SMALL_HOST_CPUS: a larger host hands large pops to its workers.
        eprintln!("skipped: {cpus} CPUs is not a small host");
        return;
    }
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const ROUNDS: u64 = 30;
    const AT_ONCE: u64 = 8;
    getattrs_in_rounds(&c, ROUNDS, AT_ONCE);
    let s = stats_after(&d, "GETATTR", ROUNDS * AT_ONCE);
    let inline = s["served_inline"].as_u64().unwrap();
    // Pops smaller than 8 happen too (the device may pop while the client still
    // submits), and go to the pool; most pops are whole rounds, served inline.
    assert!(
        inline >= ROUNDS * AT_ONCE / 2,
        "{inline} of {} inline: {s}",
        ROUNDS * AT_ONCE
    );
}

#[test]
fn forgets_are_served_on_the_queue_thread() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const NAMES: u64 = 20;
    for i in 0..NAMES {
        let name = format!("f{i}");
        std::fs::write(d.path(&name), b"").unwrap();
        let node = c.lookup(ROOT, &name).unwrap().nodeid;
        c.forget(node, 1).unwrap();
    }
    let s = stats_after(&d, "FORGET", NAMES);
    assert_eq!(s["no_reply_on_queue_thread"].as_u64(), Some(NAMES), "{s}");
    assert_eq!(
        s["live_inodes"].as_u64(),
        Some(1),
        "the forgets dropped the nodes: {s}"
    );
}

/// Makes queue 1 alone (route::LONE_POPS lone pops in a row); the `served_alone` count then.
fn alone(d: &Daemon, c: &FuseClient) -> u64 {
    for _ in 0..32 {
        c.getattr(ROOT).unwrap();
    }
    stats_after(d, "GETATTR", 32)["served_alone"]
        .as_u64()
        .unwrap()
}

#[test]
fn opens_and_creates_one_at_a_time_are_served_alone_on_the_queue_thread() {
    // untar and cp -a open every file they write: a hand-off to a worker for each cost
    // more than the open. With no lease on the file it is served where it arrived.
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    let before = alone(&d, &c);
    const FILES: u64 = 20;
    for i in 0..FILES {
        let (e, o) = c
            .create(ROOT, &format!("f{i}"), libc::O_WRONLY as u32, 0o644)
            .unwrap();
        c.release(e.nodeid, o.fh).unwrap();
        let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        c.release(e.nodeid, o.fh).unwrap();
    }
    let s = stats_after(&d, "RELEASE", 2 * FILES);
    let alone = s["served_alone"].as_u64().unwrap() - before;
    // CREATE, RELEASE, OPEN, RELEASE per file, all of them (the RELEASEs were before).
    assert!(
        alone >= 4 * FILES - 2,
        "{alone} of {} served alone: {s}",
        4 * FILES
    );
}

#[test]
fn a_lone_small_copy_file_range_is_served_alone_and_a_large_one_in_the_pool() {
    // cp -a copies each small file with one COPY_FILE_RANGE, one request in flight: a
    // hand-off to a worker for each cost more than the copy. A copy as large as the
    // largest WRITE is as bounded as that WRITE; a larger one may take seconds, and goes
    // to the pool so that the queue goes on should the guest send more meanwhile.
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    let (src, sfh) = c.create(ROOT, "src", libc::O_RDWR as u32, 0o644).unwrap();
    let (dst, dfh) = c.create(ROOT, "dst", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(src.nodeid, sfh.fh, 0, &[7u8; 4096]).unwrap();
    const COPIES: u64 = 20;
    let copy = |len: u64| {
        c.copy_file_range(src.nodeid, sfh.fh, 0, dst.nodeid, dfh.fh, 0, len)
            .unwrap()
    };
    let before = alone(&d, &c);
    for _ in 0..COPIES {
        assert_eq!(copy(4096), 4096);
    }
    let s = stats_after(&d, "COPY_FILE_RANGE", COPIES);
    let small = s["served_alone"].as_u64().unwrap() - before;
    assert!(
        small >= COPIES - 2,
        "{small} of {COPIES} small copies served alone: {s}"
    );
    let before = alone(&d, &c);
    // The source holds 4 KiB, so the copy is short; what places it is the length asked.
    assert_eq!(copy(64 << 20), 4096);
    let s = stats_after(&d, "COPY_FILE_RANGE", COPIES + 1);
    assert_eq!(
        s["served_alone"].as_u64().unwrap(),
        before,
        "a 64 MiB copy was served on the queue thread: {s}"
    );
    // The queue was still alone: the length alone kept that copy off its thread.
    assert_eq!(copy(4096), 4096);
    let s = stats_after(&d, "COPY_FILE_RANGE", COPIES + 2);
    assert_eq!(s["served_alone"].as_u64().unwrap(), before + 1, "{s}");
}

/// Sends `what` (`submit`, given the client and the node of "f", which holds "data") to
/// a lone queue while a host process holds a lease on "f", and checks that it waits for
/// the break in the pool while the queue goes on and is served once the lease is gone.
fn served_in_the_pool_once_a_host_lease_is_gone(
    what: &str,
    submit: impl FnOnce(&FuseClient, u64) -> FResult<Ticket>,
) -> (Daemon, FuseClient) {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let mut c = d.client();
    // Well under lease-break-time (45 s by default), when a blocked open would end.
    c.timeout = Duration::from_secs(5);
    std::fs::write(d.path("f"), b"data").unwrap();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    alone(&d, &c);
    crate::common::HostLease::take(&d.path("f")).served_once_gone(&c, what, || submit(&c, node));
    (d, c)
}

#[test]
fn a_lone_open_of_a_leased_file_waits_in_the_pool_while_the_queue_goes_on() {
    // An open for writing of a file a host process holds a lease on waits for the lease
    // break (up to the host's lease-break-time). Tried on the queue thread, it must not
    // wait there: the other requests of the queue go on meanwhile.
    let (d, _c) = served_in_the_pool_once_a_host_lease_is_gone("OPEN", |c, node| {
        c.submit_open(node, libc::O_WRONLY as u32)
    });
    let s = stats_after(&d, "OPEN", 1);
    assert_eq!(s["opens_handed_off"].as_u64(), Some(1), "{s}");
}

#[test]
fn a_truncate_of_a_leased_file_waits_in_the_pool_while_the_queue_goes_on() {
    // The guest kernel's O_TRUNC open (and truncate(2)) is a SETATTR of the size with no
    // handle: vfsd opens the file for writing, which waits for a host lease break as an
    // O_TRUNC open would on the host, in the pool, not with EAGAIN to the guest.
    use vm_memory::ByteValued;
    let s = SetattrIn {
        valid: FATTR_SIZE | FATTR_MTIME | FATTR_MTIME_NOW,
        ..Default::default()
    };
    let (d, _c) = served_in_the_pool_once_a_host_lease_is_gone("SETATTR", |c, node| {
        c.submit(1, FUSE_SETATTR, node, &[s.as_slice()], 256)
    });
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"");
}

#[test]
fn an_o_nonblock_open_of_a_leased_file_fails_with_ewouldblock_as_on_the_host() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    std::fs::write(d.path("f"), b"data").unwrap();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let lease = crate::common::HostLease::take(&d.path("f"));
    // The host's own answer to the same open.
    let host = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(d.path("f"))
        .map(drop)
        .map_err(|e| e.raw_os_error());
    assert_eq!(host, Err(Some(libc::EWOULDBLOCK)));
    for queue_alone in [false, true] {
        if queue_alone {
            alone(&d, &c);
        }
        let r = c.open(node, (libc::O_WRONLY | libc::O_NONBLOCK) as u32);
        assert_eq!(
            crate::common::errno(r),
            libc::EWOULDBLOCK,
            "queue alone: {queue_alone}"
        );
    }
    drop(lease);
}

/// Submits an OPEN or CREATE on queue 1 and returns its ticket, not waiting.
fn submit_open(
    c: &FuseClient,
    op: u32,
    node: u64,
    parts: &[&[u8]],
) -> vfsd::frontend::fuse::Ticket {
    c.submit(1, op, node, parts, 4096).unwrap()
}

#[test]
fn a_create_of_a_leased_existing_name_is_answered_at_once_and_keeps_no_lookup() {
    // The name exists: CREATE answers ESTALE (the guest looks it up again and opens it)
    // without opening the file, so a host lease on it neither holds the queue nor is
    // broken, and no node is left behind.
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let mut c = d.client();
    c.timeout = Duration::from_secs(5);
    std::fs::write(d.path("f"), b"data").unwrap();
    alone(&d, &c);
    let lease = crate::common::HostLease::take(&d.path("f"));
    let create = fuse_backend_rs::abi::fuse_abi::CreateIn {
        flags: libc::O_WRONLY as u32,
        mode: 0o644,
        umask: 0,
        fuse_flags: 0,
    };
    let t = submit_open(
        &c,
        vfsd::frontend::fuse::FUSE_CREATE,
        ROOT,
        &[vm_memory::ByteValued::as_slice(&create), b"f\0"],
    );
    let r = c.wait(t).unwrap();
    assert_eq!(r.error, -libc::ESTALE);
    assert!(!lease.broken(), "the CREATE opened the leased file");
    drop(lease);
    let s = stats_after(&d, "CREATE", 1);
    assert_eq!(s["live_inodes"].as_u64(), Some(1), "a node was kept: {s}");
}

/// The hiprio queue (FORGETs) runs on the first request queue's thread, as in virtiofsd:
/// a FORGET the guest sends while that thread serves a request then costs no wake-up of a
/// thread of its own. Each further request queue keeps a thread, and every queue is
/// served.
#[test]
fn the_hiprio_queue_shares_the_first_request_queues_thread() {
    let d = Daemon::start(&["--request-queues", "3"]);
    let c = d.client_with(vfsd::frontend::FrontendConfig {
        request_queues: 3,
        ..Default::default()
    });
    std::fs::write(d.path("f"), b"").unwrap();
    for q in 1..=3 {
        let node = c.lookup(ROOT, "f").unwrap().nodeid;
        let t = c
            .submit(q, FUSE_GETATTR, node, &[&[0u8; 16]], 4096)
            .unwrap();
        assert_eq!(c.wait(t).unwrap().error, 0, "GETATTR on queue {q}");
        c.forget(node, 1).unwrap();
    }
    let s = stats_after(&d, "FORGET", 3);
    assert_eq!(s["live_inodes"].as_u64(), Some(1), "{s}");
    let pid = crate::common::serving_pid(d.pid());
    let queue_threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).unwrap_or_default().trim() == "vring_worker"
        })
        .count();
    assert_eq!(
        queue_threads, 3,
        "one thread per request queue, none for hiprio"
    );
}
