//! vfsd sharing a directory that is itself a FUSE mount (a GlusterFS or ceph-fuse client,
//! here bindfs): name_to_handle_at succeeds there, but a FUSE server that does not
//! negotiate FUSE_EXPORT_SUPPORT (GlusterFS's client, high-level libfuse file systems)
//! cannot reopen a handle once the host kernel has evicted the inode: open_by_handle_at
//! then fails with ESTALE. `--inode-file-handles=prefer` must keep fds there, and
//! `mandatory` must refuse to start with a line that says why.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{require_root, run_vfsd, Daemon, ROOT};

/// A bindfs mount of `src` at `mnt`, unmounted on drop.
pub(crate) struct Bindfs(PathBuf);

impl Bindfs {
    pub(crate) fn mount(src: &Path, mnt: &Path) -> Bindfs {
        let out = Command::new("bindfs").arg(src).arg(mnt).output().unwrap();
        assert!(
            out.status.success(),
            "bindfs {} {}: {}",
            src.display(),
            mnt.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Bindfs(mnt.to_path_buf())
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Lets a stopped bindfs go and ends it, whatever the test's outcome.
struct Server(std::process::Child);

impl Server {
    fn signal(&self, sig: i32) {
        // SAFETY: signals our own child.
        assert_eq!(unsafe { libc::kill(self.0.id() as i32, sig) }, 0);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bindfs of `src` at `mnt` in the foreground, so that a test can stop it; drop the
/// mount before the server.
fn foreground_bindfs(src: &Path, mnt: &Path) -> (Server, Bindfs) {
    let server = Server(
        Command::new("bindfs")
            .arg("-f")
            .arg(src)
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let unmount = Bindfs(mnt.to_path_buf());
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .contains(mnt.to_str().unwrap())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "bindfs never mounted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, unmount)
}

/// A FUSE mount to share (root only), or None (with the reason printed) without bindfs.
fn fuse_share() -> Option<(tempfile::TempDir, Bindfs)> {
    require_root("mounting bindfs and dropping caches need root");
    let have_bindfs = Command::new("bindfs")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_bindfs {
        // scripts/setup.sh installs it, and CI runs there: a skip there would hide the test.
        assert!(
            std::env::var_os("CI").is_none(),
            "bindfs is missing (apt-get install bindfs)"
        );
        eprintln!("skipped: bindfs is not installed (apt-get install bindfs)");
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("d/f"), b"fuse host data").unwrap();
    let b = Bindfs::mount(&src, &mnt);
    Some((t, b))
}

/// Makes the host kernel forget unused dentries and inodes (the FUSE mount's among them).
fn evict_host_inodes() {
    for _ in 0..2 {
        std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root"]
fn prefer_keeps_working_after_the_host_evicts_a_fuse_inode() {
    let Some((t, _fuse)) = fuse_share() else {
        return;
    };
    let d = Daemon::start_on(&t.path().join("mnt"), &["--inode-file-handles", "prefer"]);
    let c = d.client();
    let dir = c.lookup(ROOT, "d").unwrap();
    let f = c.lookup(dir.nodeid, "f").unwrap();
    evict_host_inodes();
    // Before the fix the node held only a file handle, and these answered ESTALE.
    let o = c
        .open(f.nodeid, libc::O_RDONLY as u32)
        .expect("open after the host evicted the inode");
    assert_eq!(c.read(f.nodeid, o.fh, 0, 64).unwrap(), b"fuse host data");
    c.release(f.nodeid, o.fh).unwrap();
    c.getattr(dir.nodeid)
        .expect("getattr of a directory after eviction");
    c.lookup(dir.nodeid, "f")
        .expect("lookup under a directory after eviction");
}

#[test]
#[ignore = "needs root"]
fn mandatory_refuses_a_fuse_share_with_a_clear_line() {
    let Some((t, _fuse)) = fuse_share() else {
        return;
    };
    let sock = t.path().join("s.sock");
    let mnt = t.path().join("mnt");
    // A daemon that accepted the share would wait for a frontend forever: run_vfsd fails
    // the test then.
    let (code, err) = run_vfsd(&[
        "--socket-path",
        sock.to_str().unwrap(),
        "--shared-dir",
        mnt.to_str().unwrap(),
        "--inode-file-handles",
        "mandatory",
    ]);
    assert_ne!(code, Some(0), "vfsd started: {err}");
    assert!(
        err.contains("FUSE") && err.contains("--inode-file-handles"),
        "unclear error: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "more than one line: {err}");
}

/// The host file system stops answering (here its FUSE server is stopped, as a network
/// file system whose server is gone) while a queue thread serves a lone READ on it: when
/// the frontend leaves, vfsd still exits. Joining the queue threads on the way out waited
/// for the READ forever.
#[test]
#[ignore = "needs root"]
fn vfsd_exits_on_disconnect_while_a_queue_thread_waits_on_a_hung_host_file_system() {
    let Some((t, fuse)) = fuse_share() else {
        return;
    };
    drop(fuse);
    // This test's own bindfs, in the foreground, so that it can be stopped.
    let (src, mnt) = (t.path().join("src2"), t.path().join("mnt2"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("big"), vec![7u8; 4 << 20]).unwrap();
    let (server, _unmount) = foreground_bindfs(&src, &mnt);
    // A close on the mount, so that the kernel learns bindfs has no FLUSH: otherwise the
    // exiting daemon's own close of its handle would wait for the stopped server too.
    std::fs::read(mnt.join("big")).unwrap();
    let mut d = Daemon::start_on(&mnt, &[]);
    let mut c = d.client();
    c.timeout = Duration::from_secs(2);
    let e = c.lookup(ROOT, "big").unwrap();
    let h = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    // Enough lone requests in a row that the queue thread serves the next one itself.
    for _ in 0..32 {
        c.getattr(e.nodeid).unwrap();
    }
    std::fs::write("/proc/sys/vm/drop_caches", b"1").unwrap();
    // SAFETY: signals our own child.
    assert_eq!(
        unsafe { libc::kill(server.0.id() as i32, libc::SIGSTOP) },
        0
    );
    let (u, req) = c.read_req(e.nodeid, h.fh, 3 << 20, 65536);
    let tk = c.submit_bytes(1, &req, 65536 + 4096, u).unwrap();
    assert!(
        c.wait(tk).is_err(),
        "a READ answered with its server stopped"
    );
    drop(c); // the frontend leaves
    assert!(
        d.wait_exit(Duration::from_secs(10)).is_some(),
        "vfsd did not exit after the frontend left"
    );
}

/// A ring stopped (GET_VRING_BASE) while its queue thread is held in a request of a pop:
/// the pop's later requests are dropped, not served after the stop. Here the first is a
/// LOOKUP served inline that waits on a stopped bindfs, the second a FORGET; served
/// after the stop, the FORGET would drop a node whose lookup the guest still counts
/// once it resumes the ring (it sends the request again).
#[test]
#[ignore = "needs root"]
fn requests_popped_before_a_ring_stop_are_not_served_after_it() {
    use vfsd::frontend::fuse::{FUSE_FORGET, FUSE_LOOKUP};
    let Some((t, fuse)) = fuse_share() else {
        return;
    };
    drop(fuse);
    let (src, mnt) = (t.path().join("src3"), t.path().join("mnt3"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(src.join("known"), b"x").unwrap();
    let (server, _unmount) = foreground_bindfs(&src, &mnt);
    let d = Daemon::start_on(&mnt, &["--thread-pool-size", "4"]);
    let mut c = d.client();
    c.timeout = Duration::from_secs(2);
    let known = c.lookup(ROOT, "known").unwrap().nodeid;
    // The queue thread asleep, so that both requests below come in one pop.
    std::thread::sleep(Duration::from_millis(50));
    server.signal(libc::SIGSTOP);
    let forget = 1u64.to_le_bytes();
    let tickets = c
        .submit_together(
            1,
            &[
                (FUSE_LOOKUP, ROOT, &[b"never-seen\0"]),
                (FUSE_FORGET, known, &[&forget]),
            ],
            4096,
        )
        .unwrap();
    assert_eq!(tickets.len(), 2);
    std::thread::sleep(Duration::from_millis(200));
    // Waits vring::STOP_WAIT for the LOOKUP, then starts a new generation.
    c.fe.stop_queue(1).unwrap();
    server.signal(libc::SIGCONT);
    let t0 = std::time::Instant::now();
    let s = loop {
        let s = d.stats();
        if s["opcodes"]["LOOKUP"]["count"].as_u64() >= Some(2) {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the LOOKUP never finished: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The queue thread has moved on from the LOOKUP to the FORGET by now, or soon.
    std::thread::sleep(Duration::from_millis(200));
    let s2 = d.stats();
    assert!(
        s2["opcodes"]["FORGET"]["count"].as_u64().unwrap_or(0) == 0,
        "a FORGET popped before the stop was served after it: {s2} (before: {s})"
    );
    assert!(s2["served_inline"].as_u64() >= Some(1), "{s2}");
}
