//! xfstests (fstests, the pinned tree built by scripts/build-xfstests.sh) in a guest on
//! the host's userland: the CI list, `guest-tests/xfstests-ci.list`, must pass whole (a
//! test that does not run fails too). The guest gets four shares: the host's root alone
//! (read-only, `--cache always`; the guest builds an overlay root on it with the fstests
//! tree, /etc and /var writable and its kernel's modules), `test` and `scratch` (TEST_DEV
//! and SCRATCH_DEV, FSTYP=virtiofs, mounted by fstests) and `results`. A hung test is
//! killed by the guest's watchdog, its FUSE connections aborted, and a fresh guest runs
//! the rest of the list. The summary (summary.txt, summary.json: passed, failed, not run
//! with reasons, seconds per test) comes from scripts/xfstests_summary.py.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::fixture::{
    assets, cache_dir, daemon_under_test, helper_path, repo, DaemonKind, Guest, Share, TestDir,
};

/// The per-test watchdog in the guest.
const PER_TEST_SECS: u64 = 300;

/// The guest kernel's modules (`scripts/fetch-kernel.sh --modules`), for overlayfs.
fn modules_dir() -> PathBuf {
    let kdir = std::fs::canonicalize(assets().kernel.parent().unwrap()).unwrap();
    let abi = kdir.file_name().unwrap().to_string_lossy().into_owned();
    let version = abi.trim_end_matches("-cloud-amd64").to_string();
    helper_path(
        "fetch-kernel.sh",
        &["--modules"],
        &[("VFSD_KERNEL_VERSION", &version)],
    )
}

/// The tests of a list file: one name a line, `#` starts a comment.
fn read_list(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The tests check.out has a line for, in order, and whether its last line is whole.
fn seen(check_out: &Path) -> (Vec<String>, bool) {
    let text = std::fs::read_to_string(check_out).unwrap_or_default();
    let names = text
        .lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?;
            let (dir, num) = name.split_once('/')?;
            (dir.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && !num.is_empty()
                && num.chars().all(|c| c.is_ascii_digit()))
            .then(|| name.to_string())
        })
        .collect();
    (names, text.is_empty() || text.ends_with('\n'))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Follows check.out while a guest runs: when each test's line first showed and when it
/// was finished, as times.tsv has them for the summary.
fn follow(check_out: &Path, times: &Path, stop: &AtomicBool) {
    let mut start: HashMap<String, u64> = HashMap::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let (names, whole) = seen(check_out);
        let now = now_secs();
        let finished = if whole || stopping {
            names.len()
        } else {
            names.len().saturating_sub(1)
        };
        for (i, n) in names.iter().enumerate() {
            let t0 = *start.entry(n.clone()).or_insert(now);
            if i < finished && done.insert(n.clone()) {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(times)
                    .unwrap();
                let _ = writeln!(f, "{n}\t{t0}\t{now}");
            }
        }
        if stopping {
            return;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Runs `tests` against `daemon` with `args` for all four shares; returns the results
/// directory (summary.txt, summary.json, out/check.out, boots/).
fn run_xfstests(dir: &TestDir, daemon: DaemonKind, args: &[&str], tests: &[String]) -> PathBuf {
    let tree = cache_dir().join("xfstests");
    assert!(
        tree.join("check").is_file() && tree.join("ltp/fsstress").is_file(),
        "no built fstests tree in {}: run scripts/build-xfstests.sh (scripts/setup.sh does)",
        tree.display()
    );
    for u in ["fsgqa", "fsgqa2", "123456-fsgqa"] {
        let ok = Command::new("id")
            .arg(u)
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "user {u} missing: run scripts/build-xfstests.sh (it creates it)"
        );
    }
    let modules = modules_dir();
    // busybox and guest-tests are all the first stage needs; fstests runs on the host's
    // userland.
    let initrd = crate::fixture::minimal_initrd();
    // The guest sees them through a non-recursive bind of the host's root.
    {
        use std::os::unix::fs::MetadataExt;
        let root_dev = std::fs::metadata("/").unwrap().dev();
        for p in [&tree, &modules] {
            assert_eq!(
                std::fs::metadata(p).unwrap().dev(),
                root_dev,
                "{} is not on the root file system, so the guest can't see it (set VFSD_CACHE to a directory on /)",
                p.display()
            );
        }
    }
    let view = cache_dir().join("hostroot-view");
    std::fs::create_dir_all(&view).unwrap();

    let results = dir.dir("results");
    for d in ["out", "test", "scratch", "boots"] {
        std::fs::create_dir_all(results.join(d)).unwrap();
    }
    std::fs::write(results.join("tests.list"), tests.join("\n") + "\n").unwrap();
    let check_out = results.join("out/check.out");
    let notes = results.join("out/watchdog.log");
    let times = results.join("times.tsv");
    for f in [&check_out, &notes, &times] {
        std::fs::write(f, "").unwrap();
    }
    std::fs::write(
        results.join("run.info"),
        format!(
            "daemon: {daemon:?} {}\nkernel: {}\nper-test watchdog: {PER_TEST_SECS}s\nfstests: {}\n",
            args.join(" "),
            modules.display(),
            tree.display()
        ),
    )
    .unwrap();

    let start = Instant::now();
    let mut flakes = 0;
    for boot in 1.. {
        let (ran, _) = seen(&check_out);
        let left: Vec<&String> = tests.iter().filter(|t| !ran.contains(t)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            boot <= tests.len() + 2,
            "too many boots for {} tests",
            tests.len()
        );
        let list: String = left.iter().map(|t| format!("{t}\n")).collect();
        std::fs::write(results.join("out/tests.list"), list).unwrap();
        let mut root_args = args.to_vec();
        if daemon == DaemonKind::Vfsd || daemon == DaemonKind::Virtiofsd {
            // Keeps the guest's page cache of binaries and libraries across opens:
            // fstests' fork/exec-heavy scripts are much faster under TCG.
            root_args.extend(["--cache", "always"]);
        }
        if daemon == DaemonKind::Vfsd || daemon == DaemonKind::Virtiofsd {
            // The host's root: the guest's ro mount is not all that keeps it unchanged.
            root_args.push("--readonly");
        }
        let mut hostroot =
            Share::new(&view, "hostroot", daemon.clone(), &root_args).mount_options("ro");
        hostroot.host_root_view = true;
        // The guest's watchdog acts first; this is for a guest wedged as a whole.
        let limit = 900 + left.len() as u64 * 120 + PER_TEST_SECS;
        let guest = Guest::new(dir)
            .name(&format!("boot{boot}"))
            .mem_mb(4096)
            .initrd(initrd.clone())
            .timeout(Duration::from_secs(limit))
            .stop_when_idle(check_out.clone(), Duration::from_secs(PER_TEST_SECS + 300))
            .share(hostroot)
            .share(Share::new(&results.join("test"), "test", daemon.clone(), args).unmounted())
            .share(
                Share::new(&results.join("scratch"), "scratch", daemon.clone(), args).unmounted(),
            )
            .share(Share::new(
                &results.join("out"),
                "results",
                daemon.clone(),
                args,
            ));
        let before = ran.len();
        let stop = AtomicBool::new(false);
        let run = std::thread::scope(|s| {
            s.spawn(|| follow(&check_out, &times, &stop));
            // Stops the follower however the guest's run ends, a panic included.
            let _stop = StopOnDrop(&stop);
            guest.run(&format!(
                "/guest-tests/xfstests.sh {} {} {PER_TEST_SECS}",
                tree.display(),
                modules.display()
            ))
        });
        {
            use std::os::unix::process::ExitStatusExt;
            assert!(
                !matches!(run.status, crate::fixture::Status::DaemonDied(_))
                    && !run
                        .daemon_exits
                        .iter()
                        .any(|e| e.is_some_and(|s| s.signal().is_some())),
                "boot {boot}: a daemon died ({:?})\n{}",
                run.status,
                run.tail()
            );
        }
        let (after, whole) = seen(&check_out);
        if !whole {
            // A test line without its result: the guest stopped in the middle of it.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&check_out)
                .unwrap();
            let _ = writeln!(f);
            if let Some(cur) = after.last() {
                let noted = std::fs::read_to_string(&notes).unwrap_or_default();
                if !noted.lines().any(|l| l.starts_with(&format!("{cur}\t"))) {
                    let mut n = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&notes)
                        .unwrap();
                    let _ = writeln!(
                        n,
                        "{cur}\tthe guest stopped during the test ({:?})",
                        run.status
                    );
                }
            }
        }
        eprintln!(
            "xfstests boot {boot}: {:?}, {} of {} tests done",
            run.status,
            after.len(),
            tests.len()
        );
        if after.len() == before {
            // Nothing ran: a boot flake or a set-up error. Once more, then give up.
            flakes += 1;
            assert!(
                flakes < 2,
                "no test ran in two boots in a row\n{}",
                run.tail()
            );
        } else {
            flakes = 0;
        }
    }
    let st = Command::new("python3")
        .arg(repo().join("scripts/xfstests_summary.py"))
        .arg("--results")
        .arg(&results)
        .args([
            "--wall",
            &start.elapsed().as_secs().to_string(),
            "--strict-flag",
            "1",
        ])
        .status()
        .expect("python3 (it writes the summary)");
    assert!(st.success(), "scripts/xfstests_summary.py failed");
    results
}

#[test]
#[ignore = "needs QEMU and root"]
fn the_ci_xfstests_list_passes_whole() {
    let name = "the_ci_xfstests_list_passes_whole";
    let dir = TestDir::new(name);
    let tests = read_list(&repo().join("guest-tests/xfstests-ci.list"));
    // --posix-acl: the list has ACL tests, which are "not run" without it.
    let results = run_xfstests(&dir, daemon_under_test(), &["--posix-acl"], &tests);
    let summary = std::fs::read_to_string(results.join("summary.txt")).expect("summary.txt");
    for l in summary.lines().filter(|l| l.starts_with("passed ")) {
        crate::fixture::summarize(name, &format!("xfstests: {l}"));
    }
    assert!(
        summary.lines().any(|l| l == "RESULT: PASS"),
        "xfstests (results in {}):\n{summary}",
        results.display()
    );
}
