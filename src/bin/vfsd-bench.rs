//! vfsd-bench: a load generator that plays the guest's virtio-fs driver against any
//! vhost-user-fs socket (vfsd or virtiofsd), keeping requests in flight on every queue.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use fuse_backend_rs::abi::fuse_abi::SetattrIn;
use vfsd::frontend::fuse::*;
use vfsd::frontend::{Frontend, FrontendConfig};
use vm_memory::ByteValued;

#[path = "vfsd-bench/host.rs"]
mod host;
#[path = "vfsd-bench/pacer.rs"]
mod pacer;
use pacer::Pacer;

/// Bytes of each reply the bench reads back: headers and metadata replies whole, a READ's
/// header only (its data is counted from the used length, never copied).
const HEAD: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Random writes of --bs to one file shared by all jobs
    RandwriteShared,
    /// Random writes of --bs, a file per job
    RandwritePerjob,
    /// Random reads of --bs from one shared file
    RandreadShared,
    /// Random reads of --bs, a file per job
    RandreadPerjob,
    /// Sequential reads of --bs
    Seqread,
    /// Sequential writes of --bs
    Seqwrite,
    /// LOOKUP then GETATTR on a warm tree of files
    LookupGetattr,
    /// LOOKUP of a random one of a directory's 1,000 files
    Lookup,
    /// GETATTR of one file
    Getattr,
    /// CREATE of a new file, timed; then its RELEASE, UNLINK and FORGET, not timed
    Create,
    /// CREATE + WRITE(4k) + RELEASE + UNLINK + FORGET of small files (the guest forgets
    /// an unlinked inode at once)
    CreateUnlink,
    /// CREATE + GETATTR + RELEASE + UNLINK + FORGET: the guest's whole life cycle of a
    /// file, for memory and fd churn checks
    Churn,
    /// What untar asks per file: LOOKUP (a miss), CREATE, GETXATTR of
    /// security.capability, WRITE(4k), FLUSH, RELEASE, SETATTR (mode), SETATTR
    /// (times), then UNLINK + FORGET to keep the directory small. Run the daemons with
    /// --xattr for the GETXATTR to reach the host.
    Untar,
}

/// The opcode of `Workload::Untar`'s step, in order.
const UNTAR_STEPS: [u32; 10] = [
    FUSE_LOOKUP,
    FUSE_CREATE,
    FUSE_GETXATTR,
    FUSE_WRITE,
    FUSE_FLUSH,
    FUSE_RELEASE,
    FUSE_SETATTR,
    FUSE_SETATTR,
    FUSE_UNLINK,
    FUSE_FORGET,
];

#[derive(Parser, Debug)]
#[command(
    name = "vfsd-bench",
    about = "vhost-user-fs load generator (plays the guest driver)"
)]
struct Args {
    /// vhost-user socket of the daemon under test
    #[arg(long, required_unless_present = "host")]
    socket: Option<PathBuf>,
    /// Host path of the daemon's shared directory (to prepare files)
    #[arg(long)]
    shared_dir: PathBuf,
    /// Daemon pid, to report its CPU time per request
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Request queues to drive (one thread each)
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Requests kept in flight per queue
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Block size in bytes
    #[arg(long, default_value_t = 4096)]
    bs: usize,
    /// Size of each data file in MiB
    #[arg(long, default_value_t = 256)]
    file_mib: u64,
    /// Seconds to run (after a short warm-up)
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Stop after this many completed operations (all queues together) instead of --seconds
    #[arg(long)]
    ops: Option<u64>,
    /// Act like the guest kernel: without FOPEN_PARALLEL_DIRECT_WRITES on the open, keep at
    /// most one WRITE per inode in flight (the guest holds the inode lock across it)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    guest_locking: bool,
    /// Open the data files with O_DIRECT and put the data on page boundaries, as the guest
    /// driver does. The daemon must honour O_DIRECT (vfsd and virtiofsd: --allow-direct-io),
    /// so the host's device, not its page cache, sets the pace
    #[arg(long)]
    direct: bool,
    /// Microseconds each job waits between an operation's end and its next operation, as
    /// a guest process does between its syscalls (under TCG, 250-700 us): the daemon then
    /// goes idle and wakes for each, where back-to-back requests find it awake. Once per
    /// operation, before its first request, not between the requests of a multi-request
    /// workload; never counted in the latency, which runs from the operation's first
    /// request's submission (or, with --guest-locking, from when it starts waiting for the
    /// inode lock) to its last timed reply
    #[arg(long, default_value_t = 0)]
    gap_us: u64,
    /// Milliseconds of warm-up before the measured --seconds
    #[arg(long, default_value_t = 500)]
    warmup_ms: u64,
    /// Make the workload's syscalls on the host itself, no daemon: `fstatat` for lookup
    /// and getattr, `pread`/`pwrite` for the random reads and writes, `openat(O_CREAT)`
    /// for create (then `close` and `unlink`, not timed), on the same files under
    /// --shared-dir, paced alike; one job (--depth 1, --queues 1). Reports the thread's
    /// CPU time per syscall as the CPU per op
    #[arg(long)]
    host: bool,
}

struct Job {
    nodeid: u64,
    fh: u64,
    pos: u64,
}

/// Why a run failed.
#[derive(Debug)]
enum BenchError {
    /// Preparing the files or connecting to the socket.
    Io(std::io::Error),
    /// A request failed, or its reply didn't decode.
    Fuse(FuseError),
    /// The named setup request failed.
    Setup(&'static str, FuseError),
    /// The daemon did something the workload doesn't expect.
    Unexpected(String),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Io(e) => e.fmt(f),
            BenchError::Fuse(e) => e.fmt(f),
            BenchError::Setup(what, e) => write!(f, "{what}: {e}"),
            BenchError::Unexpected(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Io(e) => Some(e),
            BenchError::Fuse(e) | BenchError::Setup(_, e) => Some(e),
            BenchError::Unexpected(_) => None,
        }
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError::Io(e)
    }
}

impl From<FuseError> for BenchError {
    fn from(e: FuseError) -> Self {
        BenchError::Fuse(e)
    }
}

impl From<&str> for BenchError {
    fn from(why: &str) -> Self {
        BenchError::Unexpected(why.into())
    }
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("vfsd-bench: {e}");
        std::process::exit(1);
    }
}

/// `own(pid)` summed over `pid` and its descendants (a sandboxed vfsd serves from a child
/// process); None if `pid` itself can't be read.
fn over_tree(pid: u32, own: fn(u32) -> Option<u64>) -> Option<u64> {
    let mine = own(pid)?;
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    Some(
        mine + children
            .split_whitespace()
            .filter_map(|c| over_tree(c.parse().ok()?, own))
            .sum::<u64>(),
    )
}

/// CPU time (user + system ticks) of `pid` and its descendants.
fn cpu_ticks(pid: u32) -> Option<u64> {
    over_tree(pid, |pid| {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &s[s.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    })
}

/// Context switches (voluntary and not) of every thread of `pid` and its descendants: the
/// wake-ups behind each request, which on a virtual machine's idle CPUs cost more than
/// the request's own work.
fn switches(pid: u32) -> Option<u64> {
    over_tree(pid, |pid| {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let mut n = 0u64;
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            n += status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        Some(n)
    })
}

fn prepare_file(path: &std::path::Path, size: u64) -> std::io::Result<()> {
    use std::io::Write;
    if std::fs::metadata(path)
        .map(|m| m.len() == size)
        .unwrap_or(false)
    {
        return Ok(());
    }
    // Real data, not a sparse file, so reads touch the page cache like fio's do.
    let mut f = std::fs::File::create(path)?;
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    for _ in 0..size >> 20 {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

fn run(a: &Args) -> Result<(), BenchError> {
    let shared = matches!(
        a.workload,
        Workload::RandwriteShared | Workload::RandreadShared
    );
    let data = matches!(
        a.workload,
        Workload::RandwriteShared
            | Workload::RandwritePerjob
            | Workload::RandreadShared
            | Workload::RandreadPerjob
            | Workload::Seqread
            | Workload::Seqwrite
    );
    let jobs = a.queues * a.depth;
    let file_size = a.file_mib << 20;
    let dir = a.shared_dir.join("vfsd-bench");
    std::fs::create_dir_all(&dir)?;
    if data {
        let files = if shared { 1 } else { jobs };
        for j in 0..files {
            prepare_file(&dir.join(format!("data{j}")), file_size)?;
        }
    }
    let names_needed = matches!(
        a.workload,
        Workload::LookupGetattr | Workload::Lookup | Workload::Getattr
    );
    if names_needed {
        for i in 0..1000 {
            let p = dir.join(format!("m{i}"));
            if !p.exists() {
                std::fs::write(p, b"")?;
            }
        }
    }
    // The files an earlier run's last operations left behind: a CREATE of an existing
    // name is no create (vfsd answers it ESTALE).
    for q in 1..=a.queues {
        for j in 0..a.depth {
            for name in [format!("c{q}-{j}"), format!("u{q}-{j}"), "h0".into()] {
                let _ = std::fs::remove_file(dir.join(name));
            }
        }
    }
    if a.host {
        return host::run(a, &dir);
    }

    let buf = a.bs.max(4096) + 8192;
    let cfg = FrontendConfig {
        request_queues: a.queues,
        slots: a.depth,
        descs_per_slot: 4,
        buf_size: buf,
        event_idx: true,
    };
    let socket = a.socket.as_deref().ok_or("--socket is needed")?;
    let fe = Frontend::connect(socket, cfg)?;
    let mut client = FuseClient::new(fe);
    if a.direct {
        // A WRITE's data after InHeader and WriteIn, a READ's after OutHeader.
        use fuse_backend_rs::abi::fuse_abi::{InHeader, OutHeader, WriteIn};
        use std::mem::size_of;
        client.layout.page_aligned_payload = Some((
            size_of::<InHeader>() + size_of::<WriteIn>(),
            size_of::<OutHeader>(),
        ));
    }
    let c = Arc::new(client);
    c.init().map_err(|e| BenchError::Setup("INIT", e))?;
    let d = c
        .lookup(1, "vfsd-bench")
        .map_err(|e| BenchError::Setup("LOOKUP", e))?
        .nodeid;
    let direct_flags = (libc::O_RDWR | if a.direct { libc::O_DIRECT } else { 0 }) as u32;
    let mut job_files = Vec::new();
    let mut serialise_writes = false;
    if data {
        let shared_file = if shared {
            let e = c.lookup(d, "data0")?;
            let o = c.open(e.nodeid, direct_flags)?;
            serialise_writes = a.guest_locking && o.open_flags & FOPEN_PARALLEL_DIRECT_WRITES == 0;
            Some((e.nodeid, o.fh))
        } else {
            None
        };
        for j in 0..jobs {
            let (nodeid, fh) = match shared_file {
                Some(f) => f,
                None => {
                    let e = c.lookup(d, &format!("data{j}"))?;
                    let o = c.open(e.nodeid, direct_flags)?;
                    (e.nodeid, o.fh)
                }
            };
            let start = if shared {
                0
            } else {
                ((j as u64 * 7919) << 20) % file_size
            };
            job_files.push(Job {
                nodeid,
                fh,
                pos: start,
            });
        }
    }
    let mut names = Vec::new();
    if names_needed {
        for i in 0..1000 {
            names.push(format!("m{i}"));
        }
    }

    // GETATTR's file.
    let file = if a.workload == Workload::Getattr {
        c.lookup(d, "m0")?.nodeid
    } else {
        0
    };
    let writes = matches!(a.workload, Workload::RandwriteShared);
    // The guest's exclusive inode lock around a non-parallel direct write.
    let inode_lock = Arc::new(AtomicBool::new(false));
    let serialise = writes && serialise_writes;
    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(a.queues + 1));
    let mut handles = Vec::new();
    let mut jobs_iter = job_files.into_iter();
    for q in 0..a.queues {
        let my_jobs: Vec<Job> = jobs_iter
            .by_ref()
            .take(if data { a.depth } else { 0 })
            .collect();
        let (c, stop, measuring, barrier) =
            (c.clone(), stop.clone(), measuring.clone(), barrier.clone());
        let (wl, bs, names) = (a.workload, a.bs, names.clone());
        let lock = serialise.then(|| inode_lock.clone());
        let (ops_limit, done_ops) = (a.ops, done_ops.clone());
        let gap = Duration::from_micros(a.gap_us);
        handles.push(std::thread::spawn(move || {
            let w = Worker {
                queue: q + 1,
                wl,
                bs,
                file_size,
                dir: d,
                file,
                jobs: my_jobs,
                names,
                stop,
                measuring,
                barrier,
                inode_lock: lock,
                ops_limit,
                done_ops,
                gap,
            };
            worker(&c, w)
        }));
    }
    barrier.wait();
    std::thread::sleep(Duration::from_millis(a.warmup_ms));
    let cpu0 = a.pid.and_then(cpu_ticks);
    let sw0 = a.pid.and_then(switches);
    let t0 = Instant::now();
    measuring.store(true, Ordering::SeqCst);
    if a.ops.is_some() {
        // Run until the workers reach --ops, reporting progress.
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= Duration::from_secs(5) {
                eprintln!(
                    "vfsd-bench: {} operations done",
                    done_ops.load(Ordering::Relaxed)
                );
                last = Instant::now();
            }
        }
    } else {
        std::thread::sleep(Duration::from_secs_f64(a.seconds));
    }
    measuring.store(false, Ordering::SeqCst);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = a.pid.and_then(cpu_ticks);
    let sw1 = a.pid.and_then(switches);
    stop.store(true, Ordering::SeqCst);
    let mut lats: Vec<u32> = Vec::new();
    let mut bytes = 0u64;
    for h in handles {
        let (l, b) = h.join().map_err(|_| "worker panicked")??;
        lats.extend(l);
        bytes += b;
    }
    let cpu_us = match (cpu0, cpu1) {
        // SAFETY: sysconf has no preconditions.
        (Some(x), Some(y)) => {
            Some((y - x) as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64 * 1e6)
        }
        _ => None,
    };
    let switches = match (sw0, sw1) {
        (Some(x), Some(y)) => Some(y.saturating_sub(x)),
        _ => None,
    };
    report(
        a,
        lats,
        Measured {
            elapsed,
            bytes,
            cpu_us,
            switches,
            serialised: serialise,
        },
    )
}

/// A run's totals beside its latencies.
struct Measured {
    elapsed: f64,
    bytes: u64,
    /// CPU µs over the measured time (of the daemon, or the host helper's syscalls).
    cpu_us: Option<f64>,
    /// The daemon's context switches over the measured time.
    switches: Option<u64>,
    serialised: bool,
}

/// Prints the run's figures as one JSON line.
fn report(a: &Args, mut lats: Vec<u32>, m: Measured) -> Result<(), BenchError> {
    let Measured {
        elapsed,
        bytes,
        cpu_us,
        switches,
        serialised: serialise,
    } = m;
    if lats.is_empty() {
        return Err("no request completed".into());
    }
    lats.sort_unstable();
    let pct = |p: f64| lats[((lats.len() as f64 * p) as usize).min(lats.len() - 1)] as f64 / 1000.0;
    let ops = lats.len() as f64 / elapsed;
    let n = lats.len() as f64;
    let cpu_us = cpu_us.map_or(serde_json::Value::Null, |c| serde_json::json!(c / n));
    let switches_per_op =
        switches.map_or(serde_json::Value::Null, |s| serde_json::json!(s as f64 / n));
    let out = serde_json::json!({
        "workload": format!("{:?}", a.workload),
        "queues": a.queues,
        "depth": a.depth,
        "bs": a.bs,
        "ops_per_s": ops,
        "mib_per_s": bytes as f64 / elapsed / (1u64 << 20) as f64,
        "lat_us_p50": pct(0.50),
        "lat_us_p99": pct(0.99),
        "lat_us_p999": pct(0.999),
        "daemon_cpu_us_per_op": cpu_us,
        "daemon_switches_per_op": switches_per_op,
        "guest_serialised_writes": serialise,
        "gap_us": a.gap_us,
        "host": a.host,
    });
    println!("{out}");
    Ok(())
}

type WorkerResult = Result<(Vec<u32>, u64), BenchError>;

/// One queue's share of the run, for its worker thread.
struct Worker {
    queue: usize,
    wl: Workload,
    bs: usize,
    file_size: u64,
    dir: u64,
    /// The file GETATTR asks about.
    file: u64,
    jobs: Vec<Job>,
    names: Vec<String>,
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
    barrier: Arc<Barrier>,
    inode_lock: Option<Arc<AtomicBool>>,
    ops_limit: Option<u64>,
    done_ops: Arc<std::sync::atomic::AtomicU64>,
    gap: Duration,
}

/// Requests per operation, and how many of the first are timed (the rest are clean-up).
fn steps_of(wl: Workload) -> (u8, u8) {
    match wl {
        Workload::LookupGetattr => (2, 2),
        Workload::CreateUnlink | Workload::Churn => (5, 5),
        Workload::Create => (4, 1),
        Workload::Untar => (UNTAR_STEPS.len() as u8, UNTAR_STEPS.len() as u8),
        _ => (1, 1),
    }
}

/// A timer slack of 1 ns for the calling thread: the gap between operations is then the
/// gap asked for, not 50 µs more (the default slack), as a guest's vCPU would have it.
fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes a value and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

fn worker(c: &FuseClient, w: Worker) -> WorkerResult {
    let Worker {
        queue,
        wl,
        bs,
        file_size,
        dir,
        file,
        mut jobs,
        names,
        stop,
        measuring,
        barrier,
        inode_lock,
        ops_limit,
        done_ops,
        gap,
    } = w;
    precise_timers();
    let depth = c.fe.cfg.slots;
    let payload = vec![0x5au8; bs];
    let mut rng = 0x2545f4914f6cdd1du64 ^ queue as u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let blocks = (file_size / bs as u64).max(1);
    // Per in-flight slot: its job, step and request.
    struct Inflight {
        job: usize,
        step: u8,
        unique: u64,
    }
    // Per job: the node and handle its operation's later steps work on.
    let mut handles = vec![(0u64, 0u64); depth];
    let mut inflight: HashMap<usize, Inflight> = HashMap::new();
    let mut lats = Vec::with_capacity(1 << 20);
    let mut bytes = 0u64;

    // Builds the next request for `job` (step for multi-request workloads).
    let mut build = |job: usize,
                     step: u8,
                     nodeid: u64,
                     fh: u64,
                     jobs: &mut Vec<Job>|
     -> (u64, Vec<u8>, usize) {
        match wl {
            Workload::RandwriteShared | Workload::RandwritePerjob => {
                let j = &jobs[job];
                let (u, r) = c.write_req(j.nodeid, j.fh, next(blocks) * bs as u64, &payload);
                (u, r, 64)
            }
            Workload::RandreadShared | Workload::RandreadPerjob => {
                let j = &jobs[job];
                let (u, r) = c.read_req(j.nodeid, j.fh, next(blocks) * bs as u64, bs as u32);
                (u, r, 16 + bs)
            }
            Workload::Seqread | Workload::Seqwrite => {
                let j = &mut jobs[job];
                let off = j.pos;
                j.pos = (j.pos + bs as u64) % (blocks * bs as u64);
                let (u, r) = if wl == Workload::Seqread {
                    c.read_req(j.nodeid, j.fh, off, bs as u32)
                } else {
                    c.write_req(j.nodeid, j.fh, off, &payload)
                };
                (u, r, 16 + bs)
            }
            Workload::LookupGetattr | Workload::Lookup | Workload::Getattr => {
                if wl == Workload::Getattr {
                    let (u, r) = c.build(FUSE_GETATTR, file, &[&[0u8; 16]]);
                    (u, r, 256)
                } else if step == 0 {
                    let name = &names[next(names.len() as u64) as usize];
                    let mut n = name.as_bytes().to_vec();
                    n.push(0);
                    let (u, r) = c.build(FUSE_LOOKUP, dir, &[&n]);
                    (u, r, 256)
                } else {
                    let (u, r) = c.build(FUSE_GETATTR, nodeid, &[&[0u8; 16]]);
                    (u, r, 256)
                }
            }
            Workload::Untar => {
                let name = format!("u{queue}-{job}\0");
                let op = UNTAR_STEPS[step as usize];
                let le =
                    |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
                let (u, r) = match step {
                    0 | 8 => c.build(op, dir, &[name.as_bytes()]),
                    1 => {
                        let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL) as u32;
                        let ci: Vec<u8> = [flags, 0o600, 0o022, 0]
                            .iter()
                            .flat_map(|x| x.to_ne_bytes())
                            .collect();
                        c.build(op, dir, &[&ci, name.as_bytes()])
                    }
                    2 => c.build(op, nodeid, &[&[0u8; 8], b"security.capability\0"]),
                    3 => c.write_req(nodeid, fh, 0, &payload[..4096.min(payload.len())]),
                    // FlushIn and ReleaseIn: fh, then zeros.
                    4 | 5 => c.build(op, nodeid, &[&le(&[fh, 0, 0])]),
                    6 | 7 => {
                        let mut s = SetattrIn::default();
                        if step == 6 {
                            s.valid = 1; // FATTR_MODE
                            s.mode = libc::S_IFREG | 0o644;
                        } else {
                            s.valid = (1 << 4) | (1 << 5); // FATTR_ATIME | FATTR_MTIME
                            s.atime = 1_000_000_000;
                            s.mtime = 1_000_000_000;
                        }
                        c.build(op, nodeid, &[s.as_slice()])
                    }
                    _ => c.build(op, nodeid, &[&1u64.to_ne_bytes()]),
                };
                (u, r, 256)
            }
            Workload::CreateUnlink | Workload::Churn | Workload::Create => {
                let name = format!("c{queue}-{job}\0");
                let step = match (wl, step) {
                    // Churn: CREATE, GETATTR, RELEASE, UNLINK, FORGET.
                    (Workload::Churn, 1) => 10,
                    (Workload::Churn | Workload::CreateUnlink, 4) => 11,
                    // Create: CREATE (timed), then RELEASE, UNLINK, FORGET (not timed).
                    (Workload::Create, 1) => 2,
                    (Workload::Create, 2) => 3,
                    (Workload::Create, 3) => 11,
                    (_, s) => s,
                };
                match step {
                    10 => {
                        let (u, r) = c.build(FUSE_GETATTR, nodeid, &[&[0u8; 16]]);
                        (u, r, 256)
                    }
                    11 => {
                        let (u, r) = c.build(FUSE_FORGET, nodeid, &[&1u64.to_ne_bytes()]);
                        (u, r, 64)
                    }
                    0 => {
                        let ci = [(libc::O_RDWR | libc::O_CREAT) as u32, 0o644, 0, 0];
                        let ci: Vec<u8> = ci.iter().flat_map(|x| x.to_ne_bytes()).collect();
                        let (u, r) = c.build(FUSE_CREATE, dir, &[&ci, name.as_bytes()]);
                        (u, r, 256)
                    }
                    1 => {
                        let (u, r) =
                            c.write_req(nodeid, fh, 0, &payload[..4096.min(payload.len())]);
                        (u, r, 64)
                    }
                    2 => {
                        let ri: Vec<u8> = [fh.to_ne_bytes(), [0; 8], [0; 8]].concat();
                        let (u, r) = c.build(FUSE_RELEASE, nodeid, &[&ri]);
                        (u, r, 64)
                    }
                    _ => {
                        let (u, r) = c.build(FUSE_UNLINK, dir, &[name.as_bytes()]);
                        (u, r, 64)
                    }
                }
            }
        }
    };
    let (steps, timed) = steps_of(wl);
    // FORGET has no reply: the device returns the buffers empty.
    let no_reply = |step: u8| match wl {
        Workload::Churn | Workload::CreateUnlink => step == 4,
        Workload::Create => step == 3,
        Workload::Untar => UNTAR_STEPS[step as usize] == FUSE_FORGET,
        _ => false,
    };
    // The errnos a step expects: untar's LOOKUP misses, and a file has no capability.
    let expected = |step: u8, errno: i32| {
        wl == Workload::Untar
            && match UNTAR_STEPS[step as usize] {
                FUSE_LOOKUP => errno == libc::ENOENT,
                FUSE_GETXATTR => [libc::ENODATA, libc::ENOSYS, libc::EOPNOTSUPP].contains(&errno),
                _ => false,
            }
    };
    // Which steps' replies carry the node (and after 128 bytes of EntryOut, the handle)
    // that the operation's later steps use.
    let gives_node = |step: u8| {
        step == 0
            && matches!(
                wl,
                Workload::LookupGetattr
                    | Workload::CreateUnlink
                    | Workload::Churn
                    | Workload::Create
            )
            || wl == Workload::Untar && step == 1
    };
    let gives_handle = |step: u8| gives_node(step) && wl != Workload::LookupGetattr;
    // The bytes a reply says were moved: a READ's data (counted from the used length,
    // never copied), a WRITE's WriteOut size.
    let moved = |head: &[u8], len: usize| -> u64 {
        match wl {
            Workload::Seqread | Workload::RandreadShared | Workload::RandreadPerjob => {
                len.saturating_sub(16) as u64
            }
            Workload::Seqwrite | Workload::RandwriteShared | Workload::RandwritePerjob => head
                .get(16..20)
                .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap()) as u64),
            _ => 0,
        }
    };
    let try_lock = || {
        inode_lock.as_ref().is_none_or(|l| {
            l.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
    };

    barrier.wait();
    let mut pacer = Pacer::new(
        depth,
        steps,
        timed,
        gap,
        inode_lock.is_some(),
        Instant::now(),
    );
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while let Some((job, step)) = pacer.next(now, try_lock) {
            let (nodeid, fh) = handles[job];
            let (unique, req, resp_len) = build(job, step, nodeid, fh, &mut jobs);
            let t = c.submit_bytes(queue, &req, resp_len, unique)?;
            inflight.insert(t.slot, Inflight { job, step, unique });
        }
        let done = c.poll_heads(queue, HEAD)?;
        if done.is_empty() {
            // Until a reply comes or a gap ends.
            let wait = pacer.wake_at().map_or(Duration::from_millis(5), |t| {
                t.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(5))
            });
            if !wait.is_zero() {
                c.fe.wait_call(queue, wait);
            }
            continue;
        }
        let now = Instant::now();
        for (slot, len, head) in done {
            let f = inflight
                .remove(&slot)
                .ok_or("completion for an unknown slot")?;
            let error = if no_reply(f.step) {
                if len != 0 {
                    return Err("FORGET got a reply".into());
                }
                0
            } else {
                check_head(&head, len, f.unique)?
            };
            if error != 0 && !expected(f.step, -error) {
                return Err(BenchError::Unexpected(format!(
                    "{wl:?} step {}: errno {}",
                    f.step, -error
                )));
            }
            if error == 0 && gives_node(f.step) {
                // EntryOut (128 bytes), then OpenOut, after the 16-byte OutHeader.
                let field = |at: usize| {
                    head.get(16 + at..24 + at)
                        .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
                };
                let short = || {
                    BenchError::Unexpected(format!("{wl:?} step {}: reply of {len} bytes", f.step))
                };
                let nodeid = field(0).ok_or_else(short)?;
                let fh = if gives_handle(f.step) {
                    field(128).ok_or_else(short)?
                } else {
                    0
                };
                handles[f.job] = (nodeid, fh);
            }
            if let Some(l) = &inode_lock {
                l.store(false, Ordering::Release);
            }
            if let Some(lat) = pacer.completed(f.job, now) {
                if measuring.load(Ordering::Relaxed) {
                    lats.push(lat.as_nanos().min(u32::MAX as u128) as u32);
                    bytes += moved(&head, len);
                }
                if let Some(limit) = ops_limit {
                    if done_ops.fetch_add(1, Ordering::Relaxed) + 1 >= limit {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }
    // Drain what is still in flight so the daemon is idle when we disconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !inflight.is_empty() && Instant::now() < deadline {
        for (slot, ..) in c.poll_heads(queue, 0)? {
            inflight.remove(&slot);
        }
        c.fe.wait_call(queue, Duration::from_millis(5));
    }
    if !inflight.is_empty() {
        return Err(BenchError::Unexpected(format!(
            "queue {queue}: {} requests got no reply within 10 s of the run's end",
            inflight.len()
        )));
    }
    Ok((lats, bytes))
}
