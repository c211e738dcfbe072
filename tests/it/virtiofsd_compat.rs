//! The virtiofsd options that management tools pass, beyond the core ones in opcodes.rs:
//! libvirt's command lines (`--syslog`, `-o cache=none,...`), `--socket-group`,
//! `--no-readdirplus`, O_NOATIME handling, and a clear error for what vfsd lacks.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use crate::common::{
    self, dir_names, require_root, run_vfsd, serving_pid, wait_for_socket, Daemon, Tmpfs, ROOT,
};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

#[test]
fn syslog_gets_every_record_even_inside_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let log_sock = dir.path().join("log");
    let syslogd = UnixDatagram::bind(&log_sock).unwrap();
    syslogd
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // Read as the records come (a syslog daemon's queue is short; vfsd drops, never waits).
    let collector = std::thread::spawn(move || {
        let mut records = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = syslogd.recv(&mut buf) {
            let r = String::from_utf8_lossy(&buf[..n]).to_string();
            let last = r.contains("disconnect");
            records.push(r);
            if last {
                break;
            }
        }
        records
    });
    std::fs::create_dir(dir.path().join("share")).unwrap();
    let sock = dir.path().join("s");
    // libvirt's older command line, with the default sandbox and seccomp.
    let mut child = std::process::Command::new(common::vfsd_bin())
        .env("VFSD_SYSLOG_SOCKET", &log_sock)
        .arg("--syslog")
        .arg("--socket-path")
        .arg(&sock)
        .arg("-o")
        .arg(format!(
            "source={},cache=none,xattr,no_flock,no_posix_lock",
            dir.path().join("share").display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_socket(&sock);
    let c = FuseClient::new(
        vfsd::frontend::Frontend::connect(&sock, FrontendConfig::default()).unwrap(),
    );
    let init = c.init().unwrap();
    // vfsd's processes: the supervisor and those it started to serve.
    let mut pids = vec![child.id() as i32];
    while let Some(next) = std::fs::read_to_string(format!(
        "/proc/{p}/task/{p}/children",
        p = pids[pids.len() - 1]
    ))
    .ok()
    .and_then(|c| c.split_whitespace().next()?.parse().ok())
    {
        pids.push(next);
    }
    // cache=none is the C virtiofsd's name for never: opens are direct I/O.
    let (_, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    assert_ne!(
        o.open_flags & FOPEN_DIRECT_IO,
        0,
        "cache=none was not 'never'"
    );
    // Nor READDIRPLUS under it, as virtiofsd.
    assert_eq!(init.flags & INIT_DO_READDIRPLUS, 0);
    drop(c); // the daemon logs the disconnect (after sandbox and seccomp) and exits
    assert!(child.wait().unwrap().success());

    let records = collector.join().unwrap();
    let tags: Vec<String> = pids.iter().map(|p| format!("vfsd[{p}]: ")).collect();
    assert!(!records.is_empty(), "nothing reached syslog");
    for r in &records {
        // <30> = facility daemon (3) * 8 + info (6); warnings would be <28>.
        assert!(
            (r.starts_with("<30>") || r.starts_with("<28>")) && tags.iter().any(|t| r.contains(t)),
            "not a syslog record: {r:?}"
        );
        assert!(!r.ends_with('\n'), "{r:?}");
    }
    assert!(
        records.iter().any(|r| r.contains("disconnect")),
        "the exit record is missing: {records:?}"
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.is_empty(), "with --syslog, stderr got: {stderr}");
}

#[test]
fn syslog_without_a_syslog_daemon_falls_back_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("share")).unwrap();
    let sock = dir.path().join("s");
    let mut child = std::process::Command::new(common::vfsd_bin())
        .env("VFSD_SYSLOG_SOCKET", dir.path().join("nobody-listens"))
        .arg("--syslog")
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(dir.path().join("share"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_socket(&sock);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("--syslog") && stderr.contains("logging to stderr instead"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs root"]
fn socket_group_owns_the_socket() {
    require_root("changing a file's group to another one needs root");
    // A group that exists everywhere (its number differs between distributions), by name
    // and by number.
    let gid = vfsd::sys::group_id("daemon")
        .unwrap()
        .expect("group 'daemon'");
    for group in ["daemon".to_string(), gid.to_string()] {
        let d = Daemon::start(&["--socket-group", &group]);
        // The group changes just after bind (the socket exists a moment before); the socket
        // is removed once a frontend connects, so look before connecting.
        let t = Instant::now();
        let m = loop {
            let m = std::fs::metadata(&d.sock).unwrap();
            if m.gid() == gid || t.elapsed() > Duration::from_secs(5) {
                break m;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(m.gid(), gid, "--socket-group {group}");
        assert_eq!(m.mode() & 0o060, 0o060, "the group can't connect");
        d.client().getattr(ROOT).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let (code, err) = run_vfsd(&[
        "--socket-path",
        sock.to_str().unwrap(),
        "--shared-dir",
        "/",
        "--socket-group",
        "no-such-group-here",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-group-here"), "{err}");
}

/// READDIRPLUS is offered as virtiofsd 1.14 offers it: not with `--no-readdirplus`, nor
/// under `--cache never`, where each entry's lookup would be made for a guest that caches
/// none of them (its timeouts are 0).
#[test]
fn no_readdirplus_is_not_offered() {
    for (args, offered) in [
        (&["--no-readdirplus"][..], false),
        (&["--cache", "never"][..], false),
        (&["--cache", "never", "-o", "readdirplus"][..], false),
        (&["--cache", "auto"][..], true),
        (&["--cache", "metadata"][..], true),
        (&["--cache", "always"][..], true),
    ] {
        let d = Daemon::start(args);
        let c = FuseClient::new(d.frontend(FrontendConfig::default()));
        let init = c.init().unwrap();
        assert_eq!(init.flags & INIT_DO_READDIRPLUS != 0, offered, "{args:?}");
        // Plain READDIR still lists the directory.
        std::fs::write(d.path("x"), b"").unwrap();
        let names: Vec<_> = dir_names(&c, ROOT);
        assert!(names.iter().any(|n| n == b"x"));
    }
}

/// The open flags of the daemon's fd for `file`, from /proc/PID/fdinfo.
fn host_open_flags(pid: i32, file: &std::path::Path) -> i32 {
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let e = e.unwrap();
        if std::fs::read_link(e.path()).ok().as_deref() == Some(file) {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap();
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).unwrap();
            let f = i32::from_str_radix(flags.trim(), 8).unwrap();
            // O_PATH fds name the file too; the handle is the one opened for I/O.
            if f & libc::O_PATH == 0 {
                return f;
            }
        }
    }
    panic!("the daemon holds no I/O fd for {}", file.display());
}

#[test]
fn o_noatime_is_dropped_unless_preserved() {
    for (extra, kept) in [(&[][..], false), (&["--preserve-noatime"][..], true)] {
        let mut args = vec!["--sandbox", "none"];
        args.extend_from_slice(extra);
        let d = Daemon::start(&args);
        std::fs::write(d.path("f"), b"x").unwrap();
        let c = d.client();
        let e = c.lookup(ROOT, "f").unwrap();
        let _o = c
            .open(e.nodeid, (libc::O_RDONLY | libc::O_NOATIME) as u32)
            .unwrap();
        let f = host_open_flags(
            common::serving_pid(d.pid()),
            &std::fs::canonicalize(d.path("f")).unwrap(),
        );
        assert_eq!(f & libc::O_NOATIME != 0, kept, "{extra:?}: flags {f:o}");
    }
}

#[test]
fn migration_options_take_virtiofsds_values_and_refuse_others_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let sock = sock.to_str().unwrap();
    let share = dir.path().to_str().unwrap();
    // Accepted (docs/migration.md): the daemon starts and waits for its VMM.
    for opt in [
        &["--migration-mode=find-paths"][..],
        &["--migration-mode", "file-handles"],
        &["--migration-on-error=abort"],
        &["--migration-on-error", "guest-error"],
        &["--migration-verify-handles", "--migration-confirm-paths"],
    ] {
        let mut cmd = std::process::Command::new(common::vfsd_bin());
        cmd.args(["--socket-path", sock, "--shared-dir", share])
            .args(opt);
        let mut child = cmd.stderr(std::process::Stdio::null()).spawn().unwrap();
        common::wait_for_socket(std::path::Path::new(sock));
        assert!(child.try_wait().unwrap().is_none(), "{opt:?} refused");
        // SIGTERM: the supervisor takes its sandboxed daemon down with it.
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap();
        let _ = std::fs::remove_file(sock);
    }
    for (opt, says) in [
        (&["--migration-mode=by-magic"][..], "by-magic"),
        (&["--migration-on-error=retry"], "retry"),
        (
            &[
                "--migration-mode=file-handles",
                "--migration-verify-handles",
            ],
            "find-paths",
        ),
    ] {
        let args = [&["--socket-path", sock, "--shared-dir", share][..], opt].concat();
        let (code, err) = run_vfsd(&args);
        assert_ne!(code, Some(0), "{opt:?}");
        assert!(err.contains(says), "{opt:?}: {err}");
    }
}

/// INIT flag SUBMOUNTS (bit 27) and entry attr flag FUSE_ATTR_SUBMOUNT.
const INIT_SUBMOUNTS: u32 = 1 << 27;
const FUSE_ATTR_SUBMOUNT: u32 = 1;

#[test]
#[ignore = "needs root"]
fn announce_submounts_marks_directories_on_other_mounts() {
    require_root("mounting a tmpfs inside the share needs root");
    let host = tempfile::tempdir().unwrap();
    let share = host.path().join("share");
    std::fs::create_dir_all(share.join("mnt")).unwrap();
    std::fs::create_dir_all(share.join("plain")).unwrap();
    let _tmpfs = Tmpfs::mount(&share.join("mnt"), None);
    std::fs::create_dir(share.join("mnt/inner")).unwrap();

    for (extra, guest_flags, flagged) in [
        (&["--announce-submounts"][..], INIT_SUBMOUNTS, true),
        // The guest did not ask for submounts: nothing is flagged.
        (&["--announce-submounts"][..], 0, false),
        (&[][..], INIT_SUBMOUNTS, false),
    ] {
        let d = Daemon::start_on(&share, extra);
        let c = FuseClient::new(d.frontend(FrontendConfig::default()));
        let init = c.init_with(INIT_BIG_WRITES | guest_flags).unwrap();
        assert_eq!(init.flags & INIT_SUBMOUNTS != 0, flagged, "{extra:?}");
        let m = c.lookup(ROOT, "mnt").unwrap();
        assert_eq!(m.attr.flags & FUSE_ATTR_SUBMOUNT != 0, flagged, "{extra:?}");
        // Only the mount's root is a submount, not what is inside it or beside it.
        let inner = c.lookup(m.nodeid, "inner").unwrap();
        assert_eq!(inner.attr.flags & FUSE_ATTR_SUBMOUNT, 0);
        assert_eq!(
            c.lookup(ROOT, "plain").unwrap().attr.flags & FUSE_ATTR_SUBMOUNT,
            0
        );
        assert_eq!(
            c.lookup(m.nodeid, "..").unwrap().attr.flags & FUSE_ATTR_SUBMOUNT,
            0
        );
        // READDIRPLUS gives the same entry.
        let ents = c.readdir_all(ROOT, true).unwrap();
        let e = ents.iter().find(|e| e.name == b"mnt").unwrap();
        let attr_flags = e.entry.as_ref().unwrap().attr.flags;
        assert_eq!(
            attr_flags & FUSE_ATTR_SUBMOUNT != 0,
            flagged,
            "readdirplus {extra:?}"
        );
    }
}

/// Without FUSE_POSIX_ACL the guest has no ACL semantics, so ACL xattrs are refused with
/// EOPNOTSUPP as virtiofsd does (storing them made fstests' generic/099 believe ACLs work
/// and fail; found by xfstests).
#[test]
fn posix_acl_names_are_refused_without_acl_support() {
    let d = Daemon::start(&["--xattr"]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap();
    // A minimal valid access ACL: user::rw-, group::r--, other::r--.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [(1u16, 6u16), (4, 4), (0x20, 4)] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    for name in ["system.posix_acl_access", "system.posix_acl_default"] {
        assert_eq!(
            common::errno(c.setxattr(f.nodeid, name, &acl, 0)),
            libc::EOPNOTSUPP,
            "{name}"
        );
        assert_eq!(
            common::errno(c.getxattr(f.nodeid, name, 1024)),
            libc::EOPNOTSUPP
        );
        assert_eq!(
            common::errno(c.removexattr(f.nodeid, name)),
            libc::EOPNOTSUPP
        );
    }
    // Ordinary names still work.
    c.setxattr(f.nodeid, "user.k", b"v", 0).unwrap();
    assert_eq!(c.getxattr(f.nodeid, "user.k", 16).unwrap(), b"v");
}

/// Soft and hard RLIMIT_NOFILE of a process, from /proc.
fn nofile_limits(pid: i32) -> (u64, u64) {
    let l = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = l.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].parse().unwrap(), f[4].parse().unwrap())
}

#[test]
fn rlimit_nofile_means_what_virtiofsd_means() {
    let ours = nofile_limits(std::process::id() as i32);
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The default: 1,000,000 (or fs.nr_open if lower), the hard limit raised too; where
    // that is not allowed (no CAP_SYS_RESOURCE), the hard limit; left alone if the soft
    // limit is already higher.
    let target = nr_open.min(1_000_000);
    let raise = format!("ulimit -Hn {target}");
    let default = if ours.0 >= 1_000_000 {
        ours
    } else if std::process::Command::new("sh")
        .args(["-c", &raise])
        .status()
        .unwrap()
        .success()
    {
        (target, target)
    } else {
        (ours.1, ours.1)
    };
    // The limit is set before the socket exists, so reading it once the socket is
    // there (Daemon::start) is no race.
    let d = Daemon::start(&[]);
    assert_eq!(nofile_limits(d.pid()), default, "default");
    assert_eq!(
        nofile_limits(serving_pid(d.pid())),
        default,
        "default, sandbox"
    );
    drop(d);
    // 0 leaves the limit as it was.
    let d = Daemon::start(&["--rlimit-nofile=0"]);
    assert_eq!(nofile_limits(d.pid()), ours, "--rlimit-nofile=0");
    // The daemon still works: an fd per inode fits.
    std::fs::write(d.path("f"), b"x").unwrap();
    let c = d.client();
    let e = c.lookup(ROOT, "f").unwrap();
    assert_eq!(
        c.read(e.nodeid, c.open(e.nodeid, 0).unwrap().fh, 0, 1)
            .unwrap(),
        b"x"
    );
    drop(d);
    // An explicit value sets both.
    let d = Daemon::start(&["--rlimit-nofile", "4096"]);
    assert_eq!(nofile_limits(d.pid()), (4096, 4096), "4096");
    drop(d);
    // Above fs.nr_open: one line and a non-zero exit.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let too_many = (nr_open + 1).to_string();
    let (code, err) = run_vfsd(&[
        "--socket-path",
        sock.to_str().unwrap(),
        "--shared-dir",
        dir.path().to_str().unwrap(),
        "--rlimit-nofile",
        &too_many,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rlimit-nofile") && err.contains(&nr_open.to_string()),
        "{err}"
    );
}
