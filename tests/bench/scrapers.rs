//! Request latency beside `--metrics` scrapers: GETATTRs through the test frontend's real
//! socket and virtqueues, with no scraper, with 100 slow ones (each connects and sends its
//! request a byte every 50 ms, so the endpoint's deadline cuts it off), and with 100 that
//! scrape once a second each. The rounds alternate, twice over, so drift hits all three.
//!
//! ```text
//! cargo bench --bench scrapers                  # rounds of 5 s
//! cargo bench --bench scrapers -- --seconds 2 --out /tmp/scrapers
//! ```
//!
//! Prints the latency percentiles and writes OUT/scrapers.json (default
//! docs/benchmarks/metrics), with the commit and date.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfsd::frontend::fuse::FuseClient;
use vfsd::frontend::{Frontend, FrontendConfig};

const SCRAPERS: usize = 100;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Load {
    None,
    Slow,
    EverySecond,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::None => "no scraper",
            Load::Slow => "100 slow scrapers",
            Load::EverySecond => "100 scrapers, 1/s each",
        }
    }
}

fn usage(why: &str) -> ! {
    eprintln!("{why}\nusage: cargo bench --bench scrapers -- [--seconds S] [--out DIR]");
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One scraper thread under `load` until `stop`; counts finished scrapes.
fn scraper(path: PathBuf, load: Load, stop: Arc<AtomicBool>, scrapes: Arc<AtomicU64>) {
    let request = b"GET /metrics HTTP/1.1\r\nHost: vfsd\r\n\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = UnixStream::connect(&path) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        match load {
            Load::Slow => {
                for b in request.iter().cycle() {
                    if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Load::EverySecond => {
                let _ = s.write_all(request);
                let mut out = Vec::new();
                if s.read_to_end(&mut out).is_ok() && out.starts_with(b"HTTP/1.1 200") {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
                for _ in 0..20 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Load::None => return,
        }
    }
}

/// GETATTRs one after another for `secs`: each one's latency in microseconds.
fn round(c: &FuseClient, secs: f64) -> Vec<f64> {
    let start = Instant::now();
    let mut lat = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        c.getattr(1).expect("GETATTR");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn main() {
    let mut seconds = 5.0f64;
    let mut out = repo().join("docs/benchmarks/metrics");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = (args.next())
                    .and_then(|v| v.parse().ok())
                    .filter(|&n: &f64| n >= 0.5)
                    .unwrap_or_else(|| usage("--seconds wants a number of at least 0.5"))
            }
            "--out" => out = PathBuf::from(args.next().unwrap_or_else(|| usage("--out DIR"))),
            "--bench" => {}
            "-h" | "--help" => usage(""),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let sock = dir.path().join("vfsd.sock");
    let metrics = dir.path().join("metrics.sock");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_vfsd"))
        .args(["--socket-path", sock.to_str().unwrap()])
        .args(["--shared-dir", share.to_str().unwrap()])
        .args(["--metrics", metrics.to_str().unwrap()])
        .args(["--log-level", "error"])
        .stdin(Stdio::null())
        .spawn()
        .expect("start vfsd");
    wait_for(&sock);
    let c = FuseClient::new(Frontend::connect(&sock, FrontendConfig::default()).unwrap());
    c.init().expect("FUSE INIT");
    round(&c, 0.5); // warm-up

    let loads = [Load::None, Load::Slow, Load::EverySecond];
    let mut results: Vec<(Load, Vec<f64>)> = loads.iter().map(|&l| (l, Vec::new())).collect();
    let scrapes = Arc::new(AtomicU64::new(0));
    for pass in 0..2 {
        for (load, lat) in results.iter_mut() {
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..if *load == Load::None { 0 } else { SCRAPERS })
                .map(|_| {
                    let (p, s, n) = (metrics.clone(), stop.clone(), scrapes.clone());
                    let load = *load;
                    std::thread::spawn(move || scraper(p, load, s, n))
                })
                .collect();
            // Let the scrapers connect and queue up.
            std::thread::sleep(Duration::from_millis(if threads.is_empty() {
                0
            } else {
                500
            }));
            eprintln!("scrapers: pass {} of 2, {}", pass + 1, load.name());
            lat.extend(round(&c, seconds));
            stop.store(true, Ordering::Relaxed);
            for t in threads {
                let _ = t.join();
            }
        }
    }
    let _ = daemon.kill();
    let _ = daemon.wait();

    let base = {
        let l = &mut results[0].1;
        l.sort_by(f64::total_cmp);
        pct(l, 0.5)
    };
    println!("| scrapers | p50 µs | p90 µs | p99 µs | p50 / no scraper |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (load, lat) in results.iter_mut() {
        lat.sort_by(f64::total_cmp);
        let (p50, p90, p99) = (pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99));
        println!(
            "| {} | {p50:.1} | {p90:.1} | {p99:.1} | {:.2} |",
            load.name(),
            p50 / base
        );
        rows.push(serde_json::json!({
            "load": load.name(), "requests": lat.len(),
            "p50_us": p50, "p90_us": p90, "p99_us": p99, "p50_ratio": p50 / base,
        }));
    }
    println!(
        "full scrapes served meanwhile: {}",
        scrapes.load(Ordering::Relaxed)
    );
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(repo())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    std::fs::create_dir_all(&out).unwrap();
    let json = serde_json::json!({
        "command": "cargo bench --bench scrapers",
        "seconds_per_round": seconds,
        "commit": commit, "date": date, "rounds": rows,
        "scrapes_served": scrapes.load(Ordering::Relaxed),
    });
    let file = out.join("scrapers.json");
    std::fs::write(&file, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    eprintln!("scrapers: wrote {}", file.display());
}

fn wait_for(sock: &Path) {
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "vfsd did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}
