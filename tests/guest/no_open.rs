//! Fewer requests per open in a real guest: after the first OPEN is answered ENOSYS
//! (`--no-open`) the guest kernel sends no OPEN, RELEASE or FLUSH, without forwarded POSIX
//! locks opens say FOPEN_NOFLUSH, and the file system still behaves as pjdfstest and fsx
//! expect.

use crate::data::check_pjdfstest;
use crate::fixture::TestDir;
use crate::{record, run_on_share};

/// Reads 40 files twice and counts the FUSE requests of the second pass per opcode, in the
/// guest kernel (`fuse:fuse_request_send`), printing "requests: OPEN=n RELEASE=n ...".
const COUNT_READS: &str = r#"
set -e
d=$VFSD_SHARE
for i in $(seq 1 40); do echo "file $i" > $d/f$i; done
cat $d/f1 > /dev/null
t=/sys/kernel/tracing
mount -t tracefs nodev $t 2>/dev/null || true
echo 65536 > $t/buffer_size_kb
echo > $t/trace
echo 1 > $t/events/fuse/fuse_request_send/enable
for i in $(seq 1 40); do cat $d/f$i > /dev/null; done
echo 0 > $t/events/fuse/fuse_request_send/enable
line="requests:"
for op in OPEN RELEASE FLUSH READ; do
    line="$line $op=$(grep -c "(FUSE_$op)" $t/trace || true)"
done
echo "$line"
grep -q "LOST" $t/trace && echo "requests: LOST EVENTS"
for i in $(seq 1 40); do grep -qx "file $i" $d/f$i || { echo "requests: f$i read wrong"; exit 1; }; done
echo "requests: read back"
"#;

fn counts(line: &str) -> Vec<(String, u64)> {
    line.trim_start_matches("requests:")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

fn count_reads(name: &str, args: &[&str]) -> Vec<(String, u64)> {
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(&dir, args, 300, |_| {}, COUNT_READS);
    run.assert_success();
    record(name, &run, &["requests: "]);
    assert!(run.lines("requests: LOST").is_empty(), "{}", run.tail());
    let line = run
        .lines("requests: OPEN=")
        .pop()
        .unwrap_or_else(|| panic!("no request counts\n{}", run.tail()));
    counts(&line)
}

fn get(c: &[(String, u64)], op: &str) -> u64 {
    c.iter().find(|(k, _)| k == op).map(|(_, v)| *v).unwrap()
}

#[test]
#[ignore = "needs QEMU and root"]
fn no_open_reads_files_without_open_release_or_flush_messages() {
    let opened = |c: &[(String, u64)]| {
        (
            get(c, "OPEN"),
            get(c, "RELEASE"),
            get(c, "FLUSH"),
            get(c, "READ"),
        )
    };
    // The share is on the host's ext4, where a close does nothing a FLUSH must carry.
    let c = count_reads(
        "no_open_reads_files_without_open_release_or_flush",
        &["--no-open", "--cache=always"],
    );
    assert_eq!(opened(&c), (0, 0, 0, 39), "{c:?}");
    // Without forwarded POSIX locks, opens say FOPEN_NOFLUSH.
    let c = count_reads(
        "without_posix_locks_files_are_read_without_flush",
        &["--no-posix-lock", "--cache=always"],
    );
    assert_eq!(opened(&c), (40, 40, 0, 39), "{c:?}");
    // The same reads with the defaults: one OPEN, FLUSH and RELEASE each.
    let c = count_reads(
        "default_reads_send_open_flush_and_release",
        &["--cache=always"],
    );
    assert_eq!(opened(&c), (40, 40, 40, 39), "{c:?}");
}

#[test]
#[ignore = "needs QEMU and root"]
fn pjdfstest_passes_under_no_open() {
    let name = "pjdfstest_passes_under_no_open";
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(
        &dir,
        &["--no-open"],
        900,
        |_| {},
        "/guest-tests/pjdfstest.sh",
    );
    check_pjdfstest(name, &run, 1);
}

#[test]
#[ignore = "needs QEMU and root"]
fn fsx_matches_its_model_under_no_open() {
    let name = "fsx_matches_its_model_under_no_open";
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(
        &dir,
        &["--no-open", "--cache=always"],
        900,
        |_| {},
        "/guest-tests/fsx.sh -N 15000 -D 5000",
    );
    run.assert_success();
    record(name, &run, &["fsx: PASS", "fsx: FAIL", "fsx: SKIP"]);
}
