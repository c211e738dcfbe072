//! guest-tests/features.sh in one boot, with the options each section needs: shared mmap
//! under `--cache never`, POSIX ACLs, chattr, O_TMPFILE, statx's birth time, uid/gid
//! translation and xattr mapping; then the host's view: the translated owner and the
//! mapped xattr name.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::fixture::TestDir;
use crate::{record, run_on_share};

/// The value of xattr `name` of `path` (not following a symlink), if it has one.
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: both strings are NUL-terminated and the buffer's length is passed with it.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

#[test]
#[ignore = "needs QEMU and root"]
fn mmap_acls_chattr_tmpfile_statx_id_translation_and_xattr_mapping() {
    let name = "mmap_acls_chattr_tmpfile_statx_id_translation_and_xattr_mapping";
    let dir = TestDir::new(name);
    let (share, run) = run_on_share(
        &dir,
        &[
            "--cache=never",
            "--allow-mmap",
            "--posix-acl",
            "--translate-uid=map:65534:3000:1",
            "--translate-gid=map:65534:3000:1",
            "--xattrmap=:prefix:all:security.:user.virtiofs.::ok:all:::",
        ],
        600,
        |_| {},
        "/guest-tests/features.sh",
    );
    run.assert_success();
    record(name, &run, &["features: #"]);
    let keep = share.join("features-keep");
    let m = std::fs::metadata(keep.join("nobody-file")).expect("features-keep/nobody-file");
    assert_eq!(
        (m.uid(), m.gid()),
        (3000, 3000),
        "guest nobody's file on the host is not owned by the translated ids"
    );
    // A guest's label may carry the NUL the guest's tools put after it.
    let label = xattr(&keep.join("labelled"), "user.virtiofs.security.selinux").map(|mut v| {
        while v.last() == Some(&0) {
            v.pop();
        }
        v
    });
    assert_eq!(
        label.as_deref(),
        Some(&b"guest_label"[..]),
        "security.selinux is not kept under user.virtiofs.security.selinux on the host"
    );
}
