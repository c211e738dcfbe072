//! stress-ng's POSIX, lockf and OFD lock stressors, two instances each on the share, two
//! passes as root and one as a user (guest-tests/stress-locks.sh): a cycle of lock waits
//! among them must end in EDEADLK, and so must a killed child's wait for the lock of the
//! parent that waits for it (after `--lock-stall-timeout`, 5 s here): no run may hang. vfsd's
//! `--stats` say how many waits of each kind it ended.

use crate::fixture::{daemon_under_test, TestDir};
use crate::{record, run_on_share};

#[test]
#[ignore = "needs QEMU and root"]
fn lock_stressors_finish_and_a_cycle_of_waits_ends_in_edeadlk() {
    let name = "lock_stressors_finish_and_a_cycle_of_waits_ends_in_edeadlk";
    let dir = TestDir::new(name);
    let stats = dir.path.join("stats.json");
    let stats_arg = format!("--stats={}", stats.display());
    // A 5 s stall timeout instead of the default 30 s: the rule is the same, and a killed
    // child's wait ends 25 s sooner.
    let args: Vec<&str> = if daemon_under_test().is_vfsd() {
        vec![&stats_arg, "--lock-stall-timeout=5"]
    } else {
        vec![]
    };
    let (_, run) = run_on_share(
        &dir,
        &args,
        900,
        |_| {},
        "/guest-tests/stress-locks.sh -t 4 -r 2",
    );
    run.assert_success();
    record(name, &run, &["stress-locks: "]);
    if let Ok(text) = std::fs::read_to_string(&stats) {
        let v: serde_json::Value = serde_json::from_str(&text).expect("--stats JSON");
        eprintln!(
            "{name}: vfsd --stats: lock_edeadlk {}, lock_stalled {}, lock_enolck {}",
            v["lock_edeadlk"], v["lock_stalled"], v["lock_enolck"]
        );
    }
}
