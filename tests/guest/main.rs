//! Guest tests: a real Debian guest kernel under QEMU mounts shares served by vfsd (or
//! `VFSD_TEST_DAEMON=virtiofsd`) and runs the scripts in `guest-tests/`; each test boots
//! its guests through the fixture in `fixture/` and checks the guest's exit status, its
//! console, and what reached the host directory. They need QEMU and root
//! (`scripts/setup.sh`, then `scripts/test.sh`, which runs them with `--include-ignored`);
//! at most `VFSD_GUEST_JOBS` guests (default 2) run at once. A failing test keeps its
//! logs in `target/guest-tests/<test>/`; every test's summary lines are gathered in
//! `target/guest-tests/summary.txt`. docs/guest.md says how to add one.

mod fixture;

#[cfg(feature = "ceph-tests")]
mod ceph;
mod crash;
mod data;
mod fdwalk;
mod features;
#[cfg(feature = "gluster-tests")]
mod gluster;
mod idmap;
mod keep_listening;
mod libvirt;
mod locks;
mod migration;
mod no_open;
mod runner;
mod running_program;
mod setid;
mod smoke;
mod stale_entry;
mod stress_locks;
#[cfg(any(feature = "gluster-tests", feature = "ceph-tests"))]
mod two_mounts;
mod upgrade;
mod xfstests;

use std::path::PathBuf;
use std::time::Duration;

use fixture::{daemon_under_test, Guest, Run, TestDir};

/// One guest with one share (share0, `args` for its daemon), `prepare` run on the
/// share before the boot, `cmd` run in it, at most `timeout_secs`.
pub fn run_on_share(
    dir: &TestDir,
    args: &[&str],
    timeout_secs: u64,
    prepare: impl FnOnce(&std::path::Path),
    cmd: &str,
) -> (PathBuf, Run) {
    let (guest, share) = Guest::new(dir)
        .timeout(Duration::from_secs(timeout_secs))
        .with_share(daemon_under_test(), args);
    prepare(&share);
    let run = guest.run(cmd);
    (share, run)
}

/// Checks that a guest script's summary ("SCRIPT: N checks passed, 0 failed") counts
/// `checks` passes: a check it skipped would pass unnoticed otherwise.
pub fn assert_checks_ran(run: &Run, script: &str, checks: u32) {
    let want = format!("{script}: {checks} checks passed, 0 failed");
    assert!(
        run.lines(&format!("{script}: "))
            .iter()
            .any(|l| l.starts_with(&want)),
        "no '{want}'\n{}",
        run.tail()
    );
}

/// Appends the console's summary lines to the run's summary file, under the test's name:
/// the lines starting with one of `prefixes`, where a trailing `#` stands for a digit
/// (`"smoke: #"` keeps "smoke: 99 checks passed, 0 failed").
pub fn record(test: &str, run: &Run, prefixes: &[&str]) {
    let wanted = |l: &str| {
        prefixes.iter().any(|p| match p.strip_suffix('#') {
            Some(head) => l
                .strip_prefix(head)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit())),
            None => l.starts_with(p),
        })
    };
    for l in fixture::lines_starting(&run.console, "").filter(|l| wanted(l)) {
        fixture::summarize(&format!("{test} ({} s)", run.secs), l);
    }
}
