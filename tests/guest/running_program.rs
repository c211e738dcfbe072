//! guest-tests/running-program.sh: a program running from a file on the share keeps the
//! file whole. The guest kernel answers ETXTBSY to an O_RDONLY|O_TRUNC open of it only
//! after the open, so a daemon that truncates in OPEN (FUSE_ATOMIC_O_TRUNC) empties the
//! running program. One boot, a share per cache mode, the guest's tmpfs to match, as root
//! and as a non-root user.

use std::time::Duration;

use crate::fixture::{daemon_under_test, Guest, Share, TestDir};
use crate::{assert_checks_ran, record};

#[test]
#[ignore = "needs QEMU and root"]
fn an_o_trunc_open_of_a_running_program_fails_and_leaves_it_whole_in_each_cache_mode() {
    let name = "an_o_trunc_open_of_a_running_program_fails_and_leaves_it_whole";
    let dir = TestDir::new(name);
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(300));
    for (i, cache) in ["never", "auto", "always"].iter().enumerate() {
        let d = dir.dir(&format!("share{i}"));
        let args = [format!("--cache={cache}")];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        guest = guest.share(Share::new(
            &d,
            &format!("share{i}"),
            daemon_under_test(),
            &args,
        ));
    }
    let run = guest.run("/guest-tests/running-program.sh /mnt/share0 /mnt/share1 /mnt/share2 /tmp");
    run.assert_success();
    record(name, &run, &["running-program: #"]);
    // 3 checks per user (2) and directory (4): none skipped.
    assert_checks_ran(&run, "running-program", 24);
}
