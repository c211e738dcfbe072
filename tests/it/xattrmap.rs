//! xattr name mapping (`--xattrmap` and the default map) and xattrs of nodes, which vfsd
//! never opens for them (symlinks, FIFOs and devices included), through the real
//! vhost-user socket; the host side is checked with the host's own xattr calls.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    cpath, errno, file_capability, host_getxattr as host_get, host_setxattr as host_set, is_root,
    require_root, run_vfsd, Daemon, NOBODY, ROOT,
};
use vfsd::frontend::fuse::*;

fn names(list: &[u8]) -> Vec<String> {
    list.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .collect()
}

fn host_list(p: &Path) -> Vec<String> {
    let p = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: NUL-terminated path; the kernel writes at most buf.len() bytes.
    let r = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "llistxattr: {}", std::io::Error::last_os_error());
    names(&buf[..r as usize])
}

fn guest_list(c: &FuseClient, node: u64) -> Vec<String> {
    let count = c.listxattr(node, 0).unwrap();
    let count = u32::from_ne_bytes(count[..4].try_into().unwrap());
    let list = c.listxattr(node, 65536).unwrap();
    assert_eq!(
        list.len() as u32,
        count,
        "LISTXATTR size 0 gives the mapped size"
    );
    if count > 0 {
        assert_eq!(errno(c.listxattr(node, count - 1)), libc::ERANGE);
    }
    names(&list)
}

#[test]
fn a_rule_string_maps_guest_names_and_filters_the_host_list() {
    let rules = ":prefix:all:security.:user.virtiofs.:
                 :bad:server::security.:
                 :bad:client:user.virtiofs.::
                 /unsupported/all/trusted./trusted./
                 /bad/all/user.secret./user.secret./
                 :ok:all:::";
    let d = Daemon::start(&["--xattr", "--xattrmap", rules]);
    let p = d.path("f");
    std::fs::write(&p, b"").unwrap();
    host_set(&p, "user.secret.k", b"host").unwrap();
    host_set(&p, "user.plain", b"2").unwrap();
    if is_root() {
        // The host's own label: hidden from the guest, untouched by it.
        host_set(&p, "security.hostlabel", b"host_t").unwrap();
    }
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap().nodeid;

    c.setxattr(f, "security.selinux", b"guest_t", 0).unwrap();
    assert_eq!(
        host_get(&p, "user.virtiofs.security.selinux").unwrap(),
        b"guest_t"
    );
    assert!(host_get(&p, "security.selinux").is_err());
    assert_eq!(c.getxattr(f, "security.selinux", 64).unwrap(), b"guest_t");
    let mut list = guest_list(&c, f);
    list.sort();
    assert_eq!(list, ["security.selinux", "user.plain"]);

    // bad: EPERM to set and remove, ENODATA to read, hidden from the list.
    assert_eq!(
        errno(c.setxattr(f, "user.virtiofs.x", b"1", 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(c.getxattr(f, "user.virtiofs.security.selinux", 64)),
        libc::ENODATA
    );
    assert_eq!(
        errno(c.removexattr(f, "user.virtiofs.security.selinux")),
        libc::EPERM
    );
    assert_eq!(errno(c.setxattr(f, "user.secret.k", b"1", 0)), libc::EPERM);
    assert_eq!(errno(c.getxattr(f, "user.secret.k", 64)), libc::ENODATA);
    assert_eq!(host_get(&p, "user.secret.k").unwrap(), b"host");
    // unsupported: EOPNOTSUPP every way.
    assert_eq!(errno(c.setxattr(f, "trusted.t", b"1", 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(c.getxattr(f, "trusted.t", 64)), libc::EOPNOTSUPP);
    assert_eq!(errno(c.removexattr(f, "trusted.t")), libc::EOPNOTSUPP);

    c.removexattr(f, "security.selinux").unwrap();
    assert_eq!(
        host_get(&p, "user.virtiofs.security.selinux"),
        Err(libc::ENODATA)
    );
    if is_root() {
        assert_eq!(host_get(&p, "security.hostlabel").unwrap(), b"host_t");
    }
}

#[test]
fn an_unparsable_map_stops_start_up_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let sock = sock.to_str().unwrap();
    for (map, what) in [
        (
            "--xattrmap=:ok:all:::/ok/some///",
            "--xattrmap: rule 2: unknown scope 'some'",
        ),
        (
            "--xattrmap=:prefix:all:a.",
            "--xattrmap: rule 1: key is not terminated",
        ),
        ("--xattrmap=:map:a.:b.::ok:all:::", "must be the last rule"),
    ] {
        let (code, err) = run_vfsd(&["--socket-path", sock, "--shared-dir", "/", map]);
        assert_eq!(code, Some(1), "{map}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(what), "{err}");
    }
    let o = "source=/,xattrmap=:tomato:all:::";
    let (code, err) = run_vfsd(&["--socket-path", sock, "-o", o]);
    assert_eq!(code, Some(1));
    assert!(err.contains("unknown type 'tomato'"), "{err}");
    assert!(!Path::new(sock).exists());
}

#[test]
fn by_default_a_guest_capability_lives_under_the_private_prefix() {
    let d = Daemon::start(&["--xattr", "--cache", "never"]);
    std::fs::set_permissions(&d.share, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = d.path("setcap-me");
    std::fs::write(&p, vec![7u8; 4096]).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cap = file_capability();
    let c = d.client();
    let f = c.lookup(ROOT, "setcap-me").unwrap().nodeid;

    // What setcap does, as guest root.
    c.setxattr(f, "security.capability", &cap, 0).unwrap();
    assert_eq!(host_get(&p, "user.vfsd.security.capability").unwrap(), cap);
    assert_eq!(
        host_get(&p, "security.capability"),
        Err(libc::ENODATA),
        "no real capability on the host"
    );
    assert_eq!(c.getxattr(f, "security.capability", 64).unwrap(), cap);
    c.setxattr(f, "trusted.overlay.opaque", b"y", 0).unwrap();
    assert_eq!(
        host_get(&p, "user.vfsd.trusted.overlay.opaque").unwrap(),
        b"y"
    );
    let mut list = guest_list(&c, f);
    list.sort();
    assert_eq!(list, ["security.capability", "trusted.overlay.opaque"]);

    // The private names can't be reached directly: no forged capability.
    assert_eq!(
        errno(c.setxattr(f, "user.vfsd.security.capability", &cap, 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(c.getxattr(f, "user.vfsd.security.capability", 64)),
        libc::ENODATA
    );
    assert_eq!(
        errno(c.removexattr(f, "user.vfsd.trusted.overlay.opaque")),
        libc::EPERM
    );
    // Names merely starting alike are the guest's own.
    c.setxattr(f, "user.vfsdx", b"1", 0).unwrap();
    assert_eq!(host_get(&p, "user.vfsdx").unwrap(), b"1");

    if is_root() {
        // A real host capability is hidden: the guest's name reaches its own.
        host_set(&p, "security.capability", &cap).unwrap();
        let list = guest_list(&c, f);
        assert_eq!(
            list.iter().filter(|n| *n == "security.capability").count(),
            1,
            "{list:?}"
        );
    }

    // A non-root write drops the guest's capability (and the host's).
    let o = c.open(f, libc::O_RDWR as u32).unwrap();
    c.as_caller(NOBODY, |c| c.write(f, o.fh, 0, b"changed"))
        .unwrap();
    assert_eq!(
        host_get(&p, "user.vfsd.security.capability"),
        Err(libc::ENODATA)
    );
    assert_eq!(host_get(&p, "security.capability"), Err(libc::ENODATA));
    assert_eq!(
        errno(c.getxattr(f, "security.capability", 64)),
        libc::ENODATA
    );
    assert!(host_list(&p).contains(&"user.vfsd.trusted.overlay.opaque".to_string()));
}

/// Aborts the test binary if `f` has not returned in time (a FIFO opened for reading
/// without O_NONBLOCK would block forever).
fn with_watchdog<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let what = what.to_string();
    std::thread::spawn(move || {
        for _ in 0..600 {
            std::thread::sleep(Duration::from_millis(100));
            if d.load(Ordering::Relaxed) {
                return;
            }
        }
        eprintln!("{what}: no reply in 60 s (did vfsd open a FIFO?)");
        std::process::exit(1);
    });
    let r = f();
    done.store(true, Ordering::Relaxed);
    r
}

/// An inotify watch for opens (O_PATH opens don't count).
struct OpenWatch(i32);

impl OpenWatch {
    fn new(paths: &[&Path]) -> OpenWatch {
        // SAFETY: plain syscalls with NUL-terminated paths.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        for p in paths {
            let p = cpath(p);
            // SAFETY: as above.
            let wd = unsafe { libc::inotify_add_watch(fd, p.as_ptr(), libc::IN_OPEN) };
            assert!(wd >= 0, "{}", std::io::Error::last_os_error());
        }
        OpenWatch(fd)
    }

    fn opened(&self) -> bool {
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a live buffer.
        unsafe { libc::read(self.0, buf.as_mut_ptr().cast(), buf.len()) > 0 }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        // SAFETY: our own fd.
        unsafe { libc::close(self.0) };
    }
}

/// Makes a symlink, a FIFO and a character device in `dir`.
fn special_files(dir: &Path) {
    std::os::unix::fs::symlink("f", dir.join("l")).unwrap();
    for (name, mode, dev) in [
        ("p", libc::S_IFIFO | 0o666, 0),
        ("c", libc::S_IFCHR | 0o666, libc::makedev(1, 3)),
    ] {
        let p = cpath(&dir.join(name));
        // SAFETY: NUL-terminated path.
        let r = unsafe { libc::mknod(p.as_ptr(), mode, dev) };
        assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    }
}

#[test]
#[ignore = "needs root"]
fn symlinks_fifos_and_devices_have_xattrs_in_every_sandbox_without_being_opened() {
    require_root("mknod and trusted.* need root");
    // The host kernel's answers on the same kinds of files, for comparison.
    let reference = tempfile::tempdir().unwrap();
    std::fs::write(reference.path().join("f"), b"").unwrap();
    special_files(reference.path());

    for (sandbox, handles) in [
        ("namespace", "never"),
        ("chroot", "never"),
        ("none", "never"),
        // Nodes without an fd of their own: the O_PATH fd comes from the handle.
        ("namespace", "mandatory"),
    ] {
        let d = Daemon::start(&[
            "--xattr",
            "--xattrmap=:ok:all:::",
            // trusted.* needs CAP_SYS_ADMIN on the host.
            "--modcaps=+sys_admin",
            "--sandbox",
            sandbox,
            "--seccomp",
            "kill",
            "--inode-file-handles",
            handles,
        ]);
        let sandbox = format!("{sandbox}, handles {handles}");
        std::fs::write(d.path("f"), b"").unwrap();
        special_files(&d.share);
        let watch = OpenWatch::new(&[&d.path("p"), &d.path("c")]);
        let c = d.client();
        with_watchdog(&sandbox, || {
            for name in ["l", "p", "c"] {
                let what = format!("{sandbox} {name}");
                let n = c.lookup(ROOT, name).unwrap().nodeid;
                let host = d.path(name);
                let twin = reference.path().join(name);

                c.setxattr(n, "trusted.t", b"v", 0).unwrap();
                assert_eq!(host_get(&host, "trusted.t").unwrap(), b"v", "{what}");
                assert_eq!(c.getxattr(n, "trusted.t", 64).unwrap(), b"v", "{what}");
                assert_eq!(guest_list(&c, n), host_list(&host), "{what}");
                assert!(guest_list(&c, n).contains(&"trusted.t".into()), "{what}");
                c.removexattr(n, "trusted.t").unwrap();
                assert_eq!(host_get(&host, "trusted.t"), Err(libc::ENODATA), "{what}");
                assert_eq!(errno(c.getxattr(n, "trusted.t", 64)), libc::ENODATA);

                // user.* exists only on regular files and directories: the host says so.
                let set = host_set(&twin, "user.u", b"1").unwrap_err();
                assert_eq!(set, libc::EPERM, "{what}");
                assert_eq!(errno(c.setxattr(n, "user.u", b"1", 0)), set, "{what}");
                let get = host_get(&twin, "user.u").unwrap_err();
                assert_eq!(errno(c.getxattr(n, "user.u", 64)), get, "{what}");
            }
        });
        // The symlink's own xattrs, not its target's.
        assert!(host_list(&d.path("f")).is_empty());
        assert!(
            !watch.opened(),
            "{sandbox}: vfsd opened the FIFO or the device"
        );
        assert!(
            d.stats().is_object(),
            "{sandbox}: the daemon survived seccomp"
        );
    }
}

#[test]
#[ignore = "needs root"]
fn the_default_map_keeps_privileged_names_off_special_files() {
    require_root("mknod needs root");
    let d = Daemon::start(&["--xattr"]);
    std::fs::write(d.path("f"), b"").unwrap();
    special_files(&d.share);
    let c = d.client();
    with_watchdog("default map", || {
        for name in ["l", "p", "c"] {
            let n = c.lookup(ROOT, name).unwrap().nodeid;
            // Mapped to user.vfsd.*, which the host has no room for on these files.
            assert_eq!(errno(c.setxattr(n, "trusted.t", b"v", 0)), libc::EPERM);
            let cap = file_capability();
            assert_eq!(
                errno(c.setxattr(n, "security.capability", &cap, 0)),
                libc::EPERM
            );
            assert_eq!(errno(c.getxattr(n, "trusted.t", 64)), libc::ENODATA);
            assert!(guest_list(&c, n).is_empty(), "{name}");
        }
    });
}

#[test]
fn a_read_only_share_says_erofs_before_the_map_refuses() {
    let d = Daemon::start(&["--xattr", "--readonly"]);
    std::fs::write(d.path("f"), b"").unwrap();
    let c = d.client();
    let f = c.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(errno(c.setxattr(f, "user.vfsd.x", b"1", 0)), libc::EROFS);
    assert_eq!(errno(c.removexattr(f, "user.vfsd.x")), libc::EROFS);
    assert_eq!(errno(c.getxattr(f, "user.vfsd.x", 64)), libc::ENODATA);
}

#[test]
fn xattrs_of_regular_files_and_directories_never_open_them_on_the_host() {
    // An open for an xattr call would break a host lease, send the host's inotify
    // watchers open and close events, and fail where the daemon may not read the file.
    let d = Daemon::start(&["--xattr"]);
    std::fs::write(d.path("f"), b"").unwrap();
    std::fs::create_dir(d.path("dir")).unwrap();
    let c = d.client();
    let watch = OpenWatch::new(&[&d.path("f"), &d.path("dir")]);
    for name in ["f", "dir"] {
        let n = c.lookup(ROOT, name).unwrap().nodeid;
        c.setxattr(n, "user.a", b"1", 0).unwrap();
        assert_eq!(host_get(&d.path(name), "user.a").unwrap(), b"1", "{name}");
        assert_eq!(c.getxattr(n, "user.a", 64).unwrap(), b"1", "{name}");
        let size = c.getxattr(n, "user.a", 0).unwrap();
        assert_eq!(u32::from_ne_bytes(size[..4].try_into().unwrap()), 1);
        assert_eq!(guest_list(&c, n), host_list(&d.path(name)), "{name}");
        c.removexattr(n, "user.a").unwrap();
        assert_eq!(errno(c.getxattr(n, "user.a", 64)), libc::ENODATA, "{name}");
        assert_eq!(errno(c.removexattr(n, "user.a")), libc::ENODATA, "{name}");
    }
    assert!(!watch.opened(), "vfsd opened a file for an xattr request");
}

#[test]
fn long_xattr_lists_and_values_around_the_stack_buffer_size() {
    // On tmpfs: ext4 without ea_inode keeps all of a file's xattrs in one block.
    let share = tempfile::tempdir_in("/dev/shm").unwrap();
    let d = Daemon::start_on(share.path(), &["--xattr"]);
    std::fs::write(d.path("f"), b"").unwrap();
    let c = d.client();
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    // 40 names of 120 bytes: a list of 4,840 bytes, longer than the first try's buffer.
    for i in 0..40 {
        let name = format!("user.{i:03}{}", "x".repeat(112));
        host_set(&d.path("f"), &name, b"v").unwrap();
    }
    assert_eq!(guest_list(&c, n), host_list(&d.path("f")));
    assert_eq!(guest_list(&c, n).len(), 40);
    for len in [4095, 4096, 4097, 65536] {
        let v: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        c.setxattr(n, "user.v", &v, 0).unwrap();
        assert_eq!(c.getxattr(n, "user.v", len as u32).unwrap(), v, "{len}");
        assert_eq!(c.getxattr(n, "user.v", 65536).unwrap(), v, "{len}");
        let size = c.getxattr(n, "user.v", 0).unwrap();
        assert_eq!(
            u32::from_ne_bytes(size[..4].try_into().unwrap()),
            len as u32
        );
        assert_eq!(errno(c.getxattr(n, "user.v", len as u32 - 1)), libc::ERANGE);
    }
}

/// The `*xattrat` calls (Linux 6.13), for a profile that refuses them.
const XATTRAT: [i64; 4] = [
    vfsd::sys::SYS_GETXATTRAT,
    vfsd::sys::SYS_SETXATTRAT,
    vfsd::sys::SYS_LISTXATTRAT,
    vfsd::sys::SYS_REMOVEXATTRAT,
];

#[test]
fn xattrs_of_files_work_where_an_outer_profile_refuses_the_xattrat_calls_and_unshare() {
    // A container profile on a kernel before 6.13: no *xattrat, and no unshare without
    // CAP_SYS_ADMIN, so the path form's own working directory is out of reach too.
    // Regular files and directories are then opened for the f*xattr calls, as before.
    let denied = [XATTRAT.as_slice(), &[libc::SYS_unshare]].concat();
    let d = Daemon::start_denied(&denied, &["--xattr", "--sandbox", "none"]);
    std::fs::write(d.path("f"), b"").unwrap();
    std::fs::create_dir(d.path("dir")).unwrap();
    let c = d.client();
    for name in ["f", "dir"] {
        let n = c.lookup(ROOT, name).unwrap().nodeid;
        c.setxattr(n, "user.a", b"1", 0).unwrap();
        assert_eq!(host_get(&d.path(name), "user.a").unwrap(), b"1", "{name}");
        assert_eq!(c.getxattr(n, "user.a", 64).unwrap(), b"1", "{name}");
        assert!(guest_list(&c, n).contains(&"user.a".into()), "{name}");
        c.removexattr(n, "user.a").unwrap();
        assert_eq!(errno(c.getxattr(n, "user.a", 64)), libc::ENODATA, "{name}");
    }
}

#[test]
fn xattrs_work_where_an_outer_seccomp_profile_refuses_the_xattrat_calls() {
    // A container runtime's profile older than Linux 6.13 may answer EPERM, not ENOSYS.
    let d = Daemon::start_denied(&XATTRAT, &["--xattr"]);
    std::fs::write(d.path("f"), b"").unwrap();
    std::os::unix::fs::symlink("f", d.path("l")).unwrap();
    let c = d.client();
    for name in ["f", "l"] {
        let n = c.lookup(ROOT, name).unwrap().nodeid;
        let want = host_set(&d.path(name), "user.a", b"1").err();
        let got = match c.setxattr(n, "user.a", b"1", 0) {
            Ok(()) => None,
            r => Some(errno(r)),
        };
        assert_eq!(got, want, "{name}");
        if want.is_none() {
            assert_eq!(c.getxattr(n, "user.a", 64).unwrap(), b"1", "{name}");
            assert!(guest_list(&c, n).contains(&"user.a".into()), "{name}");
            c.removexattr(n, "user.a").unwrap();
        }
        assert_eq!(errno(c.getxattr(n, "user.a", 64)), libc::ENODATA, "{name}");
    }
}
