//! Upgrade in place under a working guest (docs/upgrade.md): vfsd runs from a copy of
//! its binary; while guest-tests/upgrade.sh works on the share as root and as a user
//! (appends, a held lock, an open unlinked file, fio with crc32c verify, untar rounds),
//! the host replaces the copy ten times, as a package upgrade does, and sends SIGUSR2
//! each time. The guest must see no error and nothing lost; the host probes the guest's
//! locks before, after and once released, and checks what the guest left.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::fixture::{daemon_under_test, summarize, vfsd_bin, Guest, Share, TestDir};

const UPGRADES: usize = 10;
const ROLES: [&str; 2] = ["root", "user"];

/// A copy of vfsd in a directory of its own, replaced as a package upgrade does: a new
/// file renamed over the old name.
pub(crate) struct Binary {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
}

impl Binary {
    pub(crate) fn new() -> Binary {
        let dir = tempfile::Builder::new()
            .prefix("vfsd-upgrade")
            .tempdir()
            .unwrap();
        // As /proc/PID/exe names it.
        let path = std::fs::canonicalize(dir.path()).unwrap().join("vfsd");
        std::fs::copy(vfsd_bin(), &path).unwrap();
        Binary { _dir: dir, path }
    }

    pub(crate) fn replace(&self) -> Result<(), String> {
        let tmp = self.path.with_extension("new");
        std::fs::copy(vfsd_bin(), &tmp).map_err(|e| format!("copying vfsd: {e}"))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &self.path).map_err(|e| format!("renaming the new vfsd: {e}"))
    }
}

/// The process the fixture started from `bin`: the supervisor (its child, the serving
/// process, runs the same file).
pub(crate) fn supervisor(bin: &Path) -> Option<i32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let status = std::fs::read_to_string(e.path().join("status")).ok()?;
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim();
        (ppid == me && std::fs::read_link(e.path().join("exe")).ok()? == bin).then_some(pid)
    })
}

/// The supervisor's child: the process serving the guest.
fn served_by(supervisor: i32) -> Option<i32> {
    let c =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    c.split_whitespace().next()?.parse().ok()
}

/// Waits until the supervisor serves through a process other than `old`, and `old` is
/// gone.
fn wait_for_handover(supervisor: i32, old: i32) -> Result<i32, String> {
    let t = Instant::now();
    loop {
        if let Some(p) = served_by(supervisor).filter(|&p| p != old) {
            if !Path::new(&format!("/proc/{old}")).exists() {
                return Ok(p);
            }
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "no handover within 60 s: the supervisor still serves through {old}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a host open file can take flock LOCK_EX on `p` now.
fn host_flock_free(p: &Path) -> Result<bool, String> {
    let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    // SAFETY: flock(2) on an fd this function owns; closing it drops a lock it got.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        e => Err(format!("flock {}: errno {e:?}", p.display())),
    }
}

/// The type of the lock an OFD write lock on `start`..`start + len` of `p` would
/// conflict with (F_OFD_GETLK): F_UNLCK when it is free.
fn host_ofd_conflict(p: &Path, start: i64, len: i64) -> Result<i32, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    // SAFETY: a zeroed flock is a valid value; its fields are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: fcntl on an fd this function owns with a pointer to a live flock.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) } != 0 {
        return Err(format!(
            "F_OFD_GETLK {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(fl.l_type as i32)
}

/// Checks the guest's locks on `p` (flock LOCK_EX and a write lock on 0-99) from the
/// host: `held`, or all free.
pub(crate) fn probe(p: &Path, held: bool, when: &str) -> Result<(), String> {
    let flock_free = host_flock_free(p)?;
    let range = host_ofd_conflict(p, 0, 100)?;
    let beyond = host_ofd_conflict(p, 200, 10)?;
    let want = if held { libc::F_WRLCK } else { libc::F_UNLCK };
    if flock_free == held || range != want || beyond != libc::F_UNLCK {
        return Err(format!(
            "{when}: {}: host flock {}, OFD wr 0-99 conflicts with type {range}, 200-209 with {beyond} (expected {})",
            p.display(),
            if flock_free { "granted" } else { "refused" },
            if held { "held" } else { "free" }
        ));
    }
    Ok(())
}

/// Waits until each of `names` exists in `up`; an error (and host.abort for the
/// guest) if the guest gave up or `secs` passed.
pub(crate) fn await_markers(up: &Path, secs: u64, names: &[String]) -> Result<(), String> {
    let t = Instant::now();
    for name in names {
        while !up.join(name).exists() {
            if up.join("guest.abort").exists() {
                return Err(format!("the guest gave up before {name}"));
            }
            if t.elapsed() > Duration::from_secs(secs) {
                return Err(format!("no {name} within {secs} s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The host's part: once both workloads run, probe their locks, upgrade `UPGRADES`
/// times, probe again, tell the guest (host.done), and probe each lock once released.
fn host_role(up: &Path, bin: &Binary) -> Result<Window, String> {
    let ready: Vec<String> = ROLES.iter().map(|r| format!("{r}.ready")).collect();
    await_markers(up, 600, &ready)?;
    let sup = supervisor(&bin.path).ok_or("no vfsd started from the copy")?;
    let locks: Vec<PathBuf> = ROLES.iter().map(|r| up.join(r).join("lock-file")).collect();
    for l in &locks {
        probe(l, true, "before the upgrades")?;
    }
    let appended = || -> Vec<usize> {
        ROLES
            .iter()
            .map(|r| {
                std::fs::read_to_string(up.join(r).join("data.log"))
                    .map_or(0, |t| t.lines().count())
            })
            .collect()
    };
    let (start, lines_before) = (Instant::now(), appended());
    let mut spans = Vec::new();
    for round in 1..=UPGRADES {
        let before = appended();
        let old = served_by(sup).ok_or("the supervisor serves through no process")?;
        let old_exe = std::fs::metadata(format!("/proc/{old}/exe"))
            .map_err(|e| e.to_string())?
            .ino();
        bin.replace()?;
        // SAFETY: kill(2) with a valid signal on the supervisor this test started.
        if unsafe { libc::kill(sup, libc::SIGUSR2) } != 0 {
            return Err(format!(
                "SIGUSR2 to {sup}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let new = wait_for_handover(sup, old).map_err(|e| format!("upgrade {round}: {e}"))?;
        spans.push((before, appended()));
        let exe = std::fs::metadata(format!("/proc/{new}/exe"))
            .map_err(|e| e.to_string())?
            .ino();
        let path = std::fs::metadata(&bin.path)
            .map_err(|e| e.to_string())?
            .ino();
        if exe != path || exe == old_exe {
            return Err(format!(
                "upgrade {round}: process {new} runs inode {exe}; the path's is {path}, the old process's {old_exe}"
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    for l in &locks {
        probe(l, true, &format!("after {UPGRADES} upgrades"))?;
    }
    let window = Window {
        secs: start.elapsed().as_secs_f64(),
        appended: appended()
            .iter()
            .zip(&lines_before)
            .map(|(a, b)| a - b)
            .collect(),
        spans,
    };
    std::fs::write(up.join("host.done"), format!("{UPGRADES} upgrades\n"))
        .map_err(|e| e.to_string())?;
    for (role, l) in ROLES.iter().zip(&locks) {
        await_markers(up, 300, &[format!("{role}.released")])?;
        probe(l, false, "once the guest released them")?;
        std::fs::write(up.join(format!("host.{role}.probed")), "").map_err(|e| e.to_string())?;
    }
    Ok(window)
}

/// The upgrades' time on the host, from the first SIGUSR2 to the last handover's gap,
/// and how many lines each workload appended meanwhile.
struct Window {
    secs: f64,
    appended: Vec<usize>,
    /// Per upgrade, each workload's line count at SIGUSR2 and once the new process
    /// served.
    spans: Vec<(Vec<usize>, Vec<usize>)>,
}

impl Window {
    /// Whether the append of line `line` (1-based) by workload `role` may have waited
    /// for a handover: it came after the last line seen before a SIGUSR2 and at most
    /// one line after the last seen once the new process served.
    fn across_a_handover(&self, role: usize, line: usize) -> bool {
        self.spans
            .iter()
            .any(|(b, a)| line > b[role] && line <= a[role] + 1)
    }
}

/// A small tree to untar (files of several sizes in nested directories, a symlink, an
/// empty file), packed as `up`/src.tar, with `up`/src.sha256 for the guest's checks.
pub(crate) fn make_tarball(src: &Path, up: &Path) {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for d in 0..4 {
        for f in 0..15 {
            let dir = src.join(format!("d{d}")).join(format!("s{}", f % 3));
            std::fs::create_dir_all(&dir).unwrap();
            let len = (f * 4099 + d * 977) % 40_000;
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            std::fs::write(dir.join(format!("f{f}")), data).unwrap();
        }
    }
    std::os::unix::fs::symlink("d0/s0/f0", src.join("link")).unwrap();
    let sh = |script: &str| {
        let st = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(src)
            .status()
            .unwrap();
        assert!(st.success(), "{script}: {st}");
    };
    sh("chmod -R u=rwX,go=rX . && find . -type f | sort | xargs sha256sum > ../src.sha256");
    sh(&format!(
        "tar -cf {}/src.tar . && mv ../src.sha256 {}/",
        up.display(),
        up.display()
    ));
}

/// The paths `tar -tf` lists, without "./" and a directory's trailing slash.
pub(crate) fn tar_listing(tar: &Path) -> BTreeSet<String> {
    let out = Command::new("tar").arg("-tf").arg(tar).output().unwrap();
    assert!(out.status.success(), "tar -tf {}", tar.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").trim_end_matches('/').to_string())
        .filter(|l| !l.is_empty() && l != ".")
        .collect()
}

/// Every path under `root`, relative to it.
fn walk(root: &Path, at: &Path, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(at).unwrap().flatten() {
        let p = e.path();
        out.insert(p.strip_prefix(root).unwrap().display().to_string());
        if e.file_type().unwrap().is_dir() {
            walk(root, &p, out);
        }
    }
}

/// Each untarred tree under `dir` has tar's listing, the source's file contents and its
/// symlink; returns how many trees there were.
pub(crate) fn check_trees(dir: &Path, src: &Path, listing: &BTreeSet<String>) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with("tree.") {
            continue;
        }
        n += 1;
        let tree = e.path();
        let mut found = BTreeSet::new();
        walk(&tree, &tree, &mut found);
        assert_eq!(&found, listing, "{}: not tar's listing", tree.display());
        for p in listing {
            let (a, b) = (tree.join(p), src.join(p));
            let m = std::fs::symlink_metadata(&b).unwrap();
            if m.file_type().is_symlink() {
                assert_eq!(
                    std::fs::read_link(&a).unwrap(),
                    std::fs::read_link(&b).unwrap()
                );
            } else if m.is_file() {
                assert!(
                    std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
                    "{}: not the source's contents",
                    a.display()
                );
            }
        }
    }
    n
}

/// data.log's lines ("N CENTISECONDS"): N runs 1, 2, ...; returns the count and, for
/// each line after the first, its line number and the gap since the one before in ms.
fn check_appends(log: &Path) -> (usize, Vec<(usize, u64)>) {
    let text = std::fs::read_to_string(log).unwrap();
    let mut prev: Option<u64> = None;
    let mut gaps = Vec::new();
    let mut n = 0;
    for (i, l) in text.lines().enumerate() {
        let mut w = l.split_whitespace();
        let k: usize = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let t: u64 = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        assert_eq!(k, i + 1, "{} line {}: {l:?}", log.display(), i + 1);
        if let Some(p) = prev {
            gaps.push((k, t.saturating_sub(p) * 10));
        }
        prev = Some(t);
        n = k;
    }
    (n, gaps)
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_guest_working_on_the_share_sees_nothing_of_ten_upgrades_in_place() {
    let name = "a_guest_working_on_the_share_sees_nothing_of_ten_upgrades_in_place";
    if !daemon_under_test().is_vfsd() {
        eprintln!("{name}: skipped: upgrade in place is vfsd's");
        return;
    }
    let dir = TestDir::new(name);
    let share = dir.dir("share");
    let up = share.join("up");
    std::fs::create_dir_all(&up).unwrap();
    std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o777)).unwrap();
    let src = dir.dir("tar-src");
    make_tarball(&src, &up);
    let bin = Binary::new();
    let guest = Guest::new(&dir)
        .timeout(Duration::from_secs(900))
        .share(Share::new(&share, "share0", daemon_under_test(), &[]).binary(&bin.path));
    let (run, host) = std::thread::scope(|s| {
        let host = s.spawn(|| {
            let r = host_role(&up, &bin);
            if r.is_err() {
                let _ = std::fs::write(up.join("host.abort"), "");
            }
            r
        });
        let run = guest.run("/guest-tests/upgrade.sh 600");
        // Whatever the host still waits for will not come.
        let _ = std::fs::write(up.join("guest.abort"), "");
        (run, host.join().unwrap())
    });
    for l in run.lines("upgrade") {
        eprintln!("{l}");
    }
    let window = host.unwrap_or_else(|e| panic!("host: {e}\n{}", run.tail()));
    run.assert_success();
    // The workloads ran through the upgrades: at least one append per upgrade.
    for (role, n) in ROLES.iter().zip(&window.appended) {
        assert!(
            *n >= UPGRADES,
            "{role}: {n} appends during the {UPGRADES} upgrades ({:.1} s)",
            window.secs
        );
    }
    for role in ROLES {
        let want = format!("upgrade[{role}]: ");
        assert!(
            run.lines(&want)
                .iter()
                .any(|l| l.ends_with(" checks passed, 0 failed")),
            "no clean summary from the {role} workload\n{}",
            run.tail()
        );
    }

    // The handovers, as the supervisor logged them.
    let log = std::fs::read_to_string(&run.daemon_logs[0]).unwrap();
    let pauses: Vec<u64> = log
        .lines()
        .filter_map(|l| {
            l.split_once("now serves (pause ")?
                .1
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(pauses.len(), UPGRADES, "handovers in the log:\n{log}");
    assert!(!log.contains("upgrade refused"), "{log}");

    let listing = tar_listing(&up.join("src.tar"));
    let mut figures = Vec::new();
    for (i, (role, during)) in ROLES.iter().zip(&window.appended).enumerate() {
        let (lines, gaps) = check_appends(&up.join(role).join("data.log"));
        let trees = check_trees(&up.join(role), &src, &listing);
        assert!(trees > 0, "{role}: no untarred tree");
        let (across, elsewhere): (Vec<_>, Vec<_>) = gaps
            .iter()
            .partition(|(line, _)| window.across_a_handover(i, *line));
        let max = |v: &[&(usize, u64)]| v.iter().map(|g| g.1).max().unwrap_or(0);
        let mut all: Vec<u64> = gaps.iter().map(|g| g.1).collect();
        all.sort_unstable();
        figures.push(format!(
            "{role}: {lines} appends ({during} during the upgrades), largest gap across a handover {} ms, elsewhere {} ms (median {} ms), {trees} untars",
            max(&across),
            max(&elsewhere),
            all.get(all.len() / 2).unwrap_or(&0)
        ));
    }
    summarize(
        &format!("{name} ({} s)", run.secs),
        &format!(
            "{UPGRADES} upgrades in {:.1} s, pause (log) max {} ms, mean {} ms; {}",
            window.secs,
            pauses.iter().max().unwrap(),
            pauses.iter().sum::<u64>() / pauses.len() as u64,
            figures.join("; ")
        ),
    );
    for l in run.lines("upgrade[") {
        if l.contains("FIGURE fio") {
            summarize(&format!("{name} ({} s)", run.secs), &l);
        }
    }
}
