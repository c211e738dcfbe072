//! Where the device serves metadata requests when the guest keeps several in flight
//! (`device::route`, design.md "Quick metadata beside others in flight").

use std::time::{Duration, Instant};

use crate::common::{Daemon, ROOT};
use vfsd::frontend::fuse::FUSE_GETATTR;

#[test]
fn getattrs_two_at_a_time_are_served_inline_on_the_queue_thread() {
    let d = Daemon::start(&["--thread-pool-size", "4"]);
    let c = d.client();
    const PAIRS: u64 = 50;
    for _ in 0..PAIRS {
        let tickets: Vec<_> = (0..2)
            .map(|_| {
                c.submit(1, FUSE_GETATTR, ROOT, &[&[0u8; 16]], 4096)
                    .unwrap()
            })
            .collect();
        for t in tickets {
            assert_eq!(c.wait(t).unwrap().error, 0);
        }
    }
    let t = Instant::now();
    let s = loop {
        let s = d.stats();
        if s["opcodes"]["GETATTR"]["count"].as_u64().unwrap_or(0) >= 2 * PAIRS {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "stats never showed the GETATTRs"
        );
    };
    let n = |k: &str| s[k].as_u64().unwrap();
    // A loaded host may slow some past route::SLOW_INLINE, which hands them to the pool;
    // at 2 in flight the queue is not alone, so these are not `served_alone` ones.
    assert!(n("served_inline") > 0, "{s}");
    assert!(
        n("served_inline") + n("served_alone") <= 2 * PAIRS + 1,
        "{s}"
    );
}
