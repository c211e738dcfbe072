//! guest-tests/fdwalk.sh: a host-made tree of 6,000 files (60 directories of 100, as a
//! user's data is) walked, read and stat'ed, and 60 files created, with the daemon at
//! `--rlimit-nofile=1024` while the default cache mode keeps every inode the guest has
//! seen referenced: nothing may fail with EMFILE. In each file-handle mode, and rootless
//! (vfsd as an unprivileged user with `--uid-map`, as libvirt runs it for a session VM,
//! which can't reopen file handles and finds files by name).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::fixture::{daemon_under_test, DaemonKind, Guest, TestDir};
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

fn fdwalk(name: &str, daemon: DaemonKind, handles: Option<&str>, label: &str) {
    let dir = TestDir::new(name);
    let mut args = vec!["--rlimit-nofile=1024".to_string()];
    if let Some(h) = handles {
        args.push(format!("--inode-file-handles={h}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (guest, share) = Guest::new(&dir)
        .timeout(Duration::from_secs(600))
        .with_share(daemon, &args);
    make_tree(&share);
    let run = guest.run(&format!("/guest-tests/fdwalk.sh {label}"));
    run.assert_success();
    record(name, &run, &["fdwalk: #"]);
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_6000_file_tree_at_1024_fds_without_file_handles() {
    fdwalk(
        "a_6000_file_tree_at_1024_fds_without_file_handles",
        daemon_under_test(),
        Some("never"),
        "handles=never",
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_6000_file_tree_at_1024_fds_with_file_handles_preferred() {
    fdwalk(
        "a_6000_file_tree_at_1024_fds_with_file_handles_preferred",
        daemon_under_test(),
        Some("prefer"),
        "handles=prefer",
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_6000_file_tree_at_1024_fds_with_mandatory_file_handles() {
    fdwalk(
        "a_6000_file_tree_at_1024_fds_with_mandatory_file_handles",
        daemon_under_test(),
        Some("mandatory"),
        "handles=mandatory",
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_6000_file_tree_at_1024_fds_served_rootless() {
    if !daemon_under_test().is_vfsd() {
        eprintln!("rootless: vfsd only (virtiofsd has no --uid-map of this form)");
        return;
    }
    fdwalk(
        "a_6000_file_tree_at_1024_fds_served_rootless",
        DaemonKind::Rootless { uid: 65534 },
        None,
        "rootless",
    );
}
