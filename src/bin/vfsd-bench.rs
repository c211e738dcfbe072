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
    #[arg(long)]
    socket: PathBuf,
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
    /// Microseconds to wait after each reply before the next request, as a guest does
    /// between its requests (under TCG, 250-700 us): the daemon then goes idle and wakes
    /// for every request, where back-to-back requests find it awake
    #[arg(long, default_value_t = 0)]
    gap_us: u64,
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
    if a.workload == Workload::LookupGetattr {
        for i in 0..1000 {
            let p = dir.join(format!("m{i}"));
            if !p.exists() {
                std::fs::write(p, b"")?;
            }
        }
    }

    let buf = a.bs.max(4096) + 8192;
    let cfg = FrontendConfig {
        request_queues: a.queues,
        slots: a.depth,
        descs_per_slot: 4,
        buf_size: buf,
        event_idx: true,
    };
    let fe = Frontend::connect(&a.socket, cfg)?;
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
    if a.workload == Workload::LookupGetattr {
        for i in 0..1000 {
            names.push(format!("m{i}"));
        }
    }

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
    std::thread::sleep(Duration::from_millis(500));
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
    if lats.is_empty() {
        return Err("no request completed".into());
    }
    lats.sort_unstable();
    let pct = |p: f64| lats[((lats.len() as f64 * p) as usize).min(lats.len() - 1)] as f64 / 1000.0;
    let ops = lats.len() as f64 / elapsed;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_us = match (cpu0, cpu1) {
        (Some(x), Some(y)) => serde_json::json!((y - x) as f64 / hz * 1e6 / lats.len() as f64),
        _ => serde_json::Value::Null,
    };
    let switches_per_op = match (sw0, sw1) {
        (Some(x), Some(y)) => serde_json::json!(y.saturating_sub(x) as f64 / lats.len() as f64),
        _ => serde_json::Value::Null,
    };
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

fn worker(c: &FuseClient, w: Worker) -> WorkerResult {
    let Worker {
        queue,
        wl,
        bs,
        file_size,
        dir,
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
    // Per in-flight slot: which job it belongs to, when it started, and its step.
    struct Inflight {
        job: usize,
        start: Instant,
        step: u8,
        nodeid: u64,
        fh: u64,
        unique: u64,
    }
    let mut inflight: HashMap<usize, Inflight> = HashMap::new();
    let mut lats = Vec::with_capacity(1 << 20);
    let mut bytes = 0u64;
    let mut counter = 0u64;

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
            Workload::LookupGetattr => {
                if step == 0 {
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
            Workload::CreateUnlink | Workload::Churn => {
                let name = format!("c{queue}-{job}\0");
                let step = match (wl, step) {
                    // Churn: CREATE, GETATTR, RELEASE, UNLINK, FORGET.
                    (Workload::Churn, 1) => 10,
                    (Workload::Churn | Workload::CreateUnlink, 4) => 11,
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
    let steps: u8 = match wl {
        Workload::LookupGetattr => 2,
        Workload::CreateUnlink | Workload::Churn => 5,
        Workload::Untar => UNTAR_STEPS.len() as u8,
        _ => 1,
    };
    // FORGET has no reply: the device returns the buffers empty.
    let no_reply = |step: u8| match wl {
        Workload::Churn | Workload::CreateUnlink => step == 4,
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

    barrier.wait();
    let submit = |job: usize,
                  step: u8,
                  nodeid: u64,
                  fh: u64,
                  start: Instant,
                  inflight: &mut HashMap<usize, Inflight>,
                  req: (u64, Vec<u8>, usize)|
     -> Result<(), BenchError> {
        let t = c.submit_bytes(queue, &req.1, req.2, req.0)?;
        inflight.insert(
            t.slot,
            Inflight {
                job,
                start,
                step,
                nodeid,
                fh,
                unique: req.0,
            },
        );
        Ok(())
    };
    // Jobs waiting for the guest inode lock (only with guest locking on a shared file).
    let mut waiting: std::collections::VecDeque<(usize, Instant)> =
        (0..depth).map(|j| (j, Instant::now())).collect();
    let try_lock = || {
        inode_lock.as_ref().is_none_or(|l| {
            l.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
    };
    while !stop.load(Ordering::Relaxed) {
        while let Some(&(job, start)) = waiting.front() {
            if !try_lock() {
                break;
            }
            waiting.pop_front();
            let r = build(job, 0, 0, 0, &mut jobs);
            submit(job, 0, 0, 0, start, &mut inflight, r)?;
        }
        let done = c.poll_done(queue)?;
        if done.is_empty() {
            if inode_lock.is_some() {
                std::thread::yield_now();
            } else {
                c.fe.wait_call(queue, Duration::from_millis(5));
            }
            continue;
        }
        for (slot, raw) in done {
            let f = inflight
                .remove(&slot)
                .ok_or("completion for an unknown slot")?;
            let reply = if no_reply(f.step) {
                if !raw.is_empty() {
                    return Err("FORGET got a reply".into());
                }
                Reply {
                    unique: f.unique,
                    error: 0,
                    data: Vec::new(),
                }
            } else {
                parse_reply(&raw, f.unique)?
            };
            if reply.error != 0 && !expected(f.step, -reply.error) {
                return Err(BenchError::Unexpected(format!(
                    "{wl:?} step {}: errno {}",
                    f.step, -reply.error
                )));
            }
            let (mut nodeid, mut fh) = (f.nodeid, f.fh);
            if wl == Workload::Untar && f.step == 1 {
                // EntryOut (128 bytes), then OpenOut.
                let field = |at: usize| reply.data.get(at..at + 8).map(|b| b.try_into().unwrap());
                let (Some(n), Some(h)) = (field(0), field(128)) else {
                    return Err(BenchError::Unexpected(format!(
                        "CREATE reply of {} bytes",
                        reply.data.len()
                    )));
                };
                (nodeid, fh) = (u64::from_ne_bytes(n), u64::from_ne_bytes(h));
            } else if f.step == 0
                && matches!(
                    wl,
                    Workload::LookupGetattr | Workload::CreateUnlink | Workload::Churn
                )
            {
                nodeid = u64::from_ne_bytes(reply.data[..8].try_into().unwrap());
                if wl != Workload::LookupGetattr {
                    // OpenOut follows EntryOut (128 bytes).
                    fh = u64::from_ne_bytes(reply.data[128..136].try_into().unwrap());
                }
            }
            if let Some(l) = &inode_lock {
                l.store(false, Ordering::Release);
            }
            let step = f.step + 1;
            let (start, step) = if step == steps {
                if measuring.load(Ordering::Relaxed) {
                    lats.push(f.start.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    if matches!(
                        wl,
                        Workload::Seqread
                            | Workload::Seqwrite
                            | Workload::RandreadShared
                            | Workload::RandreadPerjob
                            | Workload::RandwriteShared
                            | Workload::RandwritePerjob
                    ) {
                        bytes += bs as u64;
                    }
                }
                counter += 1;
                if let Some(limit) = ops_limit {
                    if done_ops.fetch_add(1, Ordering::Relaxed) + 1 >= limit {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                (Instant::now(), 0)
            } else {
                (f.start, step)
            };
            if inode_lock.is_some() {
                waiting.push_back((f.job, start));
                continue;
            }
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
            let r = build(f.job, step, nodeid, fh, &mut jobs);
            submit(f.job, step, nodeid, fh, start, &mut inflight, r)?;
        }
    }
    // Drain what is still in flight so the daemon is idle when we disconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !inflight.is_empty() && Instant::now() < deadline {
        for (slot, _) in c.poll_done(queue)? {
            inflight.remove(&slot);
        }
        c.fe.wait_call(queue, Duration::from_millis(5));
    }
    let _ = counter;
    Ok((lats, bytes))
}
