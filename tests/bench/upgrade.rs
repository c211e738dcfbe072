//! The pause of an upgrade in place (docs/upgrade.md) as a frontend sees it: vfsd started
//! from a copy of its binary knows N nodes (a LOOKUP of each of N host files) and holds
//! open files; a thread sends GETATTRs back to back through the test frontend's real
//! socket and virtqueues while the copy is replaced and the supervisor gets SIGUSR2; the
//! pause is the largest gap between two answers. Ten rounds per node count.
//!
//! ```text
//! cargo bench --bench upgrade                          # 1,000 and 100,000 nodes, 10 rounds
//! cargo bench --bench upgrade -- --nodes 1000 --rounds 3 --out /tmp/upgrade
//! ```
//!
//! Needs root (the lock handover's runtime directory, /run/vfsd). Prints a table and
//! writes OUT/results.jsonl (default docs/benchmarks/upgrade), then docs/benchmarks.md.

#[path = "../guest/fixture/mod.rs"]
mod fixture;
#[path = "../report/benchmarks.rs"]
mod report;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfsd::frontend::fuse::FuseClient;
use vfsd::frontend::{Frontend, FrontendConfig};

const ROOT: u64 = 1;
/// Open files the guest holds across each upgrade.
const HANDLES: usize = 64;

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: cargo bench --bench upgrade -- [--nodes N[,N...]] [--rounds R] [--out DIR]"
    );
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

fn children(pid: i32) -> Option<i32> {
    let c = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    c.split_whitespace().next()?.parse().ok()
}

fn ino(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// One node count: the pauses of `rounds` upgrades, in ms.
fn measure(nodes: usize, rounds: usize) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    let bin = dir.path().join("vfsd");
    std::fs::create_dir(&share).unwrap();
    std::fs::copy(fixture::vfsd_bin(), &bin).unwrap();
    eprintln!("upgrade: {nodes} files");
    let mut names = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let d = format!("d{}", i / 1000);
        if i % 1000 == 0 {
            std::fs::create_dir(share.join(&d)).unwrap();
        }
        std::fs::write(share.join(&d).join(format!("f{i}")), b"x").unwrap();
        names.push((d, format!("f{i}")));
    }
    let sock = dir.path().join("vfsd.sock");
    let mut daemon = Command::new(&bin)
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(["--log-level", "info"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vfsd");
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
    for (d, f) in &names {
        let parent = *dirs
            .entry(d.clone())
            .or_insert_with(|| c.lookup(ROOT, d).unwrap().nodeid);
        files.push(c.lookup(parent, f).unwrap().nodeid);
    }
    for &n in files.iter().take(HANDLES) {
        c.open(n, libc::O_RDWR as u32).unwrap();
    }
    eprintln!(
        "upgrade: {} nodes known, {HANDLES} files open",
        files.len() + dirs.len()
    );

    let sup = daemon.id() as i32;
    let mut pauses = Vec::new();
    for round in 0..rounds {
        let old = children(sup).unwrap();
        let tmp = dir.path().join("vfsd.new");
        std::fs::copy(fixture::vfsd_bin(), &tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &bin).unwrap();
        let new_ino = ino(bin.to_str().unwrap()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let prober = {
            let (c, stop, node) = (c.clone(), stop.clone(), files[files.len() / 2]);
            std::thread::spawn(move || {
                let (mut last, mut gap) = (Instant::now(), Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    c.getattr(node).expect("GETATTR across the upgrade");
                    let now = Instant::now();
                    gap = gap.max(now - last);
                    last = now;
                }
                gap
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: kill with a valid signal number.
        unsafe { libc::kill(sup, libc::SIGUSR2) };
        let t = Instant::now();
        loop {
            let done = children(sup).is_some_and(|p| p != old)
                && !Path::new(&format!("/proc/{old}")).exists()
                && ino(&format!("/proc/{sup}/exe")) == Some(new_ino);
            if done {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no handover");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let gap = prober.join().unwrap();
        let ms = gap.as_secs_f64() * 1000.0;
        eprintln!(
            "upgrade: {nodes} files, round {}: pause {ms:.1} ms",
            round + 1
        );
        pauses.push(ms);
    }
    // SAFETY: kill with a valid signal number.
    unsafe { libc::kill(sup, libc::SIGTERM) };
    let _ = daemon.wait();
    pauses
}

fn main() {
    let mut nodes = vec![1000usize, 100_000];
    let mut rounds = 10usize;
    let mut out = fixture::repo().join("docs/benchmarks/upgrade");
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--nodes" => {
                nodes = (val().split(','))
                    .map(|n| n.parse().unwrap_or_else(|_| usage("--nodes: numbers")))
                    .collect()
            }
            "--rounds" => {
                rounds = val()
                    .parse()
                    .unwrap_or_else(|_| usage("--rounds: a number"))
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
    let mut lines = String::new();
    println!("| files known | rounds | median pause ms | max pause ms |");
    println!("|---:|---:|---:|---:|");
    for &n in &nodes {
        let mut p = measure(n, rounds);
        p.sort_by(f64::total_cmp);
        let (median, max) = (p[p.len() / 2], p[p.len() - 1]);
        println!("| {n} | {rounds} | {median:.1} | {max:.1} |");
        // Other work on the host stretches the pause: the load is saved beside it.
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?").to_string();
        lines += &serde_json::json!({
            "commit": commit, "date": date, "nodes": n, "rounds": rounds, "load": load,
            "median_ms": median, "max_ms": max, "pauses_ms": p,
        })
        .to_string();
        lines += "\n";
    }
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("results.jsonl"), lines).unwrap();
    eprintln!("upgrade: wrote {}", out.join("results.jsonl").display());
    report::write_page(fixture::repo());
}
