//! Live migration of a guest between two QEMU on this host, each with its own daemon on
//! one shared directory, driven over QMP. The guest (guest-tests/migrate.sh) writes
//! numbered lines through one open fd every ~100 ms with its cwd in the share, holding a
//! flock, a POSIX lock and an OFD lock. The host checks the guest's locks are held on the
//! host before and after the switch (vfsd forwards them; virtiofsd keeps them in the
//! guest, so there they are free throughout), then lets the guest check its data, cwd
//! and locks on the destination and release them, and checks they are free.
//!
//! vfsd also carries a lock wait across: the host holds a flock and a POSIX lock the
//! guest is blocked on through the switch, and releases them after it; the destination
//! must grant both. Through the socket, fio with crc32c verify runs across the switch too.
//!
//! The variants (`Plan`): several migrations in a row, an open unlinked file under each
//! `--migration-mode`/`--migration-on-error`, no return path (the host resumes the source
//! with `cont` when the destination failed, as libvirt does), a file renamed on the host
//! during the migration, host processes probing the guest's locks throughout, and a
//! destination daemon serving another view of the directory (`migrate_between_two_views`).
//! Open files and locks pass between two vfsd on one host through the handover; a
//! destination with a runtime directory of its own goes without, as on another host. A
//! migration expected to fail must leave the source running with its locks, and the guest
//! then finishes its checks there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qapi::qmp;

use crate::fixture::{daemon_under_test, DaemonKind, Guest, Markers, Share, TestDir, Vm};

/// Lines the guest writes before the host migrates.
const AFTER_LINES: u64 = 30;

fn host_lock_tool(dir: &TestDir) -> PathBuf {
    let out = dir.path.join("vfsd-lock-host");
    crate::fixture::build_lock_tool(&out, false);
    out
}

/// The guest's three locks as a host process sees them: (flock, POSIX, OFD), each
/// "busy" or "free".
fn host_locks(mig: &Path, tool: &Path) -> [String; 3] {
    let word = |busy: i32, st: Option<i32>| match st {
        Some(c) if c == busy => "busy".to_string(),
        Some(0) => "free".to_string(),
        other => format!("error {other:?}"),
    };
    // The exit status, its output swallowed (the tool prints what holds the lock).
    let code = |c: &mut Command| c.output().ok().and_then(|o| o.status.code());
    let flock = code(
        Command::new("flock")
            .args(["-n", "-E", "99"])
            .arg(mig.join("flock-file"))
            .arg("true"),
    );
    let getlk =
        |file: &str, lock: &str| code(Command::new(tool).arg("-g").arg(mig.join(file)).arg(lock));
    let posix = getlk("posix-file", "wr:0:0");
    let ofd = getlk("ofd-file", "owr:0:0");
    [word(99, flock), word(1, posix), word(1, ofd)]
}

/// Waits up to `secs` for `vm`'s guest to be `running` (an incoming migration done); an
/// error once QEMU is gone or in a state an incoming migration does not pass through.
fn wait_running(vm: &mut Vm, secs: u64) -> Result<(), String> {
    use qmp::RunState::{inmigrate, paused, prelaunch, running};
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < Duration::from_secs(secs) {
        if !vm.is_running() {
            return Err(format!("QEMU exited ({last})"));
        }
        match vm.qmp(&qmp::query_status {}) {
            Ok(s) if s.running || s.status == running => return Ok(()),
            Ok(s) if ![inmigrate, prelaunch, paused].contains(&s.status) => {
                return Err(format!("status {:?}", s.status))
            }
            Ok(s) => last = format!("{:?}", s.status),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!("not running after {secs} s ({last})"))
}

/// The last "migrate: wrote N lines" count on a console.
fn lines_written(console: &str) -> u64 {
    console
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("migrate: wrote "))
        .find_map(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Host processes holding the locks the guest waits for across the migration, until
/// their release file exists.
struct Waiter {
    holders: Vec<Child>,
    release: PathBuf,
}

impl Waiter {
    fn hold(mig: &Path, tool: &Path, release: PathBuf) -> Waiter {
        std::fs::write(mig.join("wait-flock"), "").unwrap();
        std::fs::write(mig.join("wait-posix"), "").unwrap();
        let flock = crate::fixture::die_with_parent(&mut Command::new("flock"))
            .arg(mig.join("wait-flock"))
            .args(["sh", "-c", r#"while [ ! -e "$0" ]; do sleep 0.1; done"#])
            .arg(&release)
            .spawn()
            .expect("flock (util-linux)");
        let posix = crate::fixture::die_with_parent(&mut Command::new(tool))
            .arg("-q")
            .arg("-u")
            .arg(&release)
            .arg(mig.join("wait-posix"))
            .arg("wr:0:0")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        Waiter {
            holders: vec![flock, posix],
            release,
        }
    }

    fn release(&mut self) {
        std::fs::write(&self.release, "").unwrap();
        for h in &mut self.holders {
            let t = Instant::now();
            while h.try_wait().unwrap().is_none() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "a host lock holder did not end"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.release, "");
        for h in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

/// The guest's three locks through each of `views` (their `mig` directories), in order.
fn locks_through(views: &[PathBuf], tool: &Path) -> Vec<String> {
    views.iter().flat_map(|v| host_locks(v, tool)).collect()
}

/// Checks the guest's locks through `views` are all `expect`, giving a daemon that takes
/// them over 5 s.
fn assert_locks(views: &[PathBuf], tool: &Path, expect: &str, when: &str) {
    let t = Instant::now();
    let got = loop {
        let l = locks_through(views, tool);
        if l.iter().all(|x| x == expect) || t.elapsed() > Duration::from_secs(5) {
            break l;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        got.iter().all(|l| l == expect),
        "the guest's flock, POSIX and OFD locks {when}, as the host sees them through {views:?}: {got:?}, expected {expect}"
    );
}

/// How many "device state saved" lines a daemon's log has.
fn saves(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("device state saved")
        .count()
}

/// The last line of `log` containing `what`, without its timestamp.
fn log_line(log: &Path, what: &str) -> Option<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rfind(|l| l.contains(what))
        .map(|l| l.split_once("] ").map_or(l, |x| x.1).to_string())
}

/// Sends `sig` to `pid` and every descendant (vfsd forks into its sandbox).
fn signal_tree(pid: u32, sig: libc::c_int) {
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        // SAFETY: kill on a daemon this test started, or a child of it.
        unsafe { libc::kill(p as libc::pid_t, sig) };
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // The parent pid is the second field after the parenthesised command.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|x| x.parse::<u32>().ok());
            if ppid == Some(p) {
                todo.push(child);
            }
        }
    }
}

/// A directory daemon A serves and one daemon B serves showing the same files and the
/// same locks: a file written through A shows through B, and a flock and a POSIX lock
/// held through A exclude a host process through B (else the host's lock checks through
/// B prove nothing).
fn check_one_directory(a: &Path, b: &Path, tool: &Path, name: &str) {
    use std::os::fd::AsRawFd;
    let probe = ".vfsd-migrate-probe";
    let text = format!("probe {}", std::process::id());
    std::fs::write(a.join(probe), &text).unwrap();
    let t = Instant::now();
    while std::fs::read_to_string(b.join(probe)).ok().as_deref() != Some(text.as_str()) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{probe} written through {} does not show through {} within 5 s: not one directory",
            a.display(),
            b.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The POSIX lock on a second file: GlusterFS's client refuses a process both kinds
    // of lock on one file.
    let probe2 = ".vfsd-migrate-probe-posix";
    std::fs::write(a.join(probe2), &text).unwrap();
    let open = |name: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(a.join(name))
            .unwrap()
    };
    let (f, g) = (open(probe), open(probe2));
    // SAFETY: plain lock calls on fds this function owns.
    unsafe {
        assert_eq!(libc::flock(f.as_raw_fd(), libc::LOCK_EX), 0);
        assert_eq!(
            libc::fcntl(g.as_raw_fd(), libc::F_SETLK, &posix_lock(libc::F_WRLCK)),
            0,
            "F_SETLK through {}: {}",
            a.display(),
            std::io::Error::last_os_error()
        );
    }
    let flock = Command::new("flock")
        .args(["-n", "-E", "99"])
        .arg(b.join(probe))
        .arg("true")
        .output()
        .ok()
        .and_then(|o| o.status.code());
    let posix = Command::new(tool)
        .arg("-g")
        .arg(b.join(probe2))
        .arg("wr:0:0")
        .output()
        .ok()
        .and_then(|o| o.status.code());
    drop((f, g));
    std::fs::remove_file(a.join(probe)).unwrap();
    std::fs::remove_file(a.join(probe2)).unwrap();
    crate::fixture::summarize(
        name,
        &format!("one directory: a flock and a POSIX lock held through A, through B: flock -n exit {flock:?}, F_GETLK exit {posix:?}"),
    );
    assert_eq!(
        flock,
        Some(99),
        "a flock held through {} does not exclude one through {}",
        a.display(),
        b.display()
    );
    assert_eq!(
        posix,
        Some(1),
        "a POSIX lock held through {} is not seen through {}",
        a.display(),
        b.display()
    );
}

/// A whole-file lock of type `ty` for F_SETLK, F_OFD_SETLK and F_GETLK.
fn posix_lock(ty: libc::c_int) -> libc::flock {
    // SAFETY: an all-zero flock is valid (l_whence SEEK_SET, start 0, length 0: to EOF).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = ty as libc::c_short;
    l
}

/// What one host lock probe saw.
struct ProbeReport {
    view: PathBuf,
    attempts: [u64; 3],
    /// (kind, seconds after the probe started) of each lock it was granted.
    granted: Vec<(&'static str, f64)>,
    errors: Vec<String>,
}

const PROBE_KINDS: [(&str, &str); 3] = [
    ("flock", "flock-file"),
    ("POSIX", "posix-file"),
    ("OFD", "ofd-file"),
];

/// A third-party host process on one view of the share: until `stop`, non-blocking write
/// lock attempts on the guest's three locked files (flock, F_SETLK, F_OFD_SETLK), each
/// success released at once. A thread of the test process, which holds no other lock on
/// those files.
fn probe_locks(view: PathBuf, stop: Arc<AtomicBool>) -> ProbeReport {
    use std::os::fd::AsRawFd;
    let files: Vec<std::fs::File> = PROBE_KINDS
        .iter()
        .map(|(_, f)| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(view.join(f))
                .unwrap_or_else(|e| panic!("lock probe: {}: {e}", view.join(f).display()))
        })
        .collect();
    let mut r = ProbeReport {
        view,
        attempts: [0; 3],
        granted: Vec::new(),
        errors: Vec::new(),
    };
    let t0 = Instant::now();
    let mut rest_until = [t0; 3];
    while !stop.load(Ordering::Relaxed) {
        for (k, file) in files.iter().enumerate() {
            if Instant::now() < rest_until[k] {
                continue;
            }
            let fd = file.as_raw_fd();
            r.attempts[k] += 1;
            // SAFETY: lock calls on fds this thread owns.
            let rc = unsafe {
                match k {
                    0 => libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB),
                    1 => libc::fcntl(fd, libc::F_SETLK, &posix_lock(libc::F_WRLCK)),
                    _ => libc::fcntl(fd, libc::F_OFD_SETLK, &posix_lock(libc::F_WRLCK)),
                }
            };
            if rc == 0 {
                r.granted
                    .push((PROBE_KINDS[k].0, t0.elapsed().as_secs_f64()));
                // SAFETY: as above.
                unsafe {
                    match k {
                        0 => libc::flock(fd, libc::LOCK_UN),
                        1 => libc::fcntl(fd, libc::F_SETLK, &posix_lock(libc::F_UNLCK)),
                        _ => libc::fcntl(fd, libc::F_OFD_SETLK, &posix_lock(libc::F_UNLCK)),
                    }
                };
                // So a probe that gets in does not hold the lock most of the time.
                rest_until[k] = Instant::now() + Duration::from_millis(20);
                continue;
            }
            let e = std::io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES))
                && r.errors.len() < 10
            {
                r.errors
                    .push(format!("{} on {}: {e}", PROBE_KINDS[k].0, PROBE_KINDS[k].1));
            }
        }
        // Leaves the two cores to the guests; a window of a millisecond is still seen.
        std::thread::sleep(Duration::from_micros(500));
    }
    r
}

/// Host lock probes on each view, from before the first migration until after the host's
/// lock check after the last one.
struct Probes {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<ProbeReport>>,
}

impl Probes {
    fn start(views: &[PathBuf]) -> Probes {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = views
            .iter()
            .map(|v| {
                let (v, stop) = (v.clone(), stop.clone());
                std::thread::spawn(move || probe_locks(v, stop))
            })
            .collect();
        Probes { stop, threads }
    }

    fn stop(mut self) -> Vec<ProbeReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .drain(..)
            .map(|h| h.join().expect("a lock probe panicked"))
            .collect()
    }

    /// Stops the probes and checks none got a lock the guest held.
    fn finish(self, name: &str) {
        let reports = self.stop();
        for r in &reports {
            crate::fixture::summarize(
                name,
                &format!(
                    "lock probe on {}: attempts flock {}, POSIX {}, OFD {}; granted {}",
                    r.view.display(),
                    r.attempts[0],
                    r.attempts[1],
                    r.attempts[2],
                    r.granted.len()
                ),
            );
        }
        for r in &reports {
            assert!(
                r.errors.is_empty(),
                "lock probe on {}: {:?}",
                r.view.display(),
                r.errors
            );
            // Thousands a second: a probe with few attempts did not watch the switch.
            assert!(
                r.attempts.iter().all(|&n| n >= 100),
                "lock probe on {} made only {:?} attempts",
                r.view.display(),
                r.attempts
            );
            assert!(
                r.granted.is_empty(),
                "a host process on {} got a lock the guest held: {:?} (kind, s after the probes started)",
                r.view.display(),
                &r.granted[..r.granted.len().min(20)]
            );
        }
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
#[ignore = "builds the host lock tool"]
fn host_lock_probes_are_refused_held_locks_and_granted_free_ones() {
    let dir = TestDir::new("host_lock_probes_are_refused_held_locks_and_granted_free_ones");
    let tool = host_lock_tool(&dir);
    let mig = dir.dir("mig");
    let release = dir.path.join("release");
    let mut holders: Vec<Child> = [
        ("flock-file", "ex"),
        ("posix-file", "wr:0:0"),
        ("ofd-file", "owr:0:0"),
    ]
    .iter()
    .map(|(f, spec)| {
        std::fs::write(mig.join(f), "").unwrap();
        crate::fixture::die_with_parent(&mut Command::new(&tool))
            .arg("-q")
            .arg("-m")
            .arg(dir.path.join(format!("{f}.held")))
            .arg("-u")
            .arg(&release)
            .arg(mig.join(f))
            .arg(spec)
            .spawn()
            .unwrap()
    })
    .collect();
    let t = Instant::now();
    while ["flock-file", "posix-file", "ofd-file"]
        .iter()
        .any(|f| !dir.path.join(format!("{f}.held")).exists())
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the host lock holders did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let views = [mig.clone()];
    let probes = Probes::start(&views);
    std::thread::sleep(Duration::from_millis(500));
    let held = probes.stop();
    std::fs::write(&release, "").unwrap();
    for h in &mut holders {
        assert!(h.wait().unwrap().success());
    }
    let probes = Probes::start(&views);
    std::thread::sleep(Duration::from_millis(500));
    let free = probes.stop();
    assert!(held[0].errors.is_empty() && free[0].errors.is_empty());
    assert!(
        held[0].attempts.iter().all(|&n| n >= 100),
        "{:?}",
        held[0].attempts
    );
    assert!(
        held[0].granted.is_empty(),
        "granted held locks: {:?}",
        held[0].granted
    );
    for (kind, _) in PROBE_KINDS {
        assert!(
            free[0].granted.iter().any(|g| g.0 == kind),
            "no {kind} lock granted with nobody holding it"
        );
    }
}

/// When the host renames a file the guest has open, in the first migration.
#[derive(Clone, Copy, PartialEq, Debug)]
#[cfg_attr(not(feature = "extended-guest-tests"), allow(dead_code))]
pub enum RenameAt {
    /// After the source daemon saved its state and before the destination daemon loads it
    /// (held with SIGSTOP until then): a find-paths destination can't find the file.
    Switch,
    /// Just after the migration starts, while RAM is copied: what the source's
    /// `--migration-confirm-paths` is for.
    Precopy,
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Via {
    /// A destination QEMU listening on a unix socket, started before the migration.
    Socket,
    /// The source saves to a file and quits; a fresh QEMU restores it.
    File,
}

/// What a migration test does.
#[derive(Clone, Debug)]
pub struct Plan {
    pub via: Via,
    /// Migrations in a row, A -> B -> C ...: a daemon that loaded the state saves it again.
    pub rounds: usize,
    /// guest-tests/migrate.sh extras besides `waiter` and `fio` (`many=N`,
    /// `unlinked=ok`, `unlinked=error`).
    pub extras: Vec<String>,
    /// The host holds a flock and a POSIX lock the guest waits for across the migrations
    /// (vfsd only: virtiofsd keeps locks in the guest).
    pub waiter: bool,
    /// fio with crc32c verify across the migrations.
    pub fio: bool,
    /// Arguments for daemon A, the first source.
    pub src_args: Vec<String>,
    /// Arguments for every daemon after A.
    pub dst_args: Vec<String>,
    /// The first migration must fail and leave the source running; the guest finishes on
    /// the source.
    pub expect_fail: bool,
    /// The return-path capability on both QEMU (socket only); without it the host waits
    /// for the destination and resumes the source with `cont` when it failed.
    pub return_path: bool,
    /// A path in the share the host renames to PATH.moved in the first migration, and back
    /// once it ended.
    pub rename: Option<(String, RenameAt)>,
    /// Host lock probes on every view, which must never be granted a lock.
    pub probes: bool,
    /// Two views of one directory: daemons A, C ... serve the first, B, D ... the second.
    pub views: Option<(PathBuf, PathBuf)>,
    /// The daemons after A share A's runtime directory, so open files and locks pass
    /// through the handover; `false` gives each its own, as on another host.
    pub handover: bool,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            via: Via::Socket,
            rounds: 1,
            extras: Vec::new(),
            waiter: true,
            fio: false,
            src_args: Vec::new(),
            dst_args: Vec::new(),
            expect_fail: false,
            return_path: true,
            rename: None,
            probes: false,
            views: None,
            handover: true,
        }
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

const LABELS: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];

/// The guest as daemon number `i` (A = 0) serves it.
fn guest_for<'a>(
    dir: &'a TestDir,
    plan: &Plan,
    shares: (&Path, &Path),
    daemon: &DaemonKind,
    i: usize,
) -> Guest<'a> {
    let share = if i.is_multiple_of(2) {
        shares.0
    } else {
        shares.1
    };
    let args = if i == 0 {
        &plan.src_args
    } else {
        &plan.dst_args
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Guest::new(dir)
        .mem_mb(1024)
        .share(Share::new(share, "share0", daemon.clone(), &args))
}

/// Starts the daemons of destination `label`; without `handover`, with an
/// XDG_RUNTIME_DIR of their own, where the source's handover socket is not.
fn start_destination_daemons(
    guest: &Guest,
    dir: &TestDir,
    label: &str,
    handover: bool,
) -> crate::fixture::guest::Daemons {
    if handover {
        return guest.start_daemons(label);
    }
    let runtime = dir.dir(&format!("runtime-{label}"));
    guest.start_daemons_with_env(label, &[("XDG_RUNTIME_DIR", &runtime)])
}

/// Renames `path` in `share` to PATH.moved, or back.
fn rename(share: &Path, path: &str, away: bool) {
    let (from, to) = (share.join(path), share.join(format!("{path}.moved")));
    let (from, to) = if away { (from, to) } else { (to, from) };
    std::fs::rename(&from, &to)
        .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", from.display(), to.display()));
}

/// Checks a daemon ended by itself within 10 s and not from a signal.
fn assert_daemons_ended(d: &mut crate::fixture::guest::Daemons, which: &str) {
    use std::os::unix::process::ExitStatusExt;
    for d in &mut d.list {
        let st = d
            .finish(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("the {which} daemon still runs 10 s after its QEMU ended"));
        assert!(
            st.signal().is_none(),
            "the {which} daemon died from a signal: {st}"
        );
    }
}

/// A migration where daemon A (the source) serves `share_a` and daemon B (the
/// destination) `share_b`, two views of one directory: two client mounts of a distributed
/// file system, as two hosts have, or a bind mount. The host's own files go in through A
/// and its lock checks (and `plan.probes`) go through both: a guest lock must exclude the
/// host through either view, before, during and after the switch.
///
/// Needs, as every migration test, root and QEMU; both directories must exist and show
/// the same files (a file written through A must show through B within 5 s) and the same
/// locks (a flock and a POSIX lock held through A exclude through B), which is checked
/// first; and `--migration-mode find-paths`, the default, as two mounts' file handles
/// differ. The logs go in `target/guest-tests/<name>`; the test's files go in `mig/` of
/// the directory.
#[cfg_attr(not(feature = "extended-guest-tests"), allow(dead_code))]
pub fn migrate_between_two_views(name: &str, share_a: &Path, share_b: &Path, plan: Plan) {
    run(
        name,
        &Plan {
            views: Some((share_a.to_path_buf(), share_b.to_path_buf())),
            ..plan
        },
    );
}

/// Runs `plan`: boots the source, migrates `plan.rounds` times, then lets the guest check
/// everything on the last VM.
pub fn run(name: &str, plan: &Plan) {
    assert!((1..LABELS.len()).contains(&plan.rounds), "1 to 9 rounds");
    if let Some((_, RenameAt::Switch)) = &plan.rename {
        assert_eq!(
            plan.via,
            Via::Socket,
            "a rename at the switch needs a socket"
        );
    }
    let dir = TestDir::new(name);
    let tool = host_lock_tool(&dir);
    let daemon = daemon_under_test();
    let vfsd = daemon.is_vfsd();
    let (share_a, share_b) = match &plan.views {
        Some((a, b)) => {
            assert!(
                !plan
                    .src_args
                    .iter()
                    .chain(&plan.dst_args)
                    .any(|a| a.contains("file-handles")),
                "two views of one directory have their own file handles: find-paths only"
            );
            check_one_directory(a, b, &tool, name);
            (a.clone(), b.clone())
        }
        None => {
            let s = dir.dir("share");
            (s.clone(), s)
        }
    };
    // The host's files go in through A.
    let mig = share_a.join("mig");
    let _ = std::fs::remove_dir_all(&mig);
    std::fs::create_dir_all(&mig).unwrap();
    let views: Vec<PathBuf> = if plan.views.is_some() {
        vec![mig.clone(), share_b.join("mig")]
    } else {
        vec![mig.clone()]
    };
    let mut extras = plan.extras.clone();
    let waiter_on = plan.waiter && vfsd;
    if waiter_on {
        extras.push("waiter".into());
    }
    if plan.fio {
        extras.push("fio".into());
    }
    let mut waiter = waiter_on.then(|| Waiter::hold(&mig, &tool, dir.path.join("release-waiter")));
    let shares = (share_a.as_path(), share_b.as_path());
    let cmd = format!("/guest-tests/migrate.sh 20 900 {}", extras.join(" "));

    // The source, once the guest writes (a boot that fails before /init: once more).
    let _slots = crate::fixture::Slot::take(2);
    let source = guest_for(&dir, plan, shares, &daemon, 0);
    let (mut cur_daemons, mut cur) = {
        let mut attempt = 1;
        loop {
            let mut d = source.start_daemons(&format!("a{attempt}"));
            let mut vm = source.start_vm(&format!("a{attempt}"), &d, &cmd, &[]);
            let t = Instant::now();
            let up = loop {
                let c = vm.console_text();
                if c.contains("migrate: ready") && lines_written(&c) >= AFTER_LINES {
                    break true;
                }
                assert!(
                    !c.lines().any(|l| l.starts_with("migrate: FAIL")
                        || l.starts_with("migrate: SKIP")
                        || l.starts_with("VFSD-RESULT:")),
                    "the guest failed before the migration:\n{c}"
                );
                // A guest kernel that crashed or hung before /init: one more boot.
                let kernel_died = ["Kernel panic", "Oops", "BUG:"]
                    .iter()
                    .any(|p| c.contains(p));
                let running = vm.is_running();
                if !c.contains("vfsd-init:")
                    && ((!running && kernel_died) || t.elapsed() > Duration::from_secs(180))
                {
                    break false;
                }
                assert!(
                    running,
                    "the source QEMU exited before the guest was ready:\n{c}"
                );
                assert!(
                    d.list.iter_mut().all(|x| x.is_running()),
                    "the source daemon exited before the guest was ready:\n{c}"
                );
                assert!(
                    t.elapsed() < Duration::from_secs(400),
                    "the source guest did not start writing within 400 s:\n{c}"
                );
                std::thread::sleep(Duration::from_secs(1));
            };
            if up {
                break (d, vm);
            }
            assert!(attempt < 2, "the source guest did not come up twice");
            crate::fixture::summarize(
                name,
                "the source guest's kernel failed before /init ran; booted again",
            );
            attempt += 1;
        }
    };

    let expect = if vfsd { "busy" } else { "free" };
    assert_locks(&views, &tool, expect, "before the migration");
    let probes = plan.probes.then(|| Probes::start(&views));

    let mut failed_first = false;
    for r in 0..plan.rounds {
        let tag = format!(
            "{}->{}",
            LABELS[r].to_uppercase(),
            LABELS[r + 1].to_uppercase()
        );
        let label = LABELS[r + 1];
        let dst_guest = guest_for(&dir, plan, shares, &daemon, r + 1);
        let rename_at = plan.rename.as_ref().filter(|_| r == 0);
        let mut renamed = false;
        let sock_dir = cur_daemons.sockets[0].parent().unwrap().to_path_buf();
        let (uri, incoming) = match plan.via {
            Via::Socket => {
                let u = format!(
                    "unix:{}",
                    sock_dir.join(format!("mig-{label}.sock")).display()
                );
                (u.clone(), u)
            }
            Via::File => {
                let u = format!(
                    "file:{}",
                    dir.path.join(format!("state-{label}.bin")).display()
                );
                (u.clone(), u)
            }
        };
        let mut pending = None;
        let mut held = None;
        if plan.via == Via::Socket {
            let d = start_destination_daemons(&dst_guest, &dir, label, plan.handover);
            let mut vm = dst_guest.start_vm(label, &d, &cmd, &["-incoming", &incoming]);
            let t = Instant::now();
            while !sock_dir.join(format!("mig-{label}.sock")).exists() {
                assert!(
                    vm.is_running(),
                    "the destination QEMU exited: {}",
                    std::fs::read_to_string(&vm.log).unwrap_or_default()
                );
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "the destination does not listen"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            if plan.return_path {
                // The source learns that the destination failed to load (a daemon refusing
                // its state) and resumes by itself.
                let rp = qmp::migrate_set_capabilities {
                    capabilities: vec![qmp::MigrationCapabilityStatus {
                        capability: qmp::MigrationCapability::return_path,
                        state: true,
                    }],
                };
                for q in [&cur, &vm] {
                    q.qmp(&rp).expect("migrate-set-capabilities return-path");
                }
            }
            if let Some((_, RenameAt::Switch)) = rename_at {
                // Connected to its QEMU (it listens): it loads nothing until continued.
                let pid = d.list[0].pid();
                signal_tree(pid, libc::SIGSTOP);
                held = Some(pid);
            }
            pending = Some((d, vm));
        }
        let saved_before = saves(&cur_daemons.list[0].log);
        cur.qmp(&qmp::migrate {
            uri: Some(uri.clone()),
            channels: None,
            detach: None,
            resume: None,
        })
        .expect("QMP migrate");
        if let Some((path, RenameAt::Precopy)) = rename_at {
            rename(&share_a, path, true);
            renamed = true;
        }
        let t = Instant::now();
        let info = loop {
            if let Some(pid) = held {
                if saves(&cur_daemons.list[0].log) > saved_before {
                    rename(&share_a, &rename_at.unwrap().0, true);
                    renamed = true;
                    signal_tree(pid, libc::SIGCONT);
                    held = None;
                }
            }
            match cur.qmp(&qmp::query_migrate {}) {
                Ok(i) => match i.status {
                    Some(qmp::MigrationStatus::completed)
                    | Some(qmp::MigrationStatus::failed)
                    | Some(qmp::MigrationStatus::cancelled) => break i,
                    _ => {}
                },
                Err(e) => eprintln!("{name}: query-migrate: {e}"),
            }
            assert!(
                cur.is_running(),
                "the source QEMU exited during the migration {tag}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(600),
                "the migration {tag} did not end in 600 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        if let Some(pid) = held {
            signal_tree(pid, libc::SIGCONT);
            panic!(
                "{tag}: the source daemon never logged 'device state saved' ({:?})",
                info.status
            );
        }
        let mut failure = match info.status {
            Some(qmp::MigrationStatus::completed) => None,
            other => Some(format!(
                "{}: {}",
                other.map_or("no status".into(), |s| format!("{s:?}")),
                info.error_desc.clone().unwrap_or_default()
            )),
        };
        let mut resumed_with_cont = false;
        if failure.is_none() {
            if let Some((_, vm)) = pending.as_mut() {
                // Without a return path "completed" says nothing of the destination's load.
                if let Err(e) = wait_running(vm, 300) {
                    assert!(
                        !plan.return_path,
                        "{tag}: the source completed despite the return path, but the destination: {e}"
                    );
                    cur.qmp(&qmp::cont {}).expect("QMP cont on the source");
                    resumed_with_cont = true;
                    failure = Some(format!("the destination: {e}"));
                }
            }
        }
        if let Some(err) = failure {
            assert!(
                plan.expect_fail && r == 0,
                "the migration {tag} failed: {err}"
            );
            assert!(
                plan.return_path || resumed_with_cont,
                "{tag}: without a return path the source was to report completed and be resumed with cont: {err}"
            );
            // The source goes on.
            let w1 = lines_written(&cur.console_text());
            std::thread::sleep(Duration::from_secs(5));
            let status = cur.qmp(&qmp::query_status {});
            let w2 = lines_written(&cur.console_text());
            assert!(
                matches!(&status, Ok(s) if s.running) && w2 > w1,
                "{tag}: the source does not go on after the failed migration ({status:?}; guest lines {w1} -> {w2} in 5 s)"
            );
            crate::fixture::summarize(
                name,
                &format!(
                    "migration {tag} failed as expected{}: {err}",
                    if resumed_with_cont {
                        " (the source resumed with cont)"
                    } else {
                        ""
                    }
                ),
            );
            if let Some((mut d, mut vm)) = pending.take() {
                if vfsd {
                    let why = log_line(&d.list[0].log, "loading the device state failed");
                    crate::fixture::summarize(name, &format!("{tag}: destination: {why:?}"));
                }
                // The destination gave up: its QEMU should have exited.
                if vm.wait(Duration::from_secs(10)).is_none() {
                    eprintln!(
                        "{name}: the destination QEMU still runs after the failure; stopping it"
                    );
                }
                drop(vm);
                assert_daemons_ended(&mut d, "failed destination");
            }
            if renamed {
                rename(&share_a, &rename_at.unwrap().0, false);
            }
            assert_locks(
                &views,
                &tool,
                expect,
                "on the source after the failed migration",
            );
            failed_first = true;
            break;
        }
        let figures = format!(
            "migration {tag} via {}: total {} ms, downtime {} ms, setup {} ms, RAM {:.1} MiB",
            if plan.via == Via::Socket {
                "socket"
            } else {
                "file"
            },
            info.total_time.unwrap_or(-1),
            info.downtime.unwrap_or(-1),
            info.setup_time.unwrap_or(-1),
            info.ram
                .as_ref()
                .map_or(0.0, |r| r.transferred as f64 / 1048576.0)
        );
        crate::fixture::summarize(name, &figures);

        // The source goes away; its daemon leaves on the disconnect.
        let _ = cur.qmp(&qmp::quit {});
        assert!(
            cur.wait(Duration::from_secs(20)).is_some(),
            "the source QEMU did not quit"
        );
        assert_daemons_ended(&mut cur_daemons, "source");
        let (d, vm) = match pending {
            Some(p) => p,
            None => {
                assert_locks(
                    &views,
                    &tool,
                    "free",
                    "with the source gone and no destination yet",
                );
                let d = start_destination_daemons(&dst_guest, &dir, label, plan.handover);
                let mut vm = dst_guest.start_vm(label, &d, &cmd, &["-incoming", &incoming]);
                wait_running(&mut vm, 300)
                    .unwrap_or_else(|e| panic!("the destination of {tag}: {e}"));
                (d, vm)
            }
        };
        if vfsd {
            let saved = log_line(&cur_daemons.list[0].log, "device state saved");
            let loaded = log_line(&d.list[0].log, "device state loaded");
            crate::fixture::summarize(name, &format!("{tag}: source: {saved:?}"));
            crate::fixture::summarize(name, &format!("{tag}: destination: {loaded:?}"));
            assert!(
                saved.is_some(),
                "{tag}: the source vfsd logged no 'device state saved'"
            );
            assert!(
                loaded.is_some(),
                "{tag}: the destination vfsd logged no 'device state loaded'"
            );
        }
        // The destination holds the guest's locks on the host (it may wait a moment for
        // the locks the source released).
        assert_locks(&views, &tool, expect, &format!("after the migration {tag}"));
        if renamed {
            rename(&share_a, &rename_at.unwrap().0, false);
        }
        // Assigning drops the ended source's QEMU and daemons.
        (cur_daemons, cur) = (d, vm);
    }
    if plan.expect_fail {
        assert!(
            failed_first,
            "the migration was expected to fail and did not"
        );
    }
    if let Some(p) = probes {
        p.finish(name);
    }
    if let Some(w) = waiter.as_mut() {
        w.release();
    }

    // The guest's own checks on the last VM.
    let (mut dst_daemons, mut dst) = (cur_daemons, cur);
    let markers = Markers::new(&mig);
    markers.put("host.migrated", "migrated by the host\n");
    let seen = markers.await_any(
        &["guest.released", "guest.abort"],
        Duration::from_secs(240),
        || {
            assert!(
                dst.is_running(),
                "the guest's QEMU exited:\n{}",
                dst.console_text()
            )
        },
    );
    assert!(
        seen.is_some(),
        "the guest did not finish its checks within 240 s of host.migrated:\n{}",
        dst.console_text()
    );
    assert!(
        markers.has("guest.released"),
        "the guest gave up:\n{}",
        dst.console_text()
    );
    let released = locks_through(&views, &tool);
    assert!(
        released.iter().all(|l| l == "free"),
        "after the guest released its locks the host sees {released:?}"
    );
    markers.put("host.done", "");
    let t = Instant::now();
    let console = loop {
        let c = dst.console_text();
        if c.lines().any(|l| l.starts_with("VFSD-RESULT:")) || !dst.is_running() {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the guest did not end:\n{c}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        dst.wait(Duration::from_secs(30)).is_some(),
        "the guest's QEMU did not power off within 30 s of its result"
    );
    let report: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("migrate: ") && !l.starts_with("migrate: wrote"))
        .collect();
    for l in report
        .iter()
        .filter(|l| l.contains("FIGURE") || l.contains("checks passed"))
    {
        crate::fixture::summarize(name, l);
    }
    assert!(
        console.lines().any(|l| l == "VFSD-RESULT: 0"),
        "the guest failed:\n{}",
        report.join("\n")
    );
    assert_daemons_ended(&mut dst_daemons, "last");
}

/// Skips a test of a vfsd option under `VFSD_TEST_DAEMON=virtiofsd`.
fn vfsd_only(name: &str) -> bool {
    let vfsd = daemon_under_test().is_vfsd();
    if !vfsd {
        eprintln!("{name}: skipped: tests a vfsd option or vfsd's host locks");
    }
    vfsd
}

#[test]
#[ignore = "needs QEMU and root"]
fn live_migration_through_a_socket_keeps_open_files_locks_and_a_lock_wait() {
    run(
        "live_migration_through_a_socket_keeps_open_files_locks_and_a_lock_wait",
        &Plan {
            fio: true,
            ..Plan::default()
        },
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn migration_through_a_file_keeps_open_files_locks_and_a_lock_wait() {
    run(
        "migration_through_a_file_keeps_open_files_locks_and_a_lock_wait",
        &Plan {
            via: Via::File,
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn a_daemon_that_loaded_the_state_saves_it_again_through_three_migrations_in_a_row() {
    run(
        "a_daemon_that_loaded_the_state_saves_it_again_through_three_migrations_in_a_row",
        &Plan {
            rounds: 3,
            extras: strings(&["many=200"]),
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn an_open_unlinked_file_moves_with_its_data_under_migration_mode_file_handles() {
    let name = "an_open_unlinked_file_moves_with_its_data_under_migration_mode_file_handles";
    if !vfsd_only(name) {
        return;
    }
    let fh = strings(&["--migration-mode", "file-handles"]);
    run(
        name,
        &Plan {
            extras: strings(&["unlinked=ok"]),
            src_args: fh.clone(),
            dst_args: fh,
            ..Plan::default()
        },
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn an_open_unlinked_file_moves_with_its_data_through_the_handover_under_find_paths() {
    let name = "an_open_unlinked_file_moves_with_its_data_through_the_handover_under_find_paths";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            extras: strings(&["unlinked=ok"]),
            ..Plan::default()
        },
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn without_the_handover_an_open_unlinked_file_gives_the_guest_errors_under_migration_on_error_guest_error(
) {
    let name = "without_the_handover_an_open_unlinked_file_gives_the_guest_errors_under_migration_on_error_guest_error";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            extras: strings(&["unlinked=error"]),
            dst_args: strings(&["--migration-on-error", "guest-error"]),
            handover: false,
            ..Plan::default()
        },
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn without_the_handover_an_open_unlinked_file_fails_the_migration_and_the_source_goes_on_with_it() {
    let name = "without_the_handover_an_open_unlinked_file_fails_the_migration_and_the_source_goes_on_with_it";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            extras: strings(&["unlinked=ok"]),
            expect_fail: true,
            handover: false,
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn without_a_return_path_a_source_resumed_with_cont_after_a_failed_load_goes_on() {
    let name = "without_a_return_path_a_source_resumed_with_cont_after_a_failed_load_goes_on";
    if !vfsd_only(name) {
        return;
    }
    // An unlinked file the destination can't find makes it refuse the state after the
    // source reported completed: only the host's wait and cont keep the guest.
    run(
        name,
        &Plan {
            extras: strings(&["unlinked=ok"]),
            expect_fail: true,
            return_path: false,
            handover: false,
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn live_migration_without_a_return_path_keeps_open_files_and_locks() {
    run(
        "live_migration_without_a_return_path_keeps_open_files_and_locks",
        &Plan {
            return_path: false,
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn a_file_renamed_on_the_host_between_save_and_load_fails_the_migration_and_the_source_goes_on() {
    let name =
        "a_file_renamed_on_the_host_between_save_and_load_fails_the_migration_and_the_source_goes_on";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            rename: Some(("mig/data.log".into(), RenameAt::Switch)),
            expect_fail: true,
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn a_file_renamed_on_the_host_during_precopy_is_found_with_migration_confirm_paths() {
    let name = "a_file_renamed_on_the_host_during_precopy_is_found_with_migration_confirm_paths";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            rename: Some(("mig/data.log".into(), RenameAt::Precopy)),
            src_args: strings(&["--migration-confirm-paths"]),
            ..Plan::default()
        },
    );
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn every_file_passes_the_destinations_check_under_migration_verify_handles() {
    let name = "every_file_passes_the_destinations_check_under_migration_verify_handles";
    if !vfsd_only(name) {
        return;
    }
    let verify = strings(&["--migration-verify-handles"]);
    run(
        name,
        &Plan {
            src_args: verify.clone(),
            dst_args: verify,
            ..Plan::default()
        },
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn no_host_process_gets_a_lock_the_guest_holds_during_two_migrations() {
    let name = "no_host_process_gets_a_lock_the_guest_holds_during_two_migrations";
    if !vfsd_only(name) {
        return;
    }
    run(
        name,
        &Plan {
            rounds: 2,
            probes: true,
            ..Plan::default()
        },
    );
}

/// A bind mount, unmounted when dropped.
#[cfg_attr(not(feature = "extended-guest-tests"), allow(dead_code))]
struct BindMount(PathBuf);

#[cfg_attr(not(feature = "extended-guest-tests"), allow(dead_code))]
impl BindMount {
    fn new(from: &Path, at: &Path) -> BindMount {
        let st = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(at)
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "mount --bind {} {}",
            from.display(),
            at.display()
        );
        BindMount(at.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[cfg(feature = "extended-guest-tests")]
#[test]
#[ignore = "needs QEMU and root"]
fn a_destination_daemon_serving_a_bind_mount_of_the_directory_takes_over_files_and_locks() {
    let name =
        "a_destination_daemon_serving_a_bind_mount_of_the_directory_takes_over_files_and_locks";
    // The views live beside the test's own directory, which the run makes afresh.
    let views = TestDir::new(&format!("{name}.views"));
    let a = views.dir("a");
    let b = views.dir("b");
    let _bind = BindMount::new(&a, &b);
    migrate_between_two_views(
        name,
        &a,
        &b,
        Plan {
            probes: daemon_under_test().is_vfsd(),
            ..Plan::default()
        },
    );
}
