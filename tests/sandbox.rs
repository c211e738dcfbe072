//! The sandbox modes, seen from the host: where the daemon's root is, which fds it keeps,
//! which capabilities it holds; and that it still serves the guest in each mode.

mod common;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{is_root, read, Daemon};

const ROOT: u64 = 1;

/// The process actually serving: the spawned one, or its child in namespace mode.
fn serving_pid(d: &Daemon) -> i32 {
    let pid = d.pid();
    let t = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return c.parse().unwrap();
        }
        if t.elapsed() > Duration::from_secs(2) {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fd_targets(pid: i32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// Connects (so the daemon is past its sandbox set-up) and checks guest I/O works.
fn serves_io(d: &Daemon) -> vfsd::frontend::fuse::FuseClient {
    let c = d.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"sandboxed").unwrap();
    assert_eq!(read(&d.path("f")), b"sandboxed");
    c
}

#[test]
fn namespace_sandbox_pivots_into_the_share_and_closes_stray_fds() {
    if !is_root() {
        eprintln!("skipped: needs root for mount namespaces without a user namespace");
        return;
    }
    // An fd without CLOEXEC, inherited by the daemon: the sandbox must close it.
    let leak = std::fs::File::open("/etc/hostname").unwrap();
    unsafe { libc::fcntl(leak.as_raw_fd(), libc::F_SETFD, 0) };
    let d = Daemon::start(&["--sandbox", "namespace"]);
    let _c = serves_io(&d);
    let pid = serving_pid(&d);
    assert_ne!(
        pid,
        d.pid(),
        "namespace mode serves from a child in the new pid namespace"
    );
    assert_root_is_share(pid, &d);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(
        nspid.split_whitespace().count(),
        3,
        "two pid namespace levels: {nspid}"
    );
    assert!(
        fd_targets(pid).iter().all(|p| !p.ends_with("hostname")),
        "inherited fd left open"
    );
    // Capabilities: only virtiofsd's set (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETGID,
    // SETUID, MKNOD, SETFCAP).
    let cap = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    let eff = u64::from_str_radix(cap.split_whitespace().nth(1).unwrap(), 16).unwrap();
    let want = [0u64, 1, 3, 4, 6, 7, 27, 31]
        .iter()
        .fold(0, |m, b| m | 1 << b);
    assert_eq!(eff, want, "{cap}");
    // Its network namespace is not the host's.
    let ns = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
    assert_ne!(ns(pid), ns(std::process::id() as i32));
    drop(leak);
}

#[test]
fn chroot_sandbox_confines_the_root() {
    if !is_root() {
        eprintln!("skipped: --sandbox chroot needs root");
        return;
    }
    let d = Daemon::start(&["--sandbox", "chroot"]);
    let _c = serves_io(&d);
    assert_root_is_share(d.pid(), &d);
}

/// The daemon's `/` is the share's directory (same inode on the same device).
fn assert_root_is_share(pid: i32, d: &Daemon) {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata(format!("/proc/{pid}/root/")).unwrap();
    let share = std::fs::metadata(&d.share).unwrap();
    assert_eq!((root.dev(), root.ino()), (share.dev(), share.ino()));
    assert!(
        std::fs::metadata(format!("/proc/{pid}/root/etc/passwd")).is_err(),
        "host files visible"
    );
}

#[test]
fn modcaps_adjusts_the_capability_set() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = Daemon::start(&["--sandbox", "none", "--modcaps", "-mknod:-setfcap"]);
    let c = d.client();
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    let cap = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    let eff = u64::from_str_radix(cap.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert_eq!(eff & (1 << 27), 0, "CAP_MKNOD dropped");
    assert_ne!(eff & 1, 0, "CAP_CHOWN kept");
    // Without CAP_MKNOD the guest's mknod of a device fails the way the host says.
    let r = c.mknod(ROOT, "dev", libc::S_IFCHR | 0o600, 0x0101);
    assert_eq!(r.unwrap_err().errno(), Some(libc::EPERM));
}

#[test]
fn bad_sandbox_options_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::vfsd_bin())
        .args(["--socket-path"])
        .arg(dir.path().join("s"))
        .arg("--shared-dir")
        .arg(dir.path())
        .args(["--modcaps", "+bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("unknown capability"), "{err}");
}
