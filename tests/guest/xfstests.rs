//! xfstests (fstests, the pinned tree built by scripts/build-xfstests.sh) in a guest on
//! the host's userland. The CI list, `guest-tests/xfstests-ci.list`, must pass whole (a
//! test that does not run fails too; `data::the_ci_xfstests_list_passes_whole`, among the
//! other checkers so that this long test starts early); `VFSD_XFSTESTS_LIST` runs any
//! other list (see `any_xfstests_list_named_in_the_environment`). The guest gets four shares: the host's
//! root alone (read-only, `--cache always`; the guest builds an overlay root on it with
//! the fstests tree, /etc and /var writable and its kernel's modules), `test` and
//! `scratch` (TEST_DEV and SCRATCH_DEV, FSTYP=virtiofs, mounted by fstests) and
//! `results`. A hung test is killed by the guest's watchdog, its FUSE connections
//! aborted, and a fresh guest runs the rest of the list. Each run writes summary.txt and
//! summary.json (passed, failed, not run with reasons, seconds per test).

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::fixture::{
    assets, cache_dir, daemon_under_test, helper_path, repo, DaemonKind, Guest, Share, TestDir,
};

/// The per-test watchdog in the guest, unless `VFSD_XFSTESTS_TEST_TIMEOUT` says otherwise.
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
pub fn read_list(path: &Path) -> Vec<String> {
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

/// How one list runs.
pub struct ListRun {
    pub daemon: DaemonKind,
    /// Arguments for the daemons of all four shares.
    pub args: Vec<String>,
    /// summary.txt, summary.json, out/ (the results share: check.out, watchdog.log),
    /// boots/, times.tsv.
    pub results: PathBuf,
    /// Where the test and scratch shares are made (`results` unless the file system
    /// under test is elsewhere).
    pub devices: PathBuf,
    pub per_test_secs: u64,
    /// A "not run" counts as a failure.
    pub strict: bool,
    /// Where the list came from, for run.info.
    pub source: String,
}

impl ListRun {
    /// `daemon` with `args`, results (and the test and scratch shares) in `results`,
    /// the default watchdog.
    pub fn new(daemon: DaemonKind, args: &[&str], results: PathBuf) -> ListRun {
        ListRun {
            daemon,
            args: args.iter().map(|a| a.to_string()).collect(),
            devices: results.clone(),
            results,
            per_test_secs: PER_TEST_SECS,
            strict: false,
            source: String::new(),
        }
    }
}

/// Runs `tests` as `how` says, then writes summary.json and summary.txt.
pub fn run_list(dir: &TestDir, how: &ListRun, tests: &[String]) -> Summary {
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
    assert!(!tests.is_empty(), "the test list is empty");
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

    let (daemon, per_test) = (&how.daemon, how.per_test_secs);
    let args: Vec<&str> = how.args.iter().map(String::as_str).collect();
    let results = &how.results;
    let (test_dev, scratch_dev) = (how.devices.join("test"), how.devices.join("scratch"));
    for d in [&results.join("out"), &results.join("boots")] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d).unwrap();
    }
    for d in [&test_dev, &scratch_dev] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    std::fs::write(results.join("tests.list"), tests.join("\n") + "\n").unwrap();
    let check_out = results.join("out/check.out");
    let notes = results.join("out/watchdog.log");
    let times = results.join("times.tsv");
    for f in [&check_out, &notes, &times] {
        std::fs::write(f, "").unwrap();
    }
    let built = std::fs::read_to_string(tree.join(".vfsd-built"))
        .unwrap_or_else(|_| "not built by build-xfstests.sh".into());
    std::fs::write(
        results.join("run.info"),
        format!(
            "daemon: {daemon:?} {}\nvfsd binary: {}\nkernel: {}\nper-test watchdog: {per_test}s\nfstests: {} ({})\ntest and scratch shares: {}\nlist: {}\n",
            args.join(" "),
            crate::fixture::vfsd_bin().display(),
            modules.display(),
            tree.display(),
            built.trim(),
            how.devices.display(),
            how.source,
        ),
    )
    .unwrap();
    eprintln!(
        "xfstests: {} test(s) against {daemon:?}; results in {}",
        tests.len(),
        results.display()
    );

    let start = Instant::now();
    let mut flakes = 0;
    for boot in 1.. {
        let (ran, _) = seen(&check_out);
        let left: Vec<&String> = tests.iter().filter(|t| !ran.contains(t)).collect();
        if left.is_empty() {
            break;
        }
        if boot > tests.len() + 2 {
            eprintln!(
                "xfstests: too many boots for {} tests; giving up",
                tests.len()
            );
            break;
        }
        let list: String = left.iter().map(|t| format!("{t}\n")).collect();
        std::fs::write(results.join("out/tests.list"), list).unwrap();
        // Keeps the guest's page cache of binaries and libraries across opens:
        // fstests' fork/exec-heavy scripts are much faster under TCG. --readonly: the
        // guest's ro mount is not all that keeps the host's root unchanged.
        let mut root_args = args.clone();
        root_args.extend(["--cache", "always", "--readonly"]);
        let mut hostroot =
            Share::new(&view, "hostroot", daemon.clone(), &root_args).mount_options("ro");
        hostroot.host_root_view = true;
        // The guest's watchdog acts first; this is for a guest wedged as a whole.
        let limit = 900 + left.len() as u64 * 120 + per_test;
        let guest = Guest::new(dir)
            .name(&format!("boot{boot}"))
            .mem_mb(4096)
            .initrd(initrd.clone())
            .timeout(Duration::from_secs(limit))
            .stop_when_idle(check_out.clone(), Duration::from_secs(per_test + 300))
            .share(hostroot)
            .share(Share::new(&test_dev, "test", daemon.clone(), &args).unmounted())
            .share(Share::new(&scratch_dev, "scratch", daemon.clone(), &args).unmounted())
            .share(Share::new(
                &results.join("out"),
                "results",
                daemon.clone(),
                &args,
            ));
        let before = ran.len();
        let stop = AtomicBool::new(false);
        let run = std::thread::scope(|s| {
            s.spawn(|| follow(&check_out, &times, &stop));
            // Stops the follower however the guest's run ends, a panic included.
            let _stop = StopOnDrop(&stop);
            guest.run(&format!(
                "/guest-tests/xfstests.sh {} {} {per_test}",
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
    let summary = summarize_results(results, start.elapsed().as_secs(), how.strict);
    eprint!("{}", summary.text);
    summary
}

/// One test's line in check.out: what follows its name, and the indented lines after it
/// (a diff's first lines).
type CheckLine = (String, Vec<String>);

/// The name of a test line in check.out ("generic/001 12s ...").
fn test_name(line: &str) -> Option<&str> {
    let name = line.split_whitespace().next()?;
    if line.len() > name.len() && !line[name.len()..].starts_with(char::is_whitespace) {
        return None;
    }
    let (dir, num) = name.split_once('/')?;
    let ok = !dir.is_empty()
        && dir
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && !num.is_empty()
        && num.chars().all(|c| c.is_ascii_digit());
    ok.then_some(name)
}

/// Every test check.out has a line for (the first, when a later boot ran it again).
fn parse_check_out(text: &str) -> HashMap<String, CheckLine> {
    let mut tests: HashMap<String, CheckLine> = HashMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line
            .starts_with(|c: char| !c.is_whitespace())
            .then(|| test_name(line))
            .flatten()
        {
            tests
                .entry(name.to_string())
                .or_insert_with(|| (line[name.len()..].trim().to_string(), Vec::new()));
            current = Some(name.to_string());
        } else if let (Some(c), true) =
            (&current, line.starts_with("    ") || line.starts_with('\t'))
        {
            tests.get_mut(c).unwrap().1.push(line.trim().to_string());
        } else if !line.trim().is_empty() && !line.starts_with(' ') {
            current = None;
        }
    }
    tests
}

/// Whether `rest` ends in check's "<N>s" (a test that ran to the end), and N.
fn ends_in_seconds(rest: &str) -> Option<u64> {
    let t = rest.trim_end().strip_suffix('s')?;
    let digits = t.len() - t.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    (digits > 0)
        .then(|| t[t.len() - digits..].parse().ok())
        .flatten()
}

/// pass, notrun or fail, as check's line for the test says.
fn classify(rest: &str) -> &'static str {
    if rest.contains("[not run]") {
        return "notrun";
    }
    let failed = [
        " - output mismatch",
        "[failed",
        "_check_",
        "[dumped core]",
        "no qualified output",
    ];
    if failed.iter().any(|m| rest.contains(m)) || ends_in_seconds(rest).is_none() {
        "fail"
    } else {
        "pass"
    }
}

/// Why a test did not pass: check's words and, for a mismatch, the diff's first lines.
fn reason_of(status: &str, rest: &str, details: &[String]) -> String {
    match status {
        "notrun" => rest.split_once("[not run]").unwrap().1.trim().to_string(),
        "pass" => String::new(),
        _ => {
            // "12s ... - output mismatch (see ...)": the time is not the reason.
            let mut r = rest;
            if let Some((t, after)) = rest.split_once("s ...") {
                if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
                    r = after;
                }
            }
            let r = r.trim();
            let diff: Vec<&str> = details
                .iter()
                .map(String::as_str)
                .filter(|d| {
                    (d.starts_with('+') || d.starts_with('-'))
                        && d.len() > 1
                        && !d.starts_with("---")
                        && !d.starts_with("+++")
                })
                .take(3)
                .collect();
            let mut reason = if r.is_empty() { "no result" } else { r }.to_string();
            if !diff.is_empty() {
                reason += &format!(" | {}", diff.join(" / "));
            }
            reason
        }
    }
}

/// What a run gave, as written to summary.json and summary.txt.
pub struct Summary {
    pub json: Value,
    pub text: String,
    pub ok: bool,
    pub dir: PathBuf,
}

impl Summary {
    /// Puts the summary's lines that start with one of `prefixes` in the run's summary
    /// under `test`'s name.
    pub fn record(&self, test: &str, prefixes: &[&str]) {
        for l in self
            .text
            .lines()
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        {
            crate::fixture::summarize(test, &format!("xfstests: {l}"));
        }
    }

    /// Fails unless the list passed (`ok`), with where its results are.
    pub fn assert_ok(&self) {
        assert!(
            self.ok,
            "xfstests (results in {}):\n{}",
            self.dir.display(),
            self.text
        );
    }
}

/// Reads the results directory (tests.list, out/check.out, out/watchdog.log, times.tsv,
/// run.info) and writes summary.json and summary.txt.
fn summarize_results(results: &Path, wall: u64, strict: bool) -> Summary {
    let read = |p: &str| std::fs::read_to_string(results.join(p)).unwrap_or_default();
    let wanted: Vec<String> = read("tests.list")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let check = parse_check_out(&String::from_utf8_lossy(
        &std::fs::read(results.join("out/check.out")).unwrap_or_default(),
    ));
    let mut notes: HashMap<String, String> = HashMap::new();
    for l in read("out/watchdog.log").lines() {
        if let Some((name, why)) = l.split_once('\t') {
            notes.entry(name.to_string()).or_insert(why.to_string());
        }
    }
    let mut times: HashMap<String, u64> = HashMap::new();
    for l in read("times.tsv").lines() {
        let p: Vec<&str> = l.split_whitespace().collect();
        if let [name, t0, t1] = p[..] {
            if let (Ok(a), Ok(b)) = (t0.parse::<u64>(), t1.parse::<u64>()) {
                times.insert(name.to_string(), b.saturating_sub(a));
            }
        }
    }
    let info = read("run.info");

    let mut tests = Vec::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let mut lines = Vec::new();
    for name in &wanted {
        let (mut status, mut reason, mut check_secs) = ("unrun", String::new(), None);
        if let Some((rest, details)) = check.get(name) {
            status = classify(rest);
            reason = reason_of(status, rest, details);
            if status == "pass" {
                check_secs = ends_in_seconds(rest);
            }
        }
        if let Some(n) = notes.get(name) {
            status = "fail";
            check_secs = None;
            reason = if n.contains("no progress") {
                format!("watchdog: {n}")
            } else {
                n.clone()
            };
        } else if status == "unrun" {
            reason = "never started (the run stopped before it)".into();
        }
        *counts.entry(status).or_default() += 1;
        let secs = times.get(name).copied();
        let mut line = format!(
            "{:<8} {:<13} {:>5}s",
            status.to_uppercase(),
            name,
            secs.map_or("-".to_string(), |s| s.to_string())
        );
        if !reason.is_empty() {
            line += &format!("  {reason}");
        }
        lines.push(line);
        tests.push(json!({
            "test": name,
            "status": status,
            "reason": reason,
            "seconds": secs,
            "check_seconds": check_secs,
        }));
    }
    let n = |s: &str| counts.get(s).copied().unwrap_or(0);
    let ok = n("fail") == 0 && n("unrun") == 0 && !(strict && n("notrun") > 0);
    let json = json!({
        "info": info.lines().collect::<Vec<_>>(),
        "total": wanted.len(),
        "passed": n("pass"),
        "failed": n("fail"),
        "not_run": n("notrun"),
        "never_started": n("unrun"),
        "wall_seconds": wall,
        "strict": strict,
        "ok": ok,
        "tests": tests,
    });
    std::fs::write(
        results.join("summary.json"),
        serde_json::to_string_pretty(&json).unwrap() + "\n",
    )
    .unwrap();
    let mut text = format!("xfstests summary ({})\n", results.display());
    for l in info.lines() {
        text += &format!("  {l}\n");
    }
    text += "\n";
    for l in &lines {
        text += &format!("{l}\n");
    }
    let unrun = if n("unrun") > 0 {
        format!(", never started {}", n("unrun"))
    } else {
        String::new()
    };
    text += &format!(
        "\npassed {}, failed {}, not run {}{unrun} of {}; wall time {}m{:02}s\n",
        n("pass"),
        n("fail"),
        n("notrun"),
        wanted.len(),
        wall / 60,
        wall % 60
    );
    if strict && n("notrun") > 0 {
        text += "strict: 'not run' counts as a failure in this list\n";
    }
    text += &format!("RESULT: {}\n", if ok { "PASS" } else { "FAIL" });
    std::fs::write(results.join("summary.txt"), &text).unwrap();
    Summary {
        json,
        text,
        ok,
        dir: results.to_path_buf(),
    }
}

/// Two runs' summary.json side by side, as a Markdown table (for docs/xfstests.md), and
/// the tests that fail in one and pass in the other.
fn compare(runs: &[(String, Value)]) -> String {
    let tests = |v: &Value| v["tests"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for (_, r) in runs {
        for t in tests(r) {
            let n = t["test"].as_str().unwrap_or_default().to_string();
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let labels: Vec<&str> = runs.iter().map(|(l, _)| l.as_str()).collect();
    let mut out = format!(
        "| test | {} | reason (first run that did not pass) |\n| --- | {}--- |\n",
        labels.join(" | "),
        "--- | ".repeat(runs.len())
    );
    let status_of =
        |r: &Value, n: &str| tests(r).into_iter().find(|t| t["test"].as_str() == Some(n));
    for n in &names {
        let mut cells = Vec::new();
        let mut reason = String::new();
        for (_, r) in runs {
            match status_of(r, n) {
                None => cells.push("-".to_string()),
                Some(t) => {
                    let st = t["status"].as_str().unwrap_or("?");
                    cells.push(match t["seconds"].as_u64() {
                        Some(s) => format!("{st} ({s}s)"),
                        None => st.to_string(),
                    });
                    if st != "pass" && reason.is_empty() {
                        reason = t["reason"].as_str().unwrap_or("").replace('|', "/");
                        reason.truncate(160);
                    }
                }
            }
        }
        out += &format!("| {n} | {} | {reason} |\n", cells.join(" | "));
    }
    out += "\n";
    for (l, r) in runs {
        let w = r["wall_seconds"].as_u64().unwrap_or(0);
        out += &format!(
            "- {l}: passed {}, failed {}, not run {}, never started {} of {}; wall {}m{:02}s\n",
            r["passed"],
            r["failed"],
            r["not_run"],
            r["never_started"],
            r["total"],
            w / 60,
            w % 60
        );
    }
    if let [(la, a), (lb, b)] = runs {
        let only = |x: &Value, y: &Value| -> String {
            let v: Vec<String> = tests(x)
                .into_iter()
                .filter(|t| t["status"] == "fail")
                .filter_map(|t| {
                    let n = t["test"].as_str()?.to_string();
                    (status_of(y, &n)?["status"] == "pass").then_some(n)
                })
                .collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(", ")
            }
        };
        out += &format!(
            "- failing with {lb} but passing with {la}: {}\n",
            only(b, a)
        );
        out += &format!(
            "- failing with {la} but passing with {lb}: {}\n",
            only(a, b)
        );
    }
    out
}

/// The tests of `tests/generic` in any of `groups`, in number order.
fn in_groups(tree: &Path, groups: &[&str]) -> Vec<String> {
    let path = tree.join("tests/generic/group.list");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut found: Vec<(u32, String)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let num = w.next()?;
            w.any(|g| groups.contains(&g))
                .then(|| (num.parse().unwrap_or(u32::MAX), format!("generic/{num}")))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, n)| n).collect()
}

/// The tests `spec` names: words (whitespace or commas between them), each a list file
/// (one name a line, `#` starts a comment), a test (`generic/001`), a group of
/// tests/generic (`quick`), or `-GROUP` to leave a group's tests out. Each test once, in
/// the order named; a group's in number order.
pub fn resolve_list(spec: &str, tree: &Path) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut out: Vec<&str> = Vec::new();
    for w in spec.split(|c: char| c.is_whitespace() || c == ',') {
        if w.is_empty() {
            continue;
        }
        let as_file = if Path::new(w).is_absolute() {
            PathBuf::from(w)
        } else {
            repo().join(w)
        };
        if let Some(g) = w.strip_prefix('-') {
            out.push(g);
        } else if as_file.is_file() {
            names.extend(read_list(&as_file));
        } else if w.contains('/') {
            names.push(w.to_string());
        } else {
            let g = in_groups(tree, &[w]);
            assert!(
                !g.is_empty(),
                "no tests in group {w} (tests/generic/group.list)"
            );
            names.extend(g);
        }
    }
    if !out.is_empty() {
        let gone: BTreeSet<String> = in_groups(tree, &out).into_iter().collect();
        names.retain(|n| !gone.contains(n));
    }
    let mut once = BTreeSet::new();
    names.retain(|n| once.insert(n.clone()));
    for n in &names {
        assert!(
            test_name(n) == Some(n.as_str()) && tree.join("tests").join(n).is_file(),
            "{n}: no such test in {}/tests",
            tree.display()
        );
    }
    names
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_number(name: &str) -> Option<u64> {
    env(name).map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: a number"))
    })
}

/// `VFSD_XFSTESTS_LIST` runs any list: `quick`, `quick -dangerous`, `generic/001
/// generic/013`, `guest-tests/xfstests-fuse-features.list` (resolve_list). Unset, the test has
/// nothing to run and passes. It fails when a test fails or never starts (with
/// `VFSD_XFSTESTS_STRICT=1` also when one does not run). The results are kept in
/// `VFSD_XFSTESTS_RESULTS` (default: the cache's `xfstests-runs/<daemon>-<time>`), the
/// test and scratch shares there too: give a long list a file system of its own (a test
/// that fills the scratch file system fills that). Also: `VFSD_XFSTESTS_FIRST=N` (the
/// first N tests only), `VFSD_XFSTESTS_DAEMON_ARGS` (default `--posix-acl`; empty: none),
/// `VFSD_XFSTESTS_TEST_TIMEOUT` (the guest's per-test watchdog, seconds) and
/// `VFSD_XFSTESTS_COMPARE=<another run's summary.json>` (compare.md: both side by side).
#[test]
#[ignore = "needs QEMU and root"]
fn any_xfstests_list_named_in_the_environment() {
    let name = "any_xfstests_list_named_in_the_environment";
    let Some(spec) = env("VFSD_XFSTESTS_LIST") else {
        eprintln!("{name}: VFSD_XFSTESTS_LIST is not set: nothing to run");
        return;
    };
    let tree = cache_dir().join("xfstests");
    let mut tests = resolve_list(&spec, &tree);
    if let Some(n) = env_number("VFSD_XFSTESTS_FIRST") {
        tests.truncate(n as usize);
    }
    let daemon = daemon_under_test();
    let label = if daemon.is_vfsd() {
        "vfsd"
    } else {
        "virtiofsd"
    };
    let results = env("VFSD_XFSTESTS_RESULTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            cache_dir()
                .join("xfstests-runs")
                .join(format!("{label}-{}", now_secs()))
        });
    std::fs::create_dir_all(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display()));
    // Set but empty: no extra arguments at all.
    let args = std::env::var("VFSD_XFSTESTS_DAEMON_ARGS").unwrap_or_else(|_| "--posix-acl".into());
    let args: Vec<&str> = args.split_whitespace().collect();
    let dir = TestDir::new(name);
    let mut how = ListRun::new(daemon, &args, results);
    how.strict = env("VFSD_XFSTESTS_STRICT").as_deref() == Some("1");
    how.per_test_secs = env_number("VFSD_XFSTESTS_TEST_TIMEOUT").unwrap_or(PER_TEST_SECS);
    how.source = format!("VFSD_XFSTESTS_LIST={spec}");
    let summary = run_list(&dir, &how, &tests);
    summary.record(name, &["passed "]);
    if let Some(other) = env("VFSD_XFSTESTS_COMPARE") {
        let text = std::fs::read_to_string(&other).unwrap_or_else(|e| panic!("{other}: {e}"));
        let theirs: Value = serde_json::from_str(&text).expect("VFSD_XFSTESTS_COMPARE: JSON");
        let their_label = Path::new(&other)
            .parent()
            .and_then(Path::file_name)
            .map_or("other".into(), |n| n.to_string_lossy().into_owned());
        let table = compare(&[
            (label.to_string(), summary.json.clone()),
            (their_label, theirs),
        ]);
        std::fs::write(summary.dir.join("compare.md"), &table).unwrap();
        eprintln!("{table}");
    }
    summary.assert_ok();
}

#[test]
fn check_out_lines_are_read_as_the_summary_has_them() {
    let text = "\
generic/001 12s ...  11s
generic/002       [not run] O_TMPFILE is not supported
generic/003 3s ... - output mismatch (see /r/generic/003.out.bad)
    --- tests/generic/003.out
    +++ /r/generic/003.out.bad
    @@ -1,2 +1,2 @@
    -QA output created by 003
    +wrong
Ran: generic/001 generic/002 generic/003
generic/004 5s ...
generic/12a line
";
    let c = parse_check_out(text);
    assert_eq!(classify(&c["generic/001"].0), "pass");
    assert_eq!(ends_in_seconds(&c["generic/001"].0), Some(11));
    assert_eq!(classify(&c["generic/002"].0), "notrun");
    assert_eq!(
        reason_of("notrun", &c["generic/002"].0, &[]),
        "O_TMPFILE is not supported"
    );
    let (rest, details) = &c["generic/003"];
    assert_eq!(classify(rest), "fail");
    assert_eq!(
        reason_of("fail", rest, details),
        "- output mismatch (see /r/generic/003.out.bad) | -QA output created by 003 / +wrong"
    );
    assert_eq!(classify(&c["generic/004"].0), "fail");
    assert_eq!(reason_of("fail", &c["generic/004"].0, &[]), "no result");
    assert!(!c.contains_key("generic/12a"));
    assert_eq!(c.len(), 4);
}

#[test]
fn a_summary_fails_a_failed_or_unstarted_test_and_in_strict_mode_a_not_run_one() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    std::fs::create_dir_all(r.join("out")).unwrap();
    std::fs::write(r.join("tests.list"), "generic/001\ngeneric/002\n").unwrap();
    std::fs::write(
        r.join("out/check.out"),
        "generic/001 12s ...  11s\ngeneric/002       [not run] no ACLs\n",
    )
    .unwrap();
    std::fs::write(r.join("times.tsv"), "generic/001\t100\t113\n").unwrap();
    let s = summarize_results(r, 70, false);
    assert!(s.ok, "{}", s.text);
    assert_eq!(s.json["tests"][0]["seconds"], 13);
    assert_eq!(s.json["tests"][0]["check_seconds"], 11);
    assert!(s.text.contains("wall time 1m10s"), "{}", s.text);
    assert!(!summarize_results(r, 70, true).ok);
    std::fs::write(
        r.join("out/watchdog.log"),
        "generic/001\tno progress for 300s\n",
    )
    .unwrap();
    let s = summarize_results(r, 70, false);
    assert!(!s.ok);
    assert_eq!(
        s.json["tests"][0]["reason"],
        "watchdog: no progress for 300s"
    );
    std::fs::write(r.join("out/watchdog.log"), "").unwrap();
    std::fs::write(
        r.join("tests.list"),
        "generic/001\ngeneric/002\ngeneric/003\n",
    )
    .unwrap();
    let s = summarize_results(r, 70, false);
    assert!(!s.ok);
    assert_eq!(s.json["never_started"], 1);
    let on_compare = compare(&[("a".into(), s.json.clone()), ("b".into(), s.json)]);
    assert!(
        on_compare.contains("| generic/003 | unrun | unrun | never started"),
        "{on_compare}"
    );
}
