//! Live migration through the real socket: the test frontend plays both QEMUs.
//! The source daemon's state (SET_DEVICE_STATE_FD save) is loaded into a second daemon on
//! the same share, which must then serve the same nodes, handles and locks without a new
//! INIT; a corrupt, hostile or unfindable state is refused; and the dirty-page log marks
//! exactly the guest pages the daemon wrote.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::{
    errno, host_flock, host_ofd_lock, require_root, Daemon, HostLease, Tmpfs, ROOT,
};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

const OWNER: u64 = 0x77;
const OTHER: u64 = 0x78;

/// A host program's write lock on the guest's range, or flock, granted (then dropped).
fn host_can_lock(path: &std::path::Path) -> bool {
    host_ofd_lock(path, libc::F_WRLCK, 0, 10)
}

fn host_can_flock(path: &std::path::Path) -> bool {
    host_flock(path, libc::LOCK_EX).0
}

/// A guest's view before the switch: a directory, a file in it open for writing with a
/// POSIX lock and (through a second handle) a flock, and the directory open for reading.
struct Guest {
    dir: u64,
    file: u64,
    fh: u64,
    flock_fh: u64,
    dir_fh: u64,
}

fn set_up(c: &FuseClient) -> Guest {
    let dir = c.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    let (e, o) = c.create(dir, "f", libc::O_RDWR as u32, 0o644).unwrap();
    assert_eq!(c.write(e.nodeid, o.fh, 0, b"before ").unwrap(), 7);
    c.setlk(e.nodeid, o.fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 42))
        .unwrap();
    let flock_fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    c.setlk(e.nodeid, flock_fh, OWNER + 1, Lock::flock(libc::F_WRLCK))
        .unwrap();
    let dir_fh = c.opendir(dir).unwrap().fh;
    Guest {
        dir,
        file: e.nodeid,
        fh: o.fh,
        flock_fh,
        dir_fh,
    }
}

/// The guest lets go of `set_up`'s POSIX lock and flock.
fn unlock(c: &FuseClient, g: &Guest) {
    c.setlk(g.file, g.fh, OWNER, Lock::range(0, 9, libc::F_UNLCK, 42))
        .unwrap();
    c.setlk(g.file, g.flock_fh, OWNER + 1, Lock::flock(libc::F_UNLCK))
        .unwrap();
}

/// A frontend that has not sent INIT: a migration destination's.
fn destination(d: &Daemon) -> FuseClient {
    FuseClient::new(d.frontend(FrontendConfig::default()))
}

#[test]
fn a_second_daemon_serves_the_sources_nodes_handles_and_locks_without_init() {
    let mut src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let state = c.fe.save_state().unwrap();
    assert_eq!(&state[..8], b"VFSDSTAT");

    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();

    // The same node ids and handles, no INIT.
    assert_eq!(n.read(g.file, g.fh, 0, 7).unwrap(), b"before ");
    assert_eq!(n.write(g.file, g.fh, 7, b"after").unwrap(), 5);
    assert_eq!(std::fs::read(dst.path("d/f")).unwrap(), b"before after");
    let names: Vec<Vec<u8>> = n
        .readdir(g.dir, g.dir_fh, 0, 4096, false)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"f".to_vec()), "{names:?}");
    assert_eq!(n.getattr(g.file).unwrap().attr.size, 12);
    // New nodes and handles don't collide with the source's.
    let e2 = n.lookup(g.dir, "f").unwrap();
    assert_eq!(e2.nodeid, g.file);
    let (e3, o3) = n.create(ROOT, "new", libc::O_RDWR as u32, 0o644).unwrap();
    assert!(e3.nodeid > g.file && o3.fh > g.dir_fh.max(g.flock_fh));

    // The locks never leave the guest: the destination took the source's own host
    // descriptions (the handover), so it holds them from the load on, before the source
    // is gone, and nothing is released when the source goes.
    let f = dst.path("d/f");
    assert_eq!(dst.stats()["lock_owners"].as_u64(), Some(1));
    let probe = n.getlk(g.file, g.fh, OTHER, Lock::range(0, 9, libc::F_WRLCK, 7));
    assert_eq!(probe.unwrap().type_, libc::F_WRLCK as u32);
    assert!(!host_can_lock(&f) && !host_can_flock(&f));
    // The source QEMU quits: its daemon sees the disconnect, resets and exits.
    drop(c);
    assert!(
        src.wait_exit(Duration::from_secs(10)).is_some(),
        "the source did not exit"
    );
    assert!(
        !host_can_lock(&f),
        "a host program took the guest's POSIX lock"
    );
    assert!(!host_can_flock(&f), "a host program took the guest's flock");
    // The guest still owns them: it unlocks, and then the host may lock.
    unlock(&n, &g);
    assert!(host_can_lock(&f) && host_can_flock(&f));
}

/// The lock requests the host has queued (blocked, `->` in /proc/locks) on the file with
/// inode number `ino`: their kinds (FLOCK, OFDLCK, POSIX).
fn queued_locks(ino: u64) -> Vec<String> {
    let ino = format!(":{ino}");
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"->") && f.get(6).is_some_and(|d| d.ends_with(&ino)))
                .then(|| f[2].to_string())
        })
        .collect()
}

fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The runtime directory the daemons (which inherit this environment) keep their handover
/// sockets in: `$XDG_RUNTIME_DIR/vfsd`, or `/run/vfsd` for root.
fn runtime_dir() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => std::path::Path::new(&d).join("vfsd"),
        None => "/run/vfsd".into(),
    }
}

/// The handover socket `state` offers: the one in the runtime directory whose name the
/// state carries (other tests' daemons may have theirs there too).
fn handover_socket(state: &[u8]) -> std::path::PathBuf {
    std::fs::read_dir(runtime_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| state.windows(n.len()).any(|w| w == n.as_bytes()))
        .map(|n| runtime_dir().join(n))
        .expect("the state's handover socket in the runtime directory")
}

/// `set_up`'s guest moved to a second daemon without the handover (as between two hosts
/// over a distributed file system), while the source still holds the guest's locks.
struct Retaking {
    src: Daemon,
    c: Option<FuseClient>,
    dst: Daemon,
    n: FuseClient,
    g: Guest,
    ino: u64,
}

fn retaking() -> Retaking {
    use std::os::unix::fs::MetadataExt;
    let src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let state = c.fe.save_state().unwrap();
    std::fs::remove_file(handover_socket(&state)).unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    let ino = std::fs::metadata(dst.path("d/f")).unwrap().ino();
    Retaking {
        src,
        c: Some(c),
        dst,
        n,
        g,
        ino,
    }
}

impl Retaking {
    fn source_quits(&mut self) {
        drop(self.c.take());
        assert!(
            self.src.wait_exit(Duration::from_secs(10)).is_some(),
            "the source did not exit"
        );
    }
}

#[test]
fn locks_taken_again_without_the_handover_wait_in_the_hosts_queue_and_pass_straight_on() {
    let mut r = retaking();
    // Queued in the host's lock calls, not polled for: the file system grants each to the
    // destination as the source lets go, and a third party that comes later can't slip
    // in between (over GlusterFS the lock server grants in that order).
    until(
        "the destination is queued for the flock and the range",
        Duration::from_secs(5),
        || {
            let q = queued_locks(r.ino);
            q.iter().any(|k| k == "FLOCK") && q.iter().any(|k| k == "OFDLCK")
        },
    );
    r.source_quits();
    until(
        "the destination holds the POSIX lock",
        Duration::from_secs(5),
        || r.dst.stats()["lock_owners"].as_u64() == Some(1),
    );
    let f = r.dst.path("d/f");
    assert!(
        !host_can_lock(&f),
        "a host program took the guest's POSIX lock"
    );
    assert!(!host_can_flock(&f), "a host program took the guest's flock");
    let probe =
        r.n.getlk(r.g.file, r.g.fh, OTHER, Lock::range(0, 9, libc::F_WRLCK, 7));
    assert_eq!(probe.unwrap().type_, libc::F_WRLCK as u32);
    unlock(&r.n, &r.g);
    assert!(host_can_lock(&f) && host_can_flock(&f));
}

#[test]
fn a_guest_lock_call_a_close_or_the_sessions_end_calls_off_a_queued_lock_retake() {
    for how in ["lock calls", "a close", "DESTROY"] {
        let mut r = retaking();
        until("queued", Duration::from_secs(5), || {
            queued_locks(r.ino).len() == 2
        });
        let t = Instant::now();
        if how == "a close" {
            // The guest's process closes its fds (FLUSH by its lock owner, and the last
            // close of the flock's file): POSIX drops its locks, the close its flock.
            r.n.flush_owner(r.g.file, r.g.fh, OWNER).unwrap();
            r.n.release_flock(r.g.file, r.g.flock_fh, OWNER + 1)
                .unwrap();
        } else if how == "lock calls" {
            // The guest drops both while the source still holds them: its calls decide.
            unlock(&r.n, &r.g);
        } else {
            r.n.destroy().unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the call waited on the retake"
        );
        assert!(
            queued_locks(r.ino).is_empty(),
            "still queued: {:?}",
            queued_locks(r.ino)
        );
        r.source_quits();
        std::thread::sleep(Duration::from_millis(100));
        let f = r.dst.path("d/f");
        assert!(
            host_can_lock(&f) && host_can_flock(&f),
            "the destination took locks the guest had let go (by {how})"
        );
        assert_eq!(r.dst.stats()["lock_owners"].as_u64(), Some(0));
    }
}

#[test]
fn a_corrupt_truncated_or_foreign_state_is_refused_and_the_daemon_goes_on() {
    let src = Daemon::start(&[]);
    let c = src.client();
    set_up(&c);
    let state = c.fe.save_state().unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);

    let mut bad_magic = state.clone();
    bad_magic[0] ^= 0xff;
    let mut version = state.clone();
    version[8] = 99;
    let mut huge = state.clone();
    huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut garbage = state.clone();
    for b in &mut garbage[20..] {
        *b = 0xff;
    }
    let truncated = state[..state.len() / 2].to_vec();
    let mut longer = state.clone();
    longer.extend_from_slice(b"tail");
    for (what, s) in [
        ("bad magic", bad_magic),
        ("unknown version", version),
        ("huge length", huge),
        ("garbage body", garbage),
        ("truncated", truncated),
        ("bytes after the end", longer),
        ("empty", Vec::new()),
    ] {
        assert!(n.fe.load_state(&s).is_err(), "{what} was accepted");
    }
    // Nothing was loaded, and the daemon serves a new session.
    n.init().unwrap();
    assert!(n.lookup(ROOT, "d").is_ok());
}

/// The state with the name `from` replaced by `to` (same length): postcard keeps a name
/// as its length and its bytes, so this renames one node in the state.
fn patched(state: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let pat: Vec<u8> = [&[from.len() as u8][..], from].concat();
    let mut s = state.to_vec();
    let hits: Vec<usize> = (20..s.len() - pat.len() + 1)
        .filter(|&i| s[i..i + pat.len()] == pat[..])
        .collect();
    assert_eq!(hits.len(), 1, "{from:?} in the state");
    s[hits[0] + 1..hits[0] + pat.len()].copy_from_slice(to);
    s
}

#[test]
fn a_state_naming_a_path_outside_the_share_is_refused() {
    let src = Daemon::start(&[]);
    let c = src.client();
    let dir = c.mkdir(ROOT, "zz", 0o755).unwrap().nodeid;
    let q = c.mkdir(dir, "q", 0o755).unwrap().nodeid;
    let state = c.fe.save_state().unwrap();
    for (from, to) in [
        (&b"zz"[..], &b".."[..]),
        (b"zz", b"/e"),
        (b"q", b"."),
        (b"zz", b"z\0"),
    ] {
        // One connection per daemon, as with a VMM.
        let dst = Daemon::start_on(&src.share.clone(), &["--migration-on-error", "guest-error"]);
        let n = destination(&dst);
        let r = n.fe.load_state(&patched(&state, from, to));
        // Malformed names are refused outright, or (guest-error) leave the node out:
        // never a node for anything outside the share.
        if r.is_ok() {
            let node = if from == b"q" { q } else { dir };
            assert_eq!(errno(n.getattr(node)), libc::EBADF, "{to:?} was loaded");
        }
    }
    // A symlink where the source had a directory is not followed.
    let other = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", other.path().join("zz")).unwrap();
    let dst2 = Daemon::start_on(other.path(), &[]);
    let n = destination(&dst2);
    assert!(n.fe.load_state(&state).is_err());
}

#[test]
fn a_file_missing_on_the_destination_aborts_the_load_or_gives_the_guest_errors() {
    let src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let kept = c.lookup(ROOT, "d").unwrap().nodeid;
    let state = c.fe.save_state().unwrap();
    std::fs::rename(src.path("d/f"), src.path("moved")).unwrap();

    let abort = Daemon::start_on(&src.share.clone(), &["--migration-on-error", "abort"]);
    let n = destination(&abort);
    assert!(n.fe.load_state(&state).is_err());

    let soft = Daemon::start_on(&src.share.clone(), &["--migration-on-error", "guest-error"]);
    let n = destination(&soft);
    n.fe.load_state(&state).unwrap();
    assert_eq!(errno(n.getattr(g.file)), libc::EBADF);
    assert_eq!(errno(n.read(g.file, g.fh, 0, 4)), libc::EBADF);
    assert!(n.getattr(kept).is_ok());
    assert!(n.readdir(g.dir, g.dir_fh, 0, 4096, false).is_ok());
}

#[test]
fn verify_handles_refuses_a_different_file_at_the_same_path() {
    let src = Daemon::start(&["--migration-verify-handles"]);
    let c = src.client();
    let g = set_up(&c);
    let state = c.fe.save_state().unwrap();
    // Replaced on the host: same name, another file.
    std::fs::remove_file(src.path("d/f")).unwrap();
    std::fs::write(src.path("d/f"), b"impostor").unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &["--migration-verify-handles"]);
    let n = destination(&dst);
    assert!(n.fe.load_state(&state).is_err());
    // Without the check (the source sends no handles) the impostor is served as the
    // guest's file: what --migration-verify-handles is for.
    let src2 = Daemon::start_on(&src.share.clone(), &[]);
    let c2 = src2.client();
    let f2 = c2
        .lookup(c2.lookup(ROOT, "d").unwrap().nodeid, "f")
        .unwrap()
        .nodeid;
    let state2 = c2.fe.save_state().unwrap();
    std::fs::remove_file(src.path("d/f")).unwrap();
    std::fs::write(src.path("d/f"), b"impostor").unwrap();
    let dst2 = Daemon::start_on(&src.share.clone(), &[]);
    let n2 = destination(&dst2);
    n2.fe.load_state(&state2).unwrap();
    assert_eq!(n2.getattr(f2).unwrap().attr.size, 8);
    let _ = g;
}

/// A daemon whose file "data" of `len` bytes a guest with one request slot per queue
/// (so each reply lands in the same buffer) looked up and opened.
fn data_open_on_one_slot(
    len: usize,
) -> (
    Daemon,
    FuseClient,
    fuse_backend_rs::abi::fuse_abi::EntryOut,
    u64,
) {
    let d = Daemon::start(&[]);
    std::fs::write(d.path("data"), vec![7u8; len]).unwrap();
    let cfg = FrontendConfig {
        slots: 1,
        ..Default::default()
    };
    let c = FuseClient::new(d.frontend(cfg));
    c.init().unwrap();
    let e = c.lookup(ROOT, "data").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    (d, c, e, fh)
}

#[test]
fn the_dirty_log_marks_exactly_the_pages_the_daemon_wrote() {
    let (_d, mut c, e, fh) = data_open_on_one_slot(256 * 1024);
    let log = c.fe.start_dirty_log().unwrap();
    let (used_pages, reply) = {
        let q = c.fe.queues[1].lock().unwrap();
        let used = q.geo.used;
        let used_end = used + 6 + 8 * q.geo.size as u64;
        let (_, resp) = q.slot_addrs(0);
        (
            (used / 4096..=used_end / 4096).collect::<BTreeSet<u64>>(),
            resp,
        )
    };
    for (len, what) in [(200 * 1024u32, "READ"), (4096, "short READ")] {
        log.clear();
        assert_eq!(c.read(e.nodeid, fh, 0, len).unwrap().len(), len as usize);
        let dirty: BTreeSet<u64> = log.dirty_pages().into_iter().collect();
        // The reply header and data, and the used ring: all of them, and nothing else.
        let mut want: BTreeSet<u64> =
            (reply / 4096..=(reply + 16 + len as u64 - 1) / 4096).collect();
        want.extend(used_pages.iter().copied().filter(|p| dirty.contains(p)));
        assert!(
            dirty.iter().any(|p| used_pages.contains(p)),
            "{what}: the used ring's page is not marked"
        );
        assert_eq!(dirty, want, "{what}: dirty pages");
    }
    log.clear();
    c.getattr(e.nodeid).unwrap();
    let dirty: BTreeSet<u64> = log.dirty_pages().into_iter().collect();
    assert!(
        dirty.contains(&(reply / 4096)),
        "GETATTR's reply is not marked"
    );
    assert!(
        dirty
            .iter()
            .all(|p| *p == reply / 4096 || used_pages.contains(p)),
        "GETATTR marked other pages: {dirty:?}"
    );
}

#[test]
fn the_dirty_log_goes_on_over_a_memory_map_sent_again_and_ends_with_log_all() {
    let (_d, mut c, e, fh) = data_open_on_one_slot(64 * 1024);
    let reply = c.fe.queues[1].lock().unwrap().slot_addrs(0).1;
    let log = c.fe.start_dirty_log().unwrap();
    let want: BTreeSet<u64> = (reply / 4096..=(reply + 16 + 32 * 1024 - 1) / 4096).collect();
    // QEMU sends the table again when the guest's memory map changes (or, with
    // CONFIGURE_MEM_SLOTS, removes the regions and adds them again), and sends no new log
    // base when the log is big enough: every region is mapped anew.
    for how in [
        "the memory table came again",
        "the region was removed and added",
    ] {
        if how.contains("removed") {
            c.fe.replug_memory().unwrap();
        } else {
            c.fe.remap_memory().unwrap();
        }
        log.clear();
        assert_eq!(c.read(e.nodeid, fh, 0, 32 * 1024).unwrap().len(), 32 * 1024);
        let dirty: BTreeSet<u64> = log.dirty_pages().into_iter().collect();
        assert!(
            want.is_subset(&dirty),
            "after {how}, the READ's pages are not all marked: {dirty:?}"
        );
    }
    // The migration ended: SET_FEATURES without LOG_ALL, and nothing is marked after.
    c.fe.stop_dirty_log().unwrap();
    log.clear();
    c.read(e.nodeid, fh, 0, 32 * 1024).unwrap();
    c.getattr(e.nodeid).unwrap();
    assert_eq!(
        log.dirty_pages(),
        Vec::<u64>::new(),
        "marked after logging ended"
    );
}

/// A file the host holds an exclusive flock on, and a guest SETLKW flock on it, waiting.
struct HeldWait {
    host: std::fs::File,
    node: u64,
    fh: u64,
    t: vfsd::frontend::fuse::Ticket,
}

fn a_guest_waiting_on_a_host_flock(d: &Daemon, c: &FuseClient) -> HeldWait {
    std::fs::write(d.path("f"), b"x").unwrap();
    let host = std::fs::File::open(d.path("f")).unwrap();
    // SAFETY: plain syscall on an fd we own.
    assert_eq!(unsafe { libc::flock(host.as_raw_fd(), libc::LOCK_EX) }, 0);
    let e = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    let t = c
        .setlkw(1, e.nodeid, fh, OWNER, Lock::flock(libc::F_WRLCK))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    HeldWait {
        host,
        node: e.nodeid,
        fh,
        t,
    }
}

#[test]
fn a_lock_wait_answered_after_the_memory_map_changed_writes_its_reply_into_the_log() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let w = a_guest_waiting_on_a_host_flock(&d, &c);
    // The map changes while the guest waits, and then the VMM starts logging: the new
    // log reaches the regions mapped now, not those of when the wait began.
    c.fe.remap_memory().unwrap();
    let log = c.fe.start_dirty_log().unwrap();
    log.clear();
    drop(w.host);
    assert!(answered(&c, w.t, Duration::from_secs(5)), "no reply");
    let reply = c.fe.queues[w.t.queue]
        .lock()
        .unwrap()
        .slot_addrs(w.t.slot)
        .1;
    let dirty = log.dirty_pages();
    assert!(
        dirty.contains(&(reply / 4096)),
        "the lock reply's page {} is not marked: {dirty:?}",
        reply / 4096
    );
}

/// Whether request `t` got its reply within `within`.
fn answered(c: &FuseClient, t: vfsd::frontend::fuse::Ticket, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let mut q = c.fe.queues[t.queue].lock().unwrap();
        q.reap(&c.fe.mem).unwrap();
        if q.is_done(t.slot) {
            return true;
        }
        drop(q);
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_lock_wait_in_flight_at_the_switch_is_granted_and_answered_by_the_destination() {
    a_lock_wait_carried_across_the_switch(0);
}

#[test]
fn a_lock_wait_carried_after_more_requests_than_its_ring_holds_is_still_resumed() {
    // The guest goes on using the ring while one request waits: the avail index runs
    // more than a ring's size past the wait's position (fio beside a waiter in a guest).
    a_lock_wait_carried_across_the_switch(600);
}

/// A guest's flock wait carried across a migration, after `traffic` other requests on
/// its queue since the wait began.
fn a_lock_wait_carried_across_the_switch(traffic: usize) {
    let mut src = Daemon::start(&[]);
    let mut c = src.client();
    let w = a_guest_waiting_on_a_host_flock(&src, &c);
    for _ in 0..traffic {
        c.getattr(w.node).unwrap();
    }
    // The VMM stops the rings and saves the state: the stop does not wait on the lock,
    // and the request is neither answered (the guest's program would see EINTR, or
    // ERESTARTSYS) nor lost.
    let start = Instant::now();
    let (state, bases) = c.fe.save_state_with_bases().unwrap();
    assert!(
        start.elapsed() < vfsd::device::STOP_WAIT,
        "the stop waited {:?} for the lock wait",
        start.elapsed()
    );
    assert!(
        !answered(&c, w.t, Duration::from_millis(300)),
        "answered at the stop"
    );
    // The destination gets the guest's memory and rings as they were, and the state.
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    c.fe.migrate_to(&dst.sock, &state, &bases).unwrap();
    assert!(
        src.wait_exit(Duration::from_secs(10)).is_some(),
        "the source did not exit"
    );
    // Still waiting: the host holds the lock.
    assert!(
        !answered(&c, w.t, Duration::from_millis(500)),
        "answered while held"
    );
    drop(w.host);
    // Granted on the destination and answered on the request's own descriptors.
    c.wait(w.t).unwrap().ok().unwrap();
    let f = dst.path("f");
    assert!(
        !host_can_flock(&f),
        "the guest's flock is not held on the host"
    );
    c.setlk(w.node, w.fh, OWNER, Lock::flock(libc::F_UNLCK))
        .unwrap();
    assert!(host_can_flock(&f));
    // The ring goes on from there.
    assert_eq!(c.getattr(w.node).unwrap().attr.size, 1);
}

#[test]
fn a_lock_wait_that_begins_while_its_ring_stops_is_carried_without_stalling_the_stop() {
    // One worker: a SETLKW queued behind an OPEN that a host lease holds up reaches its
    // waiter only once the OPEN is let go, which happens while the stop waits for it.
    let mut src = Daemon::start(&["--thread-pool-size", "1"]);
    let mut c = src.client();
    std::fs::write(src.path("f"), b"x").unwrap();
    std::fs::write(src.path("g"), b"y").unwrap();
    let host = std::fs::File::open(src.path("f")).unwrap();
    // SAFETY: plain syscall on an fd we own.
    assert_eq!(unsafe { libc::flock(host.as_raw_fd(), libc::LOCK_EX) }, 0);
    let f = c.lookup(ROOT, "f").unwrap().nodeid;
    let fh = c.open(f, libc::O_RDONLY as u32).unwrap().fh;
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    let lease = HostLease::take(&src.path("g"));
    let open = c.submit_open(g, libc::O_RDWR as u32).unwrap();
    lease.wait_broken();
    let t = c
        .setlkw(1, f, fh, OWNER, Lock::flock(libc::F_WRLCK))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(lease);
    });
    let start = Instant::now();
    let (state, bases) = c.fe.save_state_with_bases().unwrap();
    release.join().unwrap();
    assert!(
        start.elapsed() < vfsd::device::STOP_WAIT,
        "the stop waited {:?}: the wait that began during it was not suspended",
        start.elapsed()
    );
    c.wait(open).unwrap().ok().unwrap();
    assert!(
        !answered(&c, t, Duration::from_millis(200)),
        "answered at the stop"
    );
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    c.fe.migrate_to(&dst.sock, &state, &bases).unwrap();
    assert!(src.wait_exit(Duration::from_secs(10)).is_some());
    drop(host);
    c.wait(t).unwrap().ok().unwrap();
    assert!(
        !host_can_flock(&dst.path("f")),
        "the guest's flock is not held"
    );
}

#[test]
fn a_lock_wait_suspended_by_a_vm_stop_goes_on_when_the_vm_does() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let w = a_guest_waiting_on_a_host_flock(&d, &c);
    let bases: Vec<u32> = (0..c.fe.queues.len())
        .map(|q| c.fe.stop_queue(q).unwrap())
        .collect();
    assert!(
        !answered(&c, w.t, Duration::from_millis(300)),
        "answered at the stop"
    );
    // The VM goes on (or a failed migration resumes the source): the same daemon takes
    // the wait up again; released, the lock goes to the guest.
    c.fe.resume_queues(&bases).unwrap();
    assert!(
        !answered(&c, w.t, Duration::from_millis(300)),
        "answered while held"
    );
    drop(w.host);
    c.wait(w.t).unwrap().ok().unwrap();
    assert!(!host_can_flock(&d.path("f")));
    assert_eq!(c.getattr(w.node).unwrap().attr.size, 1);
}

#[test]
fn a_suspended_lock_wait_is_dropped_when_the_guest_resets_its_queue() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let w = a_guest_waiting_on_a_host_flock(&d, &c);
    for q in 0..c.fe.queues.len() {
        c.fe.stop_queue(q).unwrap();
    }
    // A guest that rebooted: zeroed rings, a new INIT. Its old wait must not be answered
    // into the new ring, nor its lock taken for nobody.
    for q in 0..c.fe.queues.len() {
        c.fe.restart_queue(q).unwrap();
    }
    c.init().unwrap();
    drop(w.host);
    std::thread::sleep(Duration::from_millis(300));
    let q = c.fe.queues[1].lock().unwrap();
    assert_eq!(q.used_idx(&c.fe.mem).unwrap(), 1, "only INIT was answered");
    drop(q);
    assert!(
        host_can_flock(&d.path("f")),
        "a lock taken for the old session"
    );
    c.lookup(ROOT, "f").unwrap();
}

/// `name_to_handle_at` of `p`: the kernel's `struct file_handle` bytes.
fn handle_of(p: &std::path::Path) -> Vec<u8> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 8 + 128];
    buf[..4].copy_from_slice(&128u32.to_ne_bytes());
    let mut mnt = 0;
    // SAFETY: `buf` is a struct file_handle with room for 128 bytes, as its first field
    // says; `c` is NUL-terminated and `mnt` a valid out pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr(),
            &mut mnt as *mut libc::c_int,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at {}", p.display());
    let len = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
    buf.truncate(8 + len);
    buf
}

#[test]
#[ignore = "needs root"]
fn file_handles_mode_moves_open_files_and_refuses_a_handle_outside_the_share() {
    require_root("open_by_handle_at needs CAP_DAC_READ_SEARCH");
    let top = tempfile::tempdir().unwrap();
    let share = top.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(top.path().join("secret"), b"outside").unwrap();
    let mode = ["--migration-mode", "file-handles"];
    let src = Daemon::start_on(&share, &mode);
    let c = src.client();
    let g = set_up(&c);
    let state = c.fe.save_state().unwrap();

    let dst = Daemon::start_on(&share, &mode);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(g.file, g.fh, 0, 7).unwrap(), b"before ");

    // The same state with the file's handle swapped for one of a file beside the share.
    let inside = handle_of(&share.join("d/f"));
    let outside = handle_of(&top.path().join("secret"));
    assert_eq!(inside.len(), outside.len());
    let mut hostile = state.clone();
    let at = (20..hostile.len() - inside.len())
        .find(|&i| hostile[i..i + inside.len()] == inside[..])
        .expect("the file's handle in the state");
    hostile[at..at + inside.len()].copy_from_slice(&outside);
    let dst2 = Daemon::start_on(&share, &mode);
    assert!(destination(&dst2).fe.load_state(&hostile).is_err());
    let soft = [&mode[..], &["--migration-on-error", "guest-error"]].concat();
    let dst3 = Daemon::start_on(&share, &soft);
    let n3 = destination(&dst3);
    n3.fe.load_state(&hostile).unwrap();
    assert_eq!(errno(n3.read(g.file, g.fh, 0, 7)), libc::EBADF);
}

#[test]
fn an_open_unlinked_file_moves_with_its_data_under_find_paths() {
    let src = Daemon::start(&[]);
    let c = src.client();
    let (e, o) = c.create(ROOT, "gone", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"still here").unwrap();
    c.unlink(ROOT, "gone").unwrap();
    let state = c.fe.save_state().unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(e.nodeid, o.fh, 0, 10).unwrap(), b"still here");
    n.write(e.nodeid, o.fh, 10, b"!").unwrap();
    assert_eq!(n.getattr(e.nodeid).unwrap().attr.size, 11);
    assert!(!src.path("gone").exists());
}

#[test]
fn confirm_paths_sends_the_current_path_of_a_file_renamed_on_the_host() {
    let src = Daemon::start(&["--migration-confirm-paths"]);
    let c = src.client();
    let g = set_up(&c);
    // Renamed behind vfsd's back: the name it knows is stale.
    std::fs::rename(src.path("d/f"), src.path("moved")).unwrap();
    let state = c.fe.save_state().unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(g.file, g.fh, 0, 7).unwrap(), b"before ");
    assert_eq!(n.getattr(g.file).unwrap().attr.size, 7);
}

#[test]
#[ignore = "needs root"]
fn a_host_user_can_not_reach_the_handover_socket() {
    require_root("needs root to try the socket as another user");
    let src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let state = c.fe.save_state().unwrap();
    let sock = handover_socket(&state);
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect({sock:?})\n print('connected')\nexcept PermissionError:\n print('refused')\n"
    );
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &script,
        ])
        .output()
        .expect("setpriv python3");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "refused");
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(g.file, g.fh, 0, 7).unwrap(), b"before ");
    assert!(!host_can_lock(&dst.path("d/f")));
}

/// An open file with no name left (only the handover moves it under `abort`) and its data.
fn an_unlinked_open_file(c: &FuseClient) -> (u64, u64) {
    let (e, o) = c.create(ROOT, "gone", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"still here").unwrap();
    c.unlink(ROOT, "gone").unwrap();
    (e.nodeid, o.fh)
}

#[test]
fn a_peer_with_a_wrong_token_or_none_does_not_end_the_handover() {
    use std::io::{Read, Write};
    let src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let (node, fh) = an_unlinked_open_file(&c);
    let state = c.fe.save_state().unwrap();
    let sock = handover_socket(&state);
    // A peer with a wrong token is dropped (it reads the end of the stream, no fd)...
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(&[0u8; 16]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(s.read(&mut [0u8; 4]).unwrap(), 0, "the source answered it");
    // ... and one that sends part of a token and goes.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(&[1u8; 3]).unwrap();
    drop(s);
    // The destination still gets everything: the unlinked file moves only that way.
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(node, fh, 0, 10).unwrap(), b"still here");
    assert_eq!(dst.stats()["lock_owners"].as_u64(), Some(1));
    assert!(!host_can_lock(&dst.path("d/f")) && !host_can_flock(&dst.path("d/f")));
    unlock(&n, &g);
    assert!(!sock.exists(), "the socket outlived the handover");
}

#[test]
fn the_handover_socket_is_private_to_the_daemons_user_and_not_in_the_share() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let src = Daemon::start(&[]);
    let c = src.client();
    let g = set_up(&c);
    let names = |c: &FuseClient| -> BTreeSet<Vec<u8>> {
        c.readdir_all(ROOT, false)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    let host_names = || -> BTreeSet<std::ffi::OsString> {
        std::fs::read_dir(&src.share)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    // Another guest on the same share, through its own daemon.
    let other = Daemon::start_on(&src.share.clone(), &[]);
    let o = other.client();
    let (before, host_before) = (names(&o), host_names());
    let state = c.fe.save_state().unwrap();
    // While the source offers the handover (its rings stopped), neither that guest nor
    // the host sees anything new in the share.
    assert_eq!(names(&o), before);
    assert_eq!(host_names(), host_before);
    let sock = handover_socket(&state);
    let m = std::fs::symlink_metadata(&sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    let d = std::fs::symlink_metadata(runtime_dir()).unwrap();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(d.uid(), unsafe { libc::geteuid() });
    assert_eq!(d.permissions().mode() & 0o7777, 0o700);
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(g.file, g.fh, 0, 7).unwrap(), b"before ");
}

/// The host's leases (`/proc/locks`) on the file with inode number `ino`.
fn leases(ino: u64) -> usize {
    let ino = format!(":{ino}");
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains("LEASE") && l.split_whitespace().any(|f| f.ends_with(&ino)))
        .count()
}

#[test]
fn a_host_lease_on_a_file_the_guest_has_open_does_not_stall_the_load() {
    use std::os::unix::fs::MetadataExt;
    let mut src = Daemon::start(&[]);
    let c = src.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"data").unwrap();
    let state = c.fe.save_state().unwrap();
    // The source is gone before the destination loads (as another host's would be to this
    // one's kernel): no handover, the handle is opened again, and nothing else has the
    // file open, so a host user may take a lease on it.
    drop(c);
    assert!(src.wait_exit(Duration::from_secs(10)).is_some());
    let lease = HostLease::take(&src.path("f"));
    let ino = std::fs::metadata(src.path("f")).unwrap().ino();
    assert_eq!(leases(ino), 1);
    let dst = Daemon::start_on(&src.share.clone(), &["--migration-on-error", "guest-error"]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    // The load asked the holder to let go, did not wait out the lease's break (it is
    // still there, breaking), and left the handle out; the node itself is restored.
    assert!(lease.broken(), "the reopen never met the lease");
    assert_eq!(
        leases(ino),
        1,
        "the load waited until the kernel removed the lease"
    );
    assert_eq!(errno(n.read(e.nodeid, o.fh, 0, 4)), libc::EBADF);
    assert_eq!(n.getattr(e.nodeid).unwrap().attr.size, 4);
    drop(lease);
}

#[test]
fn an_owner_whose_handles_were_all_left_out_is_not_restored_and_holds_no_lock() {
    use std::os::unix::fs::MetadataExt;
    let mut src = Daemon::start(&[]);
    let c = src.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.setlk(e.nodeid, o.fh, OWNER, Lock::range(0, 9, libc::F_RDLCK, 42))
        .unwrap();
    let state = c.fe.save_state().unwrap();
    drop(c);
    assert!(src.wait_exit(Duration::from_secs(10)).is_some());
    // A host lease keeps the read-write handle from being opened again.
    let lease = HostLease::take(&src.path("f"));
    let ino = std::fs::metadata(src.path("f")).unwrap().ino();
    let dst = Daemon::start_on(&src.share.clone(), &["--migration-on-error", "guest-error"]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(errno(n.read(e.nodeid, o.fh, 0, 1)), libc::EBADF);
    assert_eq!(leases(ino), 1);
    // Its owner went with it: no host lock for a handle the guest can't use.
    assert_eq!(dst.stats()["lock_owners"].as_u64(), Some(0));
    drop(lease);
    assert!(
        host_can_lock(&dst.path("f")),
        "the owner's read lock is held"
    );
}

/// `state` with its one request in flight answering at `reply_at` + `delta` instead: the
/// state ends with that request (its reply address as a varint, the request's length and
/// its 88 bytes) and the handover offer (43 bytes).
fn reply_moved(state: &[u8], delta: u64) -> (Vec<u8>, u64) {
    let end = state.len() - 43 - 88 - 1;
    assert_eq!(state[end], 88, "not a SETLKW in flight where expected");
    let mut start = end - 1;
    while state[start - 1] & 0x80 != 0 {
        start -= 1;
    }
    let (mut v, mut shift) = (0u64, 0);
    for b in &state[start..end] {
        v |= u64::from(b & 0x7f) << shift;
        shift += 7;
    }
    let mut moved = v + delta;
    let mut enc = Vec::new();
    while moved >= 0x80 {
        enc.push((moved as u8) | 0x80);
        moved >>= 7;
    }
    enc.push(moved as u8);
    assert_eq!(
        enc.len(),
        end - start,
        "pick a delta of the same varint length"
    );
    let mut s = state.to_vec();
    s[start..end].copy_from_slice(&enc);
    (s, v + delta)
}

#[test]
fn a_resumed_lock_wait_answers_only_into_its_own_chains_reply_buffer() {
    use vm_memory::Bytes;
    let mut src = Daemon::start(&[]);
    let mut c = src.client();
    let w = a_guest_waiting_on_a_host_flock(&src, &c);
    let (state, bases) = c.fe.save_state_with_bases().unwrap();
    // A stream that says to answer 64 bytes past the wait's own reply buffer (the guest
    // memory of some other request, or the guest's kernel).
    let (hostile, elsewhere) = reply_moved(&state, 64);
    let before: [u8; 16] =
        c.fe.mem
            .read_obj(vm_memory::GuestAddress(elsewhere))
            .unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    c.fe.migrate_to(&dst.sock, &hostile, &bases).unwrap();
    assert!(src.wait_exit(Duration::from_secs(10)).is_some());
    drop(w.host);
    // The wait is dropped, not granted: nothing is written there, nothing answered.
    std::thread::sleep(Duration::from_millis(300));
    let after: [u8; 16] =
        c.fe.mem
            .read_obj(vm_memory::GuestAddress(elsewhere))
            .unwrap();
    assert_eq!(before, after, "the reply went where the stream said");
    assert!(!answered(&c, w.t, Duration::from_millis(200)));
    assert!(
        host_can_flock(&dst.path("f")),
        "a lock taken for a dropped wait"
    );
}

#[test]
#[ignore = "needs root"]
fn file_handles_mode_restores_nodes_and_open_files_on_a_submount() {
    require_root("mounting a tmpfs and open_by_handle_at need root");
    let top = tempfile::tempdir().unwrap();
    let share = top.path().join("share");
    std::fs::create_dir_all(share.join("sub")).unwrap();
    let _mnt = Tmpfs::mount(&share.join("sub"), None);
    std::fs::create_dir(share.join("sub/d")).unwrap();
    std::fs::write(share.join("sub/d/f"), b"on the submount").unwrap();
    let mode = ["--migration-mode", "file-handles"];
    let src = Daemon::start_on(&share, &mode);
    let c = src.client();
    let sub = c.lookup(ROOT, "sub").unwrap().nodeid;
    let d = c.lookup(sub, "d").unwrap().nodeid;
    let f = c.lookup(d, "f").unwrap().nodeid;
    let fh = c.open(f, libc::O_RDWR as u32).unwrap().fh;
    let state = c.fe.save_state().unwrap();

    let dst = Daemon::start_on(&share, &mode);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    assert_eq!(n.read(f, fh, 0, 15).unwrap(), b"on the submount");
    assert_eq!(n.lookup(d, "f").unwrap().nodeid, f);
    assert_eq!(n.lookup(ROOT, "sub").unwrap().nodeid, sub);
}

/// A directory chain deeper than any bound on walks (5,000 levels, every ancestor
/// forgotten by the guest) migrates whole: the state names each ancestor before its
/// child, so the destination restores the leaf. A walk that stopped at 4,096 ancestors
/// marked the next one as sent without sending it, and the destination refused its child
/// ("parent not in the state before it").
#[test]
fn a_directory_chain_deeper_than_4096_migrates_whole() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const DEPTH: usize = 5000;
    let src = Daemon::start(&[]);
    // Made level by level relative to the one above: the path is longer than PATH_MAX.
    let mut dir: OwnedFd = std::fs::File::open(src.path("")).unwrap().into();
    for _ in 0..DEPTH {
        // SAFETY: plain *at() calls on an fd we own, with a NUL-terminated name.
        unsafe {
            assert_eq!(libc::mkdirat(dir.as_raw_fd(), c"d".as_ptr(), 0o755), 0);
            let fd = libc::openat(
                dir.as_raw_fd(),
                c"d".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY,
            );
            assert!(fd >= 0);
            dir = OwnedFd::from_raw_fd(fd);
        }
    }
    let c = src.client();
    let mut chain = vec![ROOT];
    for _ in 0..DEPTH {
        chain.push(c.lookup(*chain.last().unwrap(), "d").unwrap().nodeid);
    }
    let leaf = *chain.last().unwrap();
    let forgets: Vec<(u64, u64)> = chain[1..DEPTH].iter().map(|&n| (n, 1)).collect();
    for batch in forgets.chunks(200) {
        c.batch_forget(batch).unwrap();
    }
    let state = c.fe.save_state().unwrap();
    let dst = Daemon::start_on(&src.share.clone(), &[]);
    let n = destination(&dst);
    n.fe.load_state(&state).unwrap();
    let a = n.getattr(leaf).unwrap();
    assert_eq!(a.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    n.mkdir(leaf, "below-the-leaf", 0o755).unwrap();
}
