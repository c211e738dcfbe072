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
