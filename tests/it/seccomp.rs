//! The seccomp filter seen from the host: the serving process runs under both of vfsd's
//! filters (clone3 answered ENOSYS, then the allowlist) in every sandbox and file-handle
//! mode, and still serves a guest's whole repertoire, as root and as another user,
//! starting its queue threads after the filter is in place. (What each argument rule
//! refuses is tested in `src/seccomp.rs`, on the same filter in a forked process.)

use std::time::Duration;

use crate::common::{self, is_root, require_root, Daemon, ROOT, USER};
use vfsd::frontend::fuse::*;

/// The "Seccomp:" mode and "Seccomp_filters:" count of a process.
fn seccomp_status(pid: i32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("Seccomp:"), field("Seccomp_filters:"))
}

/// Most opcodes, from one caller, in a fresh directory `name`.
fn workload(c: &FuseClient, name: &str) {
    let dir = c.mkdir(ROOT, name, 0o777).unwrap().nodeid;
    let (f, o) = c.create(dir, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(f.nodeid, o.fh, 0, &[7u8; 8192]).unwrap();
    assert_eq!(c.read(f.nodeid, o.fh, 4096, 4096).unwrap(), vec![7u8; 4096]);
    c.fallocate(f.nodeid, o.fh, 0, 0, 16384).unwrap();
    c.lseek(f.nodeid, o.fh, 0, libc::SEEK_DATA as u32).unwrap();
    let s = fuse_backend_rs::abi::fuse_abi::SetattrIn {
        valid: FATTR_SIZE,
        size: 100,
        ..Default::default()
    };
    c.setattr(f.nodeid, &s).unwrap();
    let (g, go) = c.create(dir, "g", libc::O_RDWR as u32, 0o644).unwrap();
    c.copy_file_range(f.nodeid, o.fh, 0, g.nodeid, go.fh, 0, 100)
        .unwrap();
    c.flush(f.nodeid, o.fh).unwrap();
    c.fsync(f.nodeid, o.fh, false).unwrap();
    c.release(g.nodeid, go.fh).unwrap();
    c.release(f.nodeid, o.fh).unwrap();
    let o = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    file_attributes(c, f.nodeid, o.fh);
    c.release(f.nodeid, o.fh).unwrap();
    c.setxattr(f.nodeid, "user.k", b"v", 0).unwrap();
    assert_eq!(c.getxattr(f.nodeid, "user.k", 64).unwrap(), b"v");
    c.listxattr(f.nodeid, 256).unwrap();
    c.removexattr(f.nodeid, "user.k").unwrap();
    c.symlink(dir, "l", "f").unwrap();
    let l = c.lookup(dir, "l").unwrap();
    assert_eq!(c.readlink(l.nodeid).unwrap(), b"f");
    c.link(f.nodeid, dir, "hard").unwrap();
    c.mknod(dir, "fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    c.rename(dir, "g", dir, "g2").unwrap();
    c.access(f.nodeid, libc::R_OK as u32).unwrap();
    c.getattr(f.nodeid).unwrap();
    c.statfs(dir).unwrap();
    assert_eq!(c.readdir_all(dir, true).unwrap().len(), 2 + 5);
    assert!(c.readdir_all(dir, false).unwrap().len() >= 7);
    for n in ["f", "g2", "l", "hard", "fifo"] {
        c.unlink(dir, n).unwrap();
    }
    c.rmdir(ROOT, name).unwrap();
    c.forget(f.nodeid, 1).unwrap();
    c.syncfs().unwrap();
}

/// lsattr and chattr (the flags set back unchanged) as the guest sends them. A host
/// filesystem without flags may refuse them, but the daemon must answer.
fn file_attributes(c: &FuseClient, node: u64, fh: u64) {
    use vfsd::passthrough::ioctl::{FS_IOC_FSGETXATTR, FS_IOC_GETFLAGS, FS_IOC_SETFLAGS};
    let answered = |r: &FResult<(i32, Vec<u8>)>| !matches!(r, Err(FuseError::Io(_)));
    let get = c.ioctl(node, fh, 0, FS_IOC_GETFLAGS, &[], 4);
    assert!(answered(&get), "{get:?}");
    if let Ok((0, flags)) = get {
        let set = c.ioctl(node, fh, 0, FS_IOC_SETFLAGS, &flags, 0);
        assert!(matches!(set, Ok((0, _))), "{set:?}");
    }
    let x = c.ioctl(node, fh, 0, FS_IOC_FSGETXATTR, &[], 28);
    assert!(answered(&x), "{x:?}");
}

fn serves_everything_under_seccomp_kill(sandbox: &str, handles: &str) {
    let what = format!("--sandbox {sandbox} --inode-file-handles {handles}");
    let mut d = Daemon::start(&[
        "--seccomp",
        "kill",
        "--sandbox",
        sandbox,
        "--inode-file-handles",
        handles,
        "--xattr",
        "--request-queues",
        "4",
    ]);
    // The other user makes its own directory in the share.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The queue threads start once the frontend is there, i.e. under the filter.
    let c = d.client();
    let pid = common::serving_pid(d.pid());
    assert_eq!(seccomp_status(pid), (2, 2), "{what}: the serving process");
    workload(&c, "as-root");
    c.as_caller(USER, |c| workload(c, "as-user"));
    // A statistics dump from the signal thread, under the filter too.
    unsafe { libc::kill(d.pid(), libc::SIGUSR1) };
    assert!(d.stats()["opcodes"]["MKNOD"]["count"].as_u64().unwrap() >= 2);
    assert!(d.stats()["opcodes"]["IOCTL"]["count"].as_u64().unwrap() >= 6);
    drop(c);
    let st = d
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: no exit"));
    // Killed by the filter, the sandboxed child would show as 128 + SIGSYS.
    assert!(st.success(), "{what}: {st:?}");
}

#[test]
fn every_opcode_is_served_under_seccomp_kill_in_each_sandbox() {
    let sandboxes: &[&str] = if is_root() {
        &["namespace", "chroot", "none"]
    } else {
        &["namespace", "none"]
    };
    for sandbox in sandboxes {
        serves_everything_under_seccomp_kill(sandbox, "never");
    }
}

#[test]
#[ignore = "needs root"]
fn every_opcode_is_served_under_seccomp_kill_with_file_handles() {
    require_root("open_by_handle_at needs CAP_DAC_READ_SEARCH");
    for handles in ["prefer", "mandatory"] {
        serves_everything_under_seccomp_kill("namespace", handles);
    }
}

#[test]
fn seccomp_none_installs_no_filter() {
    let d = Daemon::start(&["--seccomp", "none"]);
    let _c = d.client();
    assert_eq!(seccomp_status(common::serving_pid(d.pid())), (0, 0));
}
