//! guest-tests/setid.sh: set-id bits dropped by a non-root user's writes, truncates and
//! fallocates, and non-root creates of every kind; in each cache mode (the guest kernel
//! takes a different write path in each), each with a file-handle mode. One boot, a share
//! per combination, each served by a daemon of its own.

use std::time::Duration;

use crate::fixture::{daemon_under_test, Guest, Share, TestDir};
use crate::record;

/// (cache mode, file-handle mode) of share0, share1, ...
const MODES: [(&str, &str); 3] = [
    ("never", "mandatory"),
    ("auto", "prefer"),
    ("always", "never"),
];

#[test]
#[ignore = "needs QEMU and root"]
fn setid_bits_and_non_root_creates_in_each_cache_mode_each_with_a_file_handle_mode() {
    let name = "setid_bits_and_non_root_creates_in_each_cache_mode";
    let dir = TestDir::new(name);
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(300));
    let mut cmd = String::from("rc=0");
    for (i, (cache, handles)) in MODES.iter().enumerate() {
        let d = dir.dir(&format!("share{i}"));
        let args = [
            format!("--cache={cache}"),
            format!("--inode-file-handles={handles}"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        guest = guest.share(Share::new(
            &d,
            &format!("share{i}"),
            daemon_under_test(),
            &args,
        ));
        cmd.push_str(&format!(
            "; VFSD_SHARE=/mnt/share{i} /guest-tests/setid.sh cache={cache},handles={handles} || rc=1"
        ));
    }
    cmd.push_str("; exit $rc");
    let run = guest.run(&cmd);
    run.assert_success();
    record(name, &run, &["setid: #"]);
    // Each share's run printed its summary, with no failure.
    for (cache, handles) in MODES {
        let want = format!(" checks passed, 0 failed (cache={cache},handles={handles})");
        assert!(
            run.lines("setid: ").iter().any(|l| l.ends_with(&want)),
            "no setid summary for cache={cache},handles={handles}\n{}",
            run.tail()
        );
    }
}
