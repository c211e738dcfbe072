//! The fixture itself: a failing guest command and a hanging guest are reported as such,
//! so no guest test can pass on a runner that lost the guest's result.

use crate::fixture::{Status, TestDir};
use crate::run_on_share;

#[test]
#[ignore = "needs QEMU and root"]
fn a_failing_guest_command_is_reported_with_its_exit_status() {
    let dir = TestDir::new("a_failing_guest_command_is_reported_with_its_exit_status");
    let (_, run) = run_on_share(&dir, &[], 120, |_| {}, "/guest-tests/selftest-fail.sh");
    run.assert_status(3);
}

#[test]
#[ignore = "needs QEMU and root"]
fn a_guest_that_hangs_is_killed_at_its_timeout() {
    let dir = TestDir::new("a_guest_that_hangs_is_killed_at_its_timeout");
    let (_, run) = run_on_share(&dir, &[], 25, |_| {}, "/guest-tests/selftest-hang.sh");
    assert_eq!(run.status, Status::Timeout, "{}", run.tail());
    assert!(
        run.console.contains("vfsd-init: running"),
        "the guest never ran its command, so the timeout proves nothing\n{}",
        run.tail()
    );
    assert!(
        run.secs >= 25 && run.secs < 60,
        "stopped after {} s, not at its 25 s timeout",
        run.secs
    );
}

/// scripts/run-vm.sh's binary, which cargo builds with the tests.
fn run_vm() -> std::process::Command {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/run-vm");
    assert!(
        bin.is_file(),
        "{} missing: cargo test builds the examples",
        bin.display()
    );
    std::process::Command::new(bin)
}

#[test]
#[ignore = "needs QEMU and root"]
fn run_vm_serves_the_named_share_and_exits_with_the_guest_commands_status_or_124_at_its_timeout() {
    let dir = TestDir::new("run_vm_exits_with_the_guest_status");
    let share = dir.dir("data");
    std::fs::write(share.join("in"), "from the host\n").unwrap();
    let _slot = crate::fixture::Slot::take(1);
    let out = run_vm()
        .arg("--share")
        .arg(format!("{}:data", share.display()))
        .args(["--", "cat /mnt/data/in; echo from the guest > out; exit 3"])
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{console}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(console.contains("from the host"), "{console}");
    assert_eq!(
        std::fs::read_to_string(share.join("out")).unwrap(),
        "from the guest\n"
    );
    let out = run_vm()
        .args(["--timeout", "25", "--", "/guest-tests/selftest-hang.sh"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(124),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A boot that QEMU itself aborted before /init spoke (a TCG assertion, now and then) is
/// booted again; once /init has spoken, or with a daemon killed by a signal, it is not.
#[test]
fn a_qemu_abort_before_init_is_worth_a_second_boot_and_nothing_later_is() {
    use std::os::unix::process::ExitStatusExt;
    let run = |console: &str, daemon_signal: bool| crate::fixture::Run {
        status: Status::NoResult,
        console: console.into(),
        secs: 3,
        daemon_exits: vec![Some(std::process::ExitStatus::from_raw(if daemon_signal {
            libc::SIGSEGV
        } else {
            0
        }))],
        daemon_logs: Vec::new(),
        qemu_log: Default::default(),
        boot_stuck: false,
        qemu_crashed: true,
    };
    assert!(run("SeaBIOS\nBooting from ROM...", false).failed_early());
    assert!(!run("vfsd-init: running", false).failed_early());
    assert!(!run("SeaBIOS", true).failed_early());
    let mut clean = run("SeaBIOS", false);
    clean.qemu_crashed = false;
    assert!(
        !clean.failed_early(),
        "a QEMU that exited on its own, without a crash"
    );
}
