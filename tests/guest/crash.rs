//! Crash survival under a working guest: while guest-tests/crash.sh works on the share
//! as root and as a user (appends, a held lock, an open unlinked file, fio with crc32c
//! verify, untar rounds), the host SIGKILLs vfsd's serving process ten times, 1-2 s
//! apart (the most a connection survives within a minute), with an upgrade in place
//! after the fifth: the last five crash processes a re-executed supervisor started.
//! Every workload must finish and verify; EIO is allowed only where a request in flight at a crash
//! can't be run again (an append, an untar's MKDIR or CREATE with O_EXCL), and such a
//! request lands at most once. The host probes the guest's locks before, after and once
//! released, checks what the guest left, and reports the largest gap between appends.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::fixture::{daemon_under_test, summarize, Guest, Share, TestDir};
use crate::upgrade::{
    await_markers, check_trees, make_tarball, probe, supervisor, tar_listing, Binary,
};

/// The most crashes a connection survives within a minute.
const KILLS: usize = 10;
/// The upgrade in place comes after this many.
const UPGRADE_AFTER: usize = 5;
const ROLES: [&str; 2] = ["root", "user"];

/// Every child of `p` (of each of its threads).
fn children(p: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// A process's start time (clock ticks after boot), 0 if it is gone.
fn started(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(19)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The process serving below the supervisor `sup`: the deepest running process of its
/// tree (below the sandbox's parent that keeps its files), the newest among equals; a
/// dead one's keeper may linger a moment beside the new one's. None until it runs two
/// levels down.
fn serving(sup: i32) -> Option<i32> {
    let mut best = (0, 0, sup);
    let mut todo = vec![(sup, 0)];
    while let Some((p, depth)) = todo.pop() {
        if depth > 0 && alive(p) && (depth, started(p)) > (best.0, best.1) {
            best = (depth, started(p), p);
        }
        todo.extend(children(p).into_iter().map(|c| (c, depth + 1)));
    }
    (best.0 >= 2).then_some(best.2)
}

/// Whether `pid` runs (exists and is no zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn line_counts(up: &Path) -> Vec<usize> {
    ROLES
        .iter()
        .map(|r| {
            std::fs::read_to_string(up.join(r).join("data.log")).map_or(0, |t| t.lines().count())
        })
        .collect()
}

/// Waits (10 s at most) until a process serves below `sup`, and if `old` is given, one
/// other than `old`, which has gone.
fn wait_serving(sup: i32, old: Option<i32>) -> Result<i32, String> {
    let t = Instant::now();
    loop {
        match serving(sup) {
            Some(p) if old.is_none_or(|o| p != o && !alive(o)) => return Ok(p),
            _ => {}
        }
        if !alive(sup) {
            return Err(format!("the supervisor {sup} exited"));
        }
        if t.elapsed() > Duration::from_secs(10) {
            return Err(match old {
                Some(o) => format!("no new serving process 10 s after {o}"),
                None => "no serving process for 10 s".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One crash as the host saw it.
struct Kill {
    /// Each workload's data.log lines when the signal went, and once it had appended
    /// again after the crash.
    before: Vec<usize>,
    after: Vec<usize>,
    /// From the signal to a new serving process, and to an append by every workload.
    replaced_ms: u128,
    resumed_ms: u128,
}

/// SIGKILLs the serving process below `sup`; waits for another to serve and for every
/// workload to append again.
fn kill_once(sup: i32, up: &Path, n: usize) -> Result<Kill, String> {
    let victim = wait_serving(sup, None).map_err(|e| format!("kill {n}: {e}"))?;
    let before = line_counts(up);
    let t = Instant::now();
    // SAFETY: kill(2) with a valid signal on a process of the daemon this test started.
    if unsafe { libc::kill(victim, libc::SIGKILL) } != 0 {
        return Err(format!(
            "kill {n}: SIGKILL to {victim}: {}",
            std::io::Error::last_os_error()
        ));
    }
    wait_serving(sup, Some(victim)).map_err(|e| format!("kill {n}: {e}"))?;
    let replaced_ms = t.elapsed().as_millis();
    // Two more lines: one whole append after the crash.
    let after = loop {
        let now = line_counts(up);
        if now.iter().zip(&before).all(|(a, b)| *a >= b + 2) {
            break now;
        }
        if up.join("guest.abort").exists() {
            return Err(format!("kill {n}: the guest gave up"));
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "kill {n}: the workloads appended {now:?} lines within 60 s, {before:?} at the kill"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Kill {
        before,
        after,
        replaced_ms,
        resumed_ms: t.elapsed().as_millis(),
    })
}

/// The host's part: once both workloads run, probe their locks, crash the serving
/// process `KILLS` times 1-2 s apart (an upgrade after `UPGRADE_AFTER`), probing the
/// locks after each, tell the guest (host.done), and probe each lock once released.
fn host_role(up: &Path, bin: &Binary) -> Result<Window, String> {
    let ready: Vec<String> = ROLES.iter().map(|r| format!("{r}.ready")).collect();
    await_markers(up, 600, &ready)?;
    let sup = supervisor(&bin.path).ok_or("no vfsd started from the copy")?;
    let locks: Vec<_> = ROLES.iter().map(|r| up.join(r).join("lock-file")).collect();
    for l in &locks {
        probe(l, true, "before the crashes")?;
    }
    let (start, lines_before) = (Instant::now(), line_counts(up));
    let mut kills = Vec::new();
    for n in 1..=KILLS {
        kills.push(kill_once(sup, up, n)?);
        for l in &locks {
            probe(l, true, &format!("after kill {n}"))?;
        }
        if n == UPGRADE_AFTER {
            let old = wait_serving(sup, None)?;
            bin.replace()?;
            // SAFETY: kill(2) with a valid signal on the supervisor this test started.
            if unsafe { libc::kill(sup, libc::SIGUSR2) } != 0 {
                return Err(format!(
                    "SIGUSR2 to {sup}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            wait_serving(sup, Some(old)).map_err(|e| format!("the upgrade: {e}"))?;
            for l in &locks {
                probe(l, true, "after the upgrade")?;
            }
        }
        if n < KILLS {
            std::thread::sleep(Duration::from_millis(1000 + 250 * (n % 5) as u64));
        }
    }
    let window = Window {
        secs: start.elapsed().as_secs_f64(),
        appended: line_counts(up)
            .iter()
            .zip(&lines_before)
            .map(|(a, b)| a - b)
            .collect(),
        kills,
    };
    std::fs::write(up.join("host.done"), format!("{KILLS} kills\n")).map_err(|e| e.to_string())?;
    for (role, l) in ROLES.iter().zip(&locks) {
        await_markers(up, 300, &[format!("{role}.released")])?;
        probe(l, false, "once the guest released them")?;
        std::fs::write(up.join(format!("host.{role}.probed")), "").map_err(|e| e.to_string())?;
    }
    Ok(window)
}

/// The crashes' time on the host and how many lines each workload appended meanwhile.
struct Window {
    secs: f64,
    appended: Vec<usize>,
    kills: Vec<Kill>,
}

impl Window {
    /// Whether line `line` (1-based, as the file holds it) of workload `role` may have
    /// waited for a crash: it came after the last line seen at a kill and at most one
    /// line after the last seen once the workloads appended again.
    fn across_a_crash(&self, role: usize, line: usize) -> bool {
        self.kills
            .iter()
            .any(|k| line > k.before[role] && line <= k.after[role] + 1)
    }
}

/// The numbers, one a line, in a file the guest wrote (an EIO it noted).
fn noted(p: &Path) -> BTreeSet<usize> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// data.log's lines ("N CENTISECONDS"): N runs 1, 2, ..., a line repeated right after
/// itself only if its append got EIO (`eio`). Returns the last N, the repeats, and for
/// each line after the first, its position in the file (1-based) and the gap since the
/// one before in ms.
fn check_appends(log: &Path, eio: &BTreeSet<usize>) -> (usize, usize, Vec<(usize, u64)>) {
    let text = std::fs::read_to_string(log).unwrap();
    let (mut last, mut repeats) = (0usize, 0usize);
    let mut prev: Option<u64> = None;
    let mut gaps = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let mut w = l.split_whitespace();
        let k: usize = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let t: u64 = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if k == last && eio.contains(&k) {
            repeats += 1;
            continue;
        }
        assert_eq!(
            k,
            last + 1,
            "{} line {} {l:?} after line {last} (EIO noted at {eio:?})",
            log.display(),
            i + 1
        );
        if let Some(p) = prev {
            gaps.push((i + 1, t.saturating_sub(p) * 10));
        }
        prev = Some(t);
        last = k;
    }
    (last, repeats, gaps)
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_guest_working_on_the_share_goes_on_through_ten_crashes_of_the_serving_process() {
    let name = "a_guest_working_on_the_share_goes_on_through_ten_crashes_of_the_serving_process";
    if !daemon_under_test().is_vfsd() {
        eprintln!("{name}: skipped: crash survival is vfsd's");
        return;
    }
    let dir = TestDir::new(name);
    let share = dir.dir("share");
    let up = share.join("up");
    std::fs::create_dir_all(&up).unwrap();
    std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o777)).unwrap();
    let src = dir.dir("tar-src");
    make_tarball(&src, &up);
    // A copy of vfsd: it names the supervisor among the test binary's children, and the
    // upgrade between the bursts replaces it.
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
        let run = guest.run("/guest-tests/crash.sh 600");
        // Whatever the host still waits for will not come.
        let _ = std::fs::write(up.join("guest.abort"), "");
        (run, host.join().unwrap())
    });
    for l in run.lines("crash") {
        eprintln!("{l}");
    }
    let window = host.unwrap_or_else(|e| panic!("host: {e}\n{}", run.tail()));
    run.assert_success();
    for (role, n) in ROLES.iter().zip(&window.appended) {
        assert!(
            *n >= KILLS,
            "{role}: {n} appends during the {KILLS} crashes ({:.1} s)",
            window.secs
        );
    }
    for role in ROLES {
        let want = format!("crash[{role}]: ");
        assert!(
            run.lines(&want)
                .iter()
                .any(|l| l.ends_with(" checks passed, 0 failed")),
            "no clean summary from the {role} workload\n{}",
            run.tail()
        );
    }
    let log = std::fs::read_to_string(&run.daemon_logs[0]).unwrap();
    assert!(!log.contains("upgrade refused"), "{log}");

    let listing = tar_listing(&up.join("src.tar"));
    let mut figures = Vec::new();
    for (i, (role, during)) in ROLES.iter().zip(&window.appended).enumerate() {
        let at = up.join(role);
        let (eio_lines, eio_unl, eio_untar) = (
            noted(&at.join("eio.data")),
            noted(&at.join("eio.unl")),
            noted(&at.join("eio.untar")),
        );
        // A workload has one request of the appends and one of the untar rounds in
        // flight at a time: at most that many EIOs per crash.
        let eios = eio_lines.len() + eio_unl.len() + eio_untar.len();
        assert!(
            eios <= 2 * KILLS,
            "{role}: {eios} EIOs over {KILLS} crashes: appends {eio_lines:?}, fd 6 {eio_unl:?}, untar rounds {eio_untar:?}"
        );
        let (lines, repeats, gaps) = check_appends(&at.join("data.log"), &eio_lines);
        let trees = check_trees(&at, &src, &listing);
        assert!(trees > 0, "{role}: no untarred tree");
        let (across, elsewhere): (Vec<_>, Vec<_>) = gaps
            .iter()
            .partition(|(line, _)| window.across_a_crash(i, *line));
        let max = |v: &[&(usize, u64)]| v.iter().map(|g| g.1).max().unwrap_or(0);
        let mut all: Vec<u64> = gaps.iter().map(|g| g.1).collect();
        all.sort_unstable();
        figures.push(format!(
            "{role}: {lines} appends ({during} during the crashes), largest gap across a crash {} ms, elsewhere {} ms (median {} ms), {trees} untars, EIO: {} appends ({repeats} landed twice), {} fd 6 writes, {} untar rounds",
            max(&across),
            max(&elsewhere),
            all.get(all.len() / 2).unwrap_or(&0),
            eio_lines.len(),
            eio_unl.len(),
            eio_untar.len(),
        ));
    }
    let replaced: Vec<u128> = window.kills.iter().map(|k| k.replaced_ms).collect();
    let resumed: Vec<u128> = window.kills.iter().map(|k| k.resumed_ms).collect();
    summarize(
        &format!("{name} ({} s)", run.secs),
        &format!(
            "{KILLS} SIGKILLs in {:.1} s, new serving process after max {} ms (mean {} ms), every workload appending again after max {} ms; {}",
            window.secs,
            replaced.iter().max().unwrap(),
            replaced.iter().sum::<u128>() / KILLS as u128,
            resumed.iter().max().unwrap(),
            figures.join("; ")
        ),
    );
    for l in run.lines("crash[") {
        if l.contains("FIGURE fio") {
            summarize(&format!("{name} ({} s)", run.secs), &l);
        }
    }
}
