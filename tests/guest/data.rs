//! Data and metadata checkers from the file-system world, in the guest: fio with
//! `verify=crc32c`, pjdfstest (POSIX semantics, as root and as other users), fsx
//! (random buffered and O_DIRECT operations checked against a model) and the CI list of
//! xfstests (run by `crate::xfstests`). They are the longest guest tests, and libtest
//! starts tests in name order: from here they start first, and the two guest slots end
//! close together.

use crate::fixture::{daemon_under_test, repo, Run, TestDir};
use crate::xfstests::{read_list, run_list, ListRun};
use crate::{record, run_on_share};

/// Seconds per time-based fio job (`VFSD_FIO_RUNTIME`, default 8).
fn fio_runtime() -> u64 {
    std::env::var("VFSD_FIO_RUNTIME")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

#[test]
#[ignore = "needs QEMU and root"]
fn fio_jobs_read_back_what_they_wrote() {
    let name = "fio_jobs_read_back_what_they_wrote";
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(
        &dir,
        &[],
        900,
        |_| {},
        &format!("/guest-tests/fio.sh -t {}", fio_runtime()),
    );
    run.assert_success();
    record(name, &run, &["fio: PASS", "fio: FAIL", "fio: #"]);
}

#[test]
#[ignore = "needs QEMU and root"]
fn pjdfstest_passes_every_test_that_runs() {
    pjdfstest_on_a_share("pjdfstest_passes_every_test_that_runs", &[]);
}

/// pjdfstest on a share served with `args`, as test `name`: `check_pjdfstest`'s checks.
pub(crate) fn pjdfstest_on_a_share(name: &str, args: &[&str]) {
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(&dir, args, 900, |_| {}, "/guest-tests/pjdfstest.sh");
    check_pjdfstest(name, &run, 1);
}

#[test]
#[ignore = "needs QEMU and root"]
fn fsx_buffered_and_direct_operations_match_its_model() {
    fsx_on_a_share(
        "fsx_buffered_and_direct_operations_match_its_model",
        &[],
        1200,
        "-N 60000 -D 20000",
    );
}

/// fsx with `fsx_args` (guest-tests/fsx.sh's) on a share served with `args`, as test
/// `name`, within `timeout_secs`: every run must pass.
pub(crate) fn fsx_on_a_share(name: &str, args: &[&str], timeout_secs: u64, fsx_args: &str) {
    let dir = TestDir::new(name);
    let cmd = format!("/guest-tests/fsx.sh {fsx_args}");
    let (_, run) = run_on_share(&dir, args, timeout_secs, |_| {}, &cmd);
    run.assert_success();
    record(name, &run, &["fsx: PASS", "fsx: FAIL", "fsx: SKIP"]);
}

/// guest-tests/xfstests-ci.list, strictly: every test passes, none is "not run".
#[test]
#[ignore = "needs QEMU and root"]
fn the_ci_xfstests_list_passes_whole() {
    let name = "the_ci_xfstests_list_passes_whole";
    let dir = TestDir::new(name);
    let tests = read_list(&repo().join("guest-tests/xfstests-ci.list"));
    // --posix-acl: the list has ACL tests, which are "not run" without it.
    let mut how = ListRun::new(daemon_under_test(), &["--posix-acl"], dir.dir("results"));
    how.strict = true;
    how.source = "guest-tests/xfstests-ci.list".into();
    let summary = run_list(&dir, &how, &tests);
    summary.record(name, &["passed "]);
    summary.assert_ok();
}

/// Records pjdfstest's summary lines and checks its run: it passed, its summary ("P
/// passed, F failed, S skipped of T") counts no failure and at least `min_passed` passes.
pub(crate) fn check_pjdfstest(name: &str, run: &Run, min_passed: u64) {
    run.assert_success();
    record(
        name,
        run,
        &["pjdfstest: #", "pjdfstest: FLAKY", "pjdfstest: KNOWN"],
    );
    let summary = run
        .lines("pjdfstest: ")
        .into_iter()
        .rev()
        .find(|l| l.contains(" passed, "))
        .unwrap_or_else(|| panic!("no pjdfstest summary\n{}", run.tail()));
    let counts: Vec<u64> = summary
        .trim_start_matches("pjdfstest: ")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(counts.len() >= 4, "unreadable summary: {summary}");
    assert_eq!(counts[1], 0, "pjdfstest failures: {summary}");
    assert!(
        counts[0] >= min_passed,
        "pjdfstest ran too little (fewer than {min_passed} passed): {summary}"
    );
}
