//! The guest tests over CephFS (`--features ceph-tests`): a one-node Ceph cluster with
//! two ceph-fuse client mounts, A on the host and B in a network namespace of its own,
//! standing for two hosts (`scripts/ceph.sh up`, which the tests run themselves;
//! docs/distributed.md, "CephFS"). Smoke, fio, pjdfstest (CephFS's own failures listed
//! as known), fsx, the locks tests and the CI xfstests list run on a share under mount
//! A; coherence per cache mode, parallel O_DIRECT writes, locks and live migration run
//! between daemons serving mounts A and B.
//!
//! `cargo test --release --features ceph-tests --test guest -- --include-ignored ceph::`

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::fixture::daemon_under_test;
use crate::record;
use crate::two_mounts::{bring_up, run_on_mount_a, VolumeDir};

/// Client mounts A and B, brought up once per run (`scripts/ceph.sh up` is idempotent
/// and fails with a line saying what is wrong).
fn mounts() -> &'static (PathBuf, PathBuf) {
    static M: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    M.get_or_init(|| bring_up("ceph.sh", "CEPH_A", "CEPH_B"))
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_smoke_on_mount_a_and_both_hosts_see_the_data() {
    let name = "ceph_smoke_on_mount_a_and_both_hosts_see_the_data";
    // CephFS counts st_blocks from the size (a 5 GiB file with 2 MiB written reports
    // 5 GiB of blocks on the host too): smoke checks the guest sees that figure.
    let (vol, run) = run_on_mount_a(
        mounts(),
        name,
        &[],
        600,
        "SMOKE_BLOCKS=size /guest-tests/smoke.sh",
    );
    run.assert_success();
    record(name, &run, &["smoke: #", "smoke: SKIP"]);
    crate::smoke::host_sees_what_the_guest_wrote(&vol.a);
    // Client B has its own cache and session: it must read the same bytes.
    crate::smoke::host_sees_what_the_guest_wrote(&vol.b);
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_fio_jobs_read_back_what_they_wrote() {
    crate::two_mounts::fio_on_mount_a(mounts(), "ceph_fio_jobs_read_back_what_they_wrote");
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_pjdfstest_fails_only_where_cephfs_itself_does() {
    // CephFS's own departures from ext4 (guest-tests/pjdfstest-cephfs.known).
    crate::two_mounts::pjdfstest_on_mount_a(
        mounts(),
        "ceph_pjdfstest_fails_only_where_cephfs_itself_does",
        "pjdfstest-cephfs.known",
    );
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_fsx_buffered_and_direct_operations_match_its_model() {
    crate::two_mounts::fsx_on_mount_a(
        mounts(),
        "ceph_fsx_buffered_and_direct_operations_match_its_model",
    );
}

/// Two guests and a host process on one share under mount A: ceph-fuse keeps flock
/// and POSIX locks apart (unlike GlusterFS's client), so the full script runs: the
/// counters reach 2N, and a killed guest's locks go to the other guest.
#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_locks_between_two_guests_and_the_host_on_mount_a() {
    let name = "ceph_locks_between_two_guests_and_the_host_on_mount_a";
    let vol = VolumeDir::new(mounts(), name);
    crate::locks::two_guests_and_the_host(name, "never", "full", Some(&vol.a));
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_xfstests_list_on_mount_a() {
    crate::two_mounts::xfstests_list_on_mount_a(mounts(), "ceph_xfstests_list_on_mount_a");
}

#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_changes_through_mount_a_show_through_mount_b_per_cache_mode() {
    crate::two_mounts::coherence_per_cache_mode(
        mounts(),
        "ceph_changes_through_mount_a_show_through_mount_b_per_cache_mode",
    );
}

/// flock conflicts and wake-up, fcntl byte ranges and the counters under flock and
/// fcntl, between a guest on mount A and one on mount B: ceph-fuse hands both kinds to
/// the MDS, which arbitrates between the two clients.
#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_flock_and_fcntl_locks_exclude_between_guests_on_mounts_a_and_b() {
    crate::two_mounts::locks_between_guests_on_mounts_a_and_b(
        mounts(),
        "ceph_flock_and_fcntl_locks_exclude_between_guests_on_mounts_a_and_b",
        "cross",
    );
}

/// Live migration from a daemon on mount A to one on mount B: the guest's open file and
/// locks (and, with vfsd, a lock wait) carried across, host processes on both mounts
/// refused the guest's locks throughout.
#[test]
#[ignore = "needs QEMU, root and Ceph"]
fn ceph_live_migration_from_mount_a_to_mount_b_keeps_files_and_locks() {
    let name = "ceph_live_migration_from_mount_a_to_mount_b_keeps_files_and_locks";
    let vol = VolumeDir::new(mounts(), name);
    crate::migration::migrate_between_two_views(
        name,
        &vol.a,
        &vol.b,
        crate::migration::Plan {
            // virtiofsd keeps a guest's locks in the guest: no host lock to wait for.
            waiter: daemon_under_test().is_vfsd(),
            probes: true,
            ..Default::default()
        },
    );
}
