//! guest-tests/idmap.sh: idmapped bind mounts of the share in the guest (FUSE_ALLOW_IDMAP):
//! a user of the mapped range creates, appends, reads, chowns and chmods there, and every
//! result matches the same steps on an idmapped mount of the guest's tmpfs. One boot, a
//! share per cache mode; the last also with `--posix-acl` and a uid and gid translation,
//! whose host ids the host checks.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::fixture::{DaemonKind, Guest, Share, TestDir};
use crate::record;

/// A fourth share, served by virtiofsd 1.14 (which offers FUSE_ALLOW_IDMAP too), runs the
/// same steps for comparison: its idmapped mount works, and the steps that differ from
/// tmpfs are recorded (a user's append keeps the set-id bits there).
#[test]
#[ignore = "needs QEMU and root"]
fn an_idmapped_mount_of_the_share_behaves_as_one_of_the_guests_tmpfs_in_each_cache_mode_and_virtiofsd_serves_one_too(
) {
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
    let theirs = dir.dir("share3");
    guest = guest.share(Share::new(
        &theirs,
        "share3",
        DaemonKind::Virtiofsd,
        &["--cache=never"],
    ));
    // vfsd's shares decide the status; virtiofsd's run is for comparison.
    let run = guest.run(
        "/guest-tests/idmap.sh /mnt/share0 /mnt/share1 /mnt/share2; rc=$?; \
         echo 'idmap: virtiofsd:'; /guest-tests/idmap.sh /mnt/share3; exit $rc",
    );
    run.assert_success();
    record(
        name,
        &run,
        &[
            "idmap: # of",
            "idmap: virtiofsd:",
            "idmap:   +",
            "idmap:   -",
        ],
    );
    assert!(
        run.console.contains("idmap: 3 of 3 shares as on tmpfs"),
        "vfsd's shares' summary\n{}",
        run.tail()
    );
    assert!(
        run.console.contains("idmap: /mnt/share3: user creates: 0"),
        "the idmapped mount did not work with virtiofsd\n{}",
        run.tail()
    );
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
