//! `--keep-listening`: after its frontend disconnects, vfsd serves the next one on the same
//! socket, from a clean state: no fd, handle or host lock of a frontend outlives it.

use std::time::{Duration, Instant};

use crate::common::{host_flock, host_ofd_lock, Daemon, ROOT};
use vfsd::frontend::fuse::*;

/// Open fds of `pid` and every process below it.
fn fds_of_tree(pid: i32) -> usize {
    let mut n = 0;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        n += std::fs::read_dir(format!("/proc/{p}/fd")).map_or(0, |d| d.count());
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                todo.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
            }
        }
    }
    n
}

/// Waits until the host can take both kinds of lock on `path` (the frontend's session is
/// gone), at most 10 s.
fn wait_unlocked(path: &std::path::Path) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let (flock_ok, _f) = host_flock(path, libc::LOCK_EX);
        if flock_ok && host_ofd_lock(path, libc::F_WRLCK, 0, 0) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn four_frontends_in_a_row_each_start_with_no_fd_handle_or_lock_of_the_one_before() {
    // Each sandbox mode reaches /proc differently; chroot needs root.
    let modes: &[&str] = if crate::common::is_root() {
        &["namespace", "chroot", "none"]
    } else {
        &["namespace", "none"]
    };
    for mode in modes {
        rounds(mode);
    }
}

fn rounds(sandbox: &str) {
    let mut d = Daemon::start(&["--cache", "never", "--keep-listening", "--sandbox", sandbox]);
    let path = d.path("f");
    std::fs::write(&path, b"data").unwrap();
    let mut baseline = None;
    for round in 0..4 {
        let c = d.client();
        // What a frontend that has just INITed holds: the same every time.
        let fds = fds_of_tree(d.pid());
        assert_eq!(
            *baseline.get_or_insert(fds),
            fds,
            "{sandbox}, round {round}: fds left over"
        );
        // Each child writes the statistics file afresh: still one JSON document.
        let st = d.stats();
        assert!(st.is_object(), "{sandbox}, round {round}: {st}");
        let e = c.lookup(ROOT, "f").unwrap();
        let a = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        let b = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
        c.setlk(e.nodeid, a.fh, 1, Lock::flock(libc::F_WRLCK))
            .unwrap();
        c.setlk(e.nodeid, b.fh, 2, Lock::range(0, 99, libc::F_WRLCK, 7))
            .unwrap();
        let (ok, _f) = host_flock(&path, libc::LOCK_EX);
        assert!(
            !ok,
            "{sandbox}, round {round}: the frontend's flock is not on the host"
        );
        assert!(!host_ofd_lock(&path, libc::F_WRLCK, 0, 10));
        // The frontend goes away without releasing anything, as a VMM that quits.
        drop(c);
        assert!(
            wait_unlocked(&path),
            "{sandbox}, round {round}: a lock outlived its frontend"
        );
        assert!(
            d.wait_exit(Duration::from_millis(200)).is_none(),
            "{sandbox}, round {round}: vfsd exited after its frontend left"
        );
    }
}

#[test]
fn without_keep_listening_vfsd_exits_when_its_frontend_leaves() {
    let mut d = Daemon::start(&["--cache", "never"]);
    drop(d.client());
    let st = d.wait_exit(Duration::from_secs(10)).expect("still running");
    assert!(st.success(), "{st:?}");
}

#[test]
fn a_termination_signal_ends_a_keep_listening_vfsd_and_removes_its_socket() {
    let mut d = Daemon::start(&["--cache", "never", "--keep-listening"]);
    let c = d.client();
    c.getattr(1).unwrap();
    // SAFETY: kill on the daemon we spawned.
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    let st = d.wait_exit(Duration::from_secs(10)).expect("still running");
    assert!(st.success(), "{st:?}");
    assert!(!d.sock.exists(), "the socket's name is left behind");
}

/// A frontend that sends garbage ends its own session, not the daemon: the next one is
/// served. A SIGTERM between two frontends ends it and removes the socket.
#[test]
fn a_frontend_that_breaks_the_protocol_leaves_the_next_one_served() {
    use std::io::Write;
    let mut d = Daemon::start(&["--cache", "never", "--keep-listening"]);
    let mut s = std::os::unix::net::UnixStream::connect(&d.sock).unwrap();
    s.write_all(&[0xff; 12]).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        d.wait_exit(Duration::from_millis(200)).is_none(),
        "vfsd exited"
    );
    d.client().getattr(1).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill on the daemon we spawned.
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    let st = d.wait_exit(Duration::from_secs(10)).expect("still running");
    assert!(st.success(), "{st:?}");
    assert!(!d.sock.exists(), "the socket's name is left behind");
}

/// The process serving the current frontend: the last of the single line of processes
/// below `pid` (the supervisor, in the namespace sandbox, then the parent that forks a
/// child per frontend, then that child).
fn frontend_child(pid: i32) -> i32 {
    let mut p = pid;
    loop {
        let c = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap();
        match c.split_whitespace().next() {
            Some(next) => p = next.parse().unwrap(),
            None => return p,
        }
    }
}

/// A child killed by a signal (a crash a guest may trigger, the OOM killer) ends its own
/// frontend's session, not the daemon: the next frontend is served, in each sandbox mode.
#[test]
fn a_frontend_child_killed_by_a_signal_leaves_the_next_frontend_served() {
    let modes: &[&str] = if crate::common::is_root() {
        &["namespace", "none"]
    } else {
        &["none"]
    };
    for sandbox in modes {
        let mut d = Daemon::start(&["--cache", "never", "--keep-listening", "--sandbox", sandbox]);
        let c = d.client();
        c.getattr(ROOT).unwrap();
        let child = frontend_child(d.pid());
        assert_ne!(child, d.pid(), "{sandbox}: no child serves the frontend");
        // SAFETY: kill on a process of the daemon we spawned.
        unsafe { libc::kill(child, libc::SIGKILL) };
        assert!(
            d.wait_exit(Duration::from_millis(500)).is_none(),
            "{sandbox}: vfsd exited when its frontend's child was killed"
        );
        drop(c);
        let c = d.client();
        c.getattr(ROOT).unwrap();
        assert_ne!(frontend_child(d.pid()), child, "{sandbox}: the same child");
    }
}
