//! Fewer requests per file in a real guest: once the first CREATE and OPEN are answered
//! ENOSYS (`--no-open`) the guest kernel makes files with MKNOD and sends no OPEN, RELEASE
//! or FLUSH; without forwarded POSIX locks opens say FOPEN_NOFLUSH; and the file system
//! still behaves as pjdfstest and fsx expect.

use std::time::Duration;

use crate::data::check_pjdfstest;
use crate::fixture::{daemon_under_test, Guest, Share, TestDir};
use crate::record;

/// guest-tests/request-counts.sh: on each share, the requests of making 40 files
/// ("requests TAG create: CREATE=n ...") and of reading 40 ("requests TAG read: OPEN=n
/// ..."), as the guest kernel counts them on that share's connection.
const COUNT: &str = "/guest-tests/request-counts.sh";

fn counts(line: &str) -> Vec<(String, u64)> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// The create and read counts of `COUNT` on each share, one boot with a share per entry of
/// `shares` (each its daemon's arguments).
fn count(name: &str, shares: &[&[&str]]) -> Vec<[Vec<(String, u64)>; 2]> {
    let dir = TestDir::new(name);
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(300));
    for (i, args) in shares.iter().enumerate() {
        let d = dir.dir(&format!("share{i}"));
        guest = guest.share(Share::new(
            &d,
            &format!("share{i}"),
            daemon_under_test(),
            args,
        ));
    }
    let run = guest.run(COUNT);
    run.assert_success();
    record(name, &run, &["requests"]);
    assert!(run.lines("requests: LOST").is_empty(), "{}", run.tail());
    (0..shares.len())
        .map(|i| {
            [
                format!("requests share{i} create:"),
                format!("requests share{i} read:"),
            ]
            .map(|p| {
                counts(
                    &run.lines(&p)
                        .pop()
                        .unwrap_or_else(|| panic!("no request counts ({p})\n{}", run.tail())),
                )
            })
        })
        .collect()
}

fn get(c: &[(String, u64)], op: &str) -> u64 {
    c.iter().find(|(k, _)| k == op).map(|(_, v)| *v).unwrap()
}

#[test]
#[ignore = "needs QEMU and root"]
fn no_open_makes_and_reads_files_without_open_release_or_flush_messages() {
    let made = |c: &[(String, u64)]| ["CREATE", "MKNOD", "OPEN", "RELEASE"].map(|op| get(c, op));
    let read = |c: &[(String, u64)]| ["OPEN", "RELEASE", "FLUSH", "READ"].map(|op| get(c, op));
    // The shares are on the host's ext4, where a close does nothing a FLUSH must carry.
    let counted = count(
        "no_open_makes_and_reads_files_without_open_release_or_flush",
        &[
            &["--no-open", "--cache=always"],
            &["--no-posix-lock", "--cache=always"],
            &["--cache=always"],
        ],
    );
    // --no-open: MKNOD alone, no OPEN, RELEASE or FLUSH.
    let [c, r] = &counted[0];
    assert_eq!((made(c), get(c, "FLUSH")), ([0, 40, 0, 0], 0), "{c:?}");
    assert_eq!(read(r), [0, 0, 0, 39], "{r:?}");
    // Without forwarded POSIX locks, opens say FOPEN_NOFLUSH.
    let [c, r] = &counted[1];
    assert_eq!((made(c), get(c, "FLUSH")), ([40, 0, 0, 40], 0), "{c:?}");
    assert_eq!(read(r), [40, 40, 0, 39], "{r:?}");
    // The defaults: a CREATE or OPEN, a RELEASE and a FLUSH per close.
    let [c, r] = &counted[2];
    assert_eq!(made(c), [40, 0, 0, 40], "{c:?}");
    assert!(get(c, "FLUSH") >= 40, "{c:?}");
    assert_eq!(read(r), [40, 40, 40, 39], "{r:?}");
}

/// pjdfstest on one share and then fsx on another, both under `--no-open` (fsx also with
/// `--cache always`), in one boot.
#[test]
#[ignore = "needs QEMU and root"]
fn pjdfstest_and_fsx_pass_under_no_open() {
    let name = "pjdfstest_and_fsx_pass_under_no_open";
    let dir = TestDir::new(name);
    let (d0, d1) = (dir.dir("share0"), dir.dir("share1"));
    let run = Guest::new(&dir)
        .timeout(Duration::from_secs(1500))
        .share(Share::new(
            &d0,
            "share0",
            daemon_under_test(),
            &["--no-open"],
        ))
        .share(Share::new(
            &d1,
            "share1",
            daemon_under_test(),
            &["--no-open", "--cache=always"],
        ))
        .run(
            "rc=0; /guest-tests/pjdfstest.sh || rc=1; \
             /guest-tests/fsx.sh -d /mnt/share1 -N 15000 -D 5000 || rc=1; exit $rc",
        );
    // Passes only if fsx passed too: the guest's status covers both.
    check_pjdfstest(name, &run, 1);
    record(name, &run, &["fsx: PASS", "fsx: FAIL", "fsx: SKIP"]);
    for kind in ["buffered", "direct"] {
        assert!(
            !run.lines(&format!("fsx: PASS {kind} ")).is_empty(),
            "no passing fsx {kind} run\n{}",
            run.tail()
        );
    }
}
