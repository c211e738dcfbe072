//! File locks forwarded to the host, through the real socket: two daemons on
//! one directory stand for two guests, and the test process for a host program.

use std::time::{Duration, Instant};

use crate::common::{errno, host_flock, host_ofd_lock, Daemon, ROOT};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

const EOF: u64 = i64::MAX as u64;
const A: u64 = 0xa;
const B: u64 = 0xb;
const C: u64 = 0xc;

fn two_guests(extra: &[&str]) -> (Daemon, Daemon) {
    let d1 = Daemon::start(extra);
    let d2 = Daemon::start_on(&d1.share.clone(), extra);
    std::fs::write(d1.path("f"), vec![0u8; 4096]).unwrap();
    (d1, d2)
}

fn open_f(c: &FuseClient) -> (u64, u64) {
    let e = c.lookup(ROOT, "f").unwrap();
    (e.nodeid, c.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh)
}

fn wr(start: u64, end: u64, pid: u32) -> Lock {
    Lock::range(start, end, libc::F_WRLCK, pid)
}
fn rd(start: u64, end: u64, pid: u32) -> Lock {
    Lock::range(start, end, libc::F_RDLCK, pid)
}
fn un(start: u64, end: u64) -> Lock {
    Lock::range(start, end, libc::F_UNLCK, 0)
}

fn stat(d: &Daemon, key: &str) -> u64 {
    d.stats()[key].as_u64().unwrap()
}

/// A host program's OFD write lock on `len` bytes of a file from `start`, held until
/// `release`.
struct HostOfdLock {
    file: std::fs::File,
    start: i64,
    len: i64,
}

impl HostOfdLock {
    fn take(path: &std::path::Path, start: i64, len: i64) -> HostOfdLock {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let l = HostOfdLock { file, start, len };
        l.set(libc::F_WRLCK);
        l
    }

    fn release(&self) {
        self.set(libc::F_UNLCK);
    }

    fn set(&self, typ: i32) {
        // SAFETY: plain data, zeroed is valid; l_pid 0 as OFD locks require.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = self.start;
        fl.l_len = self.len;
        // SAFETY: plain fcntl on an fd we own with a live flock.
        let r = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&self.file),
                libc::F_OFD_SETLK,
                &fl,
            )
        };
        assert_eq!(r, 0, "the host's OFD lock");
    }
}

#[test]
fn byte_range_locks_conflict_across_owners_guests_and_host() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 99, 100)).unwrap();
    // The same owner may change its own lock freely.
    c1.setlk(n1, h1, A, wr(0, 99, 100)).unwrap();
    // Another owner in the same guest, another guest, and the host all conflict.
    assert_eq!(errno(c1.setlk(n1, h1, C, rd(10, 10, 300))), libc::EAGAIN);
    assert_eq!(errno(c2.setlk(n2, h2, B, rd(50, 60, 200))), libc::EAGAIN);
    assert!(!host_ofd_lock(&d1.path("f"), libc::F_RDLCK, 50, 1));
    // Disjoint ranges don't.
    c2.setlk(n2, h2, B, wr(200, 299, 200)).unwrap();
    assert!(host_ofd_lock(&d1.path("f"), libc::F_WRLCK, 400, 10));
    assert!(!host_ofd_lock(&d1.path("f"), libc::F_WRLCK, 250, 10));
    // GETLK: the range and type of the holder; its guest pid from the same guest, 0 from
    // another one.
    let g = c1.getlk(n1, h1, C, rd(50, 60, 300)).unwrap();
    assert_eq!(
        (g.start, g.end, g.type_, g.pid),
        (0, 99, libc::F_WRLCK as u32, 100)
    );
    let g = c2.getlk(n2, h2, B, rd(50, 60, 200)).unwrap();
    assert_eq!(
        (g.start, g.end, g.type_, g.pid),
        (0, 99, libc::F_WRLCK as u32, 0)
    );
    let g = c2.getlk(n2, h2, B, rd(100, 150, 200)).unwrap();
    assert_eq!(g.type_, libc::F_UNLCK as u32);
    // Split: unlocking the middle frees it for others and keeps both ends.
    c1.setlk(n1, h1, A, un(40, 59)).unwrap();
    assert_eq!(stat(&d1, "locks_held"), 2);
    c2.setlk(n2, h2, B, rd(45, 50, 200)).unwrap();
    assert_eq!(errno(c2.setlk(n2, h2, B, rd(30, 30, 200))), libc::EAGAIN);
    assert_eq!(errno(c2.setlk(n2, h2, B, rd(60, 60, 200))), libc::EAGAIN);
    // Merge: filling the hole again (once free) gives one range.
    c2.setlk(n2, h2, B, un(45, 50)).unwrap();
    c1.setlk(n1, h1, A, wr(40, 59, 100)).unwrap();
    assert_eq!(stat(&d1, "locks_held"), 1);
    // A lock to EOF.
    c1.setlk(n1, h1, A, wr(1000, EOF, 100)).unwrap();
    assert!(!host_ofd_lock(&d1.path("f"), libc::F_RDLCK, 1 << 40, 1));
}

#[test]
fn flock_shared_and_exclusive_across_guests_and_host() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, Lock::flock(libc::F_RDLCK)).unwrap();
    c2.setlk(n2, h2, B, Lock::flock(libc::F_RDLCK)).unwrap();
    assert_eq!(
        errno(c2.setlk(n2, h2, B, Lock::flock(libc::F_WRLCK))),
        libc::EAGAIN
    );
    let (ok, _f) = host_flock(&d1.path("f"), libc::LOCK_EX);
    assert!(
        !ok,
        "the host's exclusive flock must fail while guests share it"
    );
    let (ok, _g) = host_flock(&d1.path("f"), libc::LOCK_SH);
    assert!(ok);
    drop(_g);
    c1.setlk(n1, h1, A, Lock::flock(libc::F_UNLCK)).unwrap();
    c2.setlk(n2, h2, B, Lock::flock(libc::F_UNLCK)).unwrap();
    c2.setlk(n2, h2, B, Lock::flock(libc::F_WRLCK)).unwrap();
    assert_eq!(
        errno(c1.setlk(n1, h1, A, Lock::flock(libc::F_RDLCK))),
        libc::EAGAIN
    );
    // RELEASE with FUSE_RELEASE_FLOCK_UNLOCK drops it.
    c2.release_flock(n2, h2, B).unwrap();
    c1.setlk(n1, h1, A, Lock::flock(libc::F_WRLCK)).unwrap();
}

#[test]
fn locks_go_on_flush_forget_and_disconnect() {
    let (d1, d2) = two_guests(&[]);
    let c2 = d2.client();
    let (n2, h2) = open_f(&c2);
    {
        let c1 = d1.client();
        let (n1, h1) = open_f(&c1);
        c1.setlk(n1, h1, A, wr(0, 9, 1)).unwrap();
        c1.setlk(n1, h1, C, wr(20, 29, 2)).unwrap();
        // FLUSH by owner A (its close()) drops A's locks only.
        c1.flush_owner(n1, h1, A).unwrap();
        c2.setlk(n2, h2, B, wr(0, 9, 3)).unwrap();
        assert_eq!(errno(c2.setlk(n2, h2, B, wr(20, 29, 3))), libc::EAGAIN);
        assert_eq!(stat(&d1, "locks_held"), 1);
        // Forgetting the node drops the rest.
        c1.release(n1, h1).unwrap();
        c1.forget(n1, 1).unwrap();
        c2.setlk(n2, h2, B, wr(20, 29, 3)).unwrap();
        c2.setlk(n2, h2, B, un(0, EOF)).unwrap();
        // A lock, then the frontend goes away (a killed VMM).
        let (n1, h1) = open_f(&c1);
        c1.setlk(n1, h1, A, wr(0, EOF, 1)).unwrap();
        c1.setlk(n1, h1, C, Lock::flock(libc::F_WRLCK)).unwrap();
        assert_eq!(errno(c2.setlk(n2, h2, B, wr(5, 5, 3))), libc::EAGAIN);
    }
    let t = Instant::now();
    loop {
        if c2.setlk(n2, h2, B, wr(5, 5, 3)).is_ok() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "locks outlived the frontend"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (ok, _f) = host_flock(&d2.path("f"), libc::LOCK_EX);
    assert!(ok, "the flock outlived the frontend");
}

#[test]
fn setlkw_waits_without_a_worker_and_wakes_on_unlock() {
    let (d1, d2) = two_guests(&["--thread-pool-size", "1"]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 99, 1)).unwrap();
    let t = c2.setlkw(1, n2, h2, B, wr(50, 50, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(c2.poll_done(1).unwrap().is_empty(), "granted while held");
    assert_eq!(stat(&d2, "lock_waiters"), 1);
    // The only worker is free: other requests are served while the SETLKW waits.
    c2.getattr(n2).unwrap();
    assert_eq!(c2.read(n2, h2, 0, 4).unwrap(), [0u8; 4]);
    let released = Instant::now();
    c1.setlk(n1, h1, A, un(0, 99)).unwrap();
    assert_eq!(c2.wait(t).unwrap().error, 0);
    assert!(released.elapsed() < Duration::from_secs(1));
    assert_eq!(errno(c1.setlk(n1, h1, A, wr(50, 50, 1))), libc::EAGAIN);
    // A blocking flock too.
    c1.setlk(n1, h1, C, Lock::flock(libc::F_WRLCK)).unwrap();
    let t = c2.setlkw(1, n2, h2, B, Lock::flock(libc::F_WRLCK)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(c2.poll_done(1).unwrap().is_empty());
    c1.setlk(n1, h1, C, Lock::flock(libc::F_UNLCK)).unwrap();
    assert_eq!(c2.wait(t).unwrap().error, 0);
}

#[test]
fn a_destroy_ends_the_waits() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 0, 1)).unwrap();
    let t = c2.setlkw(1, n2, h2, B, wr(0, 0, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    c2.destroy().unwrap();
    assert_eq!(c2.wait(t).unwrap().error, -libc::EINTR);
    assert_eq!(stat(&d2, "lock_waiters"), 0);
    // Nothing was granted behind the guest's back.
    c1.setlk(n1, h1, A, un(0, 0)).unwrap();
    assert!(host_ofd_lock(&d1.path("f"), libc::F_WRLCK, 0, 1));
}

#[test]
fn max_locks_and_max_lock_waiters_answer_enolck() {
    let (d1, d2) = two_guests(&["--max-locks", "100", "--max-lock-waiters", "2"]);
    let c1 = d1.client();
    let (n1, h1) = open_f(&c1);
    // Every other byte: no merging, one range each.
    for i in 0..100u64 {
        c1.setlk(n1, h1, A, rd(2 * i, 2 * i, 1)).unwrap();
    }
    assert_eq!(errno(c1.setlk(n1, h1, A, rd(1000, 1000, 1))), libc::ENOLCK);
    assert_eq!(errno(c1.setlk(n1, h1, C, rd(1000, 1000, 1))), libc::ENOLCK);
    // Filling the gap at 1 merges three ranges into one: allowed, and a place freed.
    c1.setlk(n1, h1, A, rd(0, 1, 1)).unwrap();
    assert!(stat(&d1, "lock_enolck") >= 2);
    assert_eq!(stat(&d1, "locks_held"), 99);
    // Waiters: two wait, the third is refused.
    c1.setlk(n1, h1, A, wr(5000, 5000, 1)).unwrap();
    assert_eq!(stat(&d1, "locks_held"), 100);
    let c2 = d2.client();
    let (n2, h2) = open_f(&c2);
    let t1 = c2.setlkw(1, n2, h2, B, wr(5000, 5000, 2)).unwrap();
    let t2 = c2.setlkw(1, n2, h2, C, wr(5000, 5000, 3)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A SETLK that needs no wait is served as usual meanwhile.
    c2.setlk(n2, h2, 0xd, wr(9, 9, 4)).unwrap();
    let (u, req) = c2.lk_req(FUSE_SETLKW, n2, h2, 0xe, wr(5000, 5000, 5));
    let t3 = c2.submit_bytes(1, &req, 64, u).unwrap();
    assert_eq!(c2.wait(t3).unwrap().error, -libc::ENOLCK);
    // One waiter gets the byte when A lets go, the other when that one does.
    c1.setlk(n1, h1, A, un(5000, 5000)).unwrap();
    let t = Instant::now();
    let first = loop {
        let done: Vec<usize> = c2.poll_done(1).unwrap().into_iter().map(|d| d.0).collect();
        if done.contains(&t1.slot) {
            break (B, t2);
        }
        if done.contains(&t2.slot) {
            break (C, t1);
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no waiter woke");
        std::thread::sleep(Duration::from_millis(5));
    };
    c2.setlk(n2, h2, first.0, un(0, EOF)).unwrap();
    assert_eq!(c2.wait(first.1).unwrap().error, 0);
}

/// Many waiters on one queue leave GETATTR, READ and WRITE on another queue as fast as
/// before. Prints the figures; fails only on a gross slow-down.
#[test]
fn many_waiters_leave_other_requests_unaffected() {
    const WAITERS: usize = 500;
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let (n1, h1) = open_f(&c1);
    c1.setlk(n1, h1, A, wr(0, EOF, 1)).unwrap();
    let c2 = d2.client_with(FrontendConfig {
        request_queues: 2,
        slots: 512,
        descs_per_slot: 4,
        buf_size: 8192,
        ..Default::default()
    });
    let (n2, h2) = open_f(&c2);
    let latency = |c: &FuseClient| {
        let mut v = Vec::new();
        for i in 0..300 {
            let t = Instant::now();
            match i % 3 {
                0 => drop(c.getattr(n2).unwrap()),
                1 => drop(c.read(n2, h2, 0, 4096).unwrap()),
                _ => drop(c.write_on(2, n2, h2, 0, &[1u8; 4096]).unwrap()),
            }
            v.push(t.elapsed());
        }
        v.sort();
        (v[v.len() / 2], v[v.len() * 99 / 100])
    };
    let before = latency(&c2);
    let tickets: Vec<Ticket> = (0..WAITERS as u64)
        .map(|i| c2.setlkw(1, n2, h2, 0x1000 + i, wr(i, i, 10)).unwrap())
        .collect();
    let t = Instant::now();
    while stat(&d2, "lock_waiters") < WAITERS as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waiters never all waited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let during = latency(&c2);
    eprintln!(
        "latency p50/p99 with {WAITERS} SETLKW waiting: before {:?}/{:?}, during {:?}/{:?}",
        before.0, before.1, during.0, during.1
    );
    c1.setlk(n1, h1, A, un(0, EOF)).unwrap();
    for t in tickets {
        assert_eq!(c2.wait(t).unwrap().error, 0);
    }
    assert!(
        during.0 < before.0 * 5 + Duration::from_millis(2),
        "median latency went from {:?} to {:?}",
        before.0,
        during.0
    );
}

/// Active objects of the host's `file_lock_cache` slab (one per lock record).
fn lock_slab_objects() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/slabinfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("file_lock_cache "))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A guest that locks every other byte of a file, many times over, gets ENOLCK after
/// `--max-locks`, and the host's lock records stay bounded. VFSD_LOCK_FLOOD sets the
/// number of requests (default 40,000; docs/benchmarks.md has a longer run).
#[test]
fn a_lock_flood_is_bounded_on_the_host() {
    const MAX: u64 = 20_000;
    let n: u64 = std::env::var("VFSD_LOCK_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40_000);
    let max = MAX.to_string();
    let d = Daemon::start(&["--max-locks", &max, "--max-locks-per-file", &max]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let c = d.client();
    let (node, fh) = open_f(&c);
    let before = lock_slab_objects();
    let (mut granted, mut enolck) = (0u64, 0u64);
    let t = Instant::now();
    // Requests in flight together, 16 at a time, like a busy guest.
    let mut i = 0u64;
    while i < n {
        let batch: Vec<Ticket> = (0..16.min(n - i))
            .map(|k| {
                let byte = 2 * ((i + k) % (4 * MAX));
                let (u, req) = c.lk_req(FUSE_SETLK, node, fh, A, rd(byte, byte, 1));
                c.submit_bytes(1, &req, 64, u).unwrap()
            })
            .collect();
        i += batch.len() as u64;
        for tk in batch {
            match c.wait(tk).unwrap().error {
                0 => granted += 1,
                e if e == -libc::ENOLCK => enolck += 1,
                e => panic!("errno {e}"),
            }
        }
    }
    let peak = lock_slab_objects();
    let held = stat(&d, "locks_held");
    eprintln!(
        "{n} SETLKs on every other byte in {:?}: {granted} granted, {enolck} ENOLCK, \
         locks_held {held}, file_lock_cache objects {before:?} -> {peak:?}",
        t.elapsed()
    );
    assert_eq!(held, MAX);
    assert!(enolck > 0 && stat(&d, "lock_enolck") == enolck);
    if let (Some(b), Some(p)) = (before, peak) {
        // The records this daemon holds, plus room for the rest of the host's churn.
        assert!(p < b + MAX + 10_000, "slab grew from {b} to {p}");
    }
}

/// FUSE_INTERRUPT for a waiting SETLKW cancels it with EINTR, and the lock is not granted
/// later behind the guest's back. (The Linux virtio-fs driver never sends INTERRUPT; other
/// drivers may.)
#[test]
fn an_interrupt_cancels_a_waiting_setlkw() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 0, 1)).unwrap();
    let t = c2.setlkw(1, n2, h2, B, wr(0, 0, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    c2.interrupt(t.unique).unwrap();
    assert_eq!(c2.wait(t).unwrap().error, -libc::EINTR);
    assert_eq!(stat(&d2, "lock_waiters"), 0);
    c1.setlk(n1, h1, A, un(0, 0)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        host_ofd_lock(&d1.path("f"), libc::F_WRLCK, 0, 1),
        "the interrupted wait took the lock anyway"
    );
}

/// An OFD lock belongs to the guest's open file, not to a process: the guest's close()
/// sends FLUSH with the process's owner (which is not the OFD lock's), and the lock must go
/// with the RELEASE of the handle it was taken through. Under every cache mode (under
/// `never` a FORGET follows at once, which would hide a leak).
#[test]
fn ofd_lock_goes_with_the_release_of_its_handle_in_every_cache_mode() {
    for mode in ["auto", "always", "never"] {
        let d = Daemon::start(&["--cache", mode]);
        std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
        let c = d.client();
        let (n, h) = open_f(&c);
        // The open file's owner (OFD) takes bytes 0-9; the process's owner only flushes.
        let ofd_owner = 0x0fd0_0000 + h;
        c.setlk(n, h, ofd_owner, wr(0, 9, 0)).unwrap();
        assert!(
            !host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10),
            "[{mode}] lock not on the host"
        );
        c.flush_owner(n, h, A).unwrap();
        c.release(n, h).unwrap();
        // The node stays known (no FORGET): the lock must be gone all the same.
        assert!(
            host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10),
            "[{mode}] the OFD lock outlived the RELEASE of its handle"
        );
        let h2 = c.open(n, libc::O_RDWR as u32).unwrap().fh;
        c.setlk(n, h2, 0x0fd1_0000, wr(0, 9, 0)).unwrap();
        c.setlk(n, h2, 0x0fd1_0000, un(0, 9)).unwrap();
        c.release(n, h2).unwrap();
        assert_eq!(stat(&d, "locks_held"), 0, "[{mode}]");
        assert_eq!(
            stat(&d, "lock_owners"),
            0,
            "[{mode}] an owner (and its fd) leaked"
        );
    }
}

/// A GETLK poller, a holder and a SETLKW waiter in loops on one file, with many other
/// owners holding ranges elsewhere in it (so a GETLK walks them). No lock order between
/// the owners table and an owner's ranges may freeze the share.
#[test]
fn getlk_poller_holder_and_waiter_never_deadlock() {
    let d = Daemon::start(&["--thread-pool-size", "8"]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    let mut c = FuseClient::new(d.frontend(FrontendConfig {
        request_queues: 3,
        ..Default::default()
    }));
    c.timeout = Duration::from_secs(5);
    c.init().unwrap();
    let (n, h) = open_f(&c);
    for i in 0..200u64 {
        c.setlk(n, h, 0x1000 + i, rd(1000 + 2 * i, 1000 + 2 * i, 9))
            .unwrap();
    }
    let c = &c;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stop = &stop;
    let until = Instant::now() + Duration::from_secs(4);
    std::thread::scope(|s| {
        s.spawn(move || {
            while Instant::now() < until && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match c.setlk(n, h, A, wr(0, 9, 1)) {
                    Ok(()) => c.setlk(n, h, A, un(0, 9)).expect("holder unlock"),
                    Err(FuseError::Errno(libc::EAGAIN)) => {}
                    Err(e) => {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        panic!("holder: {e:?}");
                    }
                }
            }
        });
        s.spawn(move || {
            while Instant::now() < until && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = c.setlkw(2, n, h, B, wr(0, 9, 2)).unwrap();
                if let Err(e) = c.wait(t).and_then(|r| r.ok()) {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    panic!("waiter: {e:?}");
                }
                c.setlk(n, h, B, un(0, 9)).expect("waiter unlock");
            }
        });
        s.spawn(move || {
            let mut polls = 0u64;
            while Instant::now() < until && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (u, req) = c.lk_req(FUSE_GETLK, n, h, C, wr(0, 9, 3));
                let r = c
                    .submit_bytes(3, &req, 64, u)
                    .and_then(|t| c.wait(t))
                    .and_then(|r| r.ok());
                if let Err(e) = r {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    panic!("poller after {polls} GETLKs: {e:?}");
                }
                polls += 1;
            }
        });
    });
}

/// Two SETLKWs the guest sent under one `unique` (a hostile or buggy guest): an INTERRUPT
/// for that unique cancels both, and none is left that nothing can cancel.
#[test]
fn waits_sharing_a_unique_can_all_be_interrupted() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 0, 1)).unwrap();
    const U: u64 = 0xdead_0000;
    let mut tickets = Vec::new();
    for owner in [B, C] {
        let (_, mut req) = c2.lk_req(FUSE_SETLKW, n2, h2, owner, wr(0, 0, 2));
        req[8..16].copy_from_slice(&U.to_ne_bytes());
        tickets.push(c2.submit_bytes(1, &req, 64, U).unwrap());
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(stat(&d2, "lock_waiters"), 2);
    for _ in 0..2 {
        c2.interrupt(U).unwrap();
    }
    let mut c2 = c2;
    c2.timeout = Duration::from_secs(3);
    for t in tickets {
        assert_eq!(
            c2.wait(t).expect("a wait nothing could cancel").error,
            -libc::EINTR
        );
    }
    assert_eq!(stat(&d2, "lock_waiters"), 0);
}

/// Owners cost host fds: a GETLK by a fresh owner opens nothing that stays, an owner whose
/// locks are all gone is dropped, so the owners never outnumber `--max-locks`.
#[test]
fn lock_owners_are_bounded_and_getlk_keeps_none() {
    let d = Daemon::start(&["--max-locks", "8"]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    let c = d.client();
    let (n, h) = open_f(&c);
    c.setlk(n, h, A, wr(0, 0, 1)).unwrap();
    for owner in 0..100u64 {
        let l = c.getlk(n, h, 0x100 + owner, wr(0, 9, 2)).unwrap();
        assert_eq!(
            (l.type_ as i32, l.start, l.end, l.pid),
            (libc::F_WRLCK, 0, 0, 1)
        );
        let l = c.getlk(n, h, 0x100 + owner, wr(5, 9, 2)).unwrap();
        assert_eq!(l.type_ as i32, libc::F_UNLCK);
    }
    // The holder's own GETLK sees no conflict with itself.
    assert_eq!(
        c.getlk(n, h, A, wr(0, 9, 1)).unwrap().type_ as i32,
        libc::F_UNLCK
    );
    for owner in 0..100u64 {
        c.setlk(n, h, 0x1000 + owner, rd(10, 10, 3)).unwrap();
        c.setlk(n, h, 0x1000 + owner, un(0, EOF)).unwrap();
        assert_eq!(
            errno(c.setlk(n, h, 0x1000 + owner, wr(0, 0, 3))),
            libc::EAGAIN
        );
    }
    assert_eq!(stat(&d, "lock_owners"), 1);
    // Past --max-locks, a new owner is refused before it opens anything.
    for owner in 0..7u64 {
        c.setlk(n, h, 0x2000 + owner, rd(20 + owner, 20 + owner, 4))
            .unwrap();
    }
    assert_eq!(errno(c.setlk(n, h, 0x3000, rd(40, 40, 4))), libc::ENOLCK);
    assert_eq!(stat(&d, "lock_owners"), 8);
}

/// Under `--readonly` an owner's host description is opened read-only: a read-write one
/// would make the host's execve of the file fail (ETXTBSY) and break its leases.
#[test]
fn readonly_share_locks_through_read_only_descriptions() {
    let d = Daemon::start(&["--readonly"]);
    let script = d.path("run.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "run.sh").unwrap();
    let h = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    c.setlk(e.nodeid, h, A, rd(0, EOF, 1)).unwrap();
    let st = std::process::Command::new(&script).status();
    assert!(
        matches!(&st, Ok(s) if s.success()),
        "the host could not run the locked file: {st:?}"
    );
}

/// A SETLKW waits while another thread of the same process closes the file (FLUSH of the
/// same owner): as on Linux, the wait goes on and is granted when the holder lets go,
/// rather than spinning on a released owner and never answering.
#[test]
fn a_wait_outlives_a_flush_of_its_owner() {
    let (d1, d2) = two_guests(&[]);
    let c1 = d1.client();
    let c2 = d2.client();
    let (n1, h1) = open_f(&c1);
    let (n2, h2) = open_f(&c2);
    c1.setlk(n1, h1, A, wr(0, 9, 1)).unwrap();
    c2.setlk(n2, h2, B, wr(100, 109, 2)).unwrap();
    let t = c2.setlkw(1, n2, h2, B, wr(0, 9, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Another thread of B's process closes another fd of the file.
    let h3 = c2.open(n2, libc::O_RDWR as u32).unwrap().fh;
    c2.flush_owner(n2, h3, B).unwrap();
    c2.release(n2, h3).unwrap();
    assert!(
        host_ofd_lock(&d2.path("f"), libc::F_WRLCK, 100, 10),
        "the FLUSH left B's held lock"
    );
    c1.setlk(n1, h1, A, un(0, 9)).unwrap();
    let mut c2 = c2;
    c2.timeout = Duration::from_secs(3);
    assert_eq!(c2.wait(t).expect("the wait was answered").error, 0);
    assert!(
        !host_ofd_lock(&d2.path("f"), libc::F_WRLCK, 0, 10),
        "B was granted the lock"
    );
    assert_eq!(stat(&d2, "lock_waiters"), 0);
}

/// Runs a cycle of classic POSIX locks (F_SETLKW) among processes on the host, as the
/// kernel arbitrates them on a local directory. Process `i` (0 the caller, the others
/// forked) holds a write lock on byte `ranges[i].1` of file `ranges[i].0` and then waits
/// for the next one's (`ranges[(i + 1) % n]`). The children wait first; the caller's wait
/// closes the cycle. Returns the caller's errno (0 if it was granted), after it let go of
/// its own lock and every child was granted its wait and exited.
fn host_posix_cycle(ranges: &[(std::path::PathBuf, u64)]) -> i32 {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let n = ranges.len();
    let paths: Vec<CString> = ranges
        .iter()
        .map(|(p, _)| CString::new(p.as_os_str().as_bytes()).unwrap())
        .collect();
    let lock = |fd: i32, typ: i32, byte: u64, cmd: i32| -> i32 {
        // SAFETY: plain data; all-zero is valid.
        let mut f: libc::flock = unsafe { std::mem::zeroed() };
        f.l_type = typ as libc::c_short;
        f.l_whence = libc::SEEK_SET as libc::c_short;
        f.l_start = byte as libc::off_t;
        f.l_len = 1;
        // SAFETY: plain fcntl on an fd of this process with a live flock.
        if unsafe { libc::fcntl(fd, cmd, &f) } == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    let open = |p: &CString| {
        // SAFETY: a NUL-terminated path built before any fork.
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(fd >= 0);
        fd
    };
    // One fd per file for the caller (POSIX locks are per process and file).
    let my_fds: Vec<i32> = paths.iter().map(open).collect();
    let mut held = [0i32; 2];
    let mut go = [0i32; 2];
    // SAFETY: pipe fills two fds.
    assert_eq!(unsafe { libc::pipe(held.as_mut_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    let mut pids = Vec::new();
    for i in 1..n {
        let (hold, want) = (&ranges[i], &ranges[(i + 1) % n]);
        let (hp, wp) = (&paths[i], &paths[(i + 1) % n]);
        // SAFETY: the child only makes syscalls (open, fcntl, read, write, _exit) on
        // memory made before the fork, and allocates nothing.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above: syscalls only, then _exit.
            unsafe {
                let hfd = libc::open(hp.as_ptr(), libc::O_RDWR);
                let wfd = libc::open(wp.as_ptr(), libc::O_RDWR);
                let mut code = 1;
                if hfd >= 0 && wfd >= 0 && lock(hfd, libc::F_WRLCK, hold.1, libc::F_SETLK) == 0 {
                    libc::write(held[1], b"h".as_ptr().cast(), 1);
                    let mut b = 0u8;
                    libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                    // Granted once the cycle is broken; exiting lets go of both.
                    if lock(wfd, libc::F_WRLCK, want.1, libc::F_SETLKW) == 0 {
                        code = 0;
                    }
                }
                libc::_exit(code);
            }
        }
        pids.push(pid);
    }
    for _ in 1..n {
        let mut b = 0u8;
        // SAFETY: reads one byte into a live u8.
        assert_eq!(
            unsafe { libc::read(held[0], (&mut b as *mut u8).cast(), 1) },
            1
        );
    }
    assert_eq!(
        lock(my_fds[0], libc::F_WRLCK, ranges[0].1, libc::F_SETLK),
        0
    );
    for _ in 1..n {
        // SAFETY: writes one byte from a live buffer.
        assert_eq!(unsafe { libc::write(go[1], b"g".as_ptr().cast(), 1) }, 1);
    }
    // Every child blocked: /proc/locks lists each waiter with "->".
    let t = Instant::now();
    loop {
        let s = std::fs::read_to_string("/proc/locks").unwrap();
        let blocked = s
            .lines()
            .filter(|l| l.contains("->"))
            .filter(|l| {
                pids.iter()
                    .any(|p| l.split_whitespace().nth(5) == Some(&p.to_string()))
            })
            .count();
        if blocked == n - 1 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "children never all waited"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = lock(
        my_fds[1 % n],
        libc::F_WRLCK,
        ranges[1 % n].1,
        libc::F_SETLKW,
    );
    assert_eq!(
        lock(my_fds[0], libc::F_UNLCK, ranges[0].1, libc::F_SETLK),
        0
    );
    for p in pids {
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(p, &mut st, 0) }, p);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "a child's wait was not granted"
        );
    }
    for fd in my_fds.into_iter().chain(held).chain(go) {
        // SAFETY: closes fds this function opened.
        unsafe { libc::close(fd) };
    }
    e
}

/// The same cycle through vfsd: owner `owners[i]` holds byte `ranges[i].1` of node
/// `ranges[i].0` (with handle `fhs[i]`) and waits for the next one's; the owners after the
/// first wait first, and the first's wait closes the cycle. Returns the first's errno (a
/// reply within a few seconds: a wait that never ends fails the test), then checks that
/// the other waits go on and are each granted once the cycle is broken: the first lets go,
/// then each granted owner lets go in turn.
fn vfsd_cycle(c: &mut FuseClient, d: &Daemon, owners: &[u64], ranges: &[(u64, u64, u64)]) -> i32 {
    let n = owners.len();
    for i in 0..n {
        let (node, fh, byte) = ranges[i];
        c.setlk(node, fh, owners[i], wr(byte, byte, 100 + i as u32))
            .unwrap();
    }
    let mut tickets = Vec::new();
    for i in 1..n {
        let (node, fh, byte) = ranges[(i + 1) % n];
        tickets.push(
            c.setlkw(1, node, fh, owners[i], wr(byte, byte, 100 + i as u32))
                .unwrap(),
        );
    }
    let t = Instant::now();
    while stat(d, "lock_waiters") < (n - 1) as u64 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the waits never began"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (node, fh, byte) = ranges[1 % n];
    let last = c
        .setlkw(1, node, fh, owners[0], wr(byte, byte, 100))
        .unwrap();
    c.timeout = Duration::from_secs(3);
    let e = -c
        .wait(last)
        .expect("no answer to the SETLKW that closes the cycle: it waits for ever")
        .error;
    std::thread::sleep(Duration::from_millis(100));
    assert!(c.poll_done(1).unwrap().is_empty(), "another wait ended");
    // Breaking the cycle: the first lets go, and each owner granted lets go in turn.
    let (node, fh, byte) = ranges[0];
    c.setlk(node, fh, owners[0], un(byte, byte)).unwrap();
    for i in (1..n).rev() {
        let r = c.wait(tickets[i - 1]).expect("a wait was not granted");
        assert_eq!(r.error, 0, "owner {i}'s wait");
        for &(node, fh, _) in ranges {
            c.setlk(node, fh, owners[i], un(0, EOF)).unwrap();
        }
    }
    e
}

/// Two owners of one guest, each holding a byte of one file and waiting for the other's:
/// the wait that closes the cycle gets EDEADLK, as two processes get it from the host
/// kernel with F_SETLKW, and the other wait is granted once the cycle is broken.
#[test]
fn a_two_owner_lock_cycle_gets_edeadlk_as_on_the_host() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    let host = tempfile::tempdir().unwrap();
    let hf = host.path().join("f");
    std::fs::write(&hf, vec![0u8; 4096]).unwrap();
    let expected = host_posix_cycle(&[(hf.clone(), 0), (hf, 1)]);
    assert_eq!(expected, libc::EDEADLK, "the host kernel's answer");
    let mut c = d.client();
    let (n, h) = open_f(&c);
    let e = vfsd_cycle(&mut c, &d, &[A, B], &[(n, h, 0), (n, h, 1)]);
    assert_eq!(e, expected);
    assert_eq!(stat(&d, "lock_waiters"), 0);
    assert_eq!(stat(&d, "lock_edeadlk"), 1);
}

/// A cycle across two files: one owner holds a byte of file 1 and waits for file 2, the
/// other the reverse (an owner is a guest process, whatever file it locks).
#[test]
fn a_lock_cycle_across_two_files_gets_edeadlk_as_on_the_host() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    std::fs::write(d.path("g"), vec![0u8; 4096]).unwrap();
    let host = tempfile::tempdir().unwrap();
    let (hf, hg) = (host.path().join("f"), host.path().join("g"));
    std::fs::write(&hf, b"x").unwrap();
    std::fs::write(&hg, b"x").unwrap();
    let expected = host_posix_cycle(&[(hf, 0), (hg, 0)]);
    assert_eq!(expected, libc::EDEADLK, "the host kernel's answer");
    let mut c = d.client();
    let (nf, hf) = open_f(&c);
    let ng = c.lookup(ROOT, "g").unwrap().nodeid;
    let hg = c.open(ng, libc::O_RDWR as u32).unwrap().fh;
    let e = vfsd_cycle(&mut c, &d, &[A, B], &[(nf, hf, 0), (ng, hg, 0)]);
    assert_eq!(e, expected);
}

/// Three owners in a ring (A waits for B, B for C, C for A) over two files.
#[test]
fn a_three_owner_lock_cycle_gets_edeadlk_as_on_the_host() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    std::fs::write(d.path("g"), vec![0u8; 4096]).unwrap();
    let host = tempfile::tempdir().unwrap();
    let (hf, hg) = (host.path().join("f"), host.path().join("g"));
    std::fs::write(&hf, b"xx").unwrap();
    std::fs::write(&hg, b"x").unwrap();
    let expected = host_posix_cycle(&[(hf.clone(), 0), (hg, 0), (hf, 1)]);
    assert_eq!(expected, libc::EDEADLK, "the host kernel's answer");
    let mut c = d.client();
    let (nf, hf) = open_f(&c);
    let ng = c.lookup(ROOT, "g").unwrap().nodeid;
    let hg = c.open(ng, libc::O_RDWR as u32).unwrap().fh;
    let e = vfsd_cycle(
        &mut c,
        &d,
        &[A, B, C],
        &[(nf, hf, 0), (ng, hg, 0), (nf, hf, 1)],
    );
    assert_eq!(e, expected);
}

/// A chain of waits that ends at a holder outside vfsd (a host process) is no cycle: A
/// waits for B, B for the host's lock, and both are granted in turn when it goes.
#[test]
fn a_wait_chain_ending_at_a_host_lock_is_no_deadlock() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), vec![0u8; 4096]).unwrap();
    let host = HostOfdLock::take(&d.path("f"), 2, 1);
    let mut c = d.client();
    c.timeout = Duration::from_secs(3);
    let (n, h) = open_f(&c);
    c.setlk(n, h, A, wr(0, 0, 1)).unwrap();
    c.setlk(n, h, B, wr(1, 1, 2)).unwrap();
    let tb = c.setlkw(1, n, h, B, wr(2, 2, 2)).unwrap();
    let ta = c.setlkw(1, n, h, A, wr(1, 1, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.poll_done(1).unwrap().is_empty(), "a wait ended early");
    assert_eq!(stat(&d, "lock_waiters"), 2);
    host.release();
    assert_eq!(c.wait(tb).unwrap().error, 0);
    c.setlk(n, h, B, un(0, EOF)).unwrap();
    assert_eq!(c.wait(ta).unwrap().error, 0);
    assert_eq!(stat(&d, "lock_edeadlk"), 0);
}

/// The host walks every lock of a file at each lock call on it (and a migration's
/// destination places them all again, n²/2 steps for n, while the VM is paused): past
/// `--max-locks-per-file` ranges on one file, over all its owners, a lock that would add
/// one gets ENOLCK, while other files still lock and an unlock gives room back.
#[test]
fn locks_past_the_bound_per_file_get_enolck_and_other_files_still_lock() {
    let d = Daemon::start(&["--max-locks-per-file", "100"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    std::fs::write(d.path("g"), b"x").unwrap();
    let c = d.client();
    let (node, fh) = open_f(&c);
    // Two owners, 50 ranges each, fill the file's bound.
    for owner in [A, A + 1] {
        for i in 0..50 {
            let byte = 2 * (i + 50 * (owner - A));
            c.setlk(node, fh, owner, rd(byte, byte, 1)).unwrap();
        }
    }
    assert_eq!(stat(&d, "locks_held"), 100);
    assert_eq!(
        errno(c.setlk(node, fh, A + 2, rd(1000, 1000, 1))),
        libc::ENOLCK
    );
    // Merging into an existing range adds none: still granted.
    c.setlk(node, fh, A, rd(1, 1, 1)).unwrap();
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    let gh = c.open(g, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(g, gh, A, rd(0, 0, 1)).unwrap();
    c.setlk(node, fh, A + 1, un(0, i64::MAX as u64)).unwrap();
    c.setlk(node, fh, A + 2, rd(1000, 1000, 1)).unwrap();
}

/// SETLKWs of shared flocks on `n`, one per handle in `handles`, while a host program
/// holds it exclusively: each either waits or is refused. Returns the waiting ones'
/// tickets and checks that the refused ones got ENOLCK.
fn waits_and_refusals(c: &FuseClient, d: &Daemon, n: u64, handles: &[u64]) -> Vec<Ticket> {
    let tickets: Vec<Ticket> = handles
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            c.setlkw(1, n, h, 0x100 + i as u64, Lock::flock(libc::F_RDLCK))
                .unwrap()
        })
        .collect();
    let mut refused = Vec::new();
    let t = Instant::now();
    loop {
        for (slot, raw) in c.poll_done(1).unwrap() {
            let h: fuse_backend_rs::abi::fuse_abi::OutHeader =
                *vm_memory::ByteValued::from_slice(&raw[..16]).unwrap();
            assert_eq!(h.error, -libc::ENOLCK, "a SETLKW past the share");
            refused.push(slot);
        }
        let waiting = stat(d, "lock_waiters") as usize;
        // Settled: every request waits or was refused, and half of them were.
        if waiting + refused.len() == handles.len() && refused.len() >= handles.len() / 2 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{waiting} waits and {} refused of {}: half the queue's entries may be lock waits",
            refused.len(),
            handles.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(refused.len(), handles.len() / 2);
    assert_eq!(stat(d, "lock_waiters") as usize, handles.len() / 2);
    tickets
        .into_iter()
        .filter(|t| !refused.contains(&t.slot))
        .collect()
}

/// Lock waits take at most half of a request queue's descriptors: a host program holds an
/// exclusive flock on `f` and 64 shared flock SETLKWs come on a queue with room for 64
/// requests. Half wait, half are refused ENOLCK at once, and GETATTR, LOOKUP and READ of
/// another file on the same queue are answered while the waits last (without the share
/// every request would be a wait, and nothing else could be sent). The host's unlock
/// grants every wait, and their places come back: a second round goes the same way.
/// `indirect`: each request behind one descriptor (the Linux guest's way), else two.
fn lock_waits_take_at_most_half_of_a_request_queue(indirect: bool) {
    const REQUESTS: usize = 64;
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"locked").unwrap();
    std::fs::write(d.path("g"), b"another file").unwrap();
    let mut c = FuseClient::new(d.frontend(FrontendConfig {
        request_queues: 1,
        slots: REQUESTS,
        descs_per_slot: if indirect { 1 } else { 2 },
        buf_size: 8192,
        ..Default::default()
    }));
    c.layout.indirect = indirect;
    c.timeout = Duration::from_secs(5);
    c.init().unwrap();
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    let handles: Vec<u64> = (0..REQUESTS)
        .map(|_| c.open(n, libc::O_RDONLY as u32).unwrap().fh)
        .collect();
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    let gh = c.open(g, libc::O_RDONLY as u32).unwrap().fh;
    for round in 0..2 {
        let (ok, holder) = host_flock(&d.path("f"), libc::LOCK_EX);
        assert!(ok, "round {round}: the host's flock");
        let waiting = waits_and_refusals(&c, &d, n, &handles);
        // The rest of the queue serves everything else.
        c.lookup(ROOT, "g").unwrap();
        c.getattr(g).unwrap();
        assert_eq!(c.read(g, gh, 0, 64).unwrap(), b"another file");
        assert_eq!(stat(&d, "lock_waiters") as usize, REQUESTS / 2);
        drop(holder);
        for t in waiting {
            assert_eq!(c.wait(t).unwrap().error, 0, "a wait granted by the unlock");
        }
        for (i, &h) in handles.iter().enumerate() {
            c.setlk(n, h, 0x100 + i as u64, Lock::flock(libc::F_UNLCK))
                .unwrap();
        }
    }
}

#[test]
fn lock_waits_take_at_most_half_of_a_request_queue_of_indirect_chains() {
    lock_waits_take_at_most_half_of_a_request_queue(true);
}

#[test]
fn lock_waits_take_at_most_half_of_a_request_queue_of_direct_chains() {
    lock_waits_take_at_most_half_of_a_request_queue(false);
}

/// A flock taken by guest process `pid` (the guest sends the caller's tgid with it).
fn flock_by(typ: i32, pid: u32) -> Lock {
    Lock {
        pid,
        ..Lock::flock(typ)
    }
}

/// Two guest processes, each holding a flock on one file and waiting for the other's: the
/// wait that closes the cycle gets EDEADLK (neither process could be killed while it waits
/// in a forwarded flock), and the other wait is granted once the cycle is broken.
#[test]
fn a_flock_cycle_between_two_processes_gets_edeadlk() {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("f"), b"x").unwrap();
    std::fs::write(d.path("g"), b"x").unwrap();
    let mut c = d.client();
    c.timeout = Duration::from_secs(3);
    let nf = c.lookup(ROOT, "f").unwrap().nodeid;
    let ng = c.lookup(ROOT, "g").unwrap().nodeid;
    let open = |n: u64| c.open(n, libc::O_RDWR as u32).unwrap().fh;
    // Each process opens both files: flock belongs to the open file.
    let (a_f, a_g) = (open(nf), open(ng));
    let (b_f, b_g) = (open(nf), open(ng));
    c.setlk(nf, a_f, a_f, flock_by(libc::F_WRLCK, 100)).unwrap();
    c.setlk(ng, b_g, b_g, flock_by(libc::F_WRLCK, 200)).unwrap();
    let ta = c
        .setlkw(1, ng, a_g, a_g, flock_by(libc::F_WRLCK, 100))
        .unwrap();
    let t = Instant::now();
    while stat(&d, "lock_waiters") < 1 {
        assert!(t.elapsed() < Duration::from_secs(5), "the wait never began");
        std::thread::sleep(Duration::from_millis(5));
    }
    let tb = c
        .setlkw(1, nf, b_f, b_f, flock_by(libc::F_WRLCK, 200))
        .unwrap();
    let r = c
        .wait(tb)
        .expect("no answer to the flock wait that closes the cycle: it waits for ever");
    assert_eq!(r.error, -libc::EDEADLK);
    assert_eq!(stat(&d, "lock_edeadlk"), 1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(c.poll_done(1).unwrap().is_empty(), "the first wait ended");
    c.setlk(ng, b_g, b_g, flock_by(libc::F_UNLCK, 0)).unwrap();
    assert_eq!(c.wait(ta).unwrap().error, 0);
    assert_eq!(stat(&d, "lock_waiters"), 0);
}

/// A guest owner holding a lock whose process sends nothing for `--lock-stall-timeout`
/// while another owner waits for it (a parent that SIGKILLs its
/// child, blocked in a forwarded F_SETLKW for the parent's lock, and waits for it before
/// closing the file): the wait gets EDEADLK, so the waiting process can take its signal.
#[test]
fn a_wait_for_a_stalled_guest_holder_gets_edeadlk() {
    let d = Daemon::start(&["--lock-stall-timeout", "1"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let mut c = d.client();
    c.timeout = Duration::from_secs(5);
    let (n, h) = open_f(&c);
    c.setlk(n, h, A, wr(0, 9, 1)).unwrap();
    let began = Instant::now();
    let t = c.setlkw(1, n, h, B, wr(5, 5, 2)).unwrap();
    let r = c
        .wait(t)
        .expect("no answer to a wait for a stalled holder: it waits for ever");
    let took = began.elapsed();
    assert_eq!(r.error, -libc::EDEADLK);
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "answered after {took:?}"
    );
    assert_eq!(stat(&d, "lock_stalled"), 1);
    assert_eq!(stat(&d, "lock_waiters"), 0);
    // B took nothing; A still holds its range until it lets go.
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 5, 1));
    c.setlk(n, h, A, un(0, 9)).unwrap();
    assert!(host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
}

/// Owner A of guest pid `pid` holds bytes 0-9 under `--lock-stall-timeout 1` while B
/// waits for byte 5, and for 3 s `busy` runs every 200 ms: the wait must go on, not
/// stall out, and A's unlock grants it.
fn a_busy_holders_waiter_goes_on(pid: u32, busy: impl Fn(&FuseClient, u64, u64)) {
    let d = Daemon::start(&["--lock-stall-timeout", "1"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let mut c = d.client();
    c.timeout = Duration::from_secs(3);
    let (n, h) = open_f(&c);
    c.setlk(n, h, A, wr(0, 9, pid)).unwrap();
    let t = c.setlkw(1, n, h, B, wr(5, 5, pid + 1)).unwrap();
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        busy(&c, n, h);
    }
    assert!(c.poll_done(1).unwrap().is_empty(), "the wait ended");
    assert_eq!(stat(&d, "lock_waiters"), 1);
    c.setlk(n, h, A, un(0, 9)).unwrap();
    assert_eq!(c.wait(t).unwrap().error, 0);
    assert_eq!(stat(&d, "lock_stalled"), 0);
}

/// A holder that keeps making lock requests (here GETLK on another range) is not
/// stalled.
#[test]
fn a_wait_for_a_holder_that_keeps_locking_goes_on() {
    a_busy_holders_waiter_goes_on(1, |c, n, h| {
        c.getlk(n, h, A, rd(100, 100, 1)).unwrap();
    });
}

/// A holder whose process keeps sending other requests (here GETATTRs as its pid, as
/// its I/O on the share would come) is busy, not stalled, though it makes no lock call.
#[test]
fn a_wait_for_a_holder_busy_with_other_requests_goes_on() {
    let holder = Caller {
        uid: 0,
        gid: 0,
        pid: 7,
    };
    a_busy_holders_waiter_goes_on(7, |c, n, _| {
        c.as_caller(holder, |c| c.getattr(n)).unwrap();
    });
}

/// A holder outside the guest (a host process) never stalls a wait out, however long it
/// holds the lock: that wait ends when the host lets go.
#[test]
fn a_wait_for_a_host_holder_is_never_stalled_out() {
    let d = Daemon::start(&["--lock-stall-timeout", "1"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let host = HostOfdLock::take(&d.path("f"), 0, 10);
    let mut c = d.client();
    c.timeout = Duration::from_secs(3);
    let (n, h) = open_f(&c);
    let t = c.setlkw(1, n, h, B, wr(5, 5, 2)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(c.poll_done(1).unwrap().is_empty(), "the wait ended");
    host.release();
    assert_eq!(c.wait(t).unwrap().error, 0);
    assert_eq!(stat(&d, "lock_stalled"), 0);
}
