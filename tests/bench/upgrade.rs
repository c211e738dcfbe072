//! The pause a frontend sees while a new serving process takes its guest over
//! (docs/upgrade.md), for the two ways that happens: an upgrade in place (the binary
//! replaced, SIGUSR2 to the supervisor) and a crash (the serving process, the supervisor's
//! deepest child, killed with SIGKILL). vfsd started from a copy of its binary knows N
//! nodes (a LOOKUP of each of N host files) and holds open files; a thread sends GETATTRs
//! back to back through the test frontend's real socket and virtqueues meanwhile; the
//! pause is the largest gap between two answers. Ten rounds per node count and kind, each
//! kind on a daemon of its own: ten kills are as many as the crash-loop bound lets one
//! daemon survive within 60 s (more rounds wait for its window). After each round the
//! vhost-user connection must still answer (a round that lost it ends its daemon's rounds),
//! a READ on a handle opened before the first round must return the file's bytes, and
//! every GETATTR, the probing ones and one of each known node after the round, must find
//! its node; the rounds where each held are saved with the pauses.
//!
//! ```text
//! cargo bench --bench upgrade                     # both kinds, 1,000 and 100,000 nodes
//! cargo bench --bench upgrade -- --only crash     # the crash rounds alone
//! cargo bench --bench upgrade -- --only upgrade --nodes 1000 --rounds 3 --out /tmp/b
//! ```
//!
//! Needs root (the lock handover's runtime directory, /run/vfsd). Prints a table per kind
//! and writes OUT/upgrade/results.jsonl and OUT/crash/results.jsonl (default OUT:
//! docs/benchmarks) for the kinds it ran, then rewrites docs/benchmarks.md from the
//! repository's results.

#[path = "../guest/fixture/mod.rs"]
#[allow(dead_code, unused_imports)] // the part of the fixture it needs
mod fixture;
#[path = "../report/benchmarks.rs"]
mod report;

use std::collections::VecDeque;
use std::io::BufRead;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfsd::frontend::fuse::{FuseClient, FuseError};
use vfsd::frontend::{Frontend, FrontendConfig};
use vhost::VhostBackend;

const ROOT: u64 = 1;
/// Open files the guest holds across the rounds.
const HANDLES: usize = 64;
/// The supervisor's crash-loop bound (docs/upgrade.md, "Limits"): a daemon whose serving
/// processes died more than this many times within `CRASH_WINDOW` ends the session.
const CRASH_LOOP: usize = 10;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How long a hand-over may take before the round counts as lost.
const HANDOVER_WAIT: Duration = Duration::from_secs(60);

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: cargo bench --bench upgrade -- [--only upgrade|crash] [--nodes N[,N...]] \
         [--rounds R] [--out DIR]"
    );
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// The binary replaced and SIGUSR2 to the supervisor.
    Upgrade,
    /// SIGKILL to the serving process.
    Crash,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Upgrade => "upgrade",
            Kind::Crash => "crash",
        }
    }

    /// What the supervisor logs at the end of a hand-over of this kind, before the ms.
    fn log_mark(self) -> &'static str {
        match self {
            Kind::Upgrade => "now serves (pause ",
            Kind::Crash => "took the guest over in ",
        }
    }
}

fn children(pid: i32) -> Option<i32> {
    let c = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    c.split_whitespace().next()?.parse().ok()
}

/// The supervisor's first child, that one's first child, and so on: the serving process
/// is the last.
fn descendants(sup: i32) -> Vec<i32> {
    let mut chain = vec![];
    let mut p = sup;
    while let Some(c) = children(p) {
        chain.push(c);
        p = c;
    }
    chain
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name's closing parenthesis.
    (stat.rfind(')')).is_some_and(|at| !stat[at + 1..].trim_start().starts_with('Z'))
}

fn ino(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// A host directory of `nodes` files in directories of 1,000, each holding its own name.
struct Share {
    dir: tempfile::TempDir,
    names: Vec<(String, String)>,
}

impl Share {
    fn new(nodes: usize) -> Share {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        std::fs::create_dir(&share).unwrap();
        let mut names = Vec::with_capacity(nodes);
        for i in 0..nodes {
            let d = format!("d{}", i / 1000);
            if i % 1000 == 0 {
                std::fs::create_dir(share.join(&d)).unwrap();
            }
            let f = format!("f{i}");
            std::fs::write(share.join(&d).join(&f), &f).unwrap();
            names.push((d, f));
        }
        Share { dir, names }
    }
}

/// One open file: its node, handle and contents.
struct Handle {
    node: u64,
    fh: u64,
    bytes: Vec<u8>,
}

/// vfsd started from a copy of its binary, with a frontend that knows every file of the
/// share and holds `HANDLES` of them open.
struct Session {
    daemon: Child,
    bin: PathBuf,
    c: Arc<FuseClient>,
    /// The files' nodes, in the share's order.
    files: Vec<u64>,
    /// Every node the frontend knows: the directories', then the files'.
    nodes: Vec<u64>,
    handles: Vec<Handle>,
    /// The hand-over times the supervisor logged, in ms, oldest first.
    logged: Arc<Mutex<Vec<u64>>>,
}

impl Session {
    fn start(share: &Share, kind: Kind) -> Session {
        let dir = share.dir.path();
        let bin = dir.join(format!("vfsd-{}", kind.name()));
        std::fs::copy(fixture::vfsd_bin(), &bin).unwrap();
        let sock = dir.join(format!("{}.sock", kind.name()));
        let mut daemon = Command::new(&bin)
            .arg("--socket-path")
            .arg(&sock)
            .arg("--shared-dir")
            .arg(dir.join("share"))
            .args(["--log-level", "info"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vfsd");
        let logged = Arc::new(Mutex::new(vec![]));
        let stderr = daemon.stderr.take().unwrap();
        let (mark, into) = (kind.log_mark(), logged.clone());
        // The daemon's log goes on to ours; the hand-over times are kept on the way.
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(stderr);
            let mut line = vec![];
            while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let l = String::from_utf8_lossy(&line);
                eprint!("{l}");
                let ms = l.find(mark).and_then(|at| {
                    let rest = &l[at + mark.len()..];
                    rest[..rest.find(' ')?].parse().ok()
                });
                if let Some(ms) = ms {
                    into.lock().unwrap().push(ms);
                }
                line.clear();
            }
        });
        let t = Instant::now();
        while !sock.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "vfsd did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = Arc::new(FuseClient::new(
            Frontend::connect(&sock, FrontendConfig::default()).unwrap(),
        ));
        c.init().unwrap();
        let mut dirs = std::collections::HashMap::new();
        let mut files = Vec::new();
        for (d, f) in &share.names {
            let parent = *dirs
                .entry(d.clone())
                .or_insert_with(|| c.lookup(ROOT, d).unwrap().nodeid);
            files.push(c.lookup(parent, f).unwrap().nodeid);
        }
        let handles = (files.iter().zip(&share.names).take(HANDLES))
            .map(|(&node, (_, f))| Handle {
                node,
                fh: c.open(node, libc::O_RDWR as u32).unwrap().fh,
                bytes: f.as_bytes().to_vec(),
            })
            .collect();
        let nodes: Vec<u64> = dirs.into_values().chain(files.iter().copied()).collect();
        eprintln!(
            "{}: {} nodes known, {HANDLES} files open",
            kind.name(),
            nodes.len()
        );
        Session {
            daemon,
            bin,
            c,
            files,
            nodes,
            handles,
            logged,
        }
    }

    fn supervisor(&self) -> i32 {
        self.daemon.id() as i32
    }

    /// Replaces the binary and sends the supervisor SIGUSR2; true once the supervisor
    /// itself runs the new file.
    fn upgrade(&self) -> bool {
        let sup = self.supervisor();
        let old = children(sup).unwrap();
        let tmp = self.bin.with_extension("new");
        std::fs::copy(fixture::vfsd_bin(), &tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &self.bin).unwrap();
        let new_ino = ino(self.bin.to_str().unwrap()).unwrap();
        // SAFETY: kill with a valid signal number.
        unsafe { libc::kill(sup, libc::SIGUSR2) };
        wait_for(sup, || {
            children(sup).is_some_and(|p| p != old)
                && !Path::new(&format!("/proc/{old}")).exists()
                && ino(&format!("/proc/{sup}/exe")) == Some(new_ino)
        })
    }

    /// Kills the serving process, `depth` processes below the supervisor, with SIGKILL;
    /// true once a new one serves under a new keeper and `prober` had an answer since.
    fn crash(&self, depth: usize, prober: &Prober) -> bool {
        let sup = self.supervisor();
        let chain = descendants(sup);
        assert_eq!(
            chain.len(),
            depth,
            "processes under the supervisor: {chain:?}"
        );
        let (keeper, serving) = (chain[0], chain[depth - 1]);
        let answered = prober.answers.load(Ordering::Relaxed);
        // SAFETY: kill with a valid signal number, of the daemon's own process.
        unsafe { libc::kill(serving, libc::SIGKILL) };
        wait_for(sup, || {
            let now = descendants(sup);
            !alive(serving)
                && !alive(keeper)
                && now.len() == depth
                && now[0] != keeper
                && prober.answers.load(Ordering::Relaxed) > answered + 1
        })
    }
}

/// Polls `done` until it holds (true), or `HANDOVER_WAIT` passes or the supervisor `sup`
/// exits (false).
fn wait_for(sup: i32, mut done: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while !done() {
        if t.elapsed() > HANDOVER_WAIT || !alive(sup) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// A thread sending GETATTRs back to back.
struct Prober {
    answers: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Probed>,
}

/// What a prober saw.
struct Probed {
    /// The largest gap between two answers.
    gap: Duration,
    /// Answers that were an errno, and the first of them.
    errors: u64,
    first_errno: Option<i32>,
    /// The transport's failure, which ended the probing.
    broken: Option<String>,
}

impl Prober {
    fn start(c: &Arc<FuseClient>, node: u64) -> Prober {
        let answers = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, n, s) = (c.clone(), answers.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut p = Probed {
                gap: Duration::ZERO,
                errors: 0,
                first_errno: None,
                broken: None,
            };
            let mut last = Instant::now();
            while !s.load(Ordering::Relaxed) {
                match c.getattr(node) {
                    Ok(_) => {}
                    Err(FuseError::Errno(e)) => {
                        p.errors += 1;
                        p.first_errno.get_or_insert(e);
                    }
                    Err(e) => {
                        p.broken = Some(format!("GETATTR: {e}"));
                        break;
                    }
                }
                let now = Instant::now();
                p.gap = p.gap.max(now - last);
                last = now;
                n.fetch_add(1, Ordering::Relaxed);
            }
            p
        });
        Prober {
            answers,
            stop,
            thread,
        }
    }

    fn stop(self) -> Probed {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// What one round saw.
struct Round {
    pause_ms: f64,
    /// The hand-over ended, every probing GETATTR had an answer (an errno too), and the
    /// vhost-user connection answers GET_FEATURES after.
    connection: bool,
    /// The prober's GETATTRs answered with an errno.
    probe_errors: u64,
    /// A READ on a handle opened before the first round returned the file's bytes.
    read: bool,
    /// Known nodes a GETATTR of each found gone (none asked without a connection).
    nodes_lost: Option<usize>,
    /// The hand-over time the supervisor logged: for a crash, from its news of the death
    /// until it reaped the dead process's keeper, after the rings' kicks.
    logged_ms: Option<u64>,
}

/// `rounds` hand-overs of `kind` on a new daemon over `share`, until one loses the
/// frontend's connection.
fn measure(share: &Share, kind: Kind, rounds: usize) -> Vec<Round> {
    let name = kind.name();
    let mut s = Session::start(share, kind);
    let depth = descendants(s.supervisor()).len();
    let mut kills = VecDeque::new();
    let mut out = vec![];
    for round in 0..rounds {
        if kind == Kind::Crash && kills.len() >= CRASH_LOOP {
            // The oldest of the last CRASH_LOOP kills leaves the supervisor's window.
            let since: Instant = kills[kills.len() - CRASH_LOOP];
            let wait = (CRASH_WINDOW + Duration::from_secs(1)).saturating_sub(since.elapsed());
            if !wait.is_zero() {
                eprintln!(
                    "{name}: {:.0} s for the crash-loop window",
                    wait.as_secs_f64()
                );
                std::thread::sleep(wait);
            }
        }
        let logged_before = s.logged.lock().unwrap().len();
        let prober = Prober::start(&s.c, s.files[s.files.len() / 2]);
        std::thread::sleep(Duration::from_millis(200));
        let handed_over = match kind {
            Kind::Upgrade => s.upgrade(),
            Kind::Crash => {
                kills.push_back(Instant::now());
                s.crash(depth, &prober)
            }
        };
        std::thread::sleep(Duration::from_millis(200));
        let probed = prober.stop();
        let features = s.c.fe.vu.get_features();
        let connection = handed_over && probed.broken.is_none() && features.is_ok();
        let h = &s.handles[round % HANDLES];
        let read = connection
            && (s.c.read(h.node, h.fh, 0, h.bytes.len() as u32)).is_ok_and(|b| b == h.bytes);
        let mut first_gone = None;
        let nodes_lost = connection.then(|| {
            (s.nodes.iter())
                .filter(|&&n| match s.c.getattr(n) {
                    Ok(_) => false,
                    Err(e) => {
                        first_gone.get_or_insert((n, e));
                        true
                    }
                })
                .count()
        });
        let r = Round {
            pause_ms: probed.gap.as_secs_f64() * 1000.0,
            connection,
            probe_errors: probed.errors,
            read,
            nodes_lost,
            logged_ms: s.logged.lock().unwrap().get(logged_before).copied(),
        };
        eprintln!(
            "{name}: {} files, round {}: pause {:.1} ms (logged {:?} ms), connection {}, \
             READ {}, nodes lost {nodes_lost:?}",
            share.names.len(),
            round + 1,
            r.pause_ms,
            r.logged_ms,
            if connection { "kept" } else { "LOST" },
            if read { "right" } else { "WRONG" },
        );
        if let Some(e) = probed.first_errno {
            let e = std::io::Error::from_raw_os_error(e);
            eprintln!(
                "{name}: {} probing GETATTRs failed, the first: {e}",
                probed.errors
            );
        }
        if let Some((n, e)) = first_gone {
            eprintln!("{name}: GETATTR of node {n}: {e}");
        }
        if !connection {
            eprintln!(
                "{name}: handed over: {handed_over}, prober: {:?}, GET_FEATURES: {:?}",
                probed.broken,
                features.err()
            );
        }
        out.push(r);
        if !connection {
            break;
        }
    }
    // SAFETY: kill with a valid signal number.
    unsafe { libc::kill(s.supervisor(), libc::SIGTERM) };
    let _ = s.daemon.wait();
    out
}

fn main() {
    let mut kinds = vec![Kind::Upgrade, Kind::Crash];
    let mut nodes = vec![1000usize, 100_000];
    let mut rounds = 10usize;
    let mut out = fixture::repo().join("docs/benchmarks");
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--only" => {
                kinds = match val().as_str() {
                    "upgrade" => vec![Kind::Upgrade],
                    "crash" => vec![Kind::Crash],
                    _ => usage("--only: upgrade or crash"),
                }
            }
            "--nodes" => {
                nodes = (val().split(','))
                    .map(|n| n.parse().unwrap_or_else(|_| usage("--nodes: numbers")))
                    .collect()
            }
            "--rounds" => {
                rounds = val()
                    .parse()
                    .ok()
                    .filter(|&r| r > 0)
                    .unwrap_or_else(|| usage("--rounds: a number above 0"))
            }
            "--out" => out = PathBuf::from(val()),
            "-h" | "--help" => usage(""),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        usage("needs root: the lock handover's runtime directory is /run/vfsd");
    }
    let (commit, date) = fixture::commit_and_date();
    let mut lines = vec![String::new(); kinds.len()];
    let mut tables = vec![String::new(); kinds.len()];
    for &n in &nodes {
        eprintln!("upgrade: {n} files");
        let share = Share::new(n);
        for (i, &kind) in kinds.iter().enumerate() {
            let seen = measure(&share, kind, rounds);
            // A round that lost the connection has no pause that ended: it is only counted.
            let mut p: Vec<f64> = (seen.iter().filter(|r| r.connection))
                .map(|r| r.pause_ms)
                .collect();
            p.sort_by(f64::total_cmp);
            let (median, max) = (p.get(p.len() / 2).copied(), p.last().copied());
            let kept = seen.iter().filter(|r| r.connection).count();
            let read = seen.iter().filter(|r| r.read).count();
            let all_nodes = (seen.iter())
                .filter(|r| r.probe_errors == 0 && r.nodes_lost == Some(0))
                .count();
            let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
            tables[i] += &format!(
                "| {n} | {rounds} | {} | {} | {kept} | {read} | {all_nodes} |\n",
                ms(median),
                ms(max)
            );
            // Other work on the host stretches the pause: the load is saved beside it.
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let load = load.split_whitespace().next().unwrap_or("?").to_string();
            let mut line = serde_json::json!({
                "commit": commit, "date": date, "nodes": n, "rounds": rounds, "load": load,
                "median_ms": median, "max_ms": max, "pauses_ms": p,
            });
            line["connection_kept"] = kept.into();
            line["read_right"] = read.into();
            line["all_nodes_answer"] = all_nodes.into();
            line["per_round"] = (seen.iter())
                .map(|r| {
                    serde_json::json!({
                        "pause_ms": r.pause_ms, "connection": r.connection,
                        "read": r.read, "probe_errors": r.probe_errors,
                        "nodes_lost": r.nodes_lost, "logged_ms": r.logged_ms,
                    })
                })
                .collect();
            lines[i] += &(line.to_string() + "\n");
        }
    }
    for (i, kind) in kinds.iter().enumerate() {
        println!(
            "\n{}\n\n| files known | rounds | median pause ms | max pause ms | connection kept \
             | READ right | all nodes answer |\n|---:|---:|---:|---:|---:|---:|---:|\n{}",
            kind.name(),
            tables[i]
        );
        let dir = out.join(kind.name());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("results.jsonl"), &lines[i]).unwrap();
        eprintln!("upgrade: wrote {}", dir.join("results.jsonl").display());
    }
    report::write_page(fixture::repo());
}
