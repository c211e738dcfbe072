//! What the guest tests over a distributed file system share (tests/guest/gluster.rs,
//! tests/guest/ceph.rs): two client mounts of one file system, A and B, standing for two
//! hosts, brought up by a script under scripts/; a fresh directory seen through both;
//! a guest on mount A; a pair of guests, one on each mount.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::fixture::{
    daemon_under_test, repo, run_together, DaemonKind, Guest, Run, Share, TestDir,
};
use crate::record;

/// Runs `scripts/SCRIPT up` (idempotent), then reads the two mounts from its `env`
/// lines `VAR_A=...` and `VAR_B=...`.
pub fn bring_up(script: &str, var_a: &str, var_b: &str) -> (PathBuf, PathBuf) {
    let path = repo().join("scripts").join(script);
    let st = Command::new(&path)
        .arg("up")
        .status()
        .unwrap_or_else(|e| panic!("scripts/{script}: {e}"));
    assert!(
        st.success(),
        "scripts/{script} up failed ({st}); run it by hand to see why"
    );
    let out = Command::new(&path).arg("env").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let var = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("scripts/{script} env printed no {k}"))
    };
    (var(var_a), var(var_b))
}

/// A fresh directory on the file system, seen through both mounts; removed when the
/// test passes, kept with its logs when it fails.
pub struct VolumeDir {
    pub a: PathBuf,
    pub b: PathBuf,
}

impl VolumeDir {
    pub fn new(mounts: &(PathBuf, PathBuf), name: &str) -> VolumeDir {
        let (ma, mb) = mounts;
        let rel = Path::new("vfsd-tests").join(name);
        let a = ma.join(&rel);
        let _ = std::fs::remove_dir_all(&a);
        std::fs::create_dir_all(&a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
        let b = mb.join(&rel);
        // Mount B has its own client: it may see the new directory a moment later.
        let t = Instant::now();
        while !b.is_dir() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} did not appear through mount B",
                b.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        VolumeDir { a, b }
    }
}

impl Drop for VolumeDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the test's files on the volume are kept in {}",
                self.a.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.a);
        }
    }
}

/// One guest whose share0 is a fresh directory under mount A, served with `args`.
pub fn run_on_mount_a(
    mounts: &(PathBuf, PathBuf),
    name: &str,
    args: &[&str],
    timeout_secs: u64,
    cmd: &str,
) -> (VolumeDir, Run) {
    let dir = TestDir::new(name);
    let vol = VolumeDir::new(mounts, name);
    let run = Guest::new(&dir)
        .timeout(Duration::from_secs(timeout_secs))
        .share(Share::new(&vol.a, "share0", daemon_under_test(), args))
        .run(cmd);
    (vol, run)
}

/// Boots guest A (its daemons on `a`'s side) and guest B (on `b`'s) at once, `guest`
/// making each; a pair where a guest failed before /init ran is booted once more.
pub fn pair<'d>(
    name: &str,
    guest: impl Fn(&str, u32) -> Guest<'d>,
    cmd: impl Fn(&str) -> String,
    before: impl Fn(u32),
) -> Vec<Run> {
    for attempt in 1..=2 {
        before(attempt);
        let runs = run_together(
            &[
                (guest("A", attempt), &cmd("A")),
                (guest("B", attempt), &cmd("B")),
            ],
            attempt,
        );
        if attempt == 1 && runs.iter().any(|r| r.failed_early()) {
            eprintln!("{name}: a guest failed before /init ran; running the pair again");
            continue;
        }
        return runs;
    }
    unreachable!("the second attempt returns");
}

/// The cache modes the coherence test covers: virtiofsd 1.14 has no `metadata`.
pub fn coherence_modes() -> Vec<&'static str> {
    let mut m = vec!["auto", "always", "never"];
    if daemon_under_test().is_vfsd() {
        m.push("metadata");
    }
    m
}

/// guest-tests/coherence.sh between a guest on mount A and one on mount B, a share per
/// cache mode on each: what one guest changes, the other sees within the limit (the
/// delays are recorded), and parallel O_DIRECT writes into one file from both land.
pub fn coherence_per_cache_mode(mounts: &(PathBuf, PathBuf), name: &str) {
    let dir = TestDir::new(name);
    let vol = VolumeDir::new(mounts, name);
    let daemon = daemon_under_test();
    let modes = coherence_modes();
    for m in &modes {
        std::fs::create_dir_all(vol.a.join(format!("c-{m}"))).unwrap();
    }
    // The markers go through a local directory both daemons serve uncached, so only the
    // shares under test cache anything.
    let guest = |role: &str, attempt: u32| {
        let side = if role == "A" { &vol.a } else { &vol.b };
        let sync = dir.path.join(format!("sync-{attempt}"));
        let mut g = Guest::new(&dir)
            .name(&format!("{}-{attempt}", role.to_lowercase()))
            .mem_mb(1024)
            .timeout(Duration::from_secs(1200))
            .share(Share::new(
                &sync,
                "sync",
                daemon.clone(),
                &["--cache=never"],
            ));
        for m in &modes {
            let cache = format!("--cache={m}");
            g = g.share(Share::new(
                &side.join(format!("c-{m}")),
                &format!("c-{m}"),
                daemon.clone(),
                &[&cache],
            ));
        }
        g
    };
    // pdw: parallel O_DIRECT writes into one file on the never share.
    let cmd = |role: &str| {
        format!(
            "COHERENCE_LIMIT=8 /guest-tests/coherence.sh {role} {} pdw",
            modes.join(" ")
        )
    };
    let fresh_sync = |attempt: u32| {
        let sync = dir.path.join(format!("sync-{attempt}"));
        let _ = std::fs::remove_dir_all(&sync);
        std::fs::create_dir_all(&sync).unwrap();
        for m in &modes {
            let c = vol.a.join(format!("c-{m}"));
            for f in ["coh-file", "coh-renamed", "pdw-file"] {
                let _ = std::fs::remove_file(c.join(f));
            }
        }
    };
    let runs = pair(name, guest, cmd, fresh_sync);
    for (role, run) in ["A", "B"].iter().zip(&runs) {
        record(
            &format!("{name} [{role}]"),
            run,
            &[
                &format!("coherence[{role}]: #"),
                &format!("coherence[{role}]: DELAY"),
                &format!("coherence[{role}]: pdw: wrote"),
            ],
        );
    }
    for run in &runs {
        run.assert_success();
    }
    for (role, run) in ["A", "B"].iter().zip(&runs) {
        let done = run
            .lines(&format!("coherence[{role}]: "))
            .into_iter()
            .any(|l| l.contains(" checks passed, 0 failed"));
        assert!(
            done,
            "guest {role} printed no clean summary\n{}",
            run.tail()
        );
    }
}

/// guest-tests/locks.sh `steps` between a guest on mount A and one on mount B, each
/// with its own daemon (`--cache=never`): both must pass every check.
pub fn locks_between_guests_on_mounts_a_and_b(
    mounts: &(PathBuf, PathBuf),
    name: &str,
    steps: &str,
) {
    let dir = TestDir::new(name);
    let vol = VolumeDir::new(mounts, name);
    let daemon = daemon_under_test();
    let guest = |role: &str, attempt: u32| {
        let side = if role == "A" { &vol.a } else { &vol.b };
        Guest::new(&dir)
            .name(&format!("{}-{attempt}", role.to_lowercase()))
            .timeout(Duration::from_secs(1800))
            .share(Share::new(
                &side.join(format!("run{attempt}")),
                "share0",
                daemon.clone(),
                &["--cache=never"],
            ))
    };
    let cmd = |role: &str| format!("/guest-tests/locks.sh {role} {steps} 1000");
    let fresh = |attempt: u32| {
        std::fs::create_dir_all(vol.a.join(format!("run{attempt}/sync"))).unwrap();
        let t = Instant::now();
        while !vol.b.join(format!("run{attempt}/sync")).is_dir() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "sync/ not seen through mount B"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let runs = pair(name, guest, cmd, fresh);
    for (role, run) in ["A", "B"].iter().zip(&runs) {
        record(
            &format!("{name} [{role}]"),
            run,
            &[
                &format!("locks[{role}]: #"),
                &format!("locks[{role}]: FIGURE"),
            ],
        );
    }
    for run in &runs {
        run.assert_success();
    }
    // The pair that ran to the end: the last attempt's directory.
    let last = (1..=2)
        .rev()
        .map(|a| vol.a.join(format!("run{a}/sync")))
        .find(|p| p.is_dir())
        .unwrap();
    crate::locks::assert_both_guests_passed(&last);
}

/// xfstests with TEST_DEV and SCRATCH_DEV under mount A (the guest's root and the
/// results stay local): `VFSD_XFSTESTS_LIST` names the list as for
/// `xfstests::any_xfstests_list_named_in_the_environment`, else the CI list; a test may be
/// "not run", none may fail.
pub fn xfstests_list_on_mount_a(mounts: &(PathBuf, PathBuf), name: &str) {
    let dir = TestDir::new(name);
    let vol = VolumeDir::new(mounts, name);
    let (tests, source) = match std::env::var("VFSD_XFSTESTS_LIST") {
        Ok(spec) if !spec.trim().is_empty() => (
            crate::xfstests::resolve_list(&spec, &crate::fixture::cache_dir().join("xfstests")),
            spec,
        ),
        _ => (
            crate::xfstests::read_list(&repo().join("guest-tests/xfstests-ci.list")),
            "guest-tests/xfstests-ci.list".into(),
        ),
    };
    // No --posix-acl: the client mounts are made without POSIX ACLs (GlusterFS: with
    // it a non-root mkdir in a set-gid directory and stat fail with EOPNOTSUPP,
    // generic/314, 355). The list's ACL tests are then "not run", which this allows.
    let mut how = crate::xfstests::ListRun::new(daemon_under_test(), &[], dir.dir("results"));
    how.devices = vol.a.clone();
    how.source = source;
    let summary = crate::xfstests::run_list(&dir, &how, &tests);
    // What did not run, and why: the results go with the test's directory when it passes.
    summary.record(name, &["passed ", "NOTRUN "]);
    summary.assert_ok();
}

/// pjdfstest in a guest on mount A, the file system's own departures from ext4 (`known`,
/// a file under guest-tests/, each with its reason) counting as KNOWN when they fail,
/// never as passed.
pub fn pjdfstest_on_mount_a(mounts: &(PathBuf, PathBuf), name: &str, known: &str) {
    let cmd = format!("/guest-tests/pjdfstest.sh -k /guest-tests/{known}");
    let (_vol, run) = run_on_mount_a(mounts, name, &[], 1500, &cmd);
    crate::data::check_pjdfstest(name, &run, 301);
}

/// fsx's buffered and O_DIRECT runs in a guest on mount A: both must run and pass.
pub fn fsx_on_mount_a(mounts: &(PathBuf, PathBuf), name: &str) {
    let (_vol, run) = run_on_mount_a(
        mounts,
        name,
        &[],
        1500,
        "/guest-tests/fsx.sh -N 60000 -D 20000",
    );
    run.assert_success();
    record(name, &run, &["fsx: PASS", "fsx: FAIL", "fsx: SKIP"]);
    assert!(
        !run.console.contains("fsx: SKIP"),
        "a part of fsx was skipped\n{}",
        run.tail()
    );
}

/// guest-tests/fio.sh (8 jobs, each verifying what it wrote) in a guest on mount A; with
/// vfsd, its --stats must show RWF_NOWAIT given up once for the mount, not per request.
pub fn fio_on_mount_a(mounts: &(PathBuf, PathBuf), name: &str) {
    let dir = TestDir::new(name);
    let vol = VolumeDir::new(mounts, name);
    let daemon = daemon_under_test();
    let stats = dir.path.join("stats.json");
    let stats_arg = format!("--stats={}", stats.display());
    let args: Vec<&str> = if daemon == DaemonKind::Vfsd {
        vec![&stats_arg]
    } else {
        vec![]
    };
    let run = Guest::new(&dir)
        .timeout(Duration::from_secs(900))
        .share(Share::new(&vol.a, "share0", daemon.clone(), &args))
        .run("/guest-tests/fio.sh -t 8");
    run.assert_success();
    record(name, &run, &["fio: PASS", "fio: FAIL", "fio: #"]);
    if daemon == DaemonKind::Vfsd {
        // A FUSE client mount refuses RWF_NOWAIT: vfsd must give up trying once per host
        // file system, not per request.
        let text = std::fs::read_to_string(&stats)
            .unwrap_or_else(|e| panic!("vfsd wrote no --stats ({}): {e}", stats.display()));
        let s: serde_json::Value = serde_json::from_str(&text).expect("--stats is JSON");
        let get = |k: &str| {
            s[k].as_u64()
                .unwrap_or_else(|| panic!("--stats has no {k}"))
        };
        crate::fixture::summarize(
            name,
            &format!(
                "vfsd --stats: nowait_unsupported {}, reads handed off {}, reads on the queue thread {}",
                get("nowait_unsupported"),
                get("reads_handed_off"),
                get("reads_on_queue_thread")
            ),
        );
        assert_eq!(get("nowait_unsupported"), 1, "{text}");
    }
}
