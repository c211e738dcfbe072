//! `--translate-uid` / `--translate-gid` through the real vhost-user socket: guest ids in
//! request headers and chowns become host ids, host ids in every attribute reply become
//! guest ids, with virtiofsd's rule forms and meanings (docs/translate.md).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::common::{errno, require_root, run_vfsd, vfsd_bin, Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::{AttrOut, SetattrIn};
use vfsd::frontend::fuse::*;
use vfsd::frontend::FrontendConfig;

fn caller(uid: u32, gid: u32) -> Caller {
    Caller { uid, gid, pid: 77 }
}

/// A daemon with `rules`, and a world-writable directory "sub" for non-root creates.
fn start(rules: &[&str]) -> (Daemon, FuseClient, u64) {
    require_root("creating files for other users and chown need root");
    let d = Daemon::start(rules);
    std::fs::create_dir(d.path("sub")).unwrap();
    std::fs::set_permissions(d.path("sub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = d.client();
    let sub = c.lookup(ROOT, "sub").unwrap().nodeid;
    (d, c, sub)
}

fn owner(d: &Daemon, rel: &str) -> (u32, u32) {
    let m = std::fs::symlink_metadata(d.path(rel)).unwrap();
    (m.uid(), m.gid())
}

fn chown(c: &FuseClient, node: u64, uid: Option<u32>, gid: Option<u32>) -> FResult<AttrOut> {
    let mut s = SetattrIn::default();
    if let Some(u) = uid {
        s.valid |= FATTR_UID;
        s.uid = u;
    }
    if let Some(g) = gid {
        s.valid |= FATTR_GID;
        s.gid = g;
    }
    c.setattr(node, &s)
}

fn host_chown(d: &Daemon, rel: &str, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(d.path(rel), Some(uid), Some(gid)).unwrap();
}

#[test]
#[ignore = "needs root"]
fn map_translates_creates_chown_and_every_attribute_reply() {
    let (d, c, sub) = start(&[
        "--translate-uid",
        "map:1000:2000:10",
        "--translate-gid=map:1000:2000:10",
    ]);
    c.set_caller(caller(1000, 1001));

    // Creates run as the translated caller; replies show the guest's ids.
    let (f, o) = c.create(sub, "file", libc::O_RDWR as u32, 0o600).unwrap();
    assert_eq!(owner(&d, "sub/file"), (2000, 2001));
    assert_eq!((f.attr.uid, f.attr.gid), (1000, 1001), "CREATE entry");
    c.release(f.nodeid, o.fh).unwrap();
    let dir = c.mkdir(sub, "dir", 0o755).unwrap();
    assert_eq!(owner(&d, "sub/dir"), (2000, 2001));
    assert_eq!((dir.attr.uid, dir.attr.gid), (1000, 1001), "MKDIR entry");
    let fifo = c.mknod(sub, "fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(owner(&d, "sub/fifo"), (2000, 2001));
    assert_eq!(fifo.attr.uid, 1000, "MKNOD entry");
    let link = c.symlink(sub, "link", "file").unwrap();
    assert_eq!(owner(&d, "sub/link"), (2000, 2001));
    assert_eq!(link.attr.uid, 1000, "SYMLINK entry");

    let a = c.getattr(f.nodeid).unwrap();
    assert_eq!((a.attr.uid, a.attr.gid), (1000, 1001), "GETATTR");
    let e = c.lookup(sub, "file").unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1000, 1001), "LOOKUP");
    // Mode 0600 on a file the host says 2000 owns: the guest's 1000 is its owner.
    c.access(f.nodeid, (libc::R_OK | libc::W_OK) as u32)
        .unwrap();
    assert_eq!(
        errno(c.as_caller(caller(2000, 2000), |c| {
            c.access(f.nodeid, libc::R_OK as u32)
        })),
        libc::EACCES,
        "host uid 2000 is nobody the guest knows as the owner"
    );

    // A chown by root lands translated, and SETATTR's reply is in guest ids.
    c.set_caller(Caller::ROOT);
    let a = chown(&c, f.nodeid, Some(1005), Some(1009)).unwrap();
    assert_eq!(owner(&d, "sub/file"), (2005, 2009));
    assert_eq!((a.attr.uid, a.attr.gid), (1005, 1009), "SETATTR reply");
    let a = chown(&c, f.nodeid, None, Some(1003)).unwrap();
    assert_eq!(owner(&d, "sub/file"), (2005, 2003), "uid untouched");
    assert_eq!((a.attr.uid, a.attr.gid), (1005, 1003));
    // Outside the rule, ids pass unchanged both ways.
    chown(&c, f.nodeid, Some(1010), Some(500)).unwrap();
    assert_eq!(owner(&d, "sub/file"), (1010, 500));

    // Host files: mapped host ids come back as guest ids, unmapped ones unchanged.
    std::fs::write(d.path("sub/hosts"), b"").unwrap();
    host_chown(&d, "sub/hosts", 2007, 3000);
    let e = c.lookup(sub, "hosts").unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1007, 3000));
    host_chown(&d, "sub/hosts", 1000, 2010);
    let a = c.getattr(e.nodeid).unwrap();
    assert_eq!(
        (a.attr.uid, a.attr.gid),
        (1000, 2010),
        "host 1000 and 2010 are outside the host side of map:1000:2000:10"
    );

    // READDIRPLUS entries carry translated attributes too.
    let ents = c.readdir_all(sub, true).unwrap();
    let dir_ent = ents.iter().find(|e| e.name == b"dir").unwrap();
    let attr = dir_ent.entry.as_ref().unwrap().attr;
    assert_eq!((attr.uid, attr.gid), (1000, 1001), "READDIRPLUS");
}

#[test]
#[ignore = "needs root"]
fn squash_folds_every_guest_id_onto_one_host_id_and_back() {
    // virtiofsd's unprivileged setup: all guest ids become the host user 1000, whose
    // files the guest sees as root's.
    let (d, c, sub) = start(&[
        "--translate-uid=squash-guest:0:1000:4294967295",
        "--translate-gid=squash-guest:0:1000:4294967295",
        "--translate-uid=squash-host:1000:0:1",
        "--translate-gid=squash-host:1000:0:1",
    ]);
    let e = c.mkdir(sub, "by-root", 0o755).unwrap();
    assert_eq!(owner(&d, "sub/by-root"), (1000, 1000));
    assert_eq!((e.attr.uid, e.attr.gid), (0, 0));
    let (f, o) = c
        .as_caller(caller(4242, 77), |c| {
            c.create(sub, "by-user", libc::O_RDWR as u32, 0o644)
        })
        .unwrap();
    c.release(f.nodeid, o.fh).unwrap();
    assert_eq!(owner(&d, "sub/by-user"), (1000, 1000));
    assert_eq!((f.attr.uid, f.attr.gid), (0, 0));
    let a = chown(&c, f.nodeid, Some(55), Some(66)).unwrap();
    assert_eq!(owner(&d, "sub/by-user"), (1000, 1000));
    assert_eq!((a.attr.uid, a.attr.gid), (0, 0));
    // Host ids outside squash-host's one-id range are shown as they are.
    std::fs::write(d.path("sub/other"), b"").unwrap();
    host_chown(&d, "sub/other", 1001, 0);
    let e = c.lookup(sub, "other").unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (1001, 0));
}

#[test]
#[ignore = "needs root"]
fn forbid_guest_refuses_creates_and_chowns_with_eio() {
    let (d, c, sub) = start(&[
        "--translate-uid=forbid-guest:500:100",
        "--translate-gid=forbid-guest:700:1",
    ]);
    let bad = caller(550, 1);
    let eio = libc::EIO;
    assert_eq!(errno(c.as_caller(bad, |c| c.mkdir(sub, "d", 0o755))), eio);
    assert_eq!(
        errno(c.as_caller(bad, |c| c.create(sub, "f", libc::O_RDWR as u32, 0o644))),
        eio
    );
    assert_eq!(
        errno(c.as_caller(bad, |c| c.mknod(sub, "p", libc::S_IFIFO | 0o644, 0))),
        eio
    );
    assert_eq!(errno(c.as_caller(bad, |c| c.symlink(sub, "l", "x"))), eio);
    assert_eq!(
        errno(c.as_caller(caller(1, 700), |c| c.mkdir(sub, "d", 0o755))),
        eio,
        "a forbidden gid"
    );
    assert!(!d.path("sub/d").exists() && !d.path("sub/f").exists());
    // Right outside the range, and requests that make no file: allowed.
    let e = c
        .as_caller(caller(600, 1), |c| c.mkdir(sub, "d", 0o755))
        .unwrap();
    assert_eq!(owner(&d, "sub/d"), (600, 1));
    c.as_caller(bad, |c| c.getattr(e.nodeid)).unwrap();
    // A chown to a forbidden id, by anyone.
    assert_eq!(errno(chown(&c, e.nodeid, Some(599), None)), eio);
    assert_eq!(errno(chown(&c, e.nodeid, None, Some(700))), eio);
    assert_eq!(owner(&d, "sub/d"), (600, 1));
    chown(&c, e.nodeid, Some(499), Some(701)).unwrap();
    assert_eq!(owner(&d, "sub/d"), (499, 701));
    // Host files owned by a forbidden id are still shown (forbid is guest-to-host only).
    host_chown(&d, "sub/d", 550, 700);
    let a = c.getattr(e.nodeid).unwrap();
    assert_eq!((a.attr.uid, a.attr.gid), (550, 700));
}

#[test]
fn bad_rules_fail_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let sock = sock.to_str().unwrap();
    for (args, what) in [
        (
            &["--translate-uid=map:1:2"][..],
            "--translate-uid 'map:1:2'",
        ),
        (
            &["--translate-gid=squash:0:1:2"][..],
            "unknown type 'squash'",
        ),
        (
            &["--translate-uid=map:1:0:4294967295"][..],
            "past 4294967295",
        ),
        (
            &[
                "--translate-gid=forbid-guest:0:999",
                "--translate-gid=map:10:10:1",
            ][..],
            "--translate-gid map:10:10:1: range [10, 11) overlaps",
        ),
        (&["-o", "translate_uid=map:0:0:1"][..], "translate_uid"),
    ] {
        let mut all = vec!["--socket-path", sock, "--shared-dir", "/"];
        all.extend_from_slice(args);
        let (code, err) = run_vfsd(&all);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
    assert!(!std::path::Path::new(sock).exists());
}

/// A `guest` (or `host`) 1:1 rule's target range is checked against the id space too, not
/// only its source range (a security review found `wrapping_add` there): as
/// docs/translate.md promises, a range past the last id stops vfsd; were
/// `guest:1000:4294967290:100` accepted, guest uid 1006 would map onto host uid 0 and
/// that guest user's files be created as host root.
#[test]
#[ignore = "needs root"]
fn a_host_range_past_the_last_id_is_refused_not_wrapped_to_root() {
    require_root("needs root");
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = dir.path().join("s");
    let mut child = std::process::Command::new(vfsd_bin())
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
