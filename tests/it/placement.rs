//! Where the device serves metadata requests when the guest keeps several in flight
//! (`device::route`, design.md "Quick metadata beside others in flight").

use std::time::{Duration, Instant};

use crate::common::{Daemon, ROOT};
use fuse_backend_rs::abi::fuse_abi::SetattrIn;
use vfsd::frontend::fuse::{FuseClient, FATTR_MODE, FUSE_GETATTR};

/// `rounds` times, `at_once` GETATTRs of the root submitted one after another, then all
/// their replies collected (each must succeed).
fn getattrs_in_rounds(c: &FuseClient, rounds: u64, at_once: u64) {
    for _ in 0..rounds {
        let tickets: Vec<_> = (0..at_once)
            .map(|_| {
                c.submit(1, FUSE_GETATTR, ROOT, &[&[0u8; 16]], 4096)
                    .unwrap()
            })
            .collect();
        for t in tickets {
            assert_eq!(c.wait(t).unwrap().error, 0);
        }
    }
}

/// The stats once the daemon has counted `count` requests of `op`.
fn stats_after(d: &Daemon, op: &str, count: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let s = d.stats();
        if s["opcodes"][op]["count"].as_u64().unwrap_or(0) >= count {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "stats never showed {count} {op}: {s}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn getattrs_two_at_a_time_are_served_inline_on_the_queue_thread() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const PAIRS: u64 = 50;
    getattrs_in_rounds(&c, PAIRS, 2);
    let s = stats_after(&d, "GETATTR", 2 * PAIRS);
    let n = |k: &str| s[k].as_u64().unwrap();
    // A loaded host may slow some past route::SLOW_INLINE, which hands them to the pool;
    // at 2 in flight the queue is not alone, so these are not `served_alone` ones.
    assert!(n("served_inline") > 0, "{s}");
    assert!(
        n("served_inline") + n("served_alone") <= 2 * PAIRS + 1,
        "{s}"
    );
}

#[test]
fn changes_to_the_tree_one_at_a_time_are_served_alone_on_the_queue_thread() {
    // What untar, cp -a and rm -rf send, one request in flight: none of it goes to a
    // worker once the queue is seen to be alone (route::LONE_POPS lone pops in a row).
    let d = Daemon::start(&["--thread-pool-size", "4", "--xattr"]);
    let c = d.client();
    for _ in 0..32 {
        c.getattr(ROOT).unwrap();
    }
    let before = stats_after(&d, "GETATTR", 32)["served_alone"]
        .as_u64()
        .unwrap();
    const FILES: u64 = 20;
    for i in 0..FILES {
        let dir = c.mkdir(ROOT, &format!("d{i}"), 0o755).unwrap().nodeid;
        c.symlink(dir, "l", "target").unwrap();
        let chmod = SetattrIn {
            valid: FATTR_MODE,
            mode: 0o700,
            ..Default::default()
        };
        c.setattr(dir, &chmod).unwrap();
        c.setxattr(dir, "user.a", b"1", 0).unwrap();
        c.rename(dir, "l", dir, "m").unwrap();
        c.unlink(dir, "m").unwrap();
        c.rmdir(ROOT, &format!("d{i}")).unwrap();
    }
    let s = stats_after(&d, "RMDIR", FILES);
    let alone = s["served_alone"].as_u64().unwrap() - before;
    // MKDIR, SYMLINK, SETATTR, SETXATTR, RENAME, UNLINK, RMDIR: 7 per file. A loaded
    // host may see a request arrive while one is served and count the queue busy again
    // for LONE_POPS pops, so not every one, but most.
    assert!(
        alone >= 7 * FILES / 2,
        "{alone} of {} served alone: {s}",
        7 * FILES
    );
}

#[test]
fn on_a_small_host_a_large_pop_of_getattrs_is_served_inline() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus > 2 {
        // route::SMALL_HOST_CPUS: a larger host hands large pops to its workers.
        eprintln!("skipped: {cpus} CPUs is not a small host");
        return;
    }
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const ROUNDS: u64 = 30;
    const AT_ONCE: u64 = 8;
    getattrs_in_rounds(&c, ROUNDS, AT_ONCE);
    let s = stats_after(&d, "GETATTR", ROUNDS * AT_ONCE);
    let inline = s["served_inline"].as_u64().unwrap();
    // Pops smaller than 8 happen too (the device may pop while the client still
    // submits), so some were inline before; most now are.
    assert!(
        inline >= ROUNDS * AT_ONCE / 2,
        "{inline} of {} inline: {s}",
        ROUNDS * AT_ONCE
    );
}

#[test]
fn forgets_are_served_on_the_queue_thread() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const NAMES: u64 = 20;
    for i in 0..NAMES {
        let name = format!("f{i}");
        std::fs::write(d.path(&name), b"").unwrap();
        let node = c.lookup(ROOT, &name).unwrap().nodeid;
        c.forget(node, 1).unwrap();
    }
    let s = stats_after(&d, "FORGET", NAMES);
    assert_eq!(s["no_reply_on_queue_thread"].as_u64(), Some(NAMES), "{s}");
    assert_eq!(
        s["live_inodes"].as_u64(),
        Some(1),
        "the forgets dropped the nodes: {s}"
    );
}
