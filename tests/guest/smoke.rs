//! guest-tests/smoke.sh (basic operations checked one by one), then the host's view of
//! what it wrote: every kept file's checksum, and a sparse file past 4 GiB whose last
//! MiB is a copy of another. On QEMU 10 and on bookworm's QEMU 7.2, the oldest VMM kept
//! working (vhost-user protocol features it lacks, its vhost-user-fs-pci quirks).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::fixture::{daemon_under_test, qemu72, qemu_version, Guest, TestDir};
use crate::record;

fn smoke(name: &str, qemu: Option<std::path::PathBuf>) {
    let dir = TestDir::new(name);
    let mut guest = Guest::new(&dir).timeout(Duration::from_secs(600));
    if let Some(q) = qemu {
        eprintln!("{name}: QEMU {}", qemu_version(&q));
        guest = guest.qemu(q);
    }
    let (guest, share) = guest.with_share(daemon_under_test(), &[]);
    let run = guest.run("/guest-tests/smoke.sh");
    run.assert_success();
    record(name, &run, &["smoke: #", "smoke: SKIP"]);
    host_sees_what_the_guest_wrote(&share);
}

pub(crate) fn host_sees_what_the_guest_wrote(share: &Path) {
    let st = Command::new("md5sum")
        .args(["--quiet", "-c", "../smoke-manifest.md5"])
        .current_dir(share.join("smoke-keep"))
        .status()
        .expect("md5sum");
    assert!(
        st.success(),
        "files the guest wrote differ on the host (smoke-manifest.md5)"
    );
    let sparse = share.join("smoke-keep/sparse");
    let len = std::fs::metadata(&sparse).expect("smoke-keep/sparse").len();
    assert_eq!(len, 4101 << 20, "the sparse file's length on the host");
    let mut tail = vec![0u8; 1 << 20];
    let mut f = std::fs::File::open(&sparse).unwrap();
    f.seek(SeekFrom::Start(4100 << 20)).unwrap();
    f.read_exact(&mut tail).unwrap();
    let random = std::fs::read(share.join("smoke-keep/random-1m")).unwrap();
    assert!(
        tail == random,
        "the sparse file's last MiB (past 4 GiB) is not random-1m's data"
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn smoke_on_qemu_10() {
    smoke("smoke_on_qemu_10", None);
}

#[test]
#[ignore = "needs QEMU and root"]
fn smoke_on_qemu_7_2() {
    smoke("smoke_on_qemu_7_2", Some(qemu72()));
}
