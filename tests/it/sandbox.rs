//! The sandbox modes, seen from the host: where the daemon's root is, which fds it keeps,
//! which capabilities it holds; and that it still serves the guest in each mode.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{self, read, require_root, Daemon, ROOT};

/// The process actually serving: the spawned one, or its child in namespace mode.
fn serving_pid(d: &Daemon) -> i32 {
    common::serving_pid(d.pid())
}

fn fd_targets(pid: i32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// Connects (so the daemon is past its sandbox set-up) and checks guest I/O works.
fn serves_io(d: &Daemon) -> vfsd::frontend::fuse::FuseClient {
    let c = d.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"sandboxed").unwrap();
    assert_eq!(read(&d.path("f")), b"sandboxed");
    c
}

#[test]
#[ignore = "needs root"]
fn namespace_sandbox_pivots_into_the_share_and_closes_stray_fds() {
    require_root("needs root for mount namespaces without a user namespace");
    // An fd without CLOEXEC, inherited by the daemon: the sandbox must close it.
    let leak = std::fs::File::open("/etc/hostname").unwrap();
    unsafe { libc::fcntl(leak.as_raw_fd(), libc::F_SETFD, 0) };
    let d = Daemon::start(&["--sandbox", "namespace"]);
    let _c = serves_io(&d);
    let pid = serving_pid(&d);
    assert_ne!(
        pid,
        d.pid(),
        "namespace mode serves from a child in the new pid namespace"
    );
    assert_root_is_share(pid, &d);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(
        nspid.split_whitespace().count(),
        3,
        "two pid namespace levels: {nspid}"
    );
    assert!(
        fd_targets(pid).iter().all(|p| !p.ends_with("hostname")),
        "inherited fd left open"
    );
    // Capabilities: only virtiofsd's set (CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETGID,
    // SETUID, MKNOD, SETFCAP) plus LINUX_IMMUTABLE (guest root's chattr +i/+a) and, for
    // the default --inode-file-handles=prefer, DAC_READ_SEARCH (open_by_handle_at).
    let cap = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    let eff = u64::from_str_radix(cap.split_whitespace().nth(1).unwrap(), 16).unwrap();
    let want = [0u64, 1, 2, 3, 4, 6, 7, 9, 27, 31]
        .iter()
        .fold(0, |m, b| m | 1 << b);
    assert_eq!(eff, want, "{cap}");
    // No supplementary groups of its own: creates count only the guest caller's.
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(groups.split_whitespace().count(), 1, "{groups}");
    // Its network namespace is not the host's.
    let ns = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/net")).unwrap();
    assert_ne!(ns(pid), ns(std::process::id() as i32));
    drop(leak);
}

#[test]
#[ignore = "needs root"]
fn chroot_sandbox_confines_the_root() {
    require_root("--sandbox chroot needs root");
    let d = Daemon::start(&["--sandbox", "chroot"]);
    let _c = serves_io(&d);
    // A child serves; the parent, outside the chroot, only supervises.
    let pid = serving_pid(&d);
    assert_ne!(pid, d.pid(), "chroot mode serves from a child");
    assert_root_is_share(pid, &d);
}

/// The daemon's `/` is the share's directory (same inode on the same device).
fn assert_root_is_share(pid: i32, d: &Daemon) {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata(format!("/proc/{pid}/root/")).unwrap();
    let share = std::fs::metadata(&d.share).unwrap();
    assert_eq!((root.dev(), root.ino()), (share.dev(), share.ino()));
    assert!(
        std::fs::metadata(format!("/proc/{pid}/root/etc/passwd")).is_err(),
        "host files visible"
    );
}

#[test]
#[ignore = "needs root"]
fn modcaps_adjusts_the_capability_set() {
    require_root("needs root");
    let d = Daemon::start(&["--sandbox", "none", "--modcaps", "-mknod:-setfcap"]);
    let c = d.client();
    let status = std::fs::read_to_string(format!("/proc/{}/status", serving_pid(&d))).unwrap();
    let cap = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    let eff = u64::from_str_radix(cap.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert_eq!(eff & (1 << 27), 0, "CAP_MKNOD dropped");
    assert_ne!(eff & 1, 0, "CAP_CHOWN kept");
    // Without CAP_MKNOD the guest's mknod of a device fails the way the host says.
    let r = c.mknod(ROOT, "dev", libc::S_IFCHR | 0o600, 0x0101);
    assert_eq!(r.unwrap_err().errno(), Some(libc::EPERM));
}

#[test]
fn bad_sandbox_options_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::vfsd_bin())
        .args(["--socket-path"])
        .arg(dir.path().join("s"))
        .arg("--shared-dir")
        .arg(dir.path())
        .args(["--modcaps", "+bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("unknown capability"), "{err}");
}

fn chown(p: &std::path::Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

#[test]
#[ignore = "needs root"]
fn uid_and_gid_maps_shift_ownership_between_guest_and_host() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_root("mapping other ids than one's own needs root (or newuidmap)");
    let dir = tempfile::tempdir().unwrap();
    // The namespace's root (host uid 100000) must reach the share.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    chown(&share, 100_000, 100_000);
    std::fs::write(share.join("theirs"), b"x").unwrap();
    chown(&share.join("theirs"), 100_005, 100_007);
    std::fs::write(share.join("hosts"), b"x").unwrap(); // root's: not mapped
    let d = Daemon::start_on(
        &share,
        &["--uid-map=:0:100000:65536:", "--gid-map=:0:100000:65536:"],
    );
    let c = d.client();
    let t = c.lookup(ROOT, "theirs").unwrap();
    assert_eq!(
        (t.attr.uid, t.attr.gid),
        (5, 7),
        "host ids seen through the map"
    );
    let h = c.lookup(ROOT, "hosts").unwrap();
    assert_eq!(
        (h.attr.uid, h.attr.gid),
        (65534, 65534),
        "unmapped ids are the overflow id"
    );
    // What the guest's root creates belongs to what 0 maps to.
    let (e, o) = c.create(ROOT, "new", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"mapped").unwrap();
    let m = std::fs::metadata(share.join("new")).unwrap();
    assert_eq!((m.uid(), m.gid()), (100_000, 100_000));
    assert_eq!(e.attr.uid, 0);
}

const ID_MAPS: [&str; 2] = ["--uid-map=:0:100000:65536:", "--gid-map=:0:100000:65536:"];

/// A root vfsd (namespace sandbox) started with `extra` on a share its id map reaches,
/// past one answered request, its frontend still connected (held, never read): a
/// frontend's going would end the daemon by itself. With `launcher_state`, vfsd starts with SIGCHLD ignored and
/// the termination signals blocked, as exec keeps a launcher's.
struct Sandboxed {
    sock: PathBuf,
    child: std::process::Child,
    _frontend: vfsd::frontend::fuse::FuseClient,
    _dir: tempfile::TempDir,
}

fn start_sandboxed(extra: &[&str], launcher_state: bool) -> Sandboxed {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    // The namespace's root (host uid 100000) must reach the share.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    chown(&share, 100_000, 100_000);
    let sock = dir.path().join("s");
    let mut cmd = std::process::Command::new(common::vfsd_bin());
    cmd.arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(extra);
    if launcher_state {
        // SAFETY: signal(2) and sigprocmask(2) on plain data, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
                    libc::sigaddset(&mut set, sig);
                }
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                Ok(())
            })
        };
    }
    let child = cmd.spawn().unwrap();
    common::wait_for_socket(&sock);
    let c = connect(&sock);
    c.getattr(ROOT).unwrap();
    Sandboxed {
        sock,
        child,
        _frontend: c,
        _dir: dir,
    }
}

/// `start_sandboxed`, then SIGTERM: it must exit 0 within 10 s and remove the socket's
/// name.
fn sigterm_ends_it_cleanly(extra: &[&str], launcher_state: bool) {
    let mut s = start_sandboxed(extra, launcher_state);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let st = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = s.child.kill();
            let _ = s.child.wait();
            panic!("{extra:?}: SIGTERM did not end vfsd");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(st.success(), "{extra:?}: {st:?}");
    assert!(
        !s.sock.exists(),
        "{extra:?}: the socket's name is left behind"
    );
}

/// vfsd's children (the id-map helper, the sandboxed daemon under its supervisor) stay
/// its own to wait for whatever the launcher ignored (else --uid-map fails to start and
/// a SIGTERM ends the supervisor with status 1), and signals a launcher blocked reach it
/// (else SIGTERM is never acted on).
#[test]
#[ignore = "needs root"]
fn a_launchers_ignored_sigchld_and_blocked_signals_change_nothing() {
    require_root("the namespace sandbox without a user namespace, and mapping other ids");
    sigterm_ends_it_cleanly(&[], true);
    sigterm_ends_it_cleanly(&ID_MAPS, true);
}

/// The sandboxed daemon dies with its supervisor, even one killed outright (SIGKILL, so
/// nothing is relayed): its parent-death signal must survive taking the namespace's ids.
#[test]
#[ignore = "needs root"]
fn the_sandboxed_daemon_dies_with_its_supervisor() {
    require_root("the namespace sandbox without a user namespace, and mapping other ids");
    for extra in [&[][..], &ID_MAPS] {
        let mut s = start_sandboxed(extra, false);
        let daemon = common::serving_pid(s.child.id() as i32);
        assert_ne!(
            daemon,
            s.child.id() as i32,
            "{extra:?}: no supervised child"
        );
        s.child.kill().unwrap();
        s.child.wait().unwrap();
        let t = Instant::now();
        while std::path::Path::new(&format!("/proc/{daemon}")).exists()
            && !std::fs::read_to_string(format!("/proc/{daemon}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{extra:?}: the daemon outlived its supervisor"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A sandbox that can't be entered (chroot for a user who is not root) ends start-up with
/// one line, and the socket's name, already bound, goes with it (the listener's own
/// removal on drop, before any supervisor exists).
#[test]
#[ignore = "needs root"]
fn a_sandbox_that_fails_to_start_leaves_no_socket_name() {
    require_root("dropping to another user for the test needs root");
    let dir = tempfile::tempdir().unwrap();
    chown(dir.path(), 65534, 65534);
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let sock = dir.path().join("s");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::vfsd_bin())
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(["--sandbox", "chroot", "--log-level", "error"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--sandbox chroot needs root"), "{stderr}");
    assert!(!sock.exists(), "the socket's name is left behind");
}

/// With an id map, the sandboxed daemon's host uid is what 0 maps to, which may not write
/// the socket's directory: the supervisor, which removes the name, keeps root's.
#[test]
#[ignore = "needs root"]
fn a_root_daemon_with_an_id_map_removes_its_socket_name_on_sigterm() {
    require_root("mapping other ids than one's own needs root (or newuidmap)");
    sigterm_ends_it_cleanly(&ID_MAPS, false);
}

#[test]
#[ignore = "needs root"]
fn an_unprivileged_daemon_maps_its_own_ids() {
    use std::os::unix::fs::MetadataExt;
    require_root("dropping to another user for the test needs root");
    let dir = tempfile::tempdir().unwrap();
    chown(dir.path(), 65534, 65534);
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    chown(&share, 65534, 65534);
    std::fs::write(share.join("own"), b"x").unwrap();
    chown(&share.join("own"), 65534, 65534);
    let sock = dir.path().join("s");
    // libvirt's unprivileged command line, for a user without /etc/subuid ranges.
    let mut child = spawn_as_nobody(
        &share,
        &sock,
        &["--uid-map=:0:65534:1:", "--gid-map=:0:65534:1:"],
    );
    let c = connect(&sock);
    assert_eq!(
        c.lookup(ROOT, "own").unwrap().attr.uid,
        0,
        "own uid is the namespace's 0"
    );
    let (e, _o) = c.create(ROOT, "new", libc::O_RDWR as u32, 0o644).unwrap();
    assert_eq!(e.attr.uid, 0);
    assert_eq!(std::fs::metadata(share.join("new")).unwrap().uid(), 65534);
    drop(c);
    assert!(child.wait().unwrap().success());
}

/// An unprivileged daemon (no CAP_SETFCAP) still serves writes by non-root guest users:
/// dropping a file capability that is not there must not need the privilege to remove one
/// (it gave EPERM for every such write; found by review).
#[test]
#[ignore = "needs root"]
fn an_unprivileged_daemon_serves_non_root_writes() {
    require_root("dropping to another user for the test needs root");
    let dir = tempfile::tempdir().unwrap();
    chown(dir.path(), 65534, 65534);
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    chown(&share, 65534, 65534);
    std::fs::write(share.join("f"), b"x").unwrap();
    chown(&share.join("f"), 65534, 65534);
    let sock = dir.path().join("s");
    let mut child = spawn_as_nobody(&share, &sock, &["--sandbox", "none"]);
    let c = connect(&sock);
    let e = c.lookup(ROOT, "f").unwrap();
    let o = c.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let user = vfsd::frontend::fuse::Caller {
        uid: 1000,
        gid: 1000,
        pid: 9,
    };
    assert_eq!(
        c.as_caller(user, |c| c.write(e.nodeid, o.fh, 0, b"y"))
            .unwrap(),
        1
    );
    assert_eq!(read(&share.join("f")), b"y");
    drop(c);
    assert!(child.wait().unwrap().success());
}

/// vfsd as uid 65534 (no capabilities), serving `share` on a listening socket at `sock`
/// handed over as fd 3, as libvirt starts it unprivileged; `extra` are more options.
fn spawn_as_nobody(
    share: &std::path::Path,
    sock: &std::path::Path,
    extra: &[&str],
) -> std::process::Child {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(common::vfsd_bin())
        .arg("--fd=3")
        .args(["--log-level", "warn"])
        .arg("--shared-dir")
        .arg(share)
        .args(extra)
        .stdin(std::process::Stdio::null())
        .spawn_with_listener(sock)
}

/// A client that has done FUSE INIT on the daemon at `sock`.
fn connect(sock: &std::path::Path) -> vfsd::frontend::fuse::FuseClient {
    let c = vfsd::frontend::fuse::FuseClient::new(
        vfsd::frontend::Frontend::connect(sock, vfsd::frontend::FrontendConfig::default()).unwrap(),
    );
    c.init().unwrap();
    c
}

/// Spawns with a listening socket at `path` as fd 3, as libvirt hands one over.
trait SpawnWithListener {
    fn spawn_with_listener(&mut self, path: &std::path::Path) -> std::process::Child;
}

impl SpawnWithListener for std::process::Command {
    fn spawn_with_listener(&mut self, path: &std::path::Path) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        let fd = listener.as_raw_fd();
        // SAFETY: dup2 in the child between fork and exec, onto fd 3, from an fd it has.
        unsafe {
            self.pre_exec(move || {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                let r = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, 3)
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = self.spawn().unwrap();
        drop(listener);
        child
    }
}

#[test]
#[ignore = "needs root"]
fn sigterm_at_any_moment_of_start_up_leaves_no_daemon_behind() {
    require_root("needs root for the namespace sandbox without a user namespace");
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let tag = dir.path().to_str().unwrap().to_string();
    for delay_us in (0..40).map(|i| i * 250) {
        let sock = dir.path().join(format!("s{delay_us}"));
        let mut child = std::process::Command::new(common::vfsd_bin())
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(&share)
            .args(["--log-level", "error"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(delay_us));
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "SIGTERM after {delay_us} µs ignored"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // No sandboxed child outlived its parent.
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&tag) && c.contains("--socket-path"))
        .collect();
    assert!(left.is_empty(), "daemons left running: {left:?}");
}

/// Every directory the serving process holds an fd of: (fd target, whether it is the share,
/// below the share, on procfs, or the lock handover's runtime directory as a detached
/// mount whose `..` is itself). Any other directory fd outside the share is a way out of
/// the sandbox (`openat(fd, "..")`).
fn directory_fds(pid: i32, share: &std::path::Path) -> Vec<(PathBuf, bool)> {
    use std::os::unix::fs::MetadataExt;
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    let id = |m: &std::fs::Metadata| (m.dev(), m.ino());
    let share = id(&std::fs::metadata(share).unwrap());
    let runtime = vfsd::passthrough::RuntimeDir::path()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| id(&m));
    let mut dirs = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let link = e.unwrap().path();
        let Ok(target) = std::fs::read_link(&link) else {
            continue;
        };
        // Follows the magic link to the fd's own inode, whatever its name says (a name
        // in another mount namespace may read "/").
        match std::fs::metadata(&link) {
            Ok(m) if m.is_dir() => {}
            _ => continue,
        }
        let c = std::ffi::CString::new(link.as_os_str().as_encoded_bytes()).unwrap();
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut fs) }, 0);
        // Walk up from the directory itself until the share or the top.
        let mut ok = fs.f_type as i64 == PROC_SUPER_MAGIC;
        let here = id(&std::fs::metadata(&link).unwrap());
        let up = id(&std::fs::metadata(link.join("..")).unwrap());
        if Some(here) == runtime && up == here {
            ok = true;
        }
        let mut at = link.clone();
        for _ in 0..64 {
            let here = id(&std::fs::metadata(&at).unwrap());
            if ok || here == share {
                ok = true;
                break;
            }
            at.push("..");
            if id(&std::fs::metadata(&at).unwrap()) == here {
                break;
            }
        }
        dirs.push((target, ok));
    }
    dirs
}

#[test]
#[ignore = "needs root"]
fn no_directory_outside_the_share_stays_open_in_the_sandbox() {
    require_root("needs root for the namespace and chroot sandboxes");
    for mode in ["namespace", "chroot"] {
        // The stats file and the socket live beside the share, in the test's temporary
        // directory: the daemon must keep neither that directory nor its parent.
        let mut d = Daemon::start(&["--sandbox", mode]);
        let c = serves_io(&d);
        let pid = serving_pid(&d);
        let dirs = directory_fds(pid, &d.share);
        assert!(
            dirs.iter().any(|(_, ok)| *ok),
            "{mode}: the share's own fd was not seen: {dirs:?}"
        );
        let outside: Vec<_> = dirs.iter().filter(|(_, ok)| !ok).collect();
        assert!(
            outside.is_empty(),
            "{mode}: directories outside the share held open: {outside:?}"
        );
        // --stats still works (written from inside the sandbox), and the socket is
        // still removed once the daemon is done.
        assert!(d.stats()["opcodes"]["WRITE"]["count"].as_u64().unwrap() >= 1);
        unsafe { libc::kill(d.pid(), libc::SIGUSR1) };
        assert!(d.stats()["opcodes"]["CREATE"]["count"].as_u64().unwrap() >= 1);
        drop(c);
        let st = d.wait_exit(Duration::from_secs(10)).expect("no exit");
        assert!(st.success(), "{mode}: {st:?}");
        assert!(!d.sock.exists(), "{mode}: socket left behind");
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&d.stats).unwrap()).unwrap();
        assert!(s["opcodes"]["WRITE"]["count"].as_u64().unwrap() >= 1);
    }
}

/// `--shared-dir /` under the namespace sandbox (the xfstests runner shares the host's
/// root read-only): pivot_root can't pivot into the current root mount itself, so vfsd
/// pivots into a copy of it. Read-only use only; the test changes nothing.
#[test]
#[ignore = "needs root"]
fn the_host_root_can_be_shared_in_the_namespace_sandbox() {
    require_root("needs root");
    let d = Daemon::start_on(
        std::path::Path::new("/"),
        &["--sandbox", "namespace", "--readonly"],
    );
    let c = d.client();
    let etc = c.lookup(ROOT, "etc").unwrap();
    assert_eq!(etc.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    let host = std::fs::metadata("/etc").unwrap();
    assert_eq!(etc.attr.ino, std::os::unix::fs::MetadataExt::ino(&host));
    // The daemon's root is a copy of the host's root, not the host's mount itself.
    let pid = serving_pid(&d);
    assert_ne!(pid, d.pid());
}

/// A root daemon drops its own supplementary groups in every sandbox mode, so a create
/// made as a guest caller never counts the daemon's groups (only the one the request
/// carries with FUSE_CREATE_SUPP_GROUP). Started through `setpriv --groups` so it has some.
#[test]
#[ignore = "needs root"]
fn a_root_daemon_keeps_no_supplementary_groups() {
    require_root("needs root");
    if std::process::Command::new("setpriv")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("skipped: needs setpriv");
        return;
    }
    for sandbox in ["none", "chroot", "namespace"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("share")).unwrap();
        let sock = dir.path().join("s");
        let mut child = std::process::Command::new("setpriv")
            .args(["--groups=5,6", "--"])
            .arg(common::vfsd_bin())
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(dir.path().join("share"))
            .args(["--sandbox", sandbox, "--log-level", "error"])
            .spawn()
            .unwrap();
        common::wait_for_socket(&sock);
        let c = vfsd::frontend::fuse::FuseClient::new(
            vfsd::frontend::Frontend::connect(&sock, Default::default()).unwrap(),
        );
        c.init().unwrap();
        let pid = common::serving_pid(child.id() as i32);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
        drop(c);
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        assert_eq!(groups.split_whitespace().count(), 1, "{sandbox}: {groups}");
    }
}

/// Rootless, as libvirt runs vfsd unprivileged (`--uid-map`): no CAP_DAC_READ_SEARCH, so
/// file handles can't be reopened and the default `--inode-file-handles=prefer` finds
/// files by parent and name. More files than the fd limit stay usable all the same.
#[test]
#[ignore = "needs root"]
fn an_unprivileged_daemon_knows_more_files_than_its_fd_limit() {
    require_root("dropping to another user for the test needs root");
    let dir = tempfile::tempdir().unwrap();
    chown(dir.path(), 65534, 65534);
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    for i in 0..2000 {
        std::fs::write(share.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    chown(&share, 65534, 65534);
    let sock = dir.path().join("s");
    let mut child = spawn_as_nobody(
        &share,
        &sock,
        &[
            "--rlimit-nofile",
            "256",
            "--uid-map=:0:65534:1:",
            "--gid-map=:0:65534:1:",
        ],
    );
    let c = connect(&sock);
    let nodes: Vec<u64> = (0..2000)
        .map(|i| {
            c.lookup(ROOT, &format!("f{i}"))
                .unwrap_or_else(|e| panic!("f{i}: {e:?}"))
                .nodeid
        })
        .collect();
    for (i, &n) in nodes.iter().enumerate().step_by(13) {
        let o = c.open(n, libc::O_RDONLY as u32).unwrap();
        assert_eq!(c.read(n, o.fh, 0, 16).unwrap(), format!("{i}").as_bytes());
        c.release(n, o.fh).unwrap();
    }
    drop(c);
    assert!(child.wait().unwrap().success());
}
