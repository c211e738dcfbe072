//! `--keep-listening`: one vfsd process serves a guest, which powers off, and then a
//! second guest on the same socket, which sees what the first wrote.

use std::time::Duration;

use crate::fixture::guest::reported;
use crate::fixture::{DaemonKind, Guest, Share, TestDir};

#[test]
#[ignore = "needs QEMU and root"]
fn one_keep_listening_vfsd_serves_two_guests_in_a_row() {
    let dir = TestDir::new("one_keep_listening_vfsd_serves_two_guests_in_a_row");
    let share = dir.dir("share");
    let guest = Guest::new(&dir)
        .timeout(Duration::from_secs(300))
        .share(Share::new(
            &share,
            "share0",
            DaemonKind::Vfsd,
            &["--cache=auto", "--keep-listening"],
        ));
    let _slot = crate::fixture::Slot::take(1);
    let mut daemons = guest.start_daemons("vfsd");
    let pid = daemons.list[0].pid();
    let cmds = [
        // The guest powers off holding a flock and a POSIX lock on `held`.
        "echo first > one && : > held && (vfsd-lock -q -m locked -t 3600 held ex wr:0:0 &) && \
         while [ ! -e locked ]; do sleep 0.1; done",
        // They went with the first guest's session: the second gets them at once.
        "cat one && echo second > two && vfsd-lock held ex wr:0:0",
    ];
    for (i, cmd) in cmds.iter().enumerate() {
        let mut vm = guest.start_vm(&format!("guest{i}"), &daemons, cmd, &[]);
        let ended = vm.wait(Duration::from_secs(300));
        let console = vm.console_text();
        assert!(ended.is_some(), "guest {i} did not power off\n{console}");
        assert_eq!(reported(&console), Some(0), "guest {i}\n{console}");
        assert!(
            daemons.list[0].is_running(),
            "vfsd ended after guest {i} left"
        );
        assert_eq!(daemons.list[0].pid(), pid);
    }
    assert_eq!(
        std::fs::read_to_string(share.join("two")).unwrap(),
        "second\n"
    );
}
