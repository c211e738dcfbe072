use crate::common::{host_ofd_lock, serving_pid, Daemon, ROOT};
use std::time::{Duration, Instant};
use vfsd::frontend::fuse::Lock;

#[test]
fn smoke_kill9_takeover() {
    let d = Daemon::start(&["--cache", "never"]);
    let c = d.client();
    std::fs::write(d.path("f"), b"before the crash").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    assert_eq!(c.read(f.nodeid, fh, 0, 6).unwrap(), b"before");
    c.setlk(f.nodeid, fh, 77, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    let pid = serving_pid(d.pid());
    eprintln!("supervisor {} serving {}", d.pid(), pid);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let t = Instant::now();
    let a = c.getattr(f.nodeid).unwrap();
    eprintln!("first answer after {:?}", t.elapsed());
    assert_eq!(a.attr.ino, f.attr.ino);
    assert_eq!(c.read(f.nodeid, fh, 7, 3).unwrap(), b"the");
    c.write(f.nodeid, fh, 0, b"AFTER").unwrap();
    assert_eq!(&std::fs::read(d.path("f")).unwrap()[..5], b"AFTER");
    std::fs::write(d.path("g"), b"x").unwrap();
    let g = c.lookup(ROOT, "g").unwrap();
    assert!(g.nodeid > f.nodeid);
    let _ = Duration::from_secs(1);
    assert!(
        !host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10),
        "lock lost"
    );
    c.setlk(f.nodeid, fh, 77, Lock::range(0, 9, libc::F_UNLCK, 1))
        .unwrap();
    assert!(host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
}
