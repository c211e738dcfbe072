//! Locks between two guests, each with its own daemon on one host directory, and a
//! process on the host (guest-tests/locks.sh, quick mode): flock conflicts and wake-ups,
//! fcntl byte ranges and F_GETLK, locks released by a process's exit, and a host
//! process's flock and POSIX lock holding both guests off until it lets go. Under
//! `--cache never` (a FORGET follows each close) and `auto`, the default (RELEASE alone
//! ends an open file's OFD locks). The guests and the host meet through marker files in
//! the share's `sync/`. Full mode, the one run under `never`, adds to the quick mode's
//! steps counters both guests increment under flock, under fcntl and without locks, and
//! the host's kill -9 of guest A's QEMU while A holds locks guest B waits for. And 1,024
//! waiters of one guest user on one request queue, which must leave the queue serving
//! other requests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::assert_checks_ran;
use crate::fixture::{daemon_under_test, run_together, Guest, Share, TestDir};

/// guest-tests/src/vfsd-lock.c built for the host.
fn host_lock_tool(dir: &TestDir) -> PathBuf {
    let out = dir.path.join("vfsd-lock-host");
    crate::fixture::build_lock_tool(&out, false);
    out
}

/// Waits until every marker in `names` exists in `sync`; false if a guest gave up (its
/// `.abort` marker) or `secs` passed (then the host's own abort marker tells the guests).
fn await_markers(sync: &Path, secs: u64, names: &[&str]) -> bool {
    let t = Instant::now();
    for name in names {
        while !sync.join(name).exists() {
            if sync.join("A.abort").exists() || sync.join("B.abort").exists() {
                eprintln!("host: a guest gave up");
                return false;
            }
            if t.elapsed() > Duration::from_secs(secs) {
                eprintln!("host: timed out waiting for {name}");
                let _ = std::fs::write(sync.join("host.abort"), "");
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    true
}

/// The pid of the QEMU whose console is `console_prefix`*: the fixture does not hand out
/// a running guest's pid.
fn qemu_pid(console_prefix: &str) -> Option<u32> {
    let want = format!("path={console_prefix}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        cmdline
            .split(|&b| b == 0)
            .any(|a| String::from_utf8_lossy(a).contains(&want))
            .then_some(pid)
    })
}

/// The host's part of step s5: once B waits for the locks A holds, kill -9 A's QEMU
/// (found by its console, `console_prefix`*).
fn host_kills_a(sync: &Path, console_prefix: &str) -> Result<(), String> {
    if !await_markers(sync, 1800, &["B.s5-waiting"]) {
        return Err("guest B never waited in s5".into());
    }
    std::thread::sleep(Duration::from_secs(3));
    let Some(pid) = qemu_pid(console_prefix) else {
        let _ = std::fs::write(sync.join("host.abort"), "");
        return Err(format!("guest A's QEMU ({console_prefix}*) not found"));
    };
    std::fs::write(sync.join("host.s5-killing"), "").map_err(|e| e.to_string())?;
    // SAFETY: kill(2) on a pid just read from /proc; at worst it is gone already.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    Ok(())
}

/// The host's part of step s3: once both guests are ready, hold flock LOCK_EX and a
/// POSIX write lock on 0-99 of host-file until both guests wait for them, then let go.
fn host_role(share: &Path, tool: &Path) -> Result<(), String> {
    let sync = share.join("sync");
    if !await_markers(&sync, 900, &["A.s3-ready", "B.s3-ready"]) {
        return Err("the guests never got to s3".into());
    }
    let mut holder = Command::new(tool)
        .arg("-m")
        .arg(sync.join("host.s3-held"))
        .arg("-u")
        .arg(sync.join("host.s3-release"))
        .arg("-s")
        .arg(sync.join("host.s3-releasing"))
        .arg(share.join("host-file"))
        .args(["ex", "wr:0:100"])
        .spawn()
        .map_err(|e| format!("host lock holder: {e}"))?;
    let waiting = await_markers(&sync, 180, &["A.s3-waiting", "B.s3-waiting"]);
    if waiting {
        // Both guests are blocked on the host's locks: let them wait a moment.
        std::thread::sleep(Duration::from_secs(3));
    }
    std::fs::write(sync.join("host.s3-release"), "").map_err(|e| e.to_string())?;
    let st = holder.wait().map_err(|e| e.to_string())?;
    match (waiting, st.success()) {
        (true, true) => Ok(()),
        (false, _) => Err("the guests never waited for the host's locks".into()),
        (_, false) => Err(format!("the host's lock holder failed: {st}")),
    }
}

fn locks_between_two_guests_and_the_host(name: &str, cache: &str) {
    two_guests_and_the_host(name, cache, "quick", None)
}

/// `mode` is guest-tests/locks.sh's: quick, or full (counters and the kill -9 of A). The
/// share is a directory under `root` when given (a distributed file system's mount),
/// else under the test's own directory.
pub(crate) fn two_guests_and_the_host(name: &str, cache: &str, mode: &str, root: Option<&Path>) {
    let full = mode == "full";
    let dir = TestDir::new(name);
    let tool = host_lock_tool(&dir);
    let daemon = daemon_under_test();
    let args = [format!("--cache={cache}")];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for attempt in 1..=2 {
        let share = match root {
            Some(r) => r.join(format!("share-{attempt}")),
            None => dir.dir(&format!("share-{attempt}")),
        };
        std::fs::create_dir_all(share.join("sync")).unwrap();
        let guest = |role: &str| {
            Guest::new(&dir)
                .name(&format!("{}-{attempt}", role.to_lowercase()))
                .timeout(Duration::from_secs(1800))
                .share(Share::new(&share, "share0", daemon.clone(), &args))
        };
        let console_a = format!("{}/a-{attempt}-console-boot", dir.path.display());
        let (runs, host) = std::thread::scope(|s| {
            let host = s.spawn(|| {
                host_role(&share, &tool)?;
                if full {
                    host_kills_a(&share.join("sync"), &console_a)?;
                }
                Ok::<(), String>(())
            });
            let runs = run_together(
                &[
                    (guest("A"), &format!("/guest-tests/locks.sh A {mode}")),
                    (guest("B"), &format!("/guest-tests/locks.sh B {mode}")),
                ],
                attempt,
            );
            if runs
                .iter()
                .skip(usize::from(full))
                .any(|r| r.status != crate::fixture::Status::Exited(0))
            {
                // Whatever the host still waits for will not come.
                let _ = std::fs::write(share.join("sync/A.abort"), "");
            }
            (runs, host.join().unwrap())
        });
        if attempt == 1 && runs.iter().any(|r| r.failed_early()) {
            eprintln!("{name}: a guest failed before /init ran; running the pair again");
            continue;
        }
        for (role, run) in ["A", "B"].iter().zip(&runs) {
            let (counts, figures) = (
                format!("locks[{role}]: #"),
                format!("locks[{role}]: FIGURE"),
            );
            crate::record(&format!("{name} [{role}]"), run, &[&counts, &figures]);
        }
        if full {
            use std::os::unix::process::ExitStatusExt;
            // A's QEMU was killed: no result, and its daemon left when its VMM went away.
            let a = &runs[0];
            assert!(
                matches!(
                    a.status,
                    crate::fixture::Status::NoResult | crate::fixture::Status::DaemonDied(_)
                ) && !a
                    .daemon_exits
                    .iter()
                    .any(|e| e.is_some_and(|s| s.signal().is_some())),
                "guest A: {:?} after its QEMU was killed\n{}",
                a.status,
                a.tail()
            );
        } else {
            runs[0].assert_success();
        }
        runs[1].assert_success();
        host.unwrap_or_else(|e| panic!("{e}"));
        assert_both_guests_passed(&share.join("sync"));
        return;
    }
    unreachable!("the second attempt returns or panics");
}

#[test]
#[ignore = "needs QEMU and root"]
fn locks_between_two_guests_and_the_host_under_cache_auto() {
    locks_between_two_guests_and_the_host(
        "locks_between_two_guests_and_the_host_under_cache_auto",
        "auto",
    );
}

/// The full mode: the quick mode's steps, then the counters (2N under flock and fcntl)
/// and the kill -9 of A, whose locks go to B.
#[test]
#[ignore = "needs QEMU and root"]
fn locks_between_two_guests_and_the_host_under_cache_never_counters_and_a_killed_guests_locks() {
    two_guests_and_the_host(
        "locks_between_two_guests_and_the_host_under_cache_never_counters",
        "never",
        "full",
        None,
    );
}

/// Checks the summaries guests A and B wrote in `sync` ("PASSED FAILED"): each passed
/// some checks and failed none.
pub(crate) fn assert_both_guests_passed(sync: &Path) {
    for role in ["A", "B"] {
        let summary = std::fs::read_to_string(sync.join(format!("{role}.summary")))
            .unwrap_or_else(|_| panic!("guest {role} wrote no summary"));
        let counts: Vec<u64> = summary
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(
            counts.len() == 2 && counts[0] > 0 && counts[1] == 0,
            "guest {role}: {summary} (checks passed, failed)"
        );
    }
}

/// guest-tests/lock-waits.sh: a host process holds an exclusive flock on the share's `f`
/// while 1,024 guest processes of one user wait for it on the guest's one request queue
/// (1,024 entries). Half may wait and the rest are refused, so a stat and an ls of
/// other names are answered within 10 s; once the host lets go, every waiter ends.
#[test]
#[ignore = "needs QEMU and root"]
fn lock_waits_never_take_a_request_queue() {
    let name = "lock_waits_never_take_a_request_queue";
    let dir = TestDir::new(name);
    let share = dir.dir("share");
    let sync = share.join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    std::fs::write(share.join("f"), b"locked by the host").unwrap();
    // The guest's lock tool opens it for writing, as nobody.
    std::fs::set_permissions(
        share.join("f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let f = std::fs::File::open(share.join("f")).unwrap();
    // SAFETY: flock(2) on an fd this test owns.
    let held = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    assert_eq!(held, 0, "the host's flock");
    std::fs::write(sync.join("host.held"), "").unwrap();
    let guest = Guest::new(&dir)
        .timeout(Duration::from_secs(900))
        .share(Share::new(&share, "share0", daemon_under_test(), &[]));
    let run = std::thread::scope(|s| {
        let host = s.spawn(|| {
            // Lets go once the guest has checked, or when the guest is gone.
            let t = Instant::now();
            while !sync.join("guest.checked").exists() && t.elapsed() < Duration::from_secs(900) {
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(f);
        });
        let run = guest.run("/guest-tests/lock-waits.sh /mnt/share0");
        host.join().unwrap();
        run
    });
    crate::record(name, &run, &["lock-waits: "]);
    run.assert_success();
    assert_checks_ran(&run, "lock-waits", 6);
}
