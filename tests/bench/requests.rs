//! FUSE requests per step of tree work, counted in the guest kernel (tracepoint
//! `fuse:fuse_request_send`, per opcode, the same way for any daemon), beside the step's
//! time and the daemon's CPU: vfsd against virtiofsd 1.14 in each cache mode, each in a
//! guest of its own booted through the guest-test fixture. vfsd gets a request queue per
//! guest vCPU (two), virtiofsd its one.
//!
//! ```text
//! cargo bench --bench requests                        # every mode, both daemons
//! cargo bench --bench requests -- --modes auto --daemons vfsd --steps untar,cat-all
//! scripts/ceph.sh up && cargo bench --bench requests -- --share-root /srv/vfsd-ceph/a \
//!     --out docs/benchmarks/ceph-requests              # shares on a CephFS client mount
//! ```
//!
//! The guest side is guest-tests/tree-bench.sh on a source tree (the pinned xfstests
//! tarball, 4,684 entries). Writes docs/benchmarks/tree/results.jsonl (a line per
//! daemon, mode and step, with the commit and date; the lines of those not run this time
//! are kept) and docs/benchmarks/tree/report.md
//! (the tables), or under `--out DIR`, then rewrites docs/benchmarks.md and its plots
//! (tests/report/benchmarks.rs).

#[path = "../guest/fixture/mod.rs"]
#[allow(dead_code, unused_imports)] // the part of the fixture it needs
mod fixture;
#[path = "../report/benchmarks.rs"]
mod report;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fixture::{cache_dir, repo, DaemonKind, Guest, Share, TestDir};

const STEPS: &str = "untar,find,cat-all,cat-all-p2,cp-a,rm-rf,cp-a-x2,untar-x2,create,unlink";

struct Options {
    modes: Vec<String>,
    daemons: Vec<DaemonKind>,
    steps: String,
    out: PathBuf,
    /// Where the shares under test are made (a fresh directory each), else in the run's
    /// test directory.
    share_root: Option<PathBuf>,
    /// Also the steps on the guest's own tmpfs, once: the ceiling no daemon can pass.
    tmpfs: bool,
    /// Options vfsd gets besides the cache mode (`--vfsd-args`), e.g. `--no-open`.
    vfsd_args: Vec<String>,
}

fn options() -> Options {
    let mut o = Options {
        modes: ["auto", "always", "never", "metadata"]
            .map(String::from)
            .to_vec(),
        daemons: vec![DaemonKind::Vfsd, DaemonKind::Virtiofsd],
        steps: STEPS.into(),
        out: repo().join("docs/benchmarks/tree"),
        tmpfs: true,
        share_root: None,
        vfsd_args: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--modes" => o.modes = val().split(',').map(String::from).collect(),
            "--daemons" => {
                let v = val();
                o.tmpfs = v.split(',').any(|d| d == "tmpfs");
                o.daemons = v
                    .split(',')
                    .filter(|d| *d != "tmpfs")
                    .map(|d| match d {
                        "vfsd" => DaemonKind::Vfsd,
                        "virtiofsd" => DaemonKind::Virtiofsd,
                        _ => usage(&format!("--daemons: vfsd, virtiofsd or tmpfs, not {d}")),
                    })
                    .collect()
            }
            "--steps" => o.steps = val(),
            "--out" => o.out = PathBuf::from(val()),
            "--share-root" => o.share_root = Some(PathBuf::from(val())),
            "--vfsd-args" => o.vfsd_args = val().split_whitespace().map(String::from).collect(),
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            "-h" | "--help" => usage(""),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    for m in &o.modes {
        if !["auto", "always", "never", "metadata"].contains(&m.as_str()) {
            usage(&format!(
                "--modes: auto, always, never or metadata, not {m}"
            ));
        }
    }
    o
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("requests: error: {why}");
    }
    eprintln!(
        "usage: cargo bench --bench requests -- [--modes auto,always,never,metadata] \
         [--daemons vfsd,virtiofsd] [--steps {STEPS}] [--share-root DIR] [--out DIR] \
         [--vfsd-args 'OPTIONS']"
    );
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

/// src.tar (top directory "src") from the pinned xfstests tarball, made once.
fn source_tree(cache: &Path) -> (PathBuf, usize) {
    let dir = cache.join("requests-tree");
    let tar = dir.join("src.tar");
    if !tar.exists() {
        let tarball = std::fs::read_dir(repo().join("../shared/xfstests"))
            .expect("../shared/xfstests")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".tar.xz"))
            .expect("the xfstests tarball in ../shared/xfstests");
        let x = dir.join("x");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&x).unwrap();
        let st = Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&x)
            .status()
            .unwrap();
        assert!(st.success(), "unpacking {}", tarball.display());
        let top = std::fs::read_dir(&x)
            .unwrap()
            .flatten()
            .next()
            .unwrap()
            .path();
        std::fs::rename(&top, dir.join("src")).unwrap();
        let st = Command::new("tar")
            .arg("-cf")
            .arg(dir.join("src.tar.part"))
            .arg("-C")
            .arg(&dir)
            .arg("src")
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::rename(dir.join("src.tar.part"), &tar).unwrap();
        let _ = std::fs::remove_dir_all(dir.join("src"));
        let _ = std::fs::remove_dir_all(&x);
    }
    let list = Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    let entries = String::from_utf8_lossy(&list.stdout).lines().count();
    (tar, entries)
}

/// User and system CPU seconds of `pid` and every process below it.
fn tree_cpu(pid: u32) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    fixture::process_tree(pid)
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .map(|stat| {
            // Fields after the command's closing parenthesis: utime is the 12th, stime 13th.
            let rest = stat.rsplit_once(')').map_or("", |x| x.1);
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            (ut + st) / tick
        })
        .sum()
}

struct StepResult {
    step: String,
    secs: f64,
    cpu: f64,
    ops: BTreeMap<String, u64>,
}

impl StepResult {
    fn requests(&self) -> u64 {
        self.ops.values().sum()
    }
}

/// Answers tree-bench.sh's marks in `ctl` (reading the daemon's CPU at each) until
/// "done" or "fail"; the steps' results.
fn follow_marks(
    ctl: &Path,
    daemon_pid: u32,
    deadline: Duration,
) -> Result<Vec<StepResult>, String> {
    let t = Instant::now();
    let mut out = Vec::new();
    let mut cpu_at_start = 0.0;
    for n in 1.. {
        let mark = ctl.join(format!("mark.{n}"));
        while !mark.exists() {
            if t.elapsed() > deadline {
                return Err(format!("no mark {n} within {} s", deadline.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let text = std::fs::read_to_string(&mark).unwrap_or_default();
        let cpu = tree_cpu(daemon_pid);
        std::fs::write(ctl.join(format!("ack.{n}")), "").unwrap();
        let w: Vec<&str> = text.split_whitespace().collect();
        match w.first().copied() {
            Some("start") => cpu_at_start = cpu,
            Some("end") if w.len() >= 4 => {
                let t0: f64 = w[2].parse().unwrap_or(0.0);
                let t1: f64 = w[3].parse().unwrap_or(0.0);
                let ops = w[4..]
                    .iter()
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_string(), v.parse().ok()?))
                    })
                    .collect();
                out.push(StepResult {
                    step: w[1].to_string(),
                    secs: t1 - t0,
                    cpu: cpu - cpu_at_start,
                    ops,
                });
            }
            Some("done") => return Ok(out),
            _ => return Err(format!("the guest: {}", text.trim())),
        }
    }
    unreachable!()
}

/// One guest running `cmd` with the tree in the control share, and `share` (daemon,
/// cache option, queues) as share0 when given, a fresh directory under `root` when given;
/// the steps' results.
fn bench_boot(
    name: &str,
    tar: &Path,
    share: Option<(DaemonKind, Vec<String>, u32)>,
    root: Option<&Path>,
    cmd: &str,
) -> Vec<StepResult> {
    let dir = TestDir::new(name);
    let ctl = dir.dir("ctl");
    std::fs::copy(tar, ctl.join("src.tar")).unwrap();
    let mut guest = Guest::new(&dir);
    if let Some((daemon, args, queues)) = &share {
        let path = match root {
            Some(r) => {
                let p = r.join(name);
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                p
            }
            None => dir.dir("share"),
        };
        guest = guest.queues(*queues).share(Share::new(
            &path,
            "share0",
            daemon.clone(),
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
    }
    let guest = guest.share(Share::new(
        &ctl,
        "ctl",
        DaemonKind::Vfsd,
        &["--cache=never"],
    ));
    let _slot = fixture::Slot::take(1);
    let daemons = guest.start_daemons("bench");
    let mut vm = guest.start_vm("bench", &daemons, cmd, &[]);
    // The step's CPU is the daemon of the share under test (the control share's when none).
    let res = follow_marks(&ctl, daemons.list[0].pid(), Duration::from_secs(1800));
    let _ = vm.wait(Duration::from_secs(60));
    res.unwrap_or_else(|e| panic!("{name}: {e}\n{}", vm.console_text()))
}

fn label(d: &DaemonKind) -> &'static str {
    match d {
        DaemonKind::Virtiofsd => "virtiofsd",
        _ => "vfsd",
    }
}

fn main() {
    let o = options();
    let cache = cache_dir();
    let (tar, entries) = source_tree(&cache);
    let (commit, date) = fixture::commit_and_date();
    eprintln!(
        "requests: tree of {entries} entries; modes {:?}; daemons {:?}; steps {}",
        o.modes, o.daemons, o.steps
    );
    std::fs::create_dir_all(&o.out).unwrap();
    // The saved lines of the daemons, modes and steps this run does not measure are kept,
    // so a run of some replaces only theirs on the benchmark page.
    let path = o.out.join("results.jsonl");
    let steps: Vec<&str> = o.steps.split(',').collect();
    let kept: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            let step = v["step"].as_str().unwrap_or_default();
            let measured = match (v["daemon"].as_str(), v["mode"].as_str()) {
                (Some("tmpfs"), _) => o.tmpfs,
                (Some(d), Some(m)) => {
                    o.daemons.iter().any(|k| label(k) == d) && o.modes.iter().any(|x| x == m)
                }
                _ => true,
            };
            !(measured && steps.contains(&step))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, kept.concat()).unwrap();
    let mut jsonl = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    // (mode, step) -> daemon -> result
    let mut table: BTreeMap<(usize, String), BTreeMap<&'static str, StepResult>> = BTreeMap::new();
    let mut step_order: Vec<String> = Vec::new();
    // The guest's own tmpfs, once: no daemon, no requests, the ceiling of every mode.
    let mut ceiling: BTreeMap<String, StepResult> = BTreeMap::new();
    if o.tmpfs {
        let cmd = format!(
            "mkdir -p /tmp/tree && mount -t tmpfs tmpfs /tmp/tree && /guest-tests/tree-bench.sh /tmp/tree /mnt/ctl {}",
            o.steps
        );
        for r in bench_boot("requests-tmpfs", &tar, None, None, &cmd) {
            eprintln!("requests: tmpfs {}: {:.2} s", r.step, r.secs);
            writeln!(
                jsonl,
                "{{\"commit\": \"{commit}\", \"date\": \"{date}\", \"daemon\": \"tmpfs\", \"step\": \"{}\", \
                 \"entries\": {entries}, \"seconds\": {:.3}}}",
                r.step, r.secs
            )
            .unwrap();
            ceiling.insert(r.step.clone(), r);
        }
    }
    for (mi, mode) in o.modes.iter().enumerate() {
        for daemon in &o.daemons {
            let name = format!("requests-{}-{mode}", label(daemon));
            eprintln!("requests: {name} ...");
            let queues = if *daemon == DaemonKind::Vfsd { 2 } else { 1 };
            let cmd = format!(
                "/guest-tests/tree-bench.sh /mnt/share0 /mnt/ctl {}",
                o.steps
            );
            let mut args = vec![format!("--cache={mode}")];
            if *daemon == DaemonKind::Vfsd {
                args.extend(o.vfsd_args.iter().cloned());
            }
            // The options beyond the cache mode, in the data ("" for the defaults).
            let extra = args[1..].join(" ");
            let share = (daemon.clone(), args, queues);
            for r in bench_boot(&name, &tar, Some(share), o.share_root.as_deref(), &cmd) {
                let ops: Vec<String> = r.ops.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                writeln!(
                    jsonl,
                    "{{\"commit\": \"{commit}\", \"date\": \"{date}\", \"daemon\": \"{}\", \"options\": \"{extra}\", \
                     \"mode\": \"{mode}\", \"queues\": {queues}, \"step\": \"{}\", \"entries\": {entries}, \"seconds\": {:.3}, \
                     \"daemon_cpu_s\": {:.2}, \"requests\": {}, \"ops\": {{{}}}}}",
                    label(daemon),
                    r.step,
                    r.secs,
                    r.cpu,
                    r.requests(),
                    ops.join(", ")
                )
                .unwrap();
                eprintln!(
                    "requests: {} {mode} {}: {:.2} s, {} requests ({:.2} per entry), daemon CPU {:.2} s",
                    label(daemon),
                    r.step,
                    r.secs,
                    r.requests(),
                    r.requests() as f64 / entries as f64,
                    r.cpu
                );
                if !step_order.contains(&r.step) {
                    step_order.push(r.step.clone());
                }
                table
                    .entry((mi, r.step.clone()))
                    .or_default()
                    .insert(label(daemon), r);
            }
        }
    }
    write_report(&o, &table, &ceiling, &step_order, entries, &commit, &date);
}

fn write_report(
    o: &Options,
    table: &BTreeMap<(usize, String), BTreeMap<&'static str, StepResult>>,
    ceiling: &BTreeMap<String, StepResult>,
    steps: &[String],
    entries: usize,
    commit: &str,
    date: &str,
) {
    let mut md = String::new();
    md += "# FUSE requests per step: vfsd and virtiofsd\n\n";
    md += &format!(
        "Written by `cargo bench --bench requests{}` (tests/bench/requests.rs) at {commit}, {date}: \
         a guest (Debian cloud kernel, TCG, 2 vCPUs) per daemon and cache mode runs \
         guest-tests/tree-bench.sh on a source tree of {entries} entries; requests are counted \
         in the guest kernel (`fuse:fuse_request_send`), per opcode, the same way for both \
         daemons. vfsd has two request queues (one per vCPU), virtiofsd its one. Times are \
         the guest's, one run: noisy under TCG, unlike the counts; tmpfs is the same steps \
         on the guest's own tmpfs, the ceiling no daemon can pass. The data: results.jsonl.\n\n",
        {
            let a: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
            if a.is_empty() {
                String::new()
            } else {
                format!(" -- {}", a.join(" "))
            }
        }
    );
    for (mi, mode) in o.modes.iter().enumerate() {
        md += &format!("## --cache={mode}\n\n");
        md += "| step | vfsd requests | virtiofsd requests | requests vfsd / virtiofsd | per entry (vfsd) | time vfsd / virtiofsd | vfsd s | virtiofsd s | tmpfs s | vfsd / tmpfs | daemon CPU s (vfsd, virtiofsd) |\n";
        md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
        for step in steps {
            let Some(row) = table.get(&(mi, step.clone())) else {
                continue;
            };
            let v = row.get("vfsd");
            let r = row.get("virtiofsd");
            let f =
                |x: Option<&StepResult>, g: &dyn Fn(&StepResult) -> String| x.map_or("-".into(), g);
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let t = ceiling.get(step);
            md += &format!(
                "| {step} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}, {} |\n",
                f(v, &|x| x.requests().to_string()),
                f(r, &|x| x.requests().to_string()),
                ratio(
                    v.map(|x| x.requests() as f64),
                    r.map(|x| x.requests() as f64)
                ),
                f(v, &|x| format!(
                    "{:.2}",
                    x.requests() as f64 / entries as f64
                )),
                ratio(v.map(|x| x.secs), r.map(|x| x.secs)),
                f(v, &|x| format!("{:.2}", x.secs)),
                f(r, &|x| format!("{:.2}", x.secs)),
                f(t, &|x| format!("{:.2}", x.secs)),
                ratio(v.map(|x| x.secs), t.map(|x| x.secs)),
                f(v, &|x| format!("{:.2}", x.cpu)),
                f(r, &|x| format!("{:.2}", x.cpu)),
            );
        }
        md += "\nBy opcode (vfsd / virtiofsd):\n\n";
        for step in steps {
            let Some(row) = table.get(&(mi, step.clone())) else {
                continue;
            };
            let mut ops: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
            if let Some(v) = row.get("vfsd") {
                for (k, n) in &v.ops {
                    ops.entry(k).or_default().0 = *n;
                }
            }
            if let Some(r) = row.get("virtiofsd") {
                for (k, n) in &r.ops {
                    ops.entry(k).or_default().1 = *n;
                }
            }
            let cells: Vec<String> = ops
                .iter()
                .map(|(k, (a, b))| format!("{k} {a}/{b}"))
                .collect();
            md += &format!("- {step}: {}\n", cells.join(", "));
        }
        md += "\n";
    }
    std::fs::write(o.out.join("report.md"), md).unwrap();
    eprintln!("requests: wrote {}", o.out.join("report.md").display());
    report::write_page(repo());
}
