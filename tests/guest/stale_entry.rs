//! guest-tests/stale-entry.sh: an open(O_CREAT) of a name the guest holds a negative
//! entry for, made since by someone else (the same directory's second mount in the same
//! guest), opens the file that is there with an existing file's checks: root appends to
//! it, nobody gets EACCES on root's 0600 file. The guest kernel sends CREATE for such a
//! name and counts the open as a create, checking nothing on the file; vfsd answers
//! ESTALE, and the guest looks the name up again and opens it.

use std::time::Duration;

use crate::fixture::{daemon_under_test, Guest, Share, TestDir};
use crate::{assert_checks_ran, record};

#[test]
#[ignore = "needs QEMU and root"]
fn an_o_creat_open_through_a_stale_negative_entry_opens_the_file_with_its_checks() {
    let name = "an_o_creat_open_through_a_stale_negative_entry";
    let dir = TestDir::new(name);
    let d = dir.dir("share");
    // Negative entries are kept longest under --cache always.
    let guest = Guest::new(&dir)
        .timeout(Duration::from_secs(300))
        .share(Share::new(
            &d,
            "share0",
            daemon_under_test(),
            &["--cache=always"],
        ))
        .share(Share::new(
            &d,
            "share1",
            daemon_under_test(),
            &["--cache=never"],
        ));
    let run = guest.run("/guest-tests/stale-entry.sh /mnt/share0 /mnt/share1");
    run.assert_success();
    record(name, &run, &["stale-entry: #"]);
    assert_checks_ran(&run, "stale-entry", 4);
}
