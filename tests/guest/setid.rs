//! guest-tests/setid.sh: set-id bits dropped by a non-root user's writes, truncates and
//! fallocates, and non-root creates of every kind; one boot per cache mode (the guest
//! kernel takes a different write path in each), each with a file-handle mode.

use crate::fixture::TestDir;
use crate::{record, run_on_share};

fn setid(name: &str, cache: &str, handles: &str) {
    let dir = TestDir::new(name);
    let args = [
        format!("--cache={cache}"),
        format!("--inode-file-handles={handles}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, run) = run_on_share(
        &dir,
        &args,
        300,
        |_| {},
        &format!("/guest-tests/setid.sh cache={cache},handles={handles}"),
    );
    run.assert_success();
    record(name, &run, &["setid: #"]);
}

#[test]
#[ignore = "needs QEMU and root"]
fn setid_bits_and_non_root_creates_under_cache_never_with_mandatory_file_handles() {
    setid(
        "setid_bits_and_non_root_creates_under_cache_never_with_mandatory_file_handles",
        "never",
        "mandatory",
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn setid_bits_and_non_root_creates_under_cache_auto_with_file_handles_preferred() {
    setid(
        "setid_bits_and_non_root_creates_under_cache_auto_with_file_handles_preferred",
        "auto",
        "prefer",
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn setid_bits_and_non_root_creates_under_cache_always_without_file_handles() {
    setid(
        "setid_bits_and_non_root_creates_under_cache_always_without_file_handles",
        "always",
        "never",
    );
}
