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

/// A CREATE of a name that exists on the host (the guest's negative entry was stale: a
/// host process or another guest made the file since) must not open that file: the guest
/// kernel counts the open as a create and checks no permission on it. vfsd answers ESTALE,
/// on which the guest looks the name up again and opens the file with its own checks: a
/// user gets no handle on root's 0600 file, and its O_TRUNC truncates nothing.
fn a_create_of_an_existing_name_opens_nothing(mode: &str) {
    let d = Daemon::start(&["--inode-file-handles", mode]);
    std::fs::set_permissions(d.share.as_path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let host_file = |name: &str, mode: u32| {
        std::fs::write(d.path(name), b"root's data").unwrap();
        std::fs::set_permissions(d.path(name), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    host_file("secret", 0o600);
    host_file("shared", 0o666);
    let c = d.client();
    c.set_caller(USER);
    let create = |name: &str, flags: i32| c.create(ROOT, name, flags as u32, 0o644);
    let trunc = libc::O_WRONLY | libc::O_TRUNC;
    for (name, flags) in [
        ("secret", trunc),
        ("secret", libc::O_RDONLY),
        ("shared", trunc),
    ] {
        assert_eq!(
            errno(create(name, flags)),
            libc::ESTALE,
            "{mode}: {name} {flags:#o}"
        );
        assert_eq!(
            std::fs::read(d.path(name)).unwrap(),
            b"root's data",
            "{mode}: {name}"
        );
    }
    // With O_EXCL the name is taken; a new name is created as before.
    assert_eq!(
        errno(create("shared", libc::O_RDWR | libc::O_EXCL)),
        libc::EEXIST
    );
    let (e, o) = create("new", trunc).unwrap();
    assert_eq!(c.write(e.nodeid, o.fh, 0, b"user's").unwrap(), 6);
    assert_eq!(std::fs::read(d.path("new")).unwrap(), b"user's");
}

#[test]
fn a_create_of_an_existing_name_opens_nothing_without_file_handles() {
    a_create_of_an_existing_name_opens_nothing("never");
}

#[test]
fn a_create_of_an_existing_name_opens_nothing_with_file_handles_preferred() {
    a_create_of_an_existing_name_opens_nothing("prefer");
}

#[test]
fn a_create_of_an_existing_name_opens_nothing_with_file_handles_mandatory() {
    a_create_of_an_existing_name_opens_nothing("mandatory");
}

/// A user's O_TRUNC open of a file it may write but does not own arrives, as from the
/// guest kernel, as SETATTR(size 0, mtime now) with no handle. Setting one time alone
/// needs ownership or CAP_FOWNER, which `--modcaps=-fowner` takes from vfsd; the
/// truncation sets mtime and ctime itself, so the open must succeed there too, not fail
/// with EPERM once the file is empty.
#[test]
fn a_users_o_trunc_of_a_file_it_may_write_succeeds_without_cap_fowner() {
    let d = Daemon::start(&["--modcaps=-fowner"]);
    let p = d.path("shared");
    std::fs::write(&p, b"someone's data").unwrap();
    std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let c = d.client();
    c.set_caller(USER);
    let n = c.lookup(ROOT, "shared").unwrap().nodeid;
    let s = fuse_backend_rs::abi::fuse_abi::SetattrIn {
        valid: vfsd::frontend::fuse::FATTR_SIZE
            | vfsd::frontend::fuse::FATTR_MTIME
            | vfsd::frontend::fuse::FATTR_MTIME_NOW,
        ..Default::default()
    };
    assert_eq!(c.setattr(n, &s).unwrap().attr.size, 0);
    let m = std::fs::metadata(&p).unwrap();
    assert_eq!(m.len(), 0);
    assert!(m.mtime() > 1_000_000, "mtime not set by the truncation");
}
