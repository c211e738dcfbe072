//! guest-tests/idmap.sh: idmapped bind mounts of the share in the guest (FUSE_ALLOW_IDMAP):
//! a user of the mapped range creates, appends, reads, chowns and chmods there, and every
//! result matches the same steps on an idmapped mount of the guest's tmpfs. One boot, a
//! share per cache mode; the last also with `--posix-acl` and a uid and gid translation,
//! whose host ids the host checks.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::fixture::{DaemonKind, Guest, Share, TestDir};
use crate::record;

#[test]
#[ignore = "needs QEMU and root"]
fn an_idmapped_mount_of_the_share_behaves_as_one_of_the_guests_tmpfs_in_each_cache_mode() {
    let name = "an_idmapped_mount_of_the_share_behaves_as_one_of_the_guests_tmpfs";
    let dir = TestDir::new(name);
    let shares = [
        vec!["--cache=never", "--allow-idmap"],
        vec!["--cache=auto", "--allow-idmap", "--killpriv-v2"],
        vec![
            "--cache=always",
            "--allow-idmap",
            "--posix-acl",
            "--translate-uid=map:1000:5000:1",
            "--translate-gid=map:1000:5000:1",
        ],
    ];
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(300));
    let mut dirs = Vec::new();
    for (i, args) in shares.iter().enumerate() {
        let d = dir.dir(&format!("share{i}"));
        guest = guest.share(Share::new(&d, &format!("share{i}"), DaemonKind::Vfsd, args));
        dirs.push(d);
    }
    let run = guest.run("/guest-tests/idmap.sh /mnt/share0 /mnt/share1 /mnt/share2");
    run.assert_success();
    record(name, &run, &["idmap: # of"]);
    // What the host holds: the mapped user's files as the share's uid 1000, and as 5000
    // through the translation.
    for (d, id) in [(&dirs[0], 1000), (&dirs[1], 1000), (&dirs[2], 5000)] {
        for f in ["user", "userdir", "root", "plain"] {
            let m = std::fs::symlink_metadata(d.join("t").join(f)).unwrap();
            assert_eq!((m.uid(), m.gid()), (id, id), "{}: {f}", d.display());
        }
        let m = std::fs::metadata(d.join("t/user")).unwrap();
        assert_eq!(
            m.mode() & 0o7777,
            0o755,
            "the owner's append left set-id bits"
        );
        assert!(!d.join("t/unmapped").exists());
    }
}

/// virtiofsd 1.14 offers FUSE_ALLOW_IDMAP too: the idmapped mount works, and the steps
/// that differ from tmpfs are recorded (a user's append keeps the set-id bits there).
#[test]
#[ignore = "needs QEMU and root"]
fn virtiofsd_serves_an_idmapped_mount_of_the_share_too() {
    let name = "virtiofsd_serves_an_idmapped_mount_of_the_share_too";
    let dir = TestDir::new(name);
    let share = dir.dir("share0");
    let run = Guest::new(&dir)
        .timeout(Duration::from_secs(300))
        .share(Share::new(
            &share,
            "share0",
            DaemonKind::Virtiofsd,
            &["--cache=never"],
        ))
        .run("/guest-tests/idmap.sh /mnt/share0");
    assert!(
        run.console.contains("idmap: /mnt/share0: user creates: 0"),
        "the idmapped mount did not work with virtiofsd\n{}",
        run.tail()
    );
    record(name, &run, &["idmap: # of", "idmap:   +", "idmap:   -"]);
}
