//! The guest tests over GlusterFS (`--features gluster-tests`): a replica-2 volume on
//! loopback with two independent FUSE client mounts, A and B, standing for two hosts
//! (`scripts/gluster.sh up`, which the tests run themselves; docs/distributed.md). Smoke,
//! setid, fio, pjdfstest (with GlusterFS's own failures listed as known) and fsx run on a
//! share under mount A; coherence per cache mode, parallel O_DIRECT writes and locks run
//! between two guests whose daemons serve mounts A and B.
//!
//! `cargo test --release --features gluster-tests --test guest -- --include-ignored gluster::`

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::fixture::{daemon_under_test, Run};
use crate::record;
use crate::two_mounts::{bring_up, VolumeDir};

/// Client mounts A and B of the volume, brought up once per run.
fn mounts() -> &'static (PathBuf, PathBuf) {
    static M: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    M.get_or_init(|| bring_up("gluster.sh", "GLUSTER_A", "GLUSTER_B"))
}

fn run_on_mount_a(name: &str, args: &[&str], timeout_secs: u64, cmd: &str) -> (VolumeDir, Run) {
    crate::two_mounts::run_on_mount_a(mounts(), name, args, timeout_secs, cmd)
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_smoke_on_mount_a_and_the_host_sees_the_data() {
    let name = "gluster_smoke_on_mount_a_and_the_host_sees_the_data";
    let (vol, run) = run_on_mount_a(name, &[], 600, "/guest-tests/smoke.sh");
    run.assert_success();
    record(name, &run, &["smoke: #", "smoke: SKIP"]);
    crate::smoke::host_sees_what_the_guest_wrote(&vol.a);
}

/// vfsd refuses mandatory file handles on a FUSE mount, so `never` goes without them.
fn setid(name: &str, cache: &str, handles: &str) {
    let args = [
        format!("--cache={cache}"),
        format!("--inode-file-handles={handles}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cmd = format!("/guest-tests/setid.sh cache={cache},handles={handles}");
    let (_vol, run) = run_on_mount_a(name, &args, 300, &cmd);
    run.assert_success();
    record(name, &run, &["setid: #"]);
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_setid_under_cache_never() {
    setid("gluster_setid_under_cache_never", "never", "never");
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_setid_under_cache_auto() {
    setid("gluster_setid_under_cache_auto", "auto", "prefer");
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_setid_under_cache_always() {
    setid("gluster_setid_under_cache_always", "always", "prefer");
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_fio_jobs_read_back_what_they_wrote() {
    crate::two_mounts::fio_on_mount_a(mounts(), "gluster_fio_jobs_read_back_what_they_wrote");
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_pjdfstest_fails_only_where_glusterfs_itself_does() {
    // GlusterFS's own departures from ext4 (docs/distributed.md, "Quirks").
    crate::two_mounts::pjdfstest_on_mount_a(
        mounts(),
        "gluster_pjdfstest_fails_only_where_glusterfs_itself_does",
        "pjdfstest-glusterfs.known",
    );
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_fsx_buffered_and_direct_operations_match_its_model() {
    crate::two_mounts::fsx_on_mount_a(
        mounts(),
        "gluster_fsx_buffered_and_direct_operations_match_its_model",
    );
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_changes_through_mount_a_show_through_mount_b_per_cache_mode() {
    crate::two_mounts::coherence_per_cache_mode(
        mounts(),
        "gluster_changes_through_mount_a_show_through_mount_b_per_cache_mode",
    );
}

#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_flock_and_fcntl_locks_exclude_between_guests_on_mounts_a_and_b() {
    // `cross`: flock conflicts and wake-up, fcntl byte ranges and the counters under
    // flock and under fcntl. Its other steps hold flock and a POSIX lock on one file in
    // one process, which GlusterFS's client refuses (docs/distributed.md, "Locks").
    crate::two_mounts::locks_between_guests_on_mounts_a_and_b(
        mounts(),
        "gluster_flock_and_fcntl_locks_exclude_between_guests_on_mounts_a_and_b",
        "cross",
    );
}

/// xfstests with TEST_DEV and SCRATCH_DEV under mount A (the guest's root and the
/// results stay local): `VFSD_XFSTESTS_LIST` names the list as for
/// `xfstests::any_xfstests_list_named_in_the_environment`, else the CI list; a test may be
/// "not run", none may fail.
#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_xfstests_list_on_mount_a() {
    crate::two_mounts::xfstests_list_on_mount_a(mounts(), "gluster_xfstests_list_on_mount_a");
}

/// Live migration from a daemon on mount A to one on mount B, two hosts' views of one
/// directory: the guest's open file and locks (and, with vfsd, a lock wait) carried
/// across, host processes on both mounts refused the guest's locks throughout.
#[test]
#[ignore = "needs QEMU, root and GlusterFS"]
fn gluster_live_migration_from_mount_a_to_mount_b_keeps_files_and_locks() {
    let name = "gluster_live_migration_from_mount_a_to_mount_b_keeps_files_and_locks";
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
