//! FUSE_IOCTL through the vhost-user socket: chattr/lsattr (FS_IOC_GETFLAGS/SETFLAGS) and
//! xfs_io's fsxattr (FS_IOC_FSGETXATTR/FSSETXATTR), sent as the guest kernel's
//! `fuse_fileattr_get`/`fuse_fileattr_set` send them: on a read-only handle from OPEN or
//! OPENDIR, the flags as a 4-byte int, FUSE_IOCTL_DIR for a directory.
//!
//! The share lives in the test's temporary directory; if its filesystem keeps no file flags
//! the tests say so and skip. Immutable flags are cleared on the way out so the temporary
//! directories can go.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{cstr, errno, require_root, Daemon, ROOT, USER};
use fuse_backend_rs::abi::fuse_abi::CreateIn;
use vfsd::frontend::fuse::*;
use vfsd::passthrough::ioctl::{
    FS_IOC32_GETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS,
    FS_IOC_SETFLAGS,
};
use vm_memory::ByteValued;

// FS_*_FL (chattr's letters i, a, d, A) and the FS_XFLAG_* twins.
const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;
const NOATIME: u32 = 0x80;
const XFLAG_NODUMP: u32 = 0x80;

/// The daemon may set +i/+a for a root caller only with this capability.
/// vfsd's default capabilities include CAP_LINUX_IMMUTABLE (see `caps`).
const IMMUTABLE_CAP: [&str; 0] = [];

fn host_open(p: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
}

/// The host's own answer to `req` on `p` (the `lsattr`/`chattr` of the host), as root.
fn host_ioctl(p: &Path, req: u32, arg: &mut [u32; 7]) -> io::Result<()> {
    let f = host_open(p)?;
    // SAFETY: the requests used read or write at most the 28 bytes of `arg`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), req as _, arg.as_mut_ptr()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn host_flags(p: &Path) -> u32 {
    let mut a = [0; 7];
    host_ioctl(p, FS_IOC_GETFLAGS, &mut a).unwrap();
    a[0]
}

fn host_set_flags(p: &Path, flags: u32) -> io::Result<()> {
    let mut a = [flags, 0, 0, 0, 0, 0, 0];
    host_ioctl(p, FS_IOC_SETFLAGS, &mut a)
}

/// Whether the share's filesystem keeps the flags at all (ext4, xfs, btrfs do; tmpfs
/// keeps only some). Says why when it doesn't.
fn host_supports_flags(d: &Daemon) -> bool {
    let probe = d.path(".flag-probe");
    File::create(&probe).unwrap();
    let ok = host_ioctl(&probe, FS_IOC_GETFLAGS, &mut [0; 7])
        .and_then(|_| host_set_flags(&probe, host_flags(&probe) | NODUMP))
        .and_then(|_| host_set_flags(&probe, 0));
    std::fs::remove_file(&probe).unwrap();
    if let Err(e) = &ok {
        eprintln!(
            "skipped: the host filesystem under {} keeps no file flags ({e})",
            d.share.display()
        );
    }
    ok.is_ok()
}

/// Clears +i and +a from the files on drop, so that they (and the share) can be removed.
struct Unflag(Vec<PathBuf>);

impl Drop for Unflag {
    fn drop(&mut self) {
        for p in &self.0 {
            let mut a = [0; 7];
            if host_ioctl(p, FS_IOC_GETFLAGS, &mut a).is_ok() {
                let _ = host_set_flags(p, a[0] & !(IMMUTABLE | APPEND));
            }
        }
    }
}

fn get_flags(c: &FuseClient, node: u64, fh: u64, fl: u32) -> FResult<u32> {
    let (res, out) = c.ioctl(node, fh, fl, FS_IOC_GETFLAGS, &[], 4)?;
    assert_eq!((res, out.len()), (0, 4));
    Ok(u32::from_ne_bytes(out.try_into().unwrap()))
}

fn set_flags(c: &FuseClient, node: u64, fh: u64, fl: u32, flags: u32) -> FResult<()> {
    let (res, out) = c.ioctl(node, fh, fl, FS_IOC_SETFLAGS, &flags.to_ne_bytes(), 0)?;
    assert_eq!((res, out.len()), (0, 0));
    Ok(())
}

/// `chattr +bits` as the guest does it: open read-only, get, set, release.
fn chattr(c: &FuseClient, node: u64, dir: bool, add: u32, remove: u32) -> FResult<()> {
    let (fh, fl) = if dir {
        (c.opendir(node)?.fh, FUSE_IOCTL_DIR)
    } else {
        (c.open(node, libc::O_RDONLY as u32)?.fh, 0)
    };
    let r =
        get_flags(c, node, fh, fl).and_then(|f| set_flags(c, node, fh, fl, (f | add) & !remove));
    if dir {
        c.releasedir(node, fh)?;
    } else {
        c.release(node, fh)?;
    }
    r
}

fn fsx_get(c: &FuseClient, node: u64, fh: u64) -> FResult<[u32; 7]> {
    let (res, out) = c.ioctl(node, fh, 0, FS_IOC_FSGETXATTR, &[], 28)?;
    assert_eq!((res, out.len()), (0, 28));
    let mut a = [0u32; 7];
    for (v, b) in a.iter_mut().zip(out.chunks_exact(4)) {
        *v = u32::from_ne_bytes(b.try_into().unwrap());
    }
    Ok(a)
}

fn fsx_set(c: &FuseClient, node: u64, fh: u64, a: &[u32; 7]) -> FResult<()> {
    let bytes: Vec<u8> = a.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let (res, _) = c.ioctl(node, fh, 0, FS_IOC_FSSETXATTR, &bytes, 0)?;
    assert_eq!(res, 0);
    Ok(())
}

#[test]
fn flags_round_trip_on_a_file_and_a_directory() {
    let d = Daemon::start(&IMMUTABLE_CAP);
    if !host_supports_flags(&d) {
        return;
    }
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    let host_before = host_flags(&d.path("f"));
    assert_eq!(get_flags(&c, f.nodeid, o.fh, 0).unwrap(), host_before);
    c.release(f.nodeid, o.fh).unwrap();
    chattr(&c, f.nodeid, false, NODUMP | NOATIME, 0).unwrap();
    assert_eq!(host_flags(&d.path("f")), host_before | NODUMP | NOATIME);

    let dir = c.mkdir(ROOT, "d", 0o755).unwrap();
    chattr(&c, dir.nodeid, true, NODUMP, 0).unwrap();
    assert_ne!(
        host_flags(&d.path("d")) & NODUMP,
        0,
        "the host sees +d on the dir"
    );
    // Without a handle (fh 0) the node is reopened; a 32-bit guest's commands say int.
    let h = host_flags(&d.path("d"));
    assert_eq!(get_flags(&c, dir.nodeid, 0, FUSE_IOCTL_DIR).unwrap(), h);
    let (res, out) = c
        .ioctl(
            dir.nodeid,
            0,
            FUSE_IOCTL_DIR | FUSE_IOCTL_32BIT,
            FS_IOC32_GETFLAGS,
            &[],
            4,
        )
        .unwrap();
    assert_eq!((res, out), (0, h.to_ne_bytes().to_vec()));
    c.ioctl(
        dir.nodeid,
        0,
        FUSE_IOCTL_DIR | FUSE_IOCTL_32BIT,
        FS_IOC32_SETFLAGS,
        &(h & !NODUMP).to_ne_bytes(),
        0,
    )
    .unwrap();
    assert_eq!(host_flags(&d.path("d")) & NODUMP, 0, "the host sees -d");
    chattr(&c, f.nodeid, false, 0, NODUMP | NOATIME).unwrap();
    assert_eq!(host_flags(&d.path("f")), host_before);
}

#[test]
#[ignore = "needs root"]
fn immutable_and_append_only_bind_the_host() {
    require_root("setting +i/+a needs root");
    let d = Daemon::start(&IMMUTABLE_CAP);
    if !host_supports_flags(&d) {
        return;
    }
    let _unflag = Unflag(vec![d.path("i"), d.path("a"), d.path("dir")]);
    let c = d.client();
    let (i, o) = c.create(ROOT, "i", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(i.nodeid, o.fh, 0, b"before").unwrap();
    c.release(i.nodeid, o.fh).unwrap();
    chattr(&c, i.nodeid, false, IMMUTABLE, 0).unwrap();
    assert_ne!(host_flags(&d.path("i")) & IMMUTABLE, 0);
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path("i"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "host write to +i");
    assert_eq!(errno(c.open(i.nodeid, libc::O_WRONLY as u32)), libc::EPERM);
    assert_eq!(errno(c.unlink(ROOT, "i")), libc::EPERM);
    chattr(&c, i.nodeid, false, 0, IMMUTABLE).unwrap();
    std::fs::write(d.path("i"), b"after").unwrap();

    let (a, o) = c.create(ROOT, "a", libc::O_RDWR as u32, 0o644).unwrap();
    c.release(a.nodeid, o.fh).unwrap();
    chattr(&c, a.nodeid, false, APPEND, 0).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(d.path("a"))
        .unwrap()
        .write_all(b"appended")
        .unwrap();
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(d.path("a"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "host overwrite of +a");
    chattr(&c, a.nodeid, false, 0, APPEND).unwrap();

    // An immutable directory takes no new names.
    let dir = c.mkdir(ROOT, "dir", 0o755).unwrap();
    chattr(&c, dir.nodeid, true, IMMUTABLE, 0).unwrap();
    let e = File::create(d.path("dir/new")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    chattr(&c, dir.nodeid, true, 0, IMMUTABLE).unwrap();
}

#[test]
#[ignore = "needs root"]
fn root_without_the_immutable_capability_is_refused_like_the_host() {
    require_root("needs root");
    // vfsd keeps CAP_LINUX_IMMUTABLE by default; without it, root is refused.
    let d = Daemon::start(&["--modcaps", "-linux_immutable"]);
    if !host_supports_flags(&d) {
        return;
    }
    let _unflag = Unflag(vec![d.path("f")]);
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.release(f.nodeid, o.fh).unwrap();
    assert_eq!(
        errno(chattr(&c, f.nodeid, false, IMMUTABLE, 0)),
        libc::EPERM
    );
    assert_eq!(errno(chattr(&c, f.nodeid, false, APPEND, 0)), libc::EPERM);
    chattr(&c, f.nodeid, false, NODUMP, 0).unwrap();
    assert_eq!(
        host_flags(&d.path("f")) & (IMMUTABLE | APPEND | NODUMP),
        NODUMP
    );
}

#[test]
#[ignore = "needs root"]
fn a_non_root_caller_gets_the_hosts_answers() {
    require_root("needs root to act as another user");
    let d = Daemon::start(&IMMUTABLE_CAP);
    if !host_supports_flags(&d) {
        return;
    }
    let _unflag = Unflag(vec![d.path("mine"), d.path("roots")]);
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = d.client();
    let (r, o) = c.create(ROOT, "roots", libc::O_RDWR as u32, 0o644).unwrap();
    c.release(r.nodeid, o.fh).unwrap();
    c.as_caller(USER, |c| {
        let (m, o) = c.create(ROOT, "mine", libc::O_RDWR as u32, 0o644).unwrap();
        c.release(m.nodeid, o.fh).unwrap();
        // As on a local ext4 (chattr as an unprivileged user): EPERM for +i/+a even on
        // one's own file, and for any change to another's; reading flags is allowed.
        assert_eq!(errno(chattr(c, m.nodeid, false, IMMUTABLE, 0)), libc::EPERM);
        assert_eq!(errno(chattr(c, m.nodeid, false, APPEND, 0)), libc::EPERM);
        chattr(c, m.nodeid, false, NODUMP, 0).unwrap();
        assert_eq!(errno(chattr(c, r.nodeid, false, NODUMP, 0)), libc::EPERM);
        get_flags(c, r.nodeid, 0, 0).unwrap();
        // fsxattr likewise.
        let mut x = fsx_get(c, r.nodeid, 0).unwrap();
        x[0] |= XFLAG_NODUMP;
        assert_eq!(errno(fsx_set(c, r.nodeid, 0, &x)), libc::EPERM);
    });
    assert_eq!(host_flags(&d.path("mine")) & (IMMUTABLE | APPEND), 0);
    assert_ne!(host_flags(&d.path("mine")) & NODUMP, 0);
    assert_eq!(host_flags(&d.path("roots")) & NODUMP, 0);
    // Root, through the same daemon, may set +i on the user's file.
    chattr(
        &c,
        c.lookup(ROOT, "mine").unwrap().nodeid,
        false,
        IMMUTABLE,
        0,
    )
    .unwrap();
    assert_ne!(host_flags(&d.path("mine")) & IMMUTABLE, 0);
}

#[test]
fn fsxattr_flags_and_project_id() {
    let d = Daemon::start(&["--allow-project-id"]);
    if !host_supports_flags(&d) {
        return;
    }
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.release(f.nodeid, o.fh).unwrap();
    let o = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    let mut x = fsx_get(&c, f.nodeid, o.fh).unwrap();
    let mut host = [0; 7];
    host_ioctl(&d.path("f"), FS_IOC_FSGETXATTR, &mut host).unwrap();
    assert_eq!(x, host);
    x[0] |= XFLAG_NODUMP;
    fsx_set(&c, f.nodeid, o.fh, &x).unwrap();
    assert_ne!(
        host_flags(&d.path("f")) & NODUMP,
        0,
        "FS_XFLAG_NODUMP is +d"
    );
    assert_eq!(
        fsx_get(&c, f.nodeid, o.fh).unwrap()[0] & XFLAG_NODUMP,
        XFLAG_NODUMP
    );

    // A project id: whatever the host filesystem says to the same change on its own file
    // (EOPNOTSUPP without ext4's project feature), the guest hears.
    let scratch = d.path("scratch");
    File::create(&scratch).unwrap();
    let mut hx = [0; 7];
    host_ioctl(&scratch, FS_IOC_FSGETXATTR, &mut hx).unwrap();
    hx[3] = 7;
    let want = host_ioctl(&scratch, FS_IOC_FSSETXATTR, &mut hx).map_err(|e| e.raw_os_error());
    x[3] = 7;
    match want {
        Ok(()) => {
            fsx_set(&c, f.nodeid, o.fh, &x).unwrap();
            assert_eq!(fsx_get(&c, f.nodeid, 0).unwrap()[3], 7);
        }
        Err(e) => assert_eq!(Some(errno(fsx_set(&c, f.nodeid, o.fh, &x))), e),
    }
    c.release(f.nodeid, o.fh).unwrap();
}

#[test]
fn only_file_attribute_ioctls_on_files_and_directories() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    // FIONBIO, TCGETS, FS_IOC_GETVERSION, FIEMAP: ENOTTY, never the host.
    for cmd in [libc::FIONBIO as u32, 0x5401, 0x8008_7601, 0xc020_660b] {
        assert_eq!(
            errno(c.ioctl(f.nodeid, o.fh, 0, cmd, &[], 4)),
            libc::ENOTTY,
            "{cmd:#x}"
        );
    }
    // A FIFO is never opened (that would block), a symlink never followed.
    let fifo = c.mknod(ROOT, "fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    let link = c.symlink(ROOT, "link", "f").unwrap();
    let t = Instant::now();
    for node in [fifo.nodeid, link.nodeid] {
        assert_eq!(
            errno(c.ioctl(node, 0, 0, FS_IOC_GETFLAGS, &[], 4)),
            libc::ENOTTY
        );
        assert_eq!(
            errno(c.ioctl(node, 0, 0, FS_IOC_SETFLAGS, &[0; 4], 0)),
            libc::ENOTTY
        );
        // Even with another file's handle.
        assert_eq!(
            errno(c.ioctl(node, o.fh, 0, FS_IOC_FSGETXATTR, &[], 28)),
            libc::ENOTTY
        );
    }
    assert!(t.elapsed() < Duration::from_secs(5));
    c.release(f.nodeid, o.fh).unwrap();
}

#[test]
fn malformed_requests_get_an_errno() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    let (g, go) = c.create(ROOT, "g", libc::O_RDWR as u32, 0o644).unwrap();
    let n = f.nodeid;
    let bad = |r: FResult<(i32, Vec<u8>)>| errno(r);
    // A `long` (8 bytes) where the kernel passes an int; no room; input on a get.
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_GETFLAGS, &[], 8)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_GETFLAGS, &[], 0)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_GETFLAGS, &[0; 4], 4)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_SETFLAGS, &[0; 8], 0)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_SETFLAGS, &[], 0)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_SETFLAGS, &[0; 4], 4)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_FSGETXATTR, &[], 27)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_FSSETXATTR, &[0; 29], 0)),
        libc::EINVAL
    );
    assert_eq!(
        bad(c.ioctl(n, o.fh, 0, FS_IOC_GETFLAGS, &[], u32::MAX)),
        libc::EINVAL
    );
    // More input announced than sent.
    assert_eq!(
        bad(c.ioctl_sized(n, o.fh, 0, FS_IOC_SETFLAGS, 4, &[], 0)),
        libc::ENOTTY
    );
    assert_eq!(
        bad(c.ioctl_sized(n, o.fh, 0, FS_IOC_FSSETXATTR, u32::MAX, &[0; 28], 0)),
        libc::ENOTTY
    );
    // Unknown handle, another file's handle, unknown node.
    assert_eq!(
        bad(c.ioctl(n, 999_999, 0, FS_IOC_GETFLAGS, &[], 4)),
        libc::EBADF
    );
    assert_eq!(
        bad(c.ioctl(n, go.fh, 0, FS_IOC_GETFLAGS, &[], 4)),
        libc::EBADF
    );
    assert!(matches!(
        bad(c.ioctl(424_242, 0, 0, FS_IOC_GETFLAGS, &[], 4)),
        libc::ENOENT | libc::EBADF | libc::ESTALE
    ));
    // The daemon still serves.
    get_flags(&c, n, o.fh, 0).unwrap();
    c.release(f.nodeid, o.fh).unwrap();
    c.release(g.nodeid, go.fh).unwrap();
}

#[test]
fn readonly_share_gets_but_never_sets() {
    let d = Daemon::start(&["--readonly"]);
    File::create(d.path("f")).unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap();
    let o = c.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    if host_supports_flags(&d) {
        assert_eq!(
            get_flags(&c, f.nodeid, o.fh, 0).unwrap(),
            host_flags(&d.path("f"))
        );
        fsx_get(&c, f.nodeid, o.fh).unwrap();
    }
    assert_eq!(errno(set_flags(&c, f.nodeid, o.fh, 0, NODUMP)), libc::EROFS);
    assert_eq!(errno(fsx_set(&c, f.nodeid, o.fh, &[0; 7])), libc::EROFS);
    c.release(f.nodeid, o.fh).unwrap();
}

/// With `--translate-uid/gid`, the caller's ids are translated for the flag change as for
/// every other request: a guest user changes flags of its own (translated) file.
#[test]
#[ignore = "needs root"]
fn a_translated_caller_sets_flags_on_its_own_file() {
    require_root("needs root to act as another user");
    let d = Daemon::start(&[
        "--translate-uid",
        &format!("map:{}:5000:1", USER.uid),
        "--translate-gid",
        &format!("map:{}:5000:1", USER.gid),
    ]);
    if !host_supports_flags(&d) {
        return;
    }
    let _unflag = Unflag(vec![d.path("mine")]);
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = d.client();
    c.as_caller(USER, |c| {
        let (m, o) = c.create(ROOT, "mine", libc::O_RDWR as u32, 0o644).unwrap();
        c.release(m.nodeid, o.fh).unwrap();
        chattr(c, m.nodeid, false, NODUMP, 0).unwrap();
    });
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(d.path("mine")).unwrap()),
        5000
    );
    assert_eq!(host_flags(&d.path("mine")) & NODUMP, NODUMP);
}

/// A project id is a host-side quota boundary: a guest may not move a file out of (or
/// into) a project, nor change project inheritance, unless `--allow-project-id` says so.
/// Refused with EINVAL, as the host kernel refuses the same change from a user namespace.
#[test]
fn project_id_changes_need_allow_project_id() {
    const PROJINHERIT_FL: u32 = 0x2000_0000;
    const XFLAG_PROJINHERIT: u32 = 0x200;
    let d = Daemon::start(&IMMUTABLE_CAP);
    if !host_supports_flags(&d) {
        return;
    }
    let c = d.client();
    let (f, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    let dir = c.mkdir(ROOT, "d", 0o755).unwrap();
    let dh = c.opendir(dir.nodeid).unwrap().fh;
    let x = fsx_get(&c, f.nodeid, o.fh).unwrap();
    let mut moved = x;
    moved[3] = x[3] + 7;
    assert_eq!(errno(fsx_set(&c, f.nodeid, o.fh, &moved)), libc::EINVAL);
    let mut inherit = fsx_get(&c, dir.nodeid, dh).unwrap();
    inherit[0] |= XFLAG_PROJINHERIT;
    assert_eq!(errno(fsx_set(&c, dir.nodeid, dh, &inherit)), libc::EINVAL);
    let flags = host_flags(&d.path("d"));
    assert_eq!(
        errno(c.ioctl(
            dir.nodeid,
            dh,
            0x10,
            FS_IOC_SETFLAGS,
            &(flags | PROJINHERIT_FL).to_ne_bytes(),
            0
        )),
        libc::EINVAL
    );
    // Other fsxattr changes with the project id left as it is still go through.
    let mut nodump = x;
    nodump[0] |= XFLAG_NODUMP;
    fsx_set(&c, f.nodeid, o.fh, &nodump).unwrap();
    let mut host = [0; 7];
    host_ioctl(&d.path("f"), FS_IOC_FSGETXATTR, &mut host).unwrap();
    assert_eq!(host[3], x[3], "the host's project id is untouched");
}

/// SETFLAGS/FSSETXATTR act as the translated host id, as creates do, not as the raw guest
/// id (a security review found `FsCred::switch(ctx.uid, ctx.gid)` bypassing
/// `--translate-uid/gid`): a guest root squashed onto an unprivileged host id must not
/// act as host root (fsuid 0, every capability) and change a host root-owned file's flags.
#[test]
#[ignore = "needs root"]
fn setflags_runs_as_the_translated_host_id_not_the_raw_guest_id() {
    require_root("needs root");
    let d = Daemon::start(&[
        "--translate-uid",
        "squash-guest:0:4321:1",
        "--translate-gid",
        "squash-guest:0:4321:1",
    ]);
    let p = d.path("roots-file");
    File::create(&p).unwrap();
    if !host_supports_flags(&d) {
        return;
    }
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = d.client();
    // The translation is in force: guest root's create belongs to host 4321.
    let a = CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode: 0o644,
        umask: 0,
        fuse_flags: 0,
    };
    c.call(FUSE_CREATE, ROOT, &[a.as_slice(), &cstr("made")], 4096)
        .unwrap();
    assert_eq!(std::fs::metadata(d.path("made")).unwrap().uid(), 4321);

    let node = c.lookup(ROOT, "roots-file").unwrap().nodeid;
    let r = chattr(&c, node, false, NODUMP, 0);
    let flags = host_flags(&p);
    assert_eq!(
        flags & NODUMP,
        0,
        "a guest root squashed onto host uid 4321 changed the flags of a host root-owned \
         file (reply {r:?}): the ioctl ran with fsuid 0"
    );
    assert_eq!(errno(r), libc::EPERM);
}

/// The same with a forbid rule: a forbidden guest uid is refused on creates (EIO) and
/// must not act on the host through FUSE_IOCTL with its raw number as fsuid.
#[test]
#[ignore = "needs root"]
fn setflags_refuses_a_forbidden_guest_uid() {
    require_root("needs root");
    let d = Daemon::start(&["--translate-uid", "forbid-guest:1000:1"]);
    let p = d.path("f");
    File::create(&p).unwrap();
    if !host_supports_flags(&d) {
        return;
    }
    std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = d.client();
    let node = c.lookup(ROOT, "f").unwrap().nodeid;
    let forbidden = Caller {
        uid: 1000,
        gid: 1000,
        pid: 77,
    };
    c.as_caller(forbidden, |c| {
        assert_eq!(
            errno(c.mkdir(ROOT, "d", 0o755)),
            libc::EIO,
            "creates refuse it"
        );
        let r = chattr(c, node, false, NODUMP, 0);
        assert_eq!(
            host_flags(&p) & NODUMP,
            0,
            "forbidden guest uid 1000 changed host flags through FUSE_IOCTL ({r:?})"
        );
    });
}

/// The caller FUSE_ALLOW_IDMAP leaves unnamed (FUSE_INVALID_UIDGID).
const UNNAMED: Caller = Caller {
    uid: u32::MAX,
    gid: u32::MAX,
    pid: 77,
};

fn squashed_root(extra: &[&str]) -> (Daemon, PathBuf, PathBuf) {
    let mut args = vec![
        "--translate-uid",
        "squash-guest:0:4321:1",
        "--translate-gid",
        "squash-guest:0:4321:1",
    ];
    args.extend(extra);
    let d = Daemon::start(&args);
    let roots = d.path("roots-file");
    File::create(&roots).unwrap();
    let mine = d.path("squashed-roots-file");
    File::create(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(4321), Some(4321)).unwrap();
    (d, roots, mine)
}

/// Without FUSE_ALLOW_IDMAP, u32::MAX is an id like any other: a hostile guest sending
/// it gets no host root for a flag change (a review found the unnamed caller's change
/// made with the daemon's credentials, around the translation).
#[test]
#[ignore = "needs root"]
fn setflags_by_an_unnamed_caller_is_refused_without_allow_idmap() {
    require_root("needs root");
    let (d, roots, _) = squashed_root(&["--allow-idmap"]);
    if !host_supports_flags(&d) {
        return;
    }
    let _u = Unflag(vec![roots.clone()]);
    let c = d.client();
    let node = c.lookup(ROOT, "roots-file").unwrap().nodeid;
    let r = c.as_caller(UNNAMED, |c| chattr(c, node, false, IMMUTABLE | NODUMP, 0));
    assert_eq!(errno(r), libc::EPERM);
    assert_eq!(host_flags(&roots) & (IMMUTABLE | NODUMP), 0);
}

/// With FUSE_ALLOW_IDMAP an unnamed caller's flag change is made as the most the guest
/// could be, its root through the translation: refused on a host root's file, allowed on
/// the squashed id's own.
#[test]
#[ignore = "needs root"]
fn setflags_by_an_unnamed_caller_under_allow_idmap_acts_as_the_translated_guest_root() {
    require_root("needs root");
    let (d, roots, mine) = squashed_root(&["--allow-idmap"]);
    if !host_supports_flags(&d) {
        return;
    }
    let _u = Unflag(vec![roots.clone(), mine.clone()]);
    let c = FuseClient::new(d.frontend(Default::default()));
    const ALLOW_IDMAP: u64 = 1 << 40;
    let out = c
        .init_ext(
            40,
            ALLOW_IDMAP | INIT_BIG_WRITES as u64 | INIT_MAX_PAGES as u64,
        )
        .unwrap();
    assert_ne!((out.flags2 as u64) << 32 & ALLOW_IDMAP, 0);
    let node = c.lookup(ROOT, "roots-file").unwrap().nodeid;
    let r = c.as_caller(UNNAMED, |c| chattr(c, node, false, NODUMP, 0));
    assert_eq!(errno(r), libc::EPERM, "host root's file changed as root");
    assert_eq!(host_flags(&roots) & NODUMP, 0);
    let node = c.lookup(ROOT, "squashed-roots-file").unwrap().nodeid;
    c.as_caller(UNNAMED, |c| chattr(c, node, false, NODUMP, 0))
        .unwrap();
    assert_ne!(host_flags(&mine) & NODUMP, 0);
}
