//! `--no-open`: OPEN answered ENOSYS so the guest kernel stops sending OPEN and RELEASE,
//! then every file request names handle 0 and vfsd serves it from the node's own fd; and
//! FOPEN_NOFLUSH where a FLUSH would carry nothing.

use std::os::unix::fs::MetadataExt;

use crate::common::{errno, host_ofd_lock, run_vfsd, serving_pid, Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::SetattrIn;
use vfsd::frontend::fuse::*;

const POSIX_LOCKS: u64 = 1 << 1;
const ATOMIC_O_TRUNC: u64 = 1 << 3;
const FLOCK_LOCKS: u64 = 1 << 10;
const FOPEN_NOFLUSH: u32 = 1 << 5;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_FH: u32 = 1 << 6;
const OWNER: u64 = 0xa;

/// A client whose INIT offers what the guest kernel offers that `--no-open` touches.
fn client(d: &Daemon) -> (FuseClient, u64) {
    let c = FuseClient::new(d.frontend(Default::default()));
    let out = c
        .init_ext(
            38,
            POSIX_LOCKS | ATOMIC_O_TRUNC | FLOCK_LOCKS | (1 << 9) | (1 << 22),
        )
        .unwrap();
    (c, out.flags as u64)
}

/// The serving process's fds on files in the share that are open for I/O (not O_PATH).
fn io_fds_in_share(d: &Daemon) -> usize {
    let pid = serving_pid(d.pid());
    let share = std::fs::canonicalize(&d.share).unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        // The sandboxed daemon sees the share as its root: count regular files by name.
        let name = target.to_string_lossy().into_owned();
        if !(name.contains("/f") || target.starts_with(&share)) {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|v| u32::from_str_radix(v.trim(), 8).unwrap())
            .unwrap_or(0);
        if flags & libc::O_PATH as u32 == 0 {
            n += 1;
        }
    }
    n
}

#[test]
fn without_open_messages_a_file_is_created_written_read_and_truncated_by_node() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    let (c, flags) = client(&d);
    // The guest kernel would truncate on OPEN and release flocks on RELEASE: neither comes.
    assert_eq!(flags & ATOMIC_O_TRUNC, 0, "ATOMIC_O_TRUNC offered");
    assert_eq!(flags & FLOCK_LOCKS, 0, "FLOCK_LOCKS offered");
    assert_ne!(flags & POSIX_LOCKS, 0, "POSIX locks still forwarded");

    let (e, o) = c
        .create(
            ROOT,
            "f",
            libc::O_WRONLY as u32 | libc::O_CREAT as u32,
            0o644,
        )
        .unwrap();
    assert_eq!(
        o.fh, 0,
        "CREATE gives no handle: no RELEASE would come for it"
    );
    let n = e.nodeid;
    // Written through a write-only guest open, read back: the node's fd serves both.
    assert_eq!(c.write(n, 0, 0, b"hello, node").unwrap(), 11);
    assert_eq!(c.read(n, 0, 0, 64).unwrap(), b"hello, node");
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"hello, node");
    assert_eq!(errno(c.open(n, libc::O_RDONLY as u32)), libc::ENOSYS);
    // An O_TRUNC open is the guest kernel's SETATTR then, with handle 0.
    let s = SetattrIn {
        valid: FATTR_SIZE | FATTR_FH,
        fh: 0,
        size: 5,
        ..Default::default()
    };
    assert_eq!(c.setattr(n, &s).unwrap().attr.size, 5);
    assert_eq!(std::fs::read(d.path("f")).unwrap(), b"hello");
    c.fsync(n, 0, false).unwrap();
    // A RELEASE of handle 0 (a CREATE before the guest learnt of ENOSYS) is harmless.
    c.release(n, 0).unwrap();
    assert_eq!(c.read(n, 0, 0, 64).unwrap(), b"hello");

    // A file made on the host is read by node after a LOOKUP alone.
    std::fs::write(d.path("g"), b"from the host").unwrap();
    let g = c.lookup(ROOT, "g").unwrap().nodeid;
    assert_eq!(c.read(g, 0, 0, 64).unwrap(), b"from the host");
    // Handle 0 is for regular files only.
    let dir = c.mkdir(ROOT, "d", 0o755).unwrap().nodeid;
    assert_eq!(errno(c.read(dir, 0, 0, 64)), libc::EBADF);
}

#[test]
fn handle_zero_is_no_handle_without_no_open() {
    let d = Daemon::start(&["--cache", "always"]);
    std::fs::write(d.path("f"), b"data").unwrap();
    let (c, flags) = client(&d);
    assert_ne!(flags & ATOMIC_O_TRUNC, 0);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(errno(c.read(n, 0, 0, 64)), libc::EBADF);
    assert_eq!(errno(c.write(n, 0, 0, b"x")), libc::EBADF);
    let (_, o) = c
        .create(
            ROOT,
            "new",
            libc::O_RDWR as u32 | libc::O_CREAT as u32,
            0o644,
        )
        .unwrap();
    assert_ne!(o.fh, 0);
}

#[test]
fn a_flush_still_releases_posix_locks_and_is_refused_when_none_are_forwarded() {
    let d = Daemon::start(&["--no-open"]);
    std::fs::write(d.path("f"), vec![0u8; 100]).unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    c.setlk(n, 0, OWNER, Lock::range(0, 99, libc::F_WRLCK, 1))
        .unwrap();
    assert!(
        !host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 100),
        "lock not on the host"
    );
    // The guest's close: the lock goes with it, as on a local file system.
    c.flush_owner(n, 0, OWNER).unwrap();
    assert!(
        host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 100),
        "lock kept after close"
    );
    drop(c);
    drop(d);

    // No POSIX lock reaches the host: a FLUSH carries nothing, and ENOSYS stops them.
    let d = Daemon::start(&["--no-open", "--no-posix-lock"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let (c, _) = client(&d);
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(errno(c.flush(n, 0)), libc::ENOSYS);
}

#[test]
fn opens_say_noflush_only_where_a_flush_carries_nothing() {
    for (args, noflush) in [(&["--no-posix-lock"][..], true), (&[][..], false)] {
        let d = Daemon::start(args);
        std::fs::write(d.path("f"), b"x").unwrap();
        let (c, _) = client(&d);
        let n = c.lookup(ROOT, "f").unwrap().nodeid;
        let o = c.open(n, libc::O_RDONLY as u32).unwrap();
        assert_eq!(o.open_flags & FOPEN_NOFLUSH != 0, noflush, "open, {args:?}");
        let (_, o) = c
            .create(ROOT, "g", libc::O_RDWR as u32 | libc::O_CREAT as u32, 0o644)
            .unwrap();
        assert_eq!(
            o.open_flags & FOPEN_NOFLUSH != 0,
            noflush,
            "create, {args:?}"
        );
    }
}

#[test]
fn node_fds_are_bounded_and_go_when_the_guest_forgets_the_node() {
    let d = Daemon::start(&["--no-open", "--cache", "always"]);
    let (c, _) = client(&d);
    let before = io_fds_in_share(&d);
    // The bound is 4096, or a quarter of the fd limit vfsd runs with.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", serving_pid(d.pid()))).unwrap();
    let nofile: usize = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .parse()
        .unwrap();
    let bound = (nofile / 4).clamp(16, 4096);
    let mut nodes = Vec::new();
    for i in 0..bound + 100 {
        let (e, o) = c
            .create(
                ROOT,
                &format!("f{i}"),
                libc::O_RDWR as u32 | libc::O_CREAT as u32,
                0o644,
            )
            .unwrap();
        c.write(e.nodeid, o.fh, 0, b"x").unwrap();
        nodes.push(e.nodeid);
    }
    let held = io_fds_in_share(&d) - before;
    assert!(
        held <= bound && held + bound / 16 >= bound,
        "{held} node fds for {} files written (bound {bound})",
        bound + 100
    );
    // Every file still works, its fd opened again when it was let go.
    for &n in nodes.iter().take(200) {
        assert_eq!(c.read(n, 0, 0, 8).unwrap(), b"x");
    }
    for chunk in nodes.chunks(200) {
        c.batch_forget(&chunk.iter().map(|&n| (n, 1)).collect::<Vec<_>>())
            .unwrap();
    }
    // FORGET has no reply: a request after it is served after it on the same queue.
    c.getattr(ROOT).unwrap();
    assert_eq!(io_fds_in_share(&d), before, "node fds left after FORGET");
    let ino = std::fs::metadata(d.path("f0")).unwrap().ino();
    assert_ne!(ino, 0);
}

#[test]
fn no_open_needs_a_cache_mode_that_keeps_file_data() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    for mode in ["never", "metadata"] {
        let (code, err) = run_vfsd(&[
            "--socket-path",
            sock.to_str().unwrap(),
            "--shared-dir",
            "/",
            "--no-open",
            "--cache",
            mode,
        ]);
        assert_eq!(code, Some(1), "{mode}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("--no-open"), "{err}");
    }
}
