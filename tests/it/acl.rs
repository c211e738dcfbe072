//! `--posix-acl` through the real socket: FUSE_POSIX_ACL, DONT_MASK and SETXATTR_EXT are
//! negotiated, ACLs reach the host, the umask is applied only where no default ACL is,
//! and FUSE_SETXATTR_ACL_KILL_SGID clears S_ISGID.

use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::common::{host_getxattr, require_root, Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::{CreateIn, EntryOut, MkdirIn};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;
use vm_memory::ByteValued;

const POSIX_ACL: u64 = 1 << 20;
const DONT_MASK: u64 = 1 << 6;
const SETXATTR_EXT: u64 = 1 << 29;
const KILL_SGID: u32 = 1;

/// An ACL in the kernel's xattr form: version 2, then (tag, perm, id) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_ne_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_ne_bytes());
        v.extend_from_slice(&perm.to_ne_bytes());
        v.extend_from_slice(&id.to_ne_bytes());
    }
    v
}
const USER_OBJ: u16 = 1;
const USER: u16 = 2;
const GROUP_OBJ: u16 = 4;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const NONE: u32 = u32::MAX;

/// A client that INITs as the 7.3 guest kernel does with ACLs offered.
fn acl_client(d: &Daemon) -> (FuseClient, u64) {
    let c = FuseClient::new(d.frontend(FrontendConfig::default()));
    let out = c
        .init_ext(
            44,
            POSIX_ACL | DONT_MASK | SETXATTR_EXT | INIT_BIG_WRITES as u64 | INIT_MAX_PAGES as u64,
        )
        .unwrap();
    (c, out.flags as u64 | (out.flags2 as u64) << 32)
}

/// SETXATTR in its extended form (fuse_setxattr_in with setxattr_flags).
fn setxattr_ext(c: &FuseClient, node: u64, name: &str, value: &[u8], sflags: u32) -> FResult<()> {
    let mut fixed = Vec::new();
    for w in [value.len() as u32, 0, sflags, 0] {
        fixed.extend_from_slice(&w.to_ne_bytes());
    }
    let name = CString::new(name).unwrap();
    c.call(
        FUSE_SETXATTR,
        node,
        &[&fixed, name.as_bytes_with_nul(), value],
        64,
    )
    .map(drop)
}

fn mkdir_umask(c: &FuseClient, parent: u64, name: &str, mode: u32, umask: u32) -> EntryOut {
    let m = MkdirIn { mode, umask };
    let n = CString::new(name).unwrap();
    decode(
        &c.call(
            FUSE_MKDIR,
            parent,
            &[m.as_slice(), n.as_bytes_with_nul()],
            4096,
        )
        .unwrap(),
    )
    .unwrap()
}

fn create_umask(c: &FuseClient, parent: u64, name: &str, mode: u32, umask: u32) -> EntryOut {
    let a = CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode,
        umask,
        fuse_flags: 0,
    };
    let n = CString::new(name).unwrap();
    let b = c
        .call(
            FUSE_CREATE,
            parent,
            &[a.as_slice(), n.as_bytes_with_nul()],
            4096,
        )
        .unwrap();
    decode(&b).unwrap()
}

#[test]
fn acl_flags_are_negotiated_only_with_posix_acl() {
    let d = Daemon::start(&["--posix-acl"]);
    let (_, f) = acl_client(&d);
    assert_eq!(
        f & (POSIX_ACL | DONT_MASK | SETXATTR_EXT),
        POSIX_ACL | DONT_MASK | SETXATTR_EXT
    );
    let d = Daemon::start(&["--xattr"]);
    let (_, f) = acl_client(&d);
    assert_eq!(f & (POSIX_ACL | DONT_MASK | SETXATTR_EXT), 0);
    let d = Daemon::start(&["-o", "posix_acl"]);
    let (_, f) = acl_client(&d);
    assert_ne!(f & POSIX_ACL, 0);
}

#[test]
fn an_acl_set_by_the_guest_is_the_hosts_acl() {
    let d = Daemon::start(&["--posix-acl"]);
    let (c, _) = acl_client(&d);
    let e = create_umask(&c, ROOT, "f", 0o640, 0o022);
    let value = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 1234),
        (GROUP_OBJ, 4, NONE),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    setxattr_ext(&c, e.nodeid, "system.posix_acl_access", &value, 0).unwrap();
    let host = host_getxattr(&d.share.join("f"), "system.posix_acl_access").expect("host ACL");
    assert_eq!(host, value);
    // Read back through the guest's GETXATTR.
    let b = c
        .getxattr(e.nodeid, "system.posix_acl_access", 4096)
        .unwrap();
    assert_eq!(b, value);
    // chmod on the host updates the mask, as the kernel does: visible to the guest.
    std::fs::set_permissions(d.share.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let b = c
        .getxattr(e.nodeid, "system.posix_acl_access", 4096)
        .unwrap();
    let mask = b[4..]
        .chunks(8)
        .find(|e| u16::from_ne_bytes([e[0], e[1]]) == MASK)
        .unwrap();
    assert_eq!(
        u16::from_ne_bytes([mask[2], mask[3]]),
        0,
        "mask follows group bits"
    );
    // Removing the ACL entry takes the named user's access away on the host too.
    c.removexattr(e.nodeid, "system.posix_acl_access").unwrap();
    assert!(host_getxattr(&d.share.join("f"), "system.posix_acl_access")
        .ok()
        .is_none());
}

#[test]
fn the_umask_applies_only_without_a_default_acl() {
    let d = Daemon::start(&["--posix-acl"]);
    let (c, _) = acl_client(&d);
    // No default ACL: the guest's umask is applied by vfsd.
    let plain = mkdir_umask(&c, ROOT, "plain", 0o777, 0o027);
    assert_eq!(plain.attr.mode & 0o7777, 0o750);
    let f = create_umask(&c, plain.nodeid, "f", 0o666, 0o027);
    assert_eq!(f.attr.mode & 0o7777, 0o640);
    // A default ACL on the parent: no umask; the host kernel applies the ACL.
    let dir = mkdir_umask(&c, ROOT, "inherit", 0o777, 0o022);
    let def = acl(&[
        (USER_OBJ, 7, NONE),
        (USER, 7, 1234),
        (GROUP_OBJ, 7, NONE),
        (MASK, 7, NONE),
        (OTHER, 5, NONE),
    ]);
    setxattr_ext(&c, dir.nodeid, "system.posix_acl_default", &def, 0).unwrap();
    let sub = mkdir_umask(&c, dir.nodeid, "sub", 0o777, 0o077);
    assert_eq!(
        sub.attr.mode & 0o7777,
        0o775,
        "umask 077 ignored under a default ACL"
    );
    let host = d.share.join("inherit/sub");
    assert_eq!(
        host_getxattr(&host, "system.posix_acl_default").ok(),
        Some(def.clone()),
        "inherited"
    );
    assert!(host_getxattr(&host, "system.posix_acl_access")
        .ok()
        .is_some());
    let g = create_umask(&c, dir.nodeid, "g", 0o666, 0o077);
    assert_eq!(g.attr.mode & 0o7777, 0o664);
    let meta = std::fs::metadata(d.share.join("inherit/g")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o664);
}

#[test]
fn without_dont_mask_the_mode_is_taken_as_sent() {
    // A guest that did not accept DONT_MASK applied its umask already.
    let d = Daemon::start(&["--posix-acl"]);
    let c = d.client();
    let e = mkdir_umask(&c, ROOT, "m", 0o755, 0o077);
    assert_eq!(e.attr.mode & 0o7777, 0o755);
}

#[test]
#[ignore = "needs root"]
fn kill_sgid_on_an_acl_change_clears_the_set_group_id_bit() {
    require_root("needs root");
    let d = Daemon::start(&["--posix-acl"]);
    let (c, _) = acl_client(&d);
    let e = create_umask(&c, ROOT, "s", 0o2775, 0);
    std::fs::set_permissions(d.share.join("s"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    let value = acl(&[
        (USER_OBJ, 7, NONE),
        (USER, 5, 1234),
        (GROUP_OBJ, 7, NONE),
        (MASK, 7, NONE),
        (OTHER, 5, NONE),
    ]);
    // Without the flag the bit stays (root's change).
    setxattr_ext(&c, e.nodeid, "system.posix_acl_access", &value, 0).unwrap();
    assert_eq!(
        std::fs::metadata(d.share.join("s")).unwrap().mode() & 0o7777,
        0o2775
    );
    setxattr_ext(&c, e.nodeid, "system.posix_acl_access", &value, KILL_SGID).unwrap();
    assert_eq!(
        std::fs::metadata(d.share.join("s")).unwrap().mode() & 0o7777,
        0o0775
    );
}

#[test]
fn malformed_extended_setxattr_gets_einval() {
    let d = Daemon::start(&["--posix-acl"]);
    let (c, _) = acl_client(&d);
    let e = create_umask(&c, ROOT, "x", 0o644, 0);
    // Shorter than fuse_setxattr_in's extended form.
    let r = c.call(FUSE_SETXATTR, e.nodeid, &[&[0u8; 12]], 64);
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    // No NUL after the name.
    let mut fixed = Vec::new();
    for w in [1u32, 0, 0, 0] {
        fixed.extend_from_slice(&w.to_ne_bytes());
    }
    let r = c.call(FUSE_SETXATTR, e.nodeid, &[&fixed, b"user.x"], 64);
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    // Size disagreeing with the value.
    let r = setxattr_ext_sized(&c, e.nodeid, 100, b"v");
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    // The daemon serves on.
    c.getattr(e.nodeid).unwrap();
}

fn setxattr_ext_sized(c: &FuseClient, node: u64, size: u32, value: &[u8]) -> FResult<()> {
    let mut fixed = Vec::new();
    for w in [size, 0, 0, 0] {
        fixed.extend_from_slice(&w.to_ne_bytes());
    }
    c.call(FUSE_SETXATTR, node, &[&fixed, b"user.x\0", value], 64)
        .map(drop)
}

#[test]
fn acl_entries_are_translated_with_the_ids() {
    let d = Daemon::start(&[
        "--posix-acl",
        "--translate-uid",
        "map:1000:2000:10",
        "--translate-gid",
        "map:1000:3000:10",
    ]);
    let (c, _) = acl_client(&d);
    let e = create_umask(&c, ROOT, "t", 0o640, 0);
    const GROUP: u16 = 8;
    let guest = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 1003),
        (GROUP_OBJ, 4, NONE),
        (GROUP, 4, 1005),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    setxattr_ext(&c, e.nodeid, "system.posix_acl_access", &guest, 0).unwrap();
    let host = host_getxattr(&d.share.join("t"), "system.posix_acl_access")
        .ok()
        .unwrap();
    let want_host = acl(&[
        (USER_OBJ, 6, NONE),
        (USER, 4, 2003),
        (GROUP_OBJ, 4, NONE),
        (GROUP, 4, 3005),
        (MASK, 4, NONE),
        (OTHER, 0, NONE),
    ]);
    assert_eq!(host, want_host);
    assert_eq!(
        c.getxattr(e.nodeid, "system.posix_acl_access", 4096)
            .unwrap(),
        guest
    );
}
