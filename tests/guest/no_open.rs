//! Fewer requests per file in a real guest: once the first CREATE and OPEN are answered
//! ENOSYS (`--no-open`) the guest kernel makes files with MKNOD and sends no OPEN, RELEASE
//! or FLUSH; without forwarded POSIX locks opens say FOPEN_NOFLUSH; and the file system
//! still behaves as pjdfstest and fsx expect.

use crate::data::{fsx_on_a_share, pjdfstest_on_a_share};
use crate::fixture::TestDir;
use crate::{record, run_on_share};

/// Makes 40 files and reads them, then counts in the guest kernel
/// (`fuse:fuse_request_send`) the FUSE requests per opcode of making 40 more ("requests
/// create: CREATE=n ...") and of reading the first 40 again ("requests read: OPEN=n
/// ..."), and checks what was read.
const COUNT: &str = r#"
set -e
d=$VFSD_SHARE
for i in $(seq 1 40); do echo "file $i" > $d/f$i; done
cat $d/f1 > /dev/null
t=/sys/kernel/tracing
mount -t tracefs nodev $t 2>/dev/null || true
echo 65536 > $t/buffer_size_kb
traced() {  # traced WHAT OPS COMMAND...: prints "requests WHAT: OP=n ..."
    what=$1 ops=$2; shift 2
    echo > $t/trace
    echo 1 > $t/events/fuse/fuse_request_send/enable
    "$@"
    echo 0 > $t/events/fuse/fuse_request_send/enable
    line="requests $what:"
    for op in $ops; do
        line="$line $op=$(grep -c "(FUSE_$op)" $t/trace || true)"
    done
    echo "$line"
    if grep -q "LOST" $t/trace; then echo "requests: LOST EVENTS"; fi
}
make() { for i in $(seq 1 40); do echo "new $i" > $d/n$i; done; }
read_all() { for i in $(seq 1 40); do cat $d/f$i > /dev/null; done; }
traced create "CREATE MKNOD OPEN RELEASE FLUSH" make
traced read "OPEN RELEASE FLUSH READ" read_all
for i in $(seq 1 40); do
    grep -qx "file $i" $d/f$i && grep -qx "new $i" $d/n$i || { echo "requests: $i read wrong"; exit 1; }
done
echo "requests: read back"
"#;

fn counts(line: &str) -> Vec<(String, u64)> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// The create and read counts of `COUNT` on a share served with `args`.
fn count(name: &str, args: &[&str]) -> [Vec<(String, u64)>; 2] {
    let dir = TestDir::new(name);
    let (_, run) = run_on_share(&dir, args, 300, |_| {}, COUNT);
    run.assert_success();
    record(name, &run, &["requests"]);
    assert!(run.lines("requests: LOST").is_empty(), "{}", run.tail());
    ["requests create:", "requests read:"].map(|p| {
        counts(
            &run.lines(p)
                .pop()
                .unwrap_or_else(|| panic!("no request counts\n{}", run.tail())),
        )
    })
}

fn get(c: &[(String, u64)], op: &str) -> u64 {
    c.iter().find(|(k, _)| k == op).map(|(_, v)| *v).unwrap()
}

#[test]
#[ignore = "needs QEMU and root"]
fn no_open_makes_and_reads_files_without_open_release_or_flush_messages() {
    let made = |c: &[(String, u64)]| ["CREATE", "MKNOD", "OPEN", "RELEASE"].map(|op| get(c, op));
    let read = |c: &[(String, u64)]| ["OPEN", "RELEASE", "FLUSH", "READ"].map(|op| get(c, op));
    // The share is on the host's ext4, where a close does nothing a FLUSH must carry.
    let [c, r] = count(
        "no_open_makes_and_reads_files_without_open_release_or_flush",
        &["--no-open", "--cache=always"],
    );
    assert_eq!((made(&c), get(&c, "FLUSH")), ([0, 40, 0, 0], 0), "{c:?}");
    assert_eq!(read(&r), [0, 0, 0, 39], "{r:?}");
    // Without forwarded POSIX locks, opens say FOPEN_NOFLUSH.
    let [c, r] = count(
        "without_posix_locks_files_are_made_and_read_without_flush",
        &["--no-posix-lock", "--cache=always"],
    );
    assert_eq!((made(&c), get(&c, "FLUSH")), ([40, 0, 0, 40], 0), "{c:?}");
    assert_eq!(read(&r), [40, 40, 0, 39], "{r:?}");
    // The defaults: a CREATE or OPEN, a RELEASE and a FLUSH per close.
    let [c, r] = count(
        "default_files_are_made_and_read_with_open_flush_and_release",
        &["--cache=always"],
    );
    assert_eq!(made(&c), [40, 0, 0, 40], "{c:?}");
    assert!(get(&c, "FLUSH") >= 40, "{c:?}");
    assert_eq!(read(&r), [40, 40, 40, 39], "{r:?}");
}

#[test]
#[ignore = "needs QEMU and root"]
fn pjdfstest_passes_under_no_open() {
    pjdfstest_on_a_share("pjdfstest_passes_under_no_open", &["--no-open"]);
}

#[test]
#[ignore = "needs QEMU and root"]
fn fsx_matches_its_model_under_no_open() {
    fsx_on_a_share(
        "fsx_matches_its_model_under_no_open",
        &["--no-open", "--cache=always"],
        900,
        "-N 15000 -D 5000",
    );
}
