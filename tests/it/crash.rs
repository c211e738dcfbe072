//! Crash survival: when the serving process dies (SIGKILL, the OOM killer, SIGSEGV,
//! SIGABRT, SIGSYS), the supervisor starts a new one on the frontend's connection within
//! a second. Node ids and file handles the frontend holds stay valid, open files keep
//! their locks, open directories their position, and every request in flight at the
//! crash is answered exactly once, as docs/design.md's table says: run again where that
//! is exact, EIO where it is not (MKDIR, UNLINK, RENAME, CREATE with O_EXCL, a WRITE on
//! an O_APPEND handle, ...), no reply for FORGET. More than ten crashes within 60 s end
//! the connection, as any crash did before.
//!
//! The per-opcode tests need the test hook (`--features test-hooks`):
//! `VFSD_TEST_CRASH=<when>:<opcode number>[:<nth>][:every]` has the first serving process
//! die (abort) at the nth request of that opcode, `popped` right after popping it,
//! `served` once the file system acted and before the answer is on the used ring; with
//! `:every` the processes that replace it get the hook too.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{errno, host_flock, host_ofd_lock, is_root, pattern, Daemon, HostLease, ROOT};
use fuse_backend_rs::abi::fuse_abi::OpenOut;
use vfsd::frontend::fuse::{decode, FuseClient, Lock, FUSE_GETATTR};
#[cfg(feature = "test-hooks")]
use vfsd::frontend::fuse::{
    FUSE_CREATE, FUSE_FORGET, FUSE_FSYNC, FUSE_MKDIR, FUSE_READ, FUSE_RENAME, FUSE_SETLKW,
    FUSE_UNLINK, FUSE_WRITE,
};

/// How long any answer may take here, crash or not: recovery is due within a second;
/// the benchmarks hold the tighter figure.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// Crashes a connection survives within a minute.
const CRASH_LOOP: usize = 10;
const OWNER: u64 = 0xc4a5;

/// A client with INIT done that gives up on an answer after `ANSWER_LIMIT`.
fn client(d: &Daemon) -> FuseClient {
    let mut c = d.client();
    c.timeout = ANSWER_LIMIT;
    c
}

/// Every child of `p` (of each of its threads).
fn children(p: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// A process's start time (clock ticks after boot), 0 if it is gone.
fn started(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(19)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The serving process below the supervisor `sup` right now, and its depth: the deepest
/// running process of the tree, the newest among equals. Not the first child's line:
/// after a take-over the dead process's keeper (the sandbox's parent, which held its
/// files) may still be there, a leaf beside the new one's keeper.
fn deepest(sup: i32) -> (i32, usize) {
    let mut best = (0, 0, sup);
    let mut todo = vec![(sup, 0)];
    while let Some((p, depth)) = todo.pop() {
        if depth > 0 && alive(p) && (depth, started(p)) > (best.0, best.1) {
            best = (depth, started(p), p);
        }
        todo.extend(children(p).into_iter().map(|c| (c, depth + 1)));
    }
    (best.2, best.0)
}

/// The process serving for vfsd `sup`, once it runs below the sandbox's parent that
/// keeps its files (two levels down, in every sandbox mode).
fn serving_pid(sup: i32) -> i32 {
    let t = Instant::now();
    loop {
        let (p, depth) = deepest(sup);
        if depth >= 2 || t.elapsed() > Duration::from_secs(5) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` runs (exists and is no zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Sends `sig` to the serving process of `d` until it is dead (the Rust runtime's
/// stack-overflow handler takes a first SIGSEGV that no fault caused, and puts the
/// default action back); gives the dead process's pid.
fn crash(d: &Daemon, sig: i32) -> i32 {
    let victim = serving_pid(d.pid());
    assert_ne!(victim, d.pid(), "no serving process below vfsd {}", d.pid());
    let t = Instant::now();
    while alive(victim) {
        // SAFETY: kill with a valid signal on a process of the daemon this test started.
        unsafe { libc::kill(victim, sig) };
        let sent = Instant::now();
        while alive(victim) && sent.elapsed() < Duration::from_millis(200) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "signal {sig} does not end the serving process {victim}"
        );
    }
    victim
}

/// Waits until a process other than `old` serves below the supervisor `sup`.
fn wait_replaced(sup: i32, old: i32) -> i32 {
    let t = Instant::now();
    loop {
        let (p, depth) = deepest(sup);
        if p != old && depth >= 2 {
            return p;
        }
        assert!(
            t.elapsed() < ANSWER_LIMIT,
            "no new serving process {ANSWER_LIMIT:?} after {old} died (the supervisor {sup} {})",
            if alive(sup) { "still runs" } else { "exited" }
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the frontend's vhost-user connection ends (the daemon closed it) within
/// `within`.
fn connection_ended(c: &FuseClient, within: Duration) -> bool {
    let fd = c.fe.vu.as_raw_fd();
    let t = Instant::now();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut p, 1, 50) };
        if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            return true;
        }
        if p.revents & libc::POLLIN != 0 {
            let mut b = [0u8; 1];
            // SAFETY: recv into a live one-byte buffer; MSG_PEEK leaves the data queued.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.elapsed() > within {
            return false;
        }
    }
}

fn ino(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

/// A host process's OFD lock on a range of `path`, held until dropped.
struct HostLock {
    _held: std::fs::File,
}

impl HostLock {
    fn take(path: &Path, start: i64, len: i64) -> HostLock {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: plain data, zeroed is valid; l_pid 0 as OFD locks require.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = start;
        fl.l_len = len;
        // SAFETY: plain fcntl on an fd we own with a pointer to a live flock.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        assert_eq!(r, 0, "F_OFD_SETLK: {}", std::io::Error::last_os_error());
        HostLock { _held: f }
    }
}

#[test]
fn a_killed_serving_process_is_replaced_on_the_same_connection_with_nodes_and_handles() {
    let d = Daemon::start(&[]);
    let c = Arc::new(client(&d));
    let content = pattern(64 << 10, 7);
    std::fs::write(d.path("f"), &content).unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    // A directory open and read part-way.
    std::fs::create_dir(d.path("dir")).unwrap();
    let names: BTreeSet<Vec<u8>> = (0..200)
        .map(|i| format!("entry-with-a-longish-name-{i:03}").into_bytes())
        .collect();
    for n in &names {
        std::fs::write(
            d.path("dir").join(String::from_utf8_lossy(n).as_ref()),
            b"e",
        )
        .unwrap();
    }
    let dir = c.lookup(ROOT, "dir").unwrap();
    let dh = c.opendir(dir.nodeid).unwrap().fh;
    let first = c.readdir(dir.nodeid, dh, 0, 1024, false).unwrap();
    assert!(
        !first.is_empty() && first.len() < 100,
        "{} entries",
        first.len()
    );
    // Nodes the frontend knows, and an open file unlinked on the host.
    let mut known: Vec<(String, u64)> = (0..50)
        .map(|i| {
            let name = format!("entry-with-a-longish-name-{i:03}");
            (name.clone(), c.lookup(dir.nodeid, &name).unwrap().nodeid)
        })
        .collect();
    std::fs::write(d.path("gone"), b"unlinked but open").unwrap();
    let g = c.lookup(ROOT, "gone").unwrap();
    let gh = c.open(g.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    std::fs::remove_file(d.path("gone")).unwrap();
    known.extend([
        ("f".into(), f.nodeid),
        ("dir".into(), dir.nodeid),
        ("gone".into(), g.nodeid),
    ]);

    // Writes at offsets go on without pause across the crash; each answer's time is kept.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut answered = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = c.write(f.nodeid, fh, (128 << 10) + 8 * n, &n.to_le_bytes()) {
                    return Err(format!("write {n}: {e}"));
                }
                answered.push(Instant::now());
                n += 1;
            }
            Ok((n, answered))
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let old = crash(&d, libc::SIGKILL);
    let killed_at = Instant::now();
    let new = wait_replaced(d.pid(), old);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (n, answered) = writer
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("a write across the crash failed: {e}"));
    let gap = answered
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let after = answered.iter().find(|&&t| t > killed_at);
    eprintln!(
        "crash: {n} writes; serving process {old} killed, {new} serves; largest gap between answers {} ms, first answer {} ms after the kill",
        gap.as_millis(),
        after.map_or(-1, |t| (*t - killed_at).as_millis() as i64)
    );
    assert!(after.is_some(), "no write was answered after the kill");
    assert!(gap < ANSWER_LIMIT, "largest gap {gap:?}");
    assert!(alive(d.pid()), "the supervisor is gone");

    // Every write is there once, in its place.
    let data = std::fs::read(d.path("f")).unwrap();
    for i in 0..n {
        let at = (128 << 10) + 8 * i as usize;
        assert_eq!(data[at..at + 8], i.to_le_bytes(), "write {i} of {n}");
    }
    // The node and the handle from before.
    assert_eq!(c.getattr(f.nodeid).unwrap().attr.ino, ino(&d.path("f")));
    assert_eq!(
        c.read(f.nodeid, fh, 4096, 4096).unwrap(),
        content[4096..8192]
    );
    c.write(f.nodeid, fh, 100, b"after the crash").unwrap();
    assert_eq!(c.read(f.nodeid, fh, 100, 15).unwrap(), b"after the crash");
    assert_eq!(
        &std::fs::read(d.path("f")).unwrap()[100..115],
        b"after the crash"
    );
    assert_eq!(c.read(g.nodeid, gh, 0, 64).unwrap(), b"unlinked but open");
    // The directory handle goes on where it stopped: every name once.
    let mut listed: Vec<Vec<u8>> = first.iter().map(|e| e.name.clone()).collect();
    let mut off = first.last().unwrap().off;
    loop {
        let batch = c.readdir(dir.nodeid, dh, off, 1024, false).unwrap();
        let Some(last) = batch.last() else { break };
        off = last.off;
        listed.extend(batch.into_iter().map(|e| e.name));
    }
    listed.retain(|n| n != b"." && n != b"..");
    let unique: BTreeSet<Vec<u8>> = listed.iter().cloned().collect();
    assert_eq!(listed.len(), unique.len(), "names listed twice");
    assert_eq!(unique, names, "the directory handle lost its place");
    c.releasedir(dir.nodeid, dh).unwrap();
    // A known name is the same node; new names get node ids never given before.
    for (name, id) in &known[..50] {
        assert_eq!(
            c.lookup(dir.nodeid, name).unwrap().nodeid,
            *id,
            "dir/{name}"
        );
    }
    assert_eq!(c.lookup(ROOT, "f").unwrap().nodeid, f.nodeid, "f");
    assert_eq!(c.lookup(ROOT, "dir").unwrap().nodeid, dir.nodeid, "dir");
    let old_ids: BTreeSet<u64> = known.iter().map(|k| k.1).chain([ROOT]).collect();
    let mut new_ids = BTreeSet::new();
    for i in 0..50 {
        std::fs::write(d.path(&format!("new{i}")), b"n").unwrap();
        let e = c.lookup(ROOT, &format!("new{i}")).unwrap();
        assert!(
            !old_ids.contains(&e.nodeid),
            "new{i} got node id {}, given before the crash",
            e.nodeid
        );
        assert!(new_ids.insert(e.nodeid), "node id {} twice", e.nodeid);
        assert_eq!(
            c.getattr(e.nodeid).unwrap().attr.ino,
            ino(&d.path(&format!("new{i}")))
        );
    }
    c.release(f.nodeid, fh).unwrap();
    c.release(g.nodeid, gh).unwrap();
}

#[test]
fn requests_in_flight_at_a_crash_are_all_answered() {
    let d = Daemon::start(&[]);
    let c = client(&d);
    let content = pattern(256 << 10, 3);
    std::fs::write(d.path("f"), &content).unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    std::fs::write(d.path("leased"), b"leased").unwrap();
    let l = c.lookup(ROOT, "leased").unwrap();
    // An OPEN held in the host kernel by a lease: surely in flight at the crash.
    let lease = HostLease::take(&d.path("leased"));
    let open = c.submit_open(l.nodeid, libc::O_WRONLY as u32).unwrap();
    lease.wait_broken();
    // And a burst of reads and GETATTRs, as many as the queue takes.
    let mut burst = Vec::new();
    for i in 0..14u64 {
        let t = if i % 2 == 0 {
            let (u, req) = c.read_req(f.nodeid, fh, i * 16384, 16384);
            (c.submit_bytes(1, &req, 16 + 16384, u).unwrap(), Some(i))
        } else {
            // fuse_getattr_in: no flags, no handle.
            let getattr_in = [0u8; 16];
            let t = c.submit(1, FUSE_GETATTR, f.nodeid, &[&getattr_in], 4096);
            (t.unwrap(), None)
        };
        burst.push(t);
    }
    crash(&d, libc::SIGKILL);
    for (t, read_at) in burst {
        let r = c
            .wait(t)
            .unwrap_or_else(|e| panic!("request {} after the crash: {e}", t.unique));
        let data = r.ok().unwrap();
        if let Some(i) = read_at {
            let at = (i * 16384) as usize;
            assert_eq!(data, content[at..at + 16384], "read at {at}");
        }
    }
    // The OPEN still waits on the lease, in the new process; then it is served.
    std::thread::sleep(Duration::from_millis(300));
    assert!(lease.broken());
    c.getattr(ROOT).expect("a request after the crash");
    drop(lease);
    let o = c
        .wait(open)
        .unwrap()
        .ok()
        .expect("the OPEN in flight at the crash");
    let o: OpenOut = decode(&o).unwrap();
    c.write(l.nodeid, o.fh, 0, b"LEASED").unwrap();
    assert_eq!(std::fs::read(d.path("leased")).unwrap(), b"LEASED");
}

/// The signals a serving process dies of, each survived: four crashes on one
/// connection, within the crash-loop bound. Not in the namespace sandbox, whose serving process
/// is its pid namespace's init: the kernel spares it every signal from outside it has no
/// handler for, but SIGKILL (the other tests' crash).
#[test]
fn each_fatal_signal_to_the_serving_process_is_survived() {
    let sandboxes: &[&str] = if is_root() {
        &["none", "chroot"]
    } else {
        &["none"]
    };
    for sandbox in sandboxes {
        let d = Daemon::start(&["--sandbox", sandbox]);
        let c = client(&d);
        std::fs::write(d.path("f"), b"0123456789").unwrap();
        let f = c.lookup(ROOT, "f").unwrap();
        let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
        for (i, sig) in [libc::SIGKILL, libc::SIGSEGV, libc::SIGABRT, libc::SIGSYS]
            .into_iter()
            .enumerate()
        {
            let what = format!("{sandbox}, signal {sig}");
            let want = std::fs::read(d.path("f")).unwrap();
            let old = crash(&d, sig);
            let t = Instant::now();
            let r = c.read(f.nodeid, fh, 0, 10);
            let took = t.elapsed();
            assert_eq!(
                r.unwrap_or_else(|e| panic!("{what}: READ after the crash: {e}")),
                want,
                "{what}"
            );
            eprintln!("{what}: answered {} ms after the crash", took.as_millis());
            assert_ne!(serving_pid(d.pid()), old, "{what}");
            let at = i as u64 * 2;
            c.write(f.nodeid, fh, at, b"ab").unwrap();
            assert_eq!(
                &std::fs::read(d.path("f")).unwrap()[at as usize..][..2],
                b"ab"
            );
            assert_eq!(c.getattr(f.nodeid).unwrap().attr.ino, ino(&d.path("f")));
        }
    }
}

#[test]
fn locks_held_at_a_crash_stay_held_and_a_lock_wait_in_flight_is_granted_after_it() {
    let d = Daemon::start(&[]);
    let c = client(&d);
    let path = d.path("locked");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    let n = c.lookup(ROOT, "locked").unwrap().nodeid;
    let posix = c.open(n, libc::O_RDWR as u32).unwrap().fh;
    let flock = c.open(n, libc::O_RDWR as u32).unwrap().fh;
    let waiter = c.open(n, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(n, posix, OWNER, Lock::range(0, 99, libc::F_WRLCK, 7))
        .unwrap();
    c.setlk(n, flock, OWNER + 1, Lock::flock(libc::F_WRLCK))
        .unwrap();
    // A host process holds 200-209; the guest waits for it.
    let host = HostLock::take(&path, 200, 10);
    let wait = c
        .setlkw(
            1,
            n,
            waiter,
            OWNER + 2,
            Lock::range(200, 209, libc::F_WRLCK, 8),
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!host_ofd_lock(&path, libc::F_WRLCK, 0, 100));
    assert!(!host_flock(&path, libc::LOCK_EX).0);
    // Another guest owner, on a file it opened, is refused both.
    let refused = |when: &str| {
        let other = c.open(n, libc::O_RDWR as u32).unwrap().fh;
        let r = c.setlk(n, other, OWNER + 3, Lock::range(50, 59, libc::F_WRLCK, 9));
        assert_eq!(
            errno(r),
            libc::EAGAIN,
            "{when}: another owner's POSIX lock on 50-59"
        );
        let r = c.setlk(n, other, OWNER + 4, Lock::flock(libc::F_WRLCK));
        assert_eq!(errno(r), libc::EAGAIN, "{when}: another open file's flock");
        c.release(n, other).unwrap();
    };
    refused("before the crash");

    crash(&d, libc::SIGKILL);
    c.getattr(ROOT).expect("a request after the crash");
    let held = |when: &str| {
        assert!(
            !host_ofd_lock(&path, libc::F_WRLCK, 0, 100),
            "the guest's POSIX lock went {when}"
        );
        assert!(
            !host_flock(&path, libc::LOCK_EX).0,
            "the guest's flock went {when}"
        );
    };
    held("with the crash");
    // A guest's other process opens the file, is refused, and closes it: nothing of the
    // holders' changes.
    refused("after the crash");
    held("when another handle of the file was released after the crash");
    assert!(
        host_ofd_lock(&path, libc::F_WRLCK, 300, 10),
        "300-309 is free"
    );
    // The wait goes on in the new process: granted once the host lets go.
    drop(host);
    let r = c.wait(wait).expect("the lock wait in flight at the crash");
    assert_eq!(r.error, 0, "SETLKW in flight at the crash");
    assert!(!host_ofd_lock(&path, libc::F_WRLCK, 200, 10));
    // The guest releases each; the host then gets them.
    c.setlk(n, posix, OWNER, Lock::range(0, 99, libc::F_UNLCK, 7))
        .unwrap();
    assert!(host_ofd_lock(&path, libc::F_WRLCK, 0, 100));
    c.setlk(n, flock, OWNER + 1, Lock::flock(libc::F_UNLCK))
        .unwrap();
    assert!(host_flock(&path, libc::LOCK_EX).0);
    c.setlk(
        n,
        waiter,
        OWNER + 2,
        Lock::range(200, 209, libc::F_UNLCK, 8),
    )
    .unwrap();
    assert!(host_ofd_lock(&path, libc::F_WRLCK, 200, 10));
}

#[test]
fn a_crash_before_any_frontend_leaves_the_next_one_served() {
    let mut d = Daemon::start(&[]);
    let old = crash(&d, libc::SIGKILL);
    wait_replaced(d.pid(), old);
    assert!(
        d.wait_exit(Duration::from_millis(300)).is_none(),
        "vfsd exited when its idle serving process was killed"
    );
    let c = client(&d);
    std::fs::write(d.path("f"), b"x").unwrap();
    let f = c.lookup(ROOT, "f").expect("the first frontend is served");
    assert_eq!(c.getattr(f.nodeid).unwrap().attr.ino, ino(&d.path("f")));
}

#[test]
fn more_than_ten_crashes_within_a_minute_end_the_connection() {
    for keep_listening in [false, true] {
        let opts: &[&str] = if keep_listening {
            &["--keep-listening"]
        } else {
            &[]
        };
        let mut d = Daemon::start(opts);
        let c = client(&d);
        std::fs::write(d.path("f"), b"x").unwrap();
        let f = c.lookup(ROOT, "f").unwrap();
        let start = Instant::now();
        for i in 1..=CRASH_LOOP {
            crash(&d, libc::SIGKILL);
            c.getattr(f.nodeid)
                .unwrap_or_else(|e| panic!("crash {i} of {CRASH_LOOP}: GETATTR after it: {e}"));
        }
        crash(&d, libc::SIGKILL);
        assert!(start.elapsed() < Duration::from_secs(50));
        assert!(
            connection_ended(&c, ANSWER_LIMIT),
            "the connection outlived crash {} within {:?}",
            CRASH_LOOP + 1,
            start.elapsed()
        );
        if keep_listening {
            assert!(
                d.wait_exit(Duration::from_millis(500)).is_none(),
                "--keep-listening vfsd exited"
            );
            drop(c);
            let c = client(&d);
            std::fs::write(d.path("g"), b"y").unwrap();
            c.lookup(ROOT, "g")
                .expect("the next frontend is served as before");
        } else {
            let st = d
                .wait_exit(ANSWER_LIMIT)
                .expect("vfsd still runs after its connection ended");
            assert_eq!(st.code(), Some(128 + libc::SIGKILL), "{st:?}");
        }
    }
}

/// SIGUSR2 to vfsd `d` (its binary at `bin` replaced first): waits until another
/// process serves and the old one is gone.
fn upgrade(d: &Daemon, bin: &crate::upgrade::Binary) {
    let old = serving_pid(d.pid());
    bin.upgrade_to_a_rebuilt_vfsd();
    crate::upgrade::sigusr2(d.pid());
    let t = Instant::now();
    loop {
        let (p, depth) = deepest(d.pid());
        if !alive(old) && p != old && depth >= 2 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no handover within 20 s: {old} still serves (the log says whether the upgrade was refused)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs root"]
fn upgrades_before_and_after_a_crash_keep_nodes_handles_and_locks() {
    crate::common::require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = crate::upgrade::Binary::new();
    let d = Daemon::start_from(&bin.path, &[]);
    let c = client(&d);
    std::fs::write(d.path("f"), b"before").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    upgrade(&d, &bin);
    c.getattr(f.nodeid).unwrap();
    // The supervisor runs the new binary now, from the state it carried over.
    crash(&d, libc::SIGKILL);
    assert_eq!(
        c.read(f.nodeid, fh, 0, 6)
            .expect("a READ after a crash that followed an upgrade"),
        b"before"
    );
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    // The guest looks the file up again, as a guest does all the time.
    let again = c.lookup(ROOT, "f").unwrap();
    // And the process that replaced the crashed one upgrades too.
    upgrade(&d, &bin);
    assert!(
        !host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10),
        "the lock went in the upgrade after the crash"
    );
    c.write(f.nodeid, fh, 0, b"BEFORE").unwrap();
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"BEFORE");
    assert_eq!(again.nodeid, f.nodeid, "f looked up again after the crash");
}

/// Requests in flight at a crash the test hook causes at a chosen point: each gets the
/// answer the table says, once.
#[cfg(feature = "test-hooks")]
mod hook {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use vfsd::frontend::fuse::FResult;

    /// The used ring's index of queue `q`, as the device last wrote it.
    fn used(c: &FuseClient, q: usize) -> u16 {
        c.fe.queues[q].lock().unwrap().used_idx(&c.fe.mem).unwrap()
    }

    /// Right after the request is popped, and once the file system has acted on it.
    const WHENS: [&str; 2] = ["popped", "served"];

    /// A daemon whose first serving process dies at the first request of opcode `op`
    /// (`when`), and a client with INIT done.
    struct Armed {
        d: Daemon,
        c: FuseClient,
        first: i32,
        what: String,
    }

    impl Armed {
        fn new(when: &str, op: u32) -> Armed {
            let hook = format!("{when}:{op}:1");
            let d = Daemon::start_with_env(&[("VFSD_TEST_CRASH", &hook)], &[]);
            let c = client(&d);
            let first = serving_pid(d.pid());
            Armed {
                d,
                c,
                first,
                what: hook,
            }
        }

        fn path(&self, rel: &str) -> std::path::PathBuf {
            self.d.path(rel)
        }

        /// Sends the request the hook fires at (on queue `q`) and gives its result, once
        /// it has checked that the first serving process died of it and another answered,
        /// with exactly one used entry, and that the connection goes on.
        fn fire<T>(&self, q: usize, request: impl FnOnce(&FuseClient) -> T) -> T {
            let before = used(&self.c, q);
            let r = request(&self.c);
            assert!(
                !alive(self.first),
                "{}: the hook did not fire: the first serving process {} still serves",
                self.what,
                self.first
            );
            // A second answer to the same request would show as another used entry.
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(
                used(&self.c, q),
                before.wrapping_add(1),
                "{}: not exactly one used entry for the request",
                self.what
            );
            self.c
                .getattr(ROOT)
                .unwrap_or_else(|e| panic!("{}: a request after the crash: {e}", self.what));
            assert_ne!(serving_pid(self.d.pid()), self.first);
            r
        }

        /// Asserts a request's result is EIO.
        fn eio<T: std::fmt::Debug>(&self, r: FResult<T>) {
            assert_eq!(errno(r), libc::EIO, "{}", self.what);
        }
    }

    /// A request that kills every process that serves it (the hook armed in each with
    /// `:every`) is run again once, then answered EIO: it does not take every process
    /// the crash-loop bound allows, and the connection goes on.
    #[test]
    fn a_request_that_kills_every_process_serving_it_is_answered_eio() {
        for when in WHENS {
            let hook = format!("{when}:{FUSE_GETATTR}:every");
            let d = Daemon::start_with_env(&[("VFSD_TEST_CRASH", &hook)], &[]);
            let c = client(&d);
            std::fs::write(d.path("f"), b"f").unwrap();
            let f = c.lookup(ROOT, "f").unwrap();
            let first = serving_pid(d.pid());
            let before = used(&c, 1);
            let r = c.getattr(f.nodeid);
            assert!(!alive(first), "{hook}: the hook did not fire");
            assert_eq!(errno(r), libc::EIO, "{hook}");
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(used(&c, 1), before.wrapping_add(1), "{hook}: used entries");
            // Other opcodes are served as before.
            assert_eq!(c.lookup(ROOT, "f").unwrap().nodeid, f.nodeid, "{hook}");
            let fh = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
            assert_eq!(c.read(f.nodeid, fh, 0, 1).unwrap(), b"f", "{hook}");
            assert!(alive(d.pid()));
        }
    }

    #[test]
    fn a_getattr_in_flight_at_a_crash_is_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_GETATTR);
            std::fs::write(a.path("f"), b"12345").unwrap();
            let f = a.c.lookup(ROOT, "f").unwrap();
            let attr = a
                .fire(1, |c| c.getattr(f.nodeid))
                .unwrap_or_else(|e| panic!("{}: {e}", a.what))
                .attr;
            assert_eq!((attr.ino, attr.size), (ino(&a.path("f")), 5), "{}", a.what);
        }
    }

    #[test]
    fn a_read_in_flight_at_a_crash_is_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_READ);
            let content = pattern(64 << 10, 5);
            std::fs::write(a.path("f"), &content).unwrap();
            let f = a.c.lookup(ROOT, "f").unwrap();
            let fh = a.c.open(f.nodeid, libc::O_RDONLY as u32).unwrap().fh;
            let r = a.fire(1, |c| c.read(f.nodeid, fh, 4096, 8192));
            assert_eq!(r.unwrap(), content[4096..12288], "{}", a.what);
            // The handle still reads.
            assert_eq!(a.c.read(f.nodeid, fh, 0, 16).unwrap(), content[..16]);
        }
    }

    #[test]
    fn a_write_at_an_offset_in_flight_at_a_crash_is_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_WRITE);
            let before = pattern(16 << 10, 1);
            std::fs::write(a.path("f"), &before).unwrap();
            let f = a.c.lookup(ROOT, "f").unwrap();
            let fh = a.c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
            let data = pattern(4096, 2);
            let n = a.fire(1, |c| c.write(f.nodeid, fh, 8192, &data));
            assert_eq!(n.unwrap(), 4096, "{}", a.what);
            let mut want = before.clone();
            want[8192..12288].copy_from_slice(&data);
            assert!(std::fs::read(a.path("f")).unwrap() == want, "{}", a.what);
            a.c.write(f.nodeid, fh, 0, b"later").unwrap();
            assert_eq!(&std::fs::read(a.path("f")).unwrap()[..5], b"later");
        }
    }

    #[test]
    fn an_append_in_flight_at_a_crash_gets_eio_and_lands_at_most_once() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_WRITE);
            std::fs::write(a.path("log"), b"line 1\n").unwrap();
            let f = a.c.lookup(ROOT, "log").unwrap();
            let flags = (libc::O_WRONLY | libc::O_APPEND) as u32;
            let fh = a.c.open(f.nodeid, flags).unwrap().fh;
            a.eio(a.fire(1, |c| c.write(f.nodeid, fh, 7, b"line 2\n")));
            // Not run again: the file has the line once if the crashed process wrote it.
            let want: &[u8] = if when == "popped" {
                b"line 1\n"
            } else {
                b"line 1\nline 2\n"
            };
            assert_eq!(std::fs::read(a.path("log")).unwrap(), want, "{}", a.what);
            let end = want.len() as u64;
            a.c.write(f.nodeid, fh, end, b"line 3\n").unwrap();
            let mut want = want.to_vec();
            want.extend_from_slice(b"line 3\n");
            assert_eq!(std::fs::read(a.path("log")).unwrap(), want, "{}", a.what);
        }
    }

    /// Run again: a first run that made the file leaves the second one to find it, which a
    /// CREATE answers ESTALE (it never opens an existing file), and the guest's kernel
    /// then looks it up and opens it, as here.
    #[test]
    fn a_create_without_o_excl_in_flight_at_a_crash_is_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_CREATE);
            let flags = (libc::O_CREAT | libc::O_RDWR) as u32;
            let r = a.fire(1, |c| c.create(ROOT, "new", flags, 0o640));
            let (e, fh) = if when == "popped" {
                let (e, o) = r.unwrap_or_else(|e| panic!("{}: {e}", a.what));
                (e, o.fh)
            } else {
                assert_eq!(errno(r), libc::ESTALE, "{}", a.what);
                let e = a.c.lookup(ROOT, "new").unwrap();
                (e, a.c.open(e.nodeid, libc::O_RDWR as u32).unwrap().fh)
            };
            let m = std::fs::metadata(a.path("new")).unwrap();
            assert_eq!(e.attr.ino, m.ino(), "{}", a.what);
            assert_eq!(m.permissions().mode() & 0o777, 0o640, "{}", a.what);
            a.c.write(e.nodeid, fh, 0, b"through the new handle")
                .unwrap();
            assert_eq!(
                std::fs::read(a.path("new")).unwrap(),
                b"through the new handle"
            );
        }
    }

    #[test]
    fn a_create_with_o_excl_in_flight_at_a_crash_gets_eio() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_CREATE);
            let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32;
            a.eio(a.fire(1, |c| c.create(ROOT, "excl", flags, 0o600)));
            // Made on the host only if the crashed process got that far; the guest's view
            // agrees with the host's.
            let made = a.path("excl").exists();
            assert_eq!(made, when == "served", "{}: excl on the host", a.what);
            match a.c.lookup(ROOT, "excl") {
                Ok(e) if made => assert_eq!(e.attr.ino, ino(&a.path("excl"))),
                Err(e) if !made => assert_eq!(e.errno(), Some(libc::ENOENT)),
                r => panic!("{}: LOOKUP excl: {r:?}", a.what),
            }
        }
    }

    #[test]
    fn a_mkdir_in_flight_at_a_crash_gets_eio() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_MKDIR);
            a.eio(a.fire(1, |c| c.mkdir(ROOT, "dir", 0o755)));
            let made = a.path("dir").is_dir();
            assert_eq!(made, when == "served", "{}: dir on the host", a.what);
            match a.c.lookup(ROOT, "dir") {
                Ok(e) if made => assert_eq!(e.attr.ino, ino(&a.path("dir"))),
                Err(e) if !made => assert_eq!(e.errno(), Some(libc::ENOENT)),
                r => panic!("{}: LOOKUP dir: {r:?}", a.what),
            }
        }
    }

    #[test]
    fn an_unlink_in_flight_at_a_crash_gets_eio() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_UNLINK);
            std::fs::write(a.path("victim"), b"v").unwrap();
            a.c.lookup(ROOT, "victim").unwrap();
            a.eio(a.fire(1, |c| c.unlink(ROOT, "victim")));
            let gone = !a.path("victim").exists();
            assert_eq!(gone, when == "served", "{}: victim gone", a.what);
            assert_eq!(a.c.lookup(ROOT, "victim").is_err(), gone, "{}", a.what);
        }
    }

    #[test]
    fn a_rename_in_flight_at_a_crash_gets_eio() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_RENAME);
            std::fs::write(a.path("old"), b"contents").unwrap();
            let o = a.c.lookup(ROOT, "old").unwrap();
            a.eio(a.fire(1, |c| c.rename(ROOT, "old", ROOT, "new")));
            let moved = a.path("new").exists();
            assert_eq!(moved, when == "served", "{}: renamed", a.what);
            assert_eq!(a.path("old").exists(), !moved, "{}", a.what);
            let at = if moved { "new" } else { "old" };
            assert_eq!(std::fs::read(a.path(at)).unwrap(), b"contents");
            // The node goes on under whichever name it has.
            assert_eq!(a.c.lookup(ROOT, at).unwrap().nodeid, o.nodeid, "{}", a.what);
        }
    }

    #[test]
    fn an_fsync_in_flight_at_a_crash_is_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_FSYNC);
            std::fs::write(a.path("f"), b"").unwrap();
            let f = a.c.lookup(ROOT, "f").unwrap();
            let fh = a.c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
            a.c.write(f.nodeid, fh, 0, b"synced").unwrap();
            a.fire(1, |c| c.fsync(f.nodeid, fh, false))
                .unwrap_or_else(|e| panic!("{}: FSYNC: {e}", a.what));
            assert_eq!(std::fs::read(a.path("f")).unwrap(), b"synced");
        }
    }

    #[test]
    fn a_setlkw_in_flight_at_a_crash_is_run_again_and_the_lock_is_held_once() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_SETLKW);
            std::fs::write(a.path("f"), vec![0u8; 200]).unwrap();
            let n = a.c.lookup(ROOT, "f").unwrap().nodeid;
            let fh = a.c.open(n, libc::O_RDWR as u32).unwrap().fh;
            let lock = Lock::range(0, 99, libc::F_WRLCK, 9);
            let r = a.fire(1, |c| {
                let t = c.setlkw(1, n, fh, OWNER, lock)?;
                c.wait(t)?.ok()
            });
            r.unwrap_or_else(|e| panic!("{}: SETLKW: {e}", a.what));
            assert!(
                !host_ofd_lock(&a.path("f"), libc::F_WRLCK, 0, 100),
                "{}: the granted lock is not on the host",
                a.what
            );
            a.c.setlk(n, fh, OWNER, Lock::range(0, 99, libc::F_UNLCK, 9))
                .unwrap();
            assert!(
                host_ofd_lock(&a.path("f"), libc::F_WRLCK, 0, 100),
                "{}: the lock outlived its release",
                a.what
            );
        }
    }

    #[test]
    fn a_forget_in_flight_at_a_crash_gets_no_reply_and_is_not_run_again() {
        for when in WHENS {
            let a = Armed::new(when, FUSE_FORGET);
            std::fs::write(a.path("f"), b"f").unwrap();
            let f = a.c.lookup(ROOT, "f").unwrap();
            assert_eq!(a.c.lookup(ROOT, "f").unwrap().nodeid, f.nodeid);
            // Two lookups, one forgotten: the node stays known either way.
            a.fire(0, |c| c.forget(f.nodeid, 1))
                .unwrap_or_else(|e| panic!("{}: FORGET: {e}", a.what));
            assert_eq!(
                a.c.getattr(f.nodeid).unwrap().attr.ino,
                ino(&a.path("f")),
                "{}",
                a.what
            );
            assert_eq!(
                a.c.lookup(ROOT, "f").unwrap().nodeid,
                f.nodeid,
                "{}",
                a.what
            );
        }
    }
}
