//! Requests from a non-root guest user (and the frontend's credentials).
//!
//! Creates run with the caller's fsuid/fsgid, so the new file belongs to the caller and the
//! host's permission checks apply. With `--inode-file-handles`, a parent directory is
//! reopened from its handle, which needs CAP_DAC_READ_SEARCH: it must happen before the
//! credentials are switched, or every create by a non-root user fails with EPERM.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::common::{errno, Daemon, ROOT, USER};

fn creates_in_a_subdirectory(mode: &str) {
    let d = Daemon::start(&["--inode-file-handles", mode]);
    let c = d.client();
    let sub = c.mkdir(ROOT, "sub", 0o777).unwrap();
    std::fs::set_permissions(d.path("sub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A directory only root may write to: the host must refuse the user there.
    let closed = c.mkdir(ROOT, "closed", 0o755).unwrap();
    c.set_caller(USER);
    let owner = |rel: &str| {
        let m = std::fs::symlink_metadata(d.path(rel)).unwrap();
        (m.uid(), m.gid())
    };
    let ids = (USER.uid, USER.gid);

    let dir = c.mkdir(sub.nodeid, "dir", 0o755).unwrap();
    assert_eq!(owner("sub/dir"), ids, "{mode}: mkdir");
    let (f, o) = c
        .create(sub.nodeid, "file", libc::O_RDWR as u32, 0o644)
        .unwrap();
    assert_eq!(owner("sub/file"), ids, "{mode}: create");
    assert_eq!(c.write(f.nodeid, o.fh, 0, b"data").unwrap(), 4);
    c.mknod(dir.nodeid, "fifo", libc::S_IFIFO | 0o644, 0)
        .unwrap();
    assert_eq!(owner("sub/dir/fifo"), ids, "{mode}: mknod");
    c.symlink(dir.nodeid, "link", "../file").unwrap();
    assert_eq!(owner("sub/dir/link"), ids, "{mode}: symlink");
    c.link(f.nodeid, dir.nodeid, "hard").unwrap();
    assert_eq!(std::fs::metadata(d.path("sub/file")).unwrap().nlink(), 2);
    c.rename(dir.nodeid, "hard", sub.nodeid, "moved").unwrap();
    assert!(d.path("sub/moved").exists(), "{mode}: rename");
    // The host's own permission check still applies to the user.
    assert_eq!(
        errno(c.mkdir(closed.nodeid, "no", 0o755)),
        libc::EACCES,
        "{mode}"
    );
    assert_eq!(
        errno(c.create(closed.nodeid, "no", libc::O_RDWR as u32, 0o644)),
        libc::EACCES,
        "{mode}"
    );
}

#[test]
fn non_root_creates_work_without_file_handles() {
    creates_in_a_subdirectory("never");
}

#[test]
fn non_root_creates_work_with_file_handles_preferred() {
    creates_in_a_subdirectory("prefer");
}

#[test]
fn non_root_creates_work_with_file_handles_mandatory() {
    creates_in_a_subdirectory("mandatory");
}
