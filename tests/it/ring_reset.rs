//! Work in flight when a ring stops. GET_VRING_BASE, a reset or a
//! reconnect must never let a request that was still running write a used entry into a
//! ring the guest may have freed and reused: a guest that reboots lays fresh rings over the
//! same memory. The OPEN held up here is blocked in the host kernel by a read lease.

use std::time::{Duration, Instant};

use crate::common::{Daemon, HostLease, ROOT};
use vfsd::frontend::fuse::*;

/// An OPEN for writing of `f`, blocked by a host lease; the queue's used index before it.
fn blocked_open(d: &Daemon, c: &FuseClient) -> (HostLease, u16) {
    std::fs::write(d.path("f"), b"data").unwrap();
    let e = c.lookup(ROOT, "f").unwrap();
    let used = c.fe.queues[1].lock().unwrap().used_idx(&c.fe.mem).unwrap();
    let lease = HostLease::take(&d.path("f"));
    c.submit_open(e.nodeid, libc::O_RDWR as u32).unwrap();
    lease.wait_broken();
    (lease, used)
}

#[test]
fn a_request_outliving_the_stop_never_touches_the_restarted_ring() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let (lease, used) = blocked_open(&d, &c);
    let t = Instant::now();
    let base = c.fe.stop_queue(1).unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "the stop waits for the request in flight (bounded): {waited:?}"
    );
    assert_eq!(
        base as u16, used,
        "the base counts only the requests that completed"
    );
    // The guest "reboots": fresh rings in the same memory.
    c.fe.restart_queue(1).unwrap();
    drop(lease); // the old OPEN finishes now
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        c.fe.queues[1].lock().unwrap().used_idx(&c.fe.mem).unwrap(),
        0,
        "a used entry of the stopped ring landed in the new one"
    );
    // The restarted ring serves as a new one should.
    assert_eq!(c.getattr(ROOT).unwrap().attr.ino, {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&d.share).unwrap().ino()
    });
    assert_eq!(
        c.fe.queues[1].lock().unwrap().used_idx(&c.fe.mem).unwrap(),
        1
    );
}

#[test]
fn a_stop_waits_for_a_request_that_finishes_in_time() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (lease, used) = blocked_open(&d, &c);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        drop(lease);
    });
    let t = Instant::now();
    let base = c.fe.stop_queue(1).unwrap();
    let waited = t.elapsed();
    releaser.join().unwrap();
    assert!(
        waited >= Duration::from_millis(600) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(
        base as u16,
        used.wrapping_add(1),
        "the OPEN completed first"
    );
    assert_eq!(
        c.fe.queues[1].lock().unwrap().used_idx(&c.fe.mem).unwrap(),
        used.wrapping_add(1),
        "and its used entry is in the ring the stop returned"
    );
}

/// A request queued behind a stuck one when the ring stops never runs afterwards: it
/// would act on the host and answer into memory the guest may have reused (review find).
#[test]
fn a_request_still_queued_at_the_stop_never_runs() {
    let d = Daemon::start(&["--thread-pool-size", "1"]);
    let c = d.client();
    let (lease, _) = blocked_open(&d, &c);
    let mk = fuse_backend_rs::abi::fuse_abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let mut name = b"late".to_vec();
    name.push(0);
    c.submit(
        1,
        FUSE_MKDIR,
        ROOT,
        &[vm_memory::ByteValued::as_slice(&mk), &name],
        4096,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    c.fe.stop_queue(1).unwrap();
    drop(lease);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !d.path("late").exists(),
        "a request popped before the stop ran after it"
    );
}

/// A base moved back over a request that completed would make a resumed ring run it
/// twice: the base only moves back over requests none of which completed.
#[test]
fn the_base_never_moves_back_over_a_completed_request() {
    let d = Daemon::start(&[]);
    let c = d.client();
    let (lease, used) = blocked_open(&d, &c);
    // A later request completes while the OPEN is stuck.
    c.getattr(ROOT).unwrap();
    assert_eq!(
        c.fe.queues[1].lock().unwrap().used_idx(&c.fe.mem).unwrap(),
        used.wrapping_add(1)
    );
    let base = c.fe.stop_queue(1).unwrap();
    drop(lease);
    assert_eq!(
        base as u16,
        used.wrapping_add(2),
        "both requests were popped; the GETATTR completed and must not be offered again"
    );
}

#[test]
fn a_kick_fd_replaced_on_a_running_ring_is_watched() {
    // A VMM may hand a running ring a new kick eventfd (SET_VRING_KICK again). The
    // backend crate watches a kick fd only when a ring starts or is enabled; the guest's
    // next kick, on the new fd, must still be heard.
    let d = Daemon::start(&[]);
    let mut c = d.client();
    c.timeout = Duration::from_secs(3);
    c.lookup(ROOT, ".").unwrap();
    {
        let mut q = c.fe.queues[1].lock().unwrap();
        q.kick = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        vhost::VhostBackend::set_vring_kick(&c.fe.vu, 1, &q.kick).unwrap();
    }
    std::fs::write(d.path("f"), b"x").unwrap();
    c.lookup(ROOT, "f")
        .expect("no reply to a request kicked on the new fd");
}
