//! Upgrade in place: SIGUSR2 to the vfsd a VMM started hands its live vhost-user
//! connection to a serving process of the binary now at vfsd's path. The frontend keeps
//! its connection; nodes, handles, locks and unlinked open files go on working.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{host_ofd_lock, require_root, vfsd_bin, Daemon, ROOT};
use vfsd::frontend::fuse::Lock;

const OWNER: u64 = 0x5157;

/// A copy of vfsd in a directory of its own, which the test replaces as a package
/// upgrade would: a new file renamed over the old name.
pub(crate) struct Binary {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
}

impl Binary {
    pub(crate) fn new() -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vfsd");
        std::fs::copy(vfsd_bin(), &path).unwrap();
        Binary { _dir: dir, path }
    }

    /// Puts `contents` (with mode 0755) at the path, as a new file.
    pub(crate) fn replace_with(&self, contents: &[u8]) {
        let tmp = self.path.with_extension("new");
        std::fs::write(&tmp, contents).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &self.path).unwrap();
    }

    pub(crate) fn upgrade_to_a_rebuilt_vfsd(&self) {
        self.replace_with(&std::fs::read(vfsd_bin()).unwrap());
    }

    /// A shell script at the path that first runs `before`, then execs vfsd with the
    /// arguments it was given.
    fn replace_with_script(&self, before: &str) -> PathBuf {
        let real = self.path.with_extension("real");
        std::fs::copy(vfsd_bin(), &real).unwrap();
        let script = format!("#!/bin/sh\n{before}\nexec {} \"$@\"\n", real.display());
        self.replace_with(script.as_bytes());
        real
    }
}

/// The supervisor's child: the process it started to serve.
pub(crate) fn served_by(supervisor: i32) -> Option<i32> {
    let c =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    c.split_whitespace().next()?.parse().ok()
}

/// Waits until the supervisor serves through a process other than `old`.
pub(crate) fn wait_for_handover(supervisor: i32, old: i32) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(p) = served_by(supervisor).filter(|&p| p != old) {
            if !Path::new(&format!("/proc/{old}")).exists() {
                return p;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no handover: the supervisor still serves through {old}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn sigusr2(pid: i32) {
    // SAFETY: kill with a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
}

fn wait_for_file(p: &Path) {
    let t = Instant::now();
    while !p.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs root"]
fn an_upgrade_keeps_the_connection_nodes_handles_locks_and_unlinked_files() {
    require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = Binary::new();
    let d = Daemon::start_from(&bin.path, &["--cache", "never"]);
    let c = Arc::new(d.client());
    std::fs::write(d.path("f"), b"written before").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    std::fs::write(d.path("gone"), b"unlinked but open").unwrap();
    let g = c.lookup(ROOT, "gone").unwrap();
    let gh = c.open(g.nodeid, libc::O_RDONLY as u32).unwrap().fh;
    std::fs::remove_file(d.path("gone")).unwrap();

    let old = served_by(d.pid()).unwrap();
    let old_exe = std::fs::metadata(format!("/proc/{old}/exe")).unwrap().ino();
    bin.upgrade_to_a_rebuilt_vfsd();
    // Writes go on while the handover happens: none may fail or get lost.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                c.write(f.nodeid, fh, 4096 + 8 * n, &n.to_le_bytes())
                    .expect("a write across the handover");
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    sigusr2(d.pid());
    let new = wait_for_handover(d.pid(), old);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let n = writer.join().unwrap();

    // The binary that serves now is the file now at the path, and the supervisor, with
    // the pid the VMM knows, runs it too.
    let exe = std::fs::metadata(format!("/proc/{new}/exe")).unwrap().ino();
    assert_eq!(exe, std::fs::metadata(&bin.path).unwrap().ino());
    assert_ne!(exe, old_exe);
    wait_for_supervisor_to_run(d.pid(), exe);
    // The same connection and nodes: every write is there, in order.
    let data = std::fs::read(d.path("f")).unwrap();
    for i in 0..n {
        let at = 4096 + 8 * i as usize;
        assert_eq!(data[at..at + 8], i.to_le_bytes(), "write {i} of {n}");
    }
    assert_eq!(c.getattr(f.nodeid).unwrap().attr.ino, f.attr.ino);
    assert_eq!(c.read(f.nodeid, fh, 0, 14).unwrap(), b"written before");
    assert_eq!(c.read(g.nodeid, gh, 0, 64).unwrap(), b"unlinked but open");
    // The lock never went: the host can't take it, and the guest's owner still has it.
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_UNLCK, 1))
        .unwrap();
    assert!(host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    // New names work too.
    std::fs::write(d.path("after"), b"x").unwrap();
    c.lookup(ROOT, "after").unwrap();

    // The supervisor that the upgrade started upgrades again: it kept what the
    // frontend had set up.
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    bin.upgrade_to_a_rebuilt_vfsd();
    sigusr2(d.pid());
    let third = wait_for_handover(d.pid(), new);
    let exe = std::fs::metadata(format!("/proc/{third}/exe"))
        .unwrap()
        .ino();
    assert_eq!(exe, std::fs::metadata(&bin.path).unwrap().ino());
    wait_for_supervisor_to_run(d.pid(), exe);
    assert_eq!(c.read(f.nodeid, fh, 0, 14).unwrap(), b"written before");
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
}

/// Waits until the process `pid` runs the file of inode `ino`.
fn wait_for_supervisor_to_run(pid: i32, ino: u64) {
    let t = Instant::now();
    while std::fs::metadata(format!("/proc/{pid}/exe"))
        .map(|m| m.ino())
        .ok()
        != Some(ino)
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the supervisor {pid} never ran the new binary"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "needs root"]
fn a_new_binary_that_fails_leaves_the_old_process_serving_and_a_later_upgrade_works() {
    require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = Binary::new();
    let d = Daemon::start_from(&bin.path, &[]);
    let c = d.client();
    std::fs::write(d.path("f"), b"data").unwrap();
    let f = c.lookup(ROOT, "f").unwrap();
    let fh = c.open(f.nodeid, libc::O_RDWR as u32).unwrap().fh;
    c.setlk(f.nodeid, fh, OWNER, Lock::range(0, 9, libc::F_WRLCK, 1))
        .unwrap();
    let old = served_by(d.pid()).unwrap();

    // A binary that can't start.
    let ran = bin.path.with_extension("ran");
    bin.replace_with(format!("#!/bin/sh\ntouch {}\nexit 3\n", ran.display()).as_bytes());
    sigusr2(d.pid());
    wait_for_file(&ran);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.read(f.nodeid, fh, 0, 4).unwrap(), b"data");
    assert_eq!(served_by(d.pid()), Some(old));

    // One that starts but serves another directory, where none of the nodes are: it
    // refuses the state, and the old process takes its rings back.
    let other = tempfile::tempdir().unwrap();
    let swap = format!(
        "for a; do shift; [ \"$prev\" = --shared-dir ] && a={}; set -- \"$@\" \"$a\"; prev=$a; done\ntouch {}",
        other.path().display(),
        ran.display()
    );
    std::fs::remove_file(&ran).unwrap();
    bin.replace_with_script(&swap);
    sigusr2(d.pid());
    wait_for_file(&ran);
    let t = Instant::now();
    // The answer comes once the old process serves again.
    assert_eq!(c.read(f.nodeid, fh, 0, 4).unwrap(), b"data");
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(served_by(d.pid()), Some(old));
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
    c.write(f.nodeid, fh, 0, b"DATA").unwrap();

    // Then a good binary takes over.
    bin.upgrade_to_a_rebuilt_vfsd();
    sigusr2(d.pid());
    wait_for_handover(d.pid(), old);
    assert_eq!(c.read(f.nodeid, fh, 0, 4).unwrap(), b"DATA");
    assert!(!host_ofd_lock(&d.path("f"), libc::F_WRLCK, 0, 10));
}

#[test]
#[ignore = "needs root"]
fn a_second_sigusr2_during_a_handover_starts_no_second_one() {
    require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = Binary::new();
    let d = Daemon::start_from(&bin.path, &[]);
    let c = d.client();
    let old = served_by(d.pid()).unwrap();
    let starts = bin.path.with_extension("starts");
    // Each start of the new binary adds a line with its arguments (the supervisor runs
    // it too, after the handover), and the first one takes a while.
    bin.replace_with_script(&format!(
        "echo \"$@\" >> {s}; [ $(wc -l < {s}) = 1 ] && sleep 1",
        s = starts.display()
    ));
    sigusr2(d.pid());
    wait_for_file(&starts);
    sigusr2(d.pid());
    let new = wait_for_handover(d.pid(), old);
    std::thread::sleep(Duration::from_secs(2));
    let log = std::fs::read_to_string(&starts).unwrap();
    let serving = log.lines().filter(|l| l.contains("--serve-fd")).count();
    assert_eq!(serving, 1, "serving processes started: {log}");
    assert_eq!(served_by(d.pid()), Some(new));
    c.getattr(ROOT).unwrap();
}

#[test]
#[ignore = "needs root"]
fn an_upgrade_before_any_frontend_serves_the_next_one_with_the_new_binary() {
    require_root("the lock handover's runtime directory is /run/vfsd");
    let bin = Binary::new();
    let d = Daemon::start_from(&bin.path, &[]);
    let old = served_by(d.pid()).unwrap();
    bin.upgrade_to_a_rebuilt_vfsd();
    sigusr2(d.pid());
    let new = wait_for_handover(d.pid(), old);
    let exe = std::fs::metadata(format!("/proc/{new}/exe")).unwrap().ino();
    assert_eq!(exe, std::fs::metadata(&bin.path).unwrap().ino());
    let c = d.client();
    std::fs::write(d.path("f"), b"x").unwrap();
    c.lookup(ROOT, "f").unwrap();
}
