//! Security review, round 3 (code added in 9f10c63..3c1dc9b): each test here fails on the
//! reviewed code and shows one defect, through the real vhost-user socket.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::common::{
    self, cstr, errno, file_capability, host_getxattr as host_get, host_setxattr as host_set,
    is_root, Daemon, ROOT, SECURITY_CTX,
};
use fuse_backend_rs::abi::fuse_abi::{CreateIn, SetattrIn};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;
use vfsd::passthrough::ioctl::{FS_IOC_GETFLAGS, FS_IOC_SETFLAGS};
use vm_memory::ByteValued;

const NODUMP: u32 = 0x40; // FS_NODUMP_FL

fn host_flags(p: &Path) -> std::io::Result<u32> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)?;
    let mut a = [0u32; 7];
    // SAFETY: FS_IOC_GETFLAGS writes an int into `a`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, a.as_mut_ptr()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(a[0])
}

/// `chattr +d` as the guest kernel sends it: OPEN read-only, GETFLAGS, SETFLAGS, RELEASE.
fn guest_chattr_nodump(c: &FuseClient, node: u64) -> FResult<()> {
    let fh = c.open(node, libc::O_RDONLY as u32)?.fh;
    let r = (|| {
        let (_, out) = c.ioctl(node, fh, 0, FS_IOC_GETFLAGS, &[], 4)?;
        let flags = u32::from_ne_bytes(out.try_into().unwrap());
        c.ioctl(
            node,
            fh,
            0,
            FS_IOC_SETFLAGS,
            &(flags | NODUMP).to_ne_bytes(),
            0,
        )
        .map(drop)
    })();
    c.release(node, fh).unwrap();
    r
}

/// Finding 1: FUSE_IOCTL's SETFLAGS/FSSETXATTR switch to the raw guest ids
/// (`ioctl.rs`: `FsCred::switch(ctx.uid, ctx.gid)`), bypassing `--translate-uid/gid`.
/// A guest root squashed onto an unprivileged host id still acts as host root (fsuid 0,
/// every capability) and changes the flags of a host root-owned file; creates by the same
/// caller do land as the squashed id.
#[test]
fn ioctl_setflags_runs_as_the_translated_host_id_not_the_raw_guest_id() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = Daemon::start(&[
        "--translate-uid",
        "squash-guest:0:4321:1",
        "--translate-gid",
        "squash-guest:0:4321:1",
    ]);
    let p = d.path("roots-file");
    File::create(&p).unwrap();
    if host_flags(&p).is_err() {
        eprintln!("skipped: the share's filesystem has no file flags");
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
    let r = guest_chattr_nodump(&c, node);
    let flags = host_flags(&p).unwrap();
    assert_eq!(
        flags & NODUMP,
        0,
        "a guest root squashed onto host uid 4321 changed the flags of a host root-owned \
         file (reply {r:?}): the ioctl ran with fsuid 0"
    );
    assert_eq!(errno(r), libc::EPERM);
}

/// Finding 1, forbid form: a forbidden guest uid is refused on creates (EIO) but acts on
/// the host through FUSE_IOCTL with its raw number as fsuid.
#[test]
fn ioctl_setflags_refuses_a_forbidden_guest_uid() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = Daemon::start(&["--translate-uid", "forbid-guest:1000:1"]);
    let p = d.path("f");
    File::create(&p).unwrap();
    if host_flags(&p).is_err() {
        eprintln!("skipped: the share's filesystem has no file flags");
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
        let r = guest_chattr_nodump(c, node);
        assert_eq!(
            host_flags(&p).unwrap() & NODUMP,
            0,
            "forbidden guest uid 1000 changed host flags through FUSE_IOCTL ({r:?})"
        );
    });
}

/// Finding 2: the security-context extension is applied whatever was configured and
/// negotiated (`create_ext.rs` label_new/label_created_file only look at the thread slot,
/// `ext.rs` parses it on every create). Without `--security-label` (SECURITY_CTX not
/// enabled at INIT) and without `--xattr` (xattrs refused), a guest still writes
/// security.* xattrs on the host: here the guest's file capability, stored under the
/// mapped name other `--xattr` daemons on the share read back as `security.capability`.
#[test]
fn security_context_is_ignored_unless_negotiated() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = Daemon::start(&[]);
    let c = FuseClient::new(d.frontend(FrontendConfig::default()));
    let out = c
        .init_ext(44, SECURITY_CTX | INIT_BIG_WRITES as u64)
        .unwrap();
    assert_eq!(
        out.flags2 as u64 & (SECURITY_CTX >> 32),
        0,
        "not offered back without --security-label"
    );
    assert_eq!(
        errno(c.getxattr(ROOT, "user.x", 0)),
        libc::ENOSYS,
        "no --xattr"
    );
    let a = CreateIn {
        flags: (libc::O_RDWR | libc::O_CREAT) as u32,
        mode: 0o755,
        umask: 0,
        fuse_flags: 0,
    };
    let ext = common::ext::secctx("security.capability", &file_capability());
    let r = common::ext::call(&c, FUSE_CREATE, ROOT, &[a.as_slice(), &cstr("bin")], &ext);
    let p = d.path("bin");
    if p.exists() {
        assert_eq!(
            host_get(&p, "user.vfsd.security.capability"),
            Err(libc::ENODATA),
            "an unnegotiated security context reached the host (reply {:?})",
            r.map(|_| ())
        );
        assert_eq!(host_get(&p, "security.capability"), Err(libc::ENODATA));
    }
}

/// Finding 3: with the default xattr map a guest's file capability lives in host
/// `user.vfsd.security.capability`. The host kernel drops a real `security.capability`
/// on chown, and vfsd drops the mapped one on write and truncate (`killpriv.rs`), but
/// SETATTR's chown (`attr.rs`) leaves the mapped one: the capability survives a chown.
#[test]
fn chown_drops_the_mapped_file_capability() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let d = Daemon::start(&["--xattr", "--cache", "never"]);
    // What the host kernel does with a real capability on chown.
    let control = d.dir.path().join("control");
    std::fs::write(&control, b"x").unwrap();
    if host_set(&control, "security.capability", &file_capability()).is_err() {
        eprintln!("skipped: the host filesystem keeps no file capabilities");
        return;
    }
    std::os::unix::fs::chown(&control, Some(1234), None).unwrap();
    if host_get(&control, "security.capability") != Err(libc::ENODATA) {
        eprintln!("skipped: this host kernel keeps file capabilities across chown");
        return;
    }

    let p = d.path("setcap-me");
    std::fs::write(&p, b"#!/bin/true\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "setcap-me").unwrap().nodeid;
    c.setxattr(f, "security.capability", &file_capability(), 0)
        .unwrap();
    let s = SetattrIn {
        valid: FATTR_UID,
        uid: 1234,
        ..Default::default()
    };
    c.setattr(f, &s).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().uid(), 1234);
    assert_eq!(
        errno(c.getxattr(f, "security.capability", 64)),
        libc::ENODATA,
        "the guest's file capability survived a chown (host keeps {:?})",
        host_get(&p, "user.vfsd.security.capability")
    );
}

/// Finding 4: a `guest` (or `host`) 1:1 rule's target range is never checked against the
/// id space (`idtranslate.rs` `Table::add` checks only the source range, `get` uses
/// `wrapping_add`). docs/translate.md promises that a range past the last id stops vfsd,
/// but `guest:1000:4294967290:100` is accepted and maps guest uid 1006 onto host uid 0:
/// that guest user's files are created as host root.
#[test]
fn a_host_range_past_the_last_id_is_refused_not_wrapped_to_root() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = dir.path().join("s");
    let mut child = std::process::Command::new(common::vfsd_bin())
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(["--translate-uid", "guest:1000:4294967290:100"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let accepted = loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert_eq!(st.code(), Some(1));
            break false;
        }
        if sock.exists() {
            break true;
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if !accepted {
        return;
    }
    // Accepted: show where guest uid 1006 lands.
    let owner = (|| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let c = FuseClient::new(
            vfsd::frontend::Frontend::connect(&sock, FrontendConfig::default()).ok()?,
        );
        c.init().ok()?;
        let user = Caller {
            uid: 1006,
            gid: 1006,
            pid: 77,
        };
        c.as_caller(user, |c| c.mkdir(ROOT, "d", 0o755)).ok()?;
        Some(std::fs::metadata(share.join("d")).ok()?.uid())
    })();
    // SAFETY: signals the child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    panic!(
        "--translate-uid guest:1000:4294967290:100 was accepted; guest uid 1006 created a \
         directory owned by host uid {owner:?}"
    );
}
