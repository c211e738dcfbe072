//! Run-time counters: per-opcode counts and latencies, and per-inode write concurrency.
//!
//! Counters are lock-free atomics; a dump (JSON) is taken on SIGUSR1 or periodically with
//! `--stats FILE`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::passthrough::PassthroughFs;

const SLOTS: usize = 64;

#[derive(Default)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
}

pub struct Stats {
    ops: Vec<OpStats>,
    started: Instant,
    /// READs answered on a queue thread from the page cache, and those handed to the pool
    /// after the attempt would have blocked (see `passthrough::nowait`).
    pub reads_on_queue_thread: AtomicU64,
    pub reads_handed_off: AtomicU64,
    /// Of the queue-thread READs, those decoded by vfsd itself (`server::fast_read`).
    pub reads_direct: AtomicU64,
    /// Requests a queue thread served itself, blocking, because nothing else was in flight
    /// on its queue (`device::FsDevice::process_queue`).
    pub served_alone: AtomicU64,
    /// Of the OPENs and CREATEs tried on a queue thread, those that would have waited for
    /// a host lease break there, handed to the pool (`passthrough::nowait`).
    pub opens_handed_off: AtomicU64,
    /// Of those, READs that would have blocked (the rest of `reads_handed_off`'s kind).
    pub reads_served_alone: AtomicU64,
    /// Quick metadata requests a queue thread served itself beside others in flight (in a
    /// pop `device::route` allows).
    pub served_inline: AtomicU64,
    /// Requests without a reply (FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY), all served
    /// on their queue thread.
    pub no_reply_on_queue_thread: AtomicU64,
    /// Requests whose handler panicked (answered EIO; the worker lives on).
    pub panics: AtomicU64,
    /// Requests answered EMFILE or ENFILE: the host's fd limits were reached.
    pub fds_exhausted: AtomicU64,
}

/// FUSE opcode names as in the kernel's `enum fuse_opcode` (from the dispatch table).
pub fn opcode_name(op: u32) -> &'static str {
    crate::server::opcode::name(op)
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: (0..SLOTS).map(|_| OpStats::default()).collect(),
            started: Instant::now(),
            reads_on_queue_thread: AtomicU64::new(0),
            reads_handed_off: AtomicU64::new(0),
            reads_direct: AtomicU64::new(0),
            served_alone: AtomicU64::new(0),
            opens_handed_off: AtomicU64::new(0),
            reads_served_alone: AtomicU64::new(0),
            served_inline: AtomicU64::new(0),
            no_reply_on_queue_thread: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            fds_exhausted: AtomicU64::new(0),
        }
    }
}

impl Stats {
    pub fn record(&self, opcode: u32, elapsed: Duration, error: bool) {
        let s = &self.ops[(opcode as usize).min(SLOTS - 1)];
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        s.count.fetch_add(1, Ordering::Relaxed);
        s.total_ns.fetch_add(ns, Ordering::Relaxed);
        s.max_ns.fetch_max(ns, Ordering::Relaxed);
        if error {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn count(&self, opcode: u32) -> u64 {
        self.ops[(opcode as usize).min(SLOTS - 1)]
            .count
            .load(Ordering::Relaxed)
    }

    /// A JSON snapshot of every counter.
    pub fn snapshot(&self, fs: &PassthroughFs) -> Value {
        let mut ops = Map::new();
        for (i, s) in self.ops.iter().enumerate() {
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            let total = s.total_ns.load(Ordering::Relaxed);
            // Unknown opcodes keep their number, so they don't share one key.
            let name = match opcode_name(i as u32) {
                "unknown" => format!("opcode {i}"),
                n => n.to_string(),
            };
            ops.insert(
                name,
                json!({
                    "count": count,
                    "errors": s.errors.load(Ordering::Relaxed),
                    "avg_us": total as f64 / count as f64 / 1000.0,
                    "max_us": s.max_ns.load(Ordering::Relaxed) as f64 / 1000.0,
                }),
            );
        }
        let fs = fs.counters();
        let inodes: Vec<Value> = fs
            .written
            .iter()
            .map(|i| {
                json!({
                    "nodeid": i.nodeid,
                    "host_ino": i.host_ino,
                    "peak_writes_in_flight": i.io.peak_writes_in_flight,
                    "shared_writes": i.io.shared_writes,
                    "exclusive_writes": i.io.exclusive_writes,
                    "exclusive_violations": i.io.exclusive_violations,
                    "size_checks": i.io.size_checks,
                })
            })
            .collect();
        json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "opcodes": ops,
            "peak_writes_in_flight": fs.peak_writes_in_flight,
            "exclusive_violations": fs.exclusive_violations,
            "reads_on_queue_thread": self.reads_on_queue_thread.load(Ordering::Relaxed),
            "reads_handed_off": self.reads_handed_off.load(Ordering::Relaxed),
            "served_alone": self.served_alone.load(Ordering::Relaxed),
            "opens_handed_off": self.opens_handed_off.load(Ordering::Relaxed),
            "reads_served_alone": self.reads_served_alone.load(Ordering::Relaxed),
            "served_inline": self.served_inline.load(Ordering::Relaxed),
            "no_reply_on_queue_thread": self.no_reply_on_queue_thread.load(Ordering::Relaxed),
            "reads_direct": self.reads_direct.load(Ordering::Relaxed),
            "panics": self.panics.load(Ordering::Relaxed),
            "fds_exhausted": self.fds_exhausted.load(Ordering::Relaxed),
            "inode_fds": fs.inode_fds,
            "inode_fd_limit": fs.inode_fd_limit,
            "locks_held": fs.locks_held,
            "lock_waiters": fs.lock_waiters,
            "lock_enolck": fs.lock_enolck,
            "lock_edeadlk": fs.lock_edeadlk,
            "lock_owners": fs.lock_owners,
            "nowait_unsupported": fs.nowait_unsupported,
            "live_inodes": fs.live_inodes,
            "open_handles": fs.open_handles,
            "inodes": inodes,
        })
    }
}
