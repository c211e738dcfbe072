//! The opcodes vfsd serves beyond fuse-backend-rs: FUSE_TMPFILE (then linked into the
//! tree, as `linkat(AT_EMPTY_PATH)` of an O_TMPFILE does in the guest) and FUSE_STATX with
//! the birth time.

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;

use crate::common::{require_root, Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::{CreateIn, EntryOut, OpenOut};
use vfsd::frontend::fuse::*;
use vm_memory::ByteValued;

const FUSE_TMPFILE: u32 = 51;
const FUSE_STATX: u32 = 52;

fn tmpfile(c: &FuseClient, parent: u64, flags: i32, mode: u32) -> FResult<(EntryOut, OpenOut)> {
    let a = CreateIn {
        flags: (flags | libc::O_TMPFILE) as u32,
        mode,
        umask: 0,
        fuse_flags: 0,
    };
    let b = c.call(FUSE_TMPFILE, parent, &[a.as_slice(), b"/\0"], 4096)?;
    let e: EntryOut = decode(&b)?;
    let o: OpenOut = decode(&b[std::mem::size_of::<EntryOut>()..])?;
    Ok((e, o))
}

#[test]
fn an_o_tmpfile_is_written_then_linked_into_the_tree() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (e, o) = tmpfile(&c, ROOT, libc::O_RDWR, 0o640).unwrap();
    assert_eq!(e.attr.nlink, 0, "unnamed");
    assert_eq!(e.attr.mode & 0o7777, 0o640);
    assert_eq!(
        std::fs::read_dir(&d.share).unwrap().count(),
        0,
        "nothing named yet"
    );
    c.write(e.nodeid, o.fh, 0, b"tmpfile data").unwrap();
    let l = c.link(e.nodeid, ROOT, "named").unwrap();
    assert_eq!(l.nodeid, e.nodeid);
    assert_eq!(l.attr.nlink, 1);
    assert_eq!(
        std::fs::read(d.share.join("named")).unwrap(),
        b"tmpfile data"
    );
    c.release(e.nodeid, o.fh).unwrap();
}

#[test]
fn an_exclusive_o_tmpfile_can_never_be_linked() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (e, _) = tmpfile(&c, ROOT, libc::O_RDWR | libc::O_EXCL, 0o600).unwrap();
    let r = c.link(e.nodeid, ROOT, "named");
    assert!(matches!(r, Err(FuseError::Errno(libc::ENOENT))), "{r:?}");
    assert!(!d.share.join("named").exists());
}

#[test]
fn o_tmpfile_refusals() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let r = tmpfile(&c, ROOT, libc::O_RDONLY, 0o600);
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    std::fs::write(d.share.join("f"), b"").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let r = tmpfile(&c, f.nodeid, libc::O_RDWR, 0o600);
    assert!(matches!(r, Err(FuseError::Errno(libc::ENOTDIR))), "{r:?}");
    // Arguments too short for CreateIn.
    let r = c.call(FUSE_TMPFILE, ROOT, &[&[0u8; 8]], 4096);
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    let d = Daemon::start(&["--readonly"]);
    let r = tmpfile(&d.client(), ROOT, libc::O_RDWR, 0o600);
    assert!(matches!(r, Err(FuseError::Errno(libc::EROFS))), "{r:?}");
}

#[test]
#[ignore = "needs root"]
fn a_non_root_o_tmpfile_is_owned_by_its_caller() {
    require_root("needs root");
    let d = Daemon::start(&[]);
    let c = d.client();
    std::fs::set_permissions(
        &d.share,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let caller = Caller {
        uid: 65534,
        gid: 65534,
        pid: 1,
    };
    let (e, _) = c
        .as_caller(caller, |c| tmpfile(c, ROOT, libc::O_RDWR, 0o600))
        .unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 65534));
    c.as_caller(caller, |c| c.link(e.nodeid, ROOT, "mine"))
        .unwrap();
    assert_eq!(
        std::fs::metadata(d.share.join("mine")).unwrap().uid(),
        65534
    );
}

fn statx_req(c: &FuseClient, node: u64, mask: u32) -> FResult<Vec<u8>> {
    let mut a = Vec::new();
    a.extend_from_slice(&0u32.to_ne_bytes()); // getattr_flags
    a.extend_from_slice(&0u32.to_ne_bytes());
    a.extend_from_slice(&0u64.to_ne_bytes()); // fh
    a.extend_from_slice(&0u32.to_ne_bytes()); // sx_flags
    a.extend_from_slice(&mask.to_ne_bytes());
    c.call(FUSE_STATX, node, &[&a], 4096)
}

fn host_btime(p: &std::path::Path) -> (i64, u32) {
    let path = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: NUL-terminated path, writable buffer of the right size.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            0,
            libc::STATX_BTIME,
            stx.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0);
    // SAFETY: filled by a successful statx.
    let stx = unsafe { stx.assume_init() };
    (stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec)
}

#[test]
fn statx_reports_the_birth_time() {
    let d = Daemon::start(&[]);
    let c = d.client();
    std::fs::write(d.share.join("f"), b"12345").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let b = statx_req(&c, f.nodeid, libc::STATX_BTIME | libc::STATX_BASIC_STATS).unwrap();
    assert_eq!(b.len(), 32 + 256);
    let s = &b[32..];
    let u32_at = |o: usize| u32::from_ne_bytes(s[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(s[o..o + 8].try_into().unwrap());
    let mask = u32_at(0);
    assert_eq!(mask & libc::STATX_BASIC_STATS, libc::STATX_BASIC_STATS);
    assert_eq!(u64_at(40), 5, "size");
    let meta = std::fs::metadata(d.share.join("f")).unwrap();
    assert_eq!(u64_at(32), meta.ino());
    if mask & libc::STATX_BTIME != 0 {
        // btime is the second fuse_sx_time, after atime, at 64 + 16.
        let sec = i64::from_ne_bytes(s[80..88].try_into().unwrap());
        let nsec = u32_at(88);
        assert_eq!((sec, nsec), host_btime(&d.share.join("f")));
        assert!(sec > 0);
    } else {
        eprintln!("host filesystem has no birth time; only the basic stats checked");
    }
    // Short arguments.
    let r = c.call(FUSE_STATX, f.nodeid, &[&[0u8; 10]], 4096);
    assert!(matches!(r, Err(FuseError::Errno(libc::EINVAL))), "{r:?}");
    let r = statx_req(&c, 999_999, libc::STATX_BTIME);
    assert!(r.is_err());
}
