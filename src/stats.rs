//! Run-time counters: per-opcode counts, errnos and latencies, bytes moved, and per-inode
//! write concurrency.
//!
//! Counters are lock-free atomics, fixed in number (no map grows with what a guest sends).
//! Two readers take them: a JSON dump on SIGUSR1 or periodically with `--stats FILE`, and
//! the Prometheus endpoint of `--metrics` (`crate::metrics`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::passthrough::PassthroughFs;

const SLOTS: usize = 64;

/// Errnos counted by number; any other (none the host kernel returns today) is counted
/// under 0, "other".
pub const ERRNO_SLOTS: usize = 134;

/// Upper bounds of the latency histogram's buckets, in seconds (the last bucket, +Inf,
/// is implied): from a cached GETATTR's tens of microseconds to a SETLKW's long wait.
pub const LATENCY_BOUNDS_S: [f64; 12] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 100e-3, 1.0, 10.0,
];
const BUCKETS: usize = LATENCY_BOUNDS_S.len() + 1;

#[derive(Default)]
struct OpStats {
    /// Malformed requests (answered with an errno, or dropped when they take no reply).
    malformed: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
    /// Requests per latency bucket (not cumulative): their sum is the opcode's count.
    buckets: [AtomicU64; BUCKETS],
}

/// One opcode's counters, as read at one moment.
pub struct OpSnapshot {
    pub count: u64,
    pub malformed: u64,
    pub total_s: f64,
    /// Per bucket of `LATENCY_BOUNDS_S`, then +Inf; not cumulative.
    pub buckets: [u64; BUCKETS],
}

pub struct Stats {
    ops: Vec<OpStats>,
    /// Error replies per opcode and errno: `SLOTS` rows of `ERRNO_SLOTS`.
    errnos: Box<[AtomicU64]>,
    started: Instant,
    /// Data bytes in successful READ replies and WRITE replies.
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// READs answered on a queue thread from the page cache, and those handed to the pool
    /// after the attempt would have blocked (see `passthrough::nowait`).
    pub reads_on_queue_thread: AtomicU64,
    pub reads_handed_off: AtomicU64,
    /// Of the queue-thread READs, those decoded by vfsd itself (`server::data`).
    pub reads_direct: AtomicU64,
    /// Requests a queue thread served itself, blocking, because nothing else was in flight
    /// on its queue (`device::FsDevice::process_queue`).
    pub served_alone: AtomicU64,
    /// Requests tried on a queue thread without waiting that would have waited for a host
    /// lease break there, handed to the pool (`passthrough::nowait`): OPENs and CREATEs,
    /// and under `--no-open` the READs, WRITEs, LSEEKs, truncating SETATTRs and
    /// COPY_FILE_RANGEs whose node fd had to be opened.
    pub opens_handed_off: AtomicU64,
    /// Requests a serving process that died held, answered by this one (`recovery`).
    pub requests_after_crash: AtomicU64,
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
            errnos: (0..SLOTS * ERRNO_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            started: Instant::now(),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            reads_on_queue_thread: AtomicU64::new(0),
            reads_handed_off: AtomicU64::new(0),
            reads_direct: AtomicU64::new(0),
            served_alone: AtomicU64::new(0),
            opens_handed_off: AtomicU64::new(0),
            requests_after_crash: AtomicU64::new(0),
            reads_served_alone: AtomicU64::new(0),
            served_inline: AtomicU64::new(0),
            no_reply_on_queue_thread: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            fds_exhausted: AtomicU64::new(0),
        }
    }
}

impl Stats {
    /// Counts one request: how long it took, whether it was malformed, and the errno it
    /// was answered with (0 for success or no reply).
    pub fn record(&self, opcode: u32, elapsed: Duration, malformed: bool, errno: i32) {
        let slot = slot(opcode);
        let s = &self.ops[slot];
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        s.total_ns.fetch_add(ns, Ordering::Relaxed);
        s.max_ns.fetch_max(ns, Ordering::Relaxed);
        let secs = ns as f64 / 1e9;
        let bucket = LATENCY_BOUNDS_S
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS - 1);
        s.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        if malformed {
            s.malformed.fetch_add(1, Ordering::Relaxed);
        }
        if errno != 0 {
            let e = usize::try_from(errno)
                .ok()
                .filter(|&e| e < ERRNO_SLOTS)
                .unwrap_or(0);
            self.errnos[slot * ERRNO_SLOTS + e].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An opcode's counters (None if it was never seen).
    pub fn op(&self, opcode: u32) -> Option<OpSnapshot> {
        let s = self.ops.get(opcode as usize)?;
        let buckets: [u64; BUCKETS] = std::array::from_fn(|i| s.buckets[i].load(Ordering::Relaxed));
        // From the buckets, so a histogram read while requests are counted adds up.
        let count = buckets.iter().sum();
        if count == 0 {
            return None;
        }
        Some(OpSnapshot {
            count,
            malformed: s.malformed.load(Ordering::Relaxed),
            total_s: s.total_ns.load(Ordering::Relaxed) as f64 / 1e9,
            buckets,
        })
    }

    /// The opcodes' numbers, for `op`.
    pub fn opcodes() -> std::ops::Range<u32> {
        0..SLOTS as u32
    }

    /// An opcode's error replies, per errno (0: any errno beyond the table).
    pub fn errnos(&self, opcode: u32) -> impl Iterator<Item = (i32, u64)> + '_ {
        let slot = slot(opcode);
        self.errnos[slot * ERRNO_SLOTS..(slot + 1) * ERRNO_SLOTS]
            .iter()
            .enumerate()
            .map(|(e, n)| (e as i32, n.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn count(&self, opcode: u32) -> u64 {
        self.op(slot(opcode) as u32).map_or(0, |s| s.count)
    }

    /// A JSON snapshot of every counter.
    pub fn snapshot(&self, fs: &PassthroughFs) -> Value {
        let mut ops = Map::new();
        for (i, s) in self.ops.iter().enumerate() {
            let Some(OpSnapshot {
                count,
                malformed,
                total_s,
                ..
            }) = self.op(i as u32)
            else {
                continue;
            };
            // Numbers FUSE doesn't define share the last slot.
            let name = match slot(i as u32) == i {
                true => opcode_name(i as u32).to_string(),
                false => "other".to_string(),
            };
            let errnos: Map<String, Value> = self
                .errnos(i as u32)
                .map(|(e, n)| (errno_label(e).into_owned(), json!(n)))
                .collect();
            ops.insert(
                name,
                json!({
                    "count": count,
                    "errors": malformed,
                    "errnos": errnos,
                    "avg_us": total_s * 1e6 / count as f64,
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
            "bytes_read": self.bytes_read.load(Ordering::Relaxed),
            "bytes_written": self.bytes_written.load(Ordering::Relaxed),
            "peak_writes_in_flight": fs.peak_writes_in_flight,
            "exclusive_violations": fs.exclusive_violations,
            "reads_on_queue_thread": self.reads_on_queue_thread.load(Ordering::Relaxed),
            "reads_handed_off": self.reads_handed_off.load(Ordering::Relaxed),
            "served_alone": self.served_alone.load(Ordering::Relaxed),
            "opens_handed_off": self.opens_handed_off.load(Ordering::Relaxed),
            "requests_after_crash": self.requests_after_crash.load(Ordering::Relaxed),
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
            "lock_stalled": fs.lock_stalled,
            "nowait_unsupported": fs.nowait_unsupported,
            "live_inodes": fs.live_inodes,
            "open_handles": fs.open_handles,
            "inodes": inodes,
        })
    }
}

/// An opcode's counter slot: its number for an opcode vfsd knows, the last slot for any
/// other number (a guest may send any), so there are never more series than opcodes.
fn slot(op: u32) -> usize {
    match crate::server::opcode::Opcode::of(op) {
        Some(_) if (op as usize) < SLOTS - 1 => op as usize,
        _ => SLOTS - 1,
    }
}

/// A slot's label: the opcode's name in lower case ("lookup"), "other" for the last.
pub fn opcode_label(op: u32) -> String {
    match crate::server::opcode::Opcode::of(op) {
        Some(o) if slot(op) == op as usize => o.name().to_ascii_lowercase(),
        _ => "other".into(),
    }
}

/// An errno's label: its symbolic name ("ENOENT"), its number for one without a name
/// here, and "other" for slot 0 (errnos beyond the table).
pub fn errno_label(e: i32) -> std::borrow::Cow<'static, str> {
    match (e, errno_name(e)) {
        (0, _) => "other".into(),
        (_, Some(n)) => n.into(),
        (_, None) => e.to_string().into(),
    }
}

fn errno_name(e: i32) -> Option<&'static str> {
    use libc::*;
    Some(match e {
        EPERM => "EPERM",
        ENOENT => "ENOENT",
        ESRCH => "ESRCH",
        EINTR => "EINTR",
        EIO => "EIO",
        ENXIO => "ENXIO",
        E2BIG => "E2BIG",
        EBADF => "EBADF",
        EAGAIN => "EAGAIN",
        ENOMEM => "ENOMEM",
        EACCES => "EACCES",
        EFAULT => "EFAULT",
        EBUSY => "EBUSY",
        EEXIST => "EEXIST",
        EXDEV => "EXDEV",
        ENODEV => "ENODEV",
        ENOTDIR => "ENOTDIR",
        EISDIR => "EISDIR",
        EINVAL => "EINVAL",
        ENFILE => "ENFILE",
        EMFILE => "EMFILE",
        ENOTTY => "ENOTTY",
        ETXTBSY => "ETXTBSY",
        EFBIG => "EFBIG",
        ENOSPC => "ENOSPC",
        ESPIPE => "ESPIPE",
        EROFS => "EROFS",
        EMLINK => "EMLINK",
        EPIPE => "EPIPE",
        ERANGE => "ERANGE",
        EDEADLK => "EDEADLK",
        ENAMETOOLONG => "ENAMETOOLONG",
        ENOLCK => "ENOLCK",
        ENOSYS => "ENOSYS",
        ENOTEMPTY => "ENOTEMPTY",
        ELOOP => "ELOOP",
        ENODATA => "ENODATA",
        EOVERFLOW => "EOVERFLOW",
        EBADMSG => "EBADMSG",
        EOPNOTSUPP => "EOPNOTSUPP",
        ESTALE => "ESTALE",
        EDQUOT => "EDQUOT",
        ECANCELED => "ECANCELED",
        EOWNERDEAD => "EOWNERDEAD",
        ENOTCONN => "ENOTCONN",
        ETIMEDOUT => "ETIMEDOUT",
        EUCLEAN => "EUCLEAN",
        ENOKEY => "ENOKEY",
        EKEYREJECTED => "EKEYREJECTED",
        EREMOTEIO => "EREMOTEIO",
        EHWPOISON => "EHWPOISON",
        _ => return None,
    })
}
