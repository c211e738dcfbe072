//! `--poll`: after answering a request the queue thread polls its ring before it sleeps,
//! so a request the guest makes available within the window is answered without a kick;
//! while it polls the guest is asked not to kick (VRING_USED_F_NO_NOTIFY without
//! EVENT_IDX), and when it gives up the guest may kick again and nothing made available
//! meanwhile is left unanswered.
//!
//! These tests drive one request queue by hand, as the guest's driver does: a request
//! goes into the avail ring, and a kick follows only when the test says so, or (as a
//! driver decides) when the device's used flags or avail_event ask for one.

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vfsd::frontend::fuse::{FuseClient, FUSE_GETATTR};
use vfsd::frontend::FrontendConfig;
use vm_memory::{Bytes, GuestAddress};

use crate::common::Daemon;

const Q: usize = 1;
/// fuse_getattr_in: no flags, no handle.
const GETATTR_IN: [u8; 16] = [0; 16];
/// VRING_USED_F_NO_NOTIFY.
const NO_NOTIFY: u16 = 1;

fn client(d: &Daemon, event_idx: bool) -> FuseClient {
    let c = d.client_with(FrontendConfig {
        event_idx,
        ..Default::default()
    });
    // The queue thread serves lone GETATTRs itself (not inline, which has a brief
    // watch of its own) once the guest has waited on each reply for a while.
    for _ in 0..32 {
        c.getattr(1).unwrap();
    }
    c
}

/// Makes a GETATTR available on queue `Q` without kicking; returns its slot.
fn make_available(c: &FuseClient) -> usize {
    let (_, req) = c.build(FUSE_GETATTR, 1, &[&GETATTR_IN]);
    let mut q = c.fe.queues[Q].lock().unwrap();
    q.reap(&c.fe.mem).unwrap();
    let slot = q.free_slot().expect("a free slot");
    q.submit(&c.fe.mem, slot, &req, 4096, c.layout).unwrap();
    slot
}

/// Kicks queue `Q` unconditionally.
fn kick(c: &FuseClient) {
    c.fe.queues[Q].lock().unwrap().kick.write(1).unwrap();
}

/// Whether the device asks for a kick for the request just made available, as the
/// guest's driver decides it (virtqueue_kick_prepare): without EVENT_IDX by the used
/// flags, with it by avail_event against the avail index before and after.
fn wants_kick(c: &FuseClient, event_idx: bool) -> bool {
    fence(Ordering::SeqCst);
    let q = c.fe.queues[Q].lock().unwrap();
    let mem = &c.fe.mem;
    if !event_idx {
        let flags: u16 = mem
            .load(GuestAddress(q.geo.used), Ordering::Acquire)
            .unwrap();
        return flags & NO_NOTIFY == 0;
    }
    let new: u16 = mem
        .load(GuestAddress(q.geo.avail + 2), Ordering::Acquire)
        .unwrap();
    let old = new.wrapping_sub(1);
    let event: u16 = mem
        .load(
            GuestAddress(q.geo.used + 4 + 8 * q.geo.size as u64),
            Ordering::Acquire,
        )
        .unwrap();
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

fn used_flags(c: &FuseClient) -> u16 {
    let q = c.fe.queues[Q].lock().unwrap();
    c.fe.mem
        .load(GuestAddress(q.geo.used), Ordering::Acquire)
        .unwrap()
}

/// Spins (no sleep, so the test sees a reply as soon as it is used) until `slot` is
/// answered or `limit` passes; takes the reply.
fn answered_within(c: &FuseClient, slot: usize, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        {
            let mut q = c.fe.queues[Q].lock().unwrap();
            q.reap(&c.fe.mem).unwrap();
            if q.is_done(slot) {
                let reply = q.take(&c.fe.mem, slot).unwrap();
                assert!(reply.len() > 16, "a GETATTR reply");
                return true;
            }
        }
        if start.elapsed() > limit {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// This file's tests one at a time: each spins a thread of its own against the daemon's
/// polling thread, and on a small host two such pairs would take turns at the CPUs in
/// slices longer than the window.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Puts the calling thread on CPU 0 and every thread of `d` on CPU 1, as a guest's vCPU
/// and the daemon's queue thread run on a host with CPUs to spare. On one CPU a thread
/// that polls and the thread that would send the request only take turns: the scheduler
/// runs the other once the poll is over. False on a host of one CPU.
fn apart(d: &Daemon) -> bool {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: one CPU, where a poll can't see a request sent meanwhile");
        return false;
    }
    let on = |tid: i32, cpu: usize| {
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity only read
        // and write the set, which lives on this stack frame.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        }
    };
    assert_eq!(on(0, 0), 0, "{}", std::io::Error::last_os_error());
    let tasks = std::fs::read_dir(format!("/proc/{}/task", d.pid())).unwrap();
    for t in tasks {
        let tid: i32 = t.unwrap().file_name().to_str().unwrap().parse().unwrap();
        on(tid, 1);
    }
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// The device asked for no kick, and answered without one.
    Quiet,
    /// It asked for a kick, and answered after it.
    Kicked,
}

/// One request kicked and answered (the test spinning on the used ring), then the next
/// made available `delay` after the reply, kicked only if the device asks for a kick then,
/// as a guest's driver does. Every request must be answered. `unkicked_waits`: a request
/// the device asked a kick for must still be unanswered 20 ms later without one.
fn round(c: &FuseClient, event_idx: bool, delay: Duration, unkicked_waits: bool) -> Round {
    let first = make_available(c);
    kick(c);
    assert!(answered_within(c, first, Duration::from_secs(10)));
    let start = Instant::now();
    while start.elapsed() < delay {
        std::hint::spin_loop();
    }
    let next = make_available(c);
    if !wants_kick(c, event_idx) {
        assert!(
            answered_within(c, next, Duration::from_secs(5)),
            "a request made available {delay:?} after a reply, for which the device asked no kick, was never answered (event_idx {event_idx})"
        );
        return Round::Quiet;
    }
    if unkicked_waits {
        assert!(
            !answered_within(c, next, Duration::from_millis(20)),
            "answered without the kick the device asked for (event_idx {event_idx})"
        );
    }
    kick(c);
    assert!(
        answered_within(c, next, Duration::from_secs(10)),
        "answered after its kick"
    );
    Round::Kicked
}

/// With `--poll=on`, requests made available from right after a reply to past the 200 µs
/// window: the device asks no kick for many of them, and answers each one (one made
/// available as the poll gives up is seen by the look after the guest may kick again,
/// or the guest sees it must kick). Without EVENT_IDX it asks by VRING_USED_F_NO_NOTIFY,
/// cleared once the thread sleeps.
fn polled_without_a_kick(event_idx: bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let d = Daemon::start(&["--poll=on"]);
    let c = client(&d, event_idx);
    if !apart(&d) {
        return;
    }
    // At least 150 rounds, so requests come at every time from the reply to past the
    // window, and on until enough needed no kick: on a busy host this thread is often
    // off its CPU for longer than the window.
    let (mut rounds, mut quiet) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(20);
    while rounds < 150 || (quiet < 15 && Instant::now() < deadline) {
        // 0 to 298 µs after the reply: within the window, at its end, past it.
        let delay = Duration::from_micros(rounds * 2 % 300);
        if round(&c, event_idx, delay, false) == Round::Quiet {
            quiet += 1;
        }
        rounds += 1;
    }
    // Without polling only a request made available before the thread's last look
    // (within a µs or two of the reply) would need no kick.
    assert!(
        quiet >= 15,
        "only {quiet} of {rounds} requests made available within 300 µs of a reply were taken without a kick"
    );
    if !event_idx {
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(used_flags(&c) & NO_NOTIFY, 0, "the guest may kick again");
    }
}

#[test]
fn with_polling_on_requests_after_a_reply_need_no_kick_and_none_is_left_unanswered() {
    polled_without_a_kick(true);
}

#[test]
fn without_event_idx_requests_after_a_reply_need_no_kick_and_none_is_left_unanswered() {
    polled_without_a_kick(false);
}

#[test]
fn with_polling_off_a_request_right_after_a_reply_waits_for_a_kick() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for event_idx in [true, false] {
        let d = Daemon::start(&["--poll=off"]);
        let c = client(&d, event_idx);
        if !apart(&d) {
            return;
        }
        let rounds = 20;
        let quiet = (0..rounds)
            .filter(|_| round(&c, event_idx, Duration::from_micros(50), true) == Round::Quiet)
            .count();
        // The daemon's thread preempted between the reply and its last look makes a
        // round quiet now and then; with polling on, most are.
        assert!(
            quiet <= rounds / 4,
            "{quiet} of {rounds} requests 50 µs after a reply needed no kick (event_idx {event_idx})"
        );
        assert_eq!(used_flags(&c), 0, "the guest is never asked not to kick");
    }
}
