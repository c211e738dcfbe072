//! The fds and memory a daemon holds while a guest walks a huge host-made tree: vfsd
//! against virtiofsd 1.14, each with its defaults plus `--xattr`, cache mode auto (the
//! guest keeps every inode it has seen). The guest runs `find | wc -l` over the tree, then
//! `du -s` (a stat of every file); every second the host samples the open fds and VmRSS
//! of the daemon's process with the most fds (a sandbox's child serves the requests).
//!
//! ```text
//! cargo bench --bench walk                       # 1,000,000 files, both daemons
//! cargo bench --bench walk -- --files 100000 --daemons vfsd --daemon-args=--inode-file-handles=prefer
//! ```
//!
//! The tree (1,000 files per directory) is made once under the cache directory, or under
//! `--share-root DIR` (a distributed file system's client mount, say), and kept. Writes
//! OUT/<daemon>.csv (seconds, fds, RSS KiB), OUT/results.jsonl (a line per daemon, with
//! the commit and date; other daemons' lines are kept) and OUT/report.md (default
//! docs/benchmarks/walk), then rewrites docs/benchmarks.md and its plots
//! (tests/report/benchmarks.rs).

#[path = "../guest/fixture/mod.rs"]
#[allow(dead_code, unused_imports)] // the part of the fixture it needs
mod fixture;
#[path = "../report/benchmarks.rs"]
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fixture::{cache_dir, repo, DaemonKind, Guest, Share, TestDir};

struct Options {
    files: usize,
    daemons: Vec<DaemonKind>,
    daemon_args: Vec<String>,
    share_root: Option<PathBuf>,
    out: PathBuf,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: cargo bench --bench walk -- [--files N] [--daemons vfsd,virtiofsd] \
         [--daemon-args=ARGS] [--share-root DIR] [--out DIR]"
    );
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

fn options() -> Options {
    let mut o = Options {
        files: 1_000_000,
        daemons: vec![DaemonKind::Vfsd, DaemonKind::Virtiofsd],
        daemon_args: Vec::new(),
        share_root: None,
        out: repo().join("docs/benchmarks/walk"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut val = || {
            inline
                .clone()
                .or_else(|| args.next())
                .unwrap_or_else(|| usage(&format!("{key} needs a value")))
        };
        match key.as_str() {
            "--files" => {
                o.files = val()
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1000)
                    .unwrap_or_else(|| usage("--files wants a number of at least 1000"))
            }
            "--daemons" => {
                o.daemons = val()
                    .split(',')
                    .map(|d| match d {
                        "vfsd" => DaemonKind::Vfsd,
                        "virtiofsd" => DaemonKind::Virtiofsd,
                        _ => usage(&format!("--daemons: vfsd or virtiofsd, not {d}")),
                    })
                    .collect()
            }
            "--daemon-args" => o.daemon_args = val().split_whitespace().map(String::from).collect(),
            "--share-root" => o.share_root = Some(PathBuf::from(val())),
            "--out" => o.out = PathBuf::from(val()),
            "--bench" => {} // cargo bench passes it to every bench target
            "-h" | "--help" => usage(""),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    o
}

/// The tree of `files` empty files, 1,000 per directory, made once under `base`.
fn tree(files: usize, base: &std::path::Path) -> PathBuf {
    let root = base.join(format!("walk-tree-{files}"));
    if root.join(".complete").exists() {
        return root;
    }
    let _ = std::fs::remove_dir_all(&root);
    let dirs = files / 1000;
    eprintln!(
        "walk: making {files} files in {dirs} directories under {} (once)",
        root.display()
    );
    for d in 0..dirs {
        let p = root.join(format!("d{d}"));
        std::fs::create_dir_all(&p).unwrap();
        for f in 0..1000 {
            std::fs::File::create(p.join(format!("f{f}"))).unwrap();
        }
        if d % 100 == 99 {
            eprintln!("walk:   {} of {dirs} directories", d + 1);
        }
    }
    std::fs::write(root.join(".complete"), "").unwrap();
    root
}

/// Open fds and VmRSS (KiB) of the process below `pid` with the most fds.
fn sample(pid: u32) -> Option<(usize, u64)> {
    fixture::process_tree(pid)
        .into_iter()
        .filter_map(|p| {
            let fds = std::fs::read_dir(format!("/proc/{p}/fd")).ok()?.count();
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let rss = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            Some((fds, rss))
        })
        .max_by_key(|s| s.0)
}

fn label(d: &DaemonKind) -> &'static str {
    if *d == DaemonKind::Virtiofsd {
        "virtiofsd"
    } else {
        "vfsd"
    }
}

fn main() {
    let o = options();
    let root = tree(o.files, o.share_root.as_deref().unwrap_or(&cache_dir()));
    std::fs::create_dir_all(&o.out).unwrap();
    let mut rows = Vec::new();
    for daemon in &o.daemons {
        let name = label(daemon);
        eprintln!("walk: {name}: a guest walks {} files", o.files);
        let dir = TestDir::new(&format!("bench-walk-{name}"));
        let args: Vec<&str> = o.daemon_args.iter().map(String::as_str).collect();
        let guest = Guest::new(&dir)
            .mem_mb(4096)
            .timeout(Duration::from_secs(7200))
            .share(Share::new(&root, "share0", daemon.clone(), &args).mount_options("ro"));
        let _slot = fixture::Slot::take(1);
        let daemons = guest.start_daemons("walk");
        let cmd = "t=$(date +%s); n=$(find /mnt/share0 | wc -l); echo walk: find $n entries in $(( $(date +%s) - t )) s; \
                   t=$(date +%s); du -s /mnt/share0 > /dev/null; echo walk: du in $(( $(date +%s) - t )) s";
        let start = Instant::now();
        let mut vm = guest.start_vm("walk", &daemons, cmd, &[]);
        let done = AtomicBool::new(false);
        let pid = daemons.list[0].pid();
        let samples = std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut v = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    if let Some((fds, rss)) = sample(pid) {
                        v.push((start.elapsed().as_secs_f64(), fds, rss));
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                v
            });
            let ended = vm.wait(Duration::from_secs(7200));
            done.store(true, Ordering::Relaxed);
            assert!(
                ended.is_some(),
                "{name}: the guest did not finish within 2 hours"
            );
            sampler.join().unwrap()
        });
        let secs = start.elapsed().as_secs();
        let console = vm.console_text();
        let walk: Vec<&str> = fixture::lines_starting(&console, "walk: ").collect();
        assert!(
            walk.len() == 2,
            "{name}: the guest's walk did not finish:\n{console}"
        );
        let csv: String = std::iter::once("seconds,fds,rss_kib\n".to_string())
            .chain(samples.iter().map(|(t, f, r)| format!("{t:.1},{f},{r}\n")))
            .collect();
        std::fs::write(o.out.join(format!("{name}.csv")), csv).unwrap();
        let fds = samples.iter().map(|s| s.1).max().unwrap_or(0);
        let rss = samples.iter().map(|s| s.2).max().unwrap_or(0);
        eprintln!(
            "walk: {name}: peak fds {fds}, peak RSS {} MiB, {secs} s; {}",
            rss / 1024,
            walk.join("; ")
        );
        rows.push((name, fds, rss, secs, walk.join("; ").replace("walk: ", "")));
    }
    write_report(&o, &rows);
}

fn write_report(o: &Options, rows: &[(&str, usize, u64, u64, String)]) {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let (commit, date) = fixture::commit_and_date();
    let mut md = format!(
        "# A guest walks {} host-made files: the daemon's fds and RSS\n\nWritten by `cargo bench --bench walk{}{}` \
         (tests/bench/walk.rs) at {commit}, {date}: a TCG guest, cache mode auto, each daemon with its defaults plus \
         `--xattr`. Samples once a second: `<daemon>.csv` beside this file.\n\n\
         | daemon | peak fds | peak RSS (MiB) | RSS per file (bytes) | wall time (s) | walk |\n|---|---:|---:|---:|---:|---|\n",
        o.files,
        if args.is_empty() { "" } else { " -- " },
        args.join(" ")
    );
    // The saved lines of daemons this run did not measure are kept.
    let path = o.out.join("results.jsonl");
    let mut json: String = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            !rows.iter().any(|r| v["daemon"].as_str() == Some(r.0))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    for (name, fds, rss, secs, walk) in rows {
        json += &serde_json::json!({"commit": commit, "date": date, "files": o.files,
            "daemon": name, "daemon_args": o.daemon_args, "peak_fds": fds,
            "peak_rss_kib": rss, "seconds": secs, "walk": walk})
        .to_string();
        json += "\n";
        md += &format!(
            "| {name} | {fds} | {} | {} | {secs} | {walk} |\n",
            rss / 1024,
            rss * 1024 / o.files as u64
        );
    }
    std::fs::write(o.out.join("report.md"), md).unwrap();
    std::fs::write(&path, json).unwrap();
    eprintln!("walk: wrote {}", o.out.join("report.md").display());
    report::write_page(repo());
}
