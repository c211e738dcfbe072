//! guest-tests/fdwalk.sh: a host-made tree of 6,000 files (60 directories of 100, as a
//! user's data is) walked, read and stat'ed, and 60 files created, with the daemon at
//! `--rlimit-nofile=1024` while the default cache mode keeps every inode the guest has
//! seen referenced: nothing may fail with EMFILE. In each file-handle mode, and rootless
//! (vfsd as an unprivileged user with `--uid-map`, as libvirt runs it for a session VM,
//! which can't reopen file handles and finds files by name).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::fixture::{daemon_under_test, DaemonKind, Guest, Share, TestDir};
use crate::record;

fn make_tree(share: &Path) {
    let t = share.join("fdwalk-tree");
    for d in 0..60 {
        let sub = t.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(sub.join(format!("f{f}")), format!("{d}/{f}\n")).unwrap();
        }
    }
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o777)).unwrap();
}

/// The shares' daemons and labels: a daemon in each file-handle mode, and a rootless one
/// (vfsd only: virtiofsd has no `--uid-map` of this form).
fn shares() -> Vec<(DaemonKind, Option<&'static str>, String)> {
    let mut out: Vec<_> = ["never", "prefer", "mandatory"]
        .map(|h| (daemon_under_test(), Some(h), format!("handles={h}")))
        .into_iter()
        .collect();
    if daemon_under_test().is_vfsd() {
        let rootless = DaemonKind::Rootless { uid: 65534 };
        out.push((rootless, None, "rootless".to_string()));
    } else {
        eprintln!("rootless: vfsd only (virtiofsd has no --uid-map of this form)");
    }
    out
}

/// One boot, a share per daemon of `shares()`, each with its own host-made tree, walked
/// one after the other.
#[test]
#[ignore = "needs QEMU and root"]
fn a_6000_file_tree_at_1024_fds_in_each_file_handle_mode_and_served_rootless() {
    let name = "a_6000_file_tree_at_1024_fds";
    let dir = TestDir::new(name);
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(900));
    let mut cmd = String::from("rc=0");
    let shares = shares();
    for (i, (daemon, handles, _)) in shares.iter().enumerate() {
        let d = dir.dir(&format!("share{i}"));
        make_tree(&d);
        let mut args = vec!["--rlimit-nofile=1024".to_string()];
        if let Some(h) = handles {
            args.push(format!("--inode-file-handles={h}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        guest = guest.share(Share::new(&d, &format!("share{i}"), daemon.clone(), &args));
    }
    for (i, (_, _, label)) in shares.iter().enumerate() {
        cmd.push_str(&format!(
            "; VFSD_SHARE=/mnt/share{i} /guest-tests/fdwalk.sh {label} || rc=1"
        ));
    }
    cmd.push_str("; exit $rc");
    let run = guest.run(&cmd);
    run.assert_success();
    record(name, &run, &["fdwalk: #"]);
    // Each share's walk printed its summary, with no failure.
    for (_, _, label) in &shares {
        let want = format!(" checks passed, 0 failed ({label})");
        assert!(
            run.lines("fdwalk: ").iter().any(|l| l.ends_with(&want)),
            "no fdwalk summary for {label}\n{}",
            run.tail()
        );
    }
}
