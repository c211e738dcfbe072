//! A serving process killed while a frontend is connected: the supervisor's next serving
//! process takes the guest over on the same connection (docs/upgrade.md, "A crash of the
//! serving process"), in every sandbox, with --keep-listening, and before any frontend.

use std::time::{Duration, Instant};

use crate::common::{host_ofd_lock, require_root, serving_pid, Daemon, ROOT};
use vfsd::frontend::fuse::Lock;

const OWNER: u64 = 0x7a7a;

/// Waits until the supervisor has one child: a keeper that handed a dead process's
/// files over is reaped a moment after the new process first answers, and until then
/// the first child `serving_pid` follows may be that keeper.
fn one_child(supervisor: i32) {
    let t = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
                .unwrap_or_default();
        if children.split_whitespace().count() == 1 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "children: {children}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL to the process that serves (the supervisor's deepest child), waiting until
/// it is gone.
fn kill_serving(supervisor: i32) -> i32 {
    one_child(supervisor);
    let pid = serving_pid(supervisor);
    // SAFETY: kill with a valid signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let t = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(t.elapsed() < Duration::from_secs(10), "{pid} did not die");
        std::thread::sleep(Duration::from_millis(2));
    }
    pid
}

/// Nodes, an open handle (its data, a write through it), a POSIX lock held through it
/// (probed from the host) and new lookups, across a kill -9 of the serving process.
fn survives_a_kill(extra: &[&str]) {
    let d = Daemon::start(&[&["--cache", "never"], extra].concat());
    let c = d.client();
    std::fs::write(d.path("f"), b"before the crash").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    for round in 0..3 {
        let old = kill_serving(d.pid());
        let t = Instant::now();
        let a = c.getattr(f.nodeid).expect("the same connection answers");
        eprintln!("round {round}: answered {:?} after the kill", t.elapsed());
        one_child(d.pid());
        assert_ne!(serving_pid(d.pid()), old);
        assert_eq!(a.attr.ino, f.attr.ino);
        assert_eq!(c.read(f.nodeid, fh, 7, 3).unwrap(), b"the");
        c.write(f.nodeid, fh, 0, format!("AFTER{round}").as_bytes())
            .unwrap();
        assert_eq!(
            &std::fs::read(d.path("f")).unwrap()[..6],
            format!("AFTER{round}").as_bytes()
        );
        assert!(
            !host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10),
            "the guest's lock was lost"
        );
        let name = format!("g{round}");
        std::fs::write(d.path(&name), b"x").unwrap();
        let g = c.lookup(ROOT, &name).unwrap();
        assert!(g.nodeid > f.nodeid, "a new node id reused an old one");
    }
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_UNLCK, 1))
        .unwrap();
    assert!(host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
}

#[test]
#[ignore = "needs root"]
fn a_killed_serving_process_is_taken_over_in_the_namespace_sandbox() {
    require_root("the namespace sandbox as root");
    survives_a_kill(&["--sandbox", "namespace"]);
}

#[test]
#[ignore = "needs root"]
fn a_killed_serving_process_is_taken_over_in_the_chroot_sandbox() {
    require_root("--sandbox chroot needs root");
    survives_a_kill(&["--sandbox", "chroot"]);
}

#[test]
fn a_killed_serving_process_is_taken_over_without_a_sandbox() {
    survives_a_kill(&["--sandbox", "none"]);
}

#[test]
fn a_killed_serving_process_is_taken_over_with_keep_listening() {
    survives_a_kill(&["--sandbox", "none", "--keep-listening"]);
}

#[test]
fn a_serving_process_killed_before_any_frontend_is_replaced() {
    let d = Daemon::start(&["--sandbox", "none"]);
    let first = kill_serving(d.pid());
    std::fs::write(d.path("f"), b"x").unwrap();
    let c = d.client();
    c.lookup(ROOT, "f").expect("a new serving process serves");
    one_child(d.pid());
    assert_ne!(serving_pid(d.pid()), first);
}
