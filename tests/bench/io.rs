//! Data I/O, vfsd against virtiofsd 1.14 and the host itself, in one run:
//!
//! 1. `loadgen`: `vfsd-bench` plays the guest driver on each daemon's socket (at its
//!    default pool size and its best one), beside native fio at the same concurrency (a
//!    psync thread per request the load generator keeps in flight, buffered, as the
//!    daemons' own I/O).
//! 2. `native`: the guest's fio jobs on the host, in a directory beside the shares.
//! 3. `guest`: the fio jobs in a guest booted through the guest-test fixture, a guest per
//!    daemon and run, `--cache never`.
//! 4. `roundtrip`: one request at a time on one queue, with no gap and with a 100 µs gap
//!    between operations: p50, p99 and daemon CPU per operation of LOOKUP, GETATTR, READ
//!    4 KiB, WRITE 4 KiB and CREATE, each daemon of RT_DAEMONS, and beside them the same
//!    syscalls made on the host (`vfsd-bench --host`), paced alike.
//! 5. `instr` (only when named): user-space instructions per operation of each daemon
//!    under the load generator's untar workload, one request in flight, counted by
//!    valgrind's callgrind: the same count run to run, where CPU time moves by 10-20%.
//!    The difference of a run of 3,000 operations and one of 1,000, over 2,000, leaves
//!    the start-up out.
//!
//! ```text
//! cargo bench --bench io                                    # everything, 3 runs
//! cargo bench --bench io -- --quick --parts guest           # fewer jobs, shorter runs
//! cargo bench --bench io -- --parts roundtrip --seconds 1   # the round trip alone
//! scripts/gluster.sh up && cargo bench --bench io -- --share-root /srv/vfsd-gluster/a \
//!     --out docs/benchmarks/gluster                         # on a GlusterFS client mount
//! ```
//!
//! Each figure is the median of `--runs` runs, the runs interleaved across daemons so
//! that drift hits each alike. Writes OUT/results.jsonl (a line per figure and run, with
//! the commit and date; the lines of parts not run this time are kept) and OUT/report.md (default docs/benchmarks/io), then
//! rewrites docs/benchmarks.md and its plots (tests/report/benchmarks.rs).

#[path = "../guest/fixture/mod.rs"]
#[allow(dead_code, unused_imports)] // the part of the fixture it needs
mod fixture;
#[path = "../report/benchmarks.rs"]
mod report;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fixture::{repo, Daemon, DaemonKind, Guest, Share, TestDir};
use serde_json::{json, Value};

/// The load generator's workloads: name, queues, requests in flight per queue, block
/// size, file MiB.
const WORKLOADS: &[(&str, u32, u32, u32, u32)] = &[
    ("randwrite-shared", 1, 32, 4096, 64),
    ("randwrite-perjob", 1, 8, 4096, 16),
    ("randread-shared", 1, 32, 4096, 64),
    ("randread-perjob", 1, 8, 4096, 16),
    ("seqread", 1, 4, 1 << 20, 256),
    ("seqwrite", 1, 4, 1 << 20, 256),
    ("lookup-getattr", 1, 32, 4096, 1),
    ("create-unlink", 1, 16, 4096, 1),
];

/// The fio jobs of the guest and native runs: name, fio arguments.
const FIO_JOBS: &[(&str, &str)] = &[
    (
        "randread-4k-psync",
        "--rw=randread --bs=4k --ioengine=psync --direct=1 --size=64m",
    ),
    (
        "randread-4k-libaio16",
        "--rw=randread --bs=4k --ioengine=libaio --iodepth=16 --direct=1 --size=64m",
    ),
    (
        "randwrite-4k-psync",
        "--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m",
    ),
    (
        "randwrite-4k-libaio16",
        "--rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 --size=64m",
    ),
    (
        "seqread-1m",
        "--rw=read --bs=1m --ioengine=psync --direct=1 --size=256m",
    ),
    (
        "seqwrite-1m",
        "--rw=write --bs=1m --ioengine=psync --direct=1 --size=256m",
    ),
    (
        "ssf-randwrite-4k-j1",
        "--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=1",
    ),
    (
        "ssf-randwrite-4k-j2",
        "--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=2",
    ),
    (
        "ssf-randwrite-4k-j4",
        "--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=4",
    ),
];

/// Daemon configurations of the load generator: name, daemon, options. The pool sizes
/// of "best" are the ones each daemon did best with on two CPUs.
const CONFIGS: &[(&str, bool, &str)] = &[
    ("vfsd-default", true, ""),
    ("vfsd-best", true, "--thread-pool-size=8"),
    ("virtiofsd-default", false, ""),
    ("virtiofsd-best", false, "--thread-pool-size=4"),
];

/// The round trip's daemons: name, whether vfsd (else virtiofsd), options. A line here
/// is a column of the round-trip table.
const RT_DAEMONS: &[(&str, bool, &str)] = &[
    ("vfsd", true, ""),
    ("vfsd-poll-adaptive", true, "--poll=adaptive"),
    ("vfsd-poll-on", true, "--poll=on"),
    ("virtiofsd", false, ""),
    ("virtiofsd-pool4", false, "--thread-pool-size=4"),
];

/// The round trip's operations: row, vfsd-bench workload.
const RT_OPS: &[(&str, &str)] = &[
    ("LOOKUP", "lookup"),
    ("GETATTR", "getattr"),
    ("READ 4 KiB", "randread-shared"),
    ("WRITE 4 KiB", "randwrite-shared"),
    ("CREATE", "create"),
];

/// Microseconds between a reply and the next operation of the round trip.
const RT_GAPS: &[u32] = &[0, 100];

const PARTS: &[&str] = &["loadgen", "native", "guest", "roundtrip", "instr"];

struct Options {
    runs: usize,
    secs: u32,
    guest_secs: u32,
    quick: bool,
    parts: Vec<String>,
    share_root: Option<PathBuf>,
    out: PathBuf,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: cargo bench --bench io -- [--runs N] [--quick] [--parts loadgen,native,guest,roundtrip,instr] \
         [--seconds S] [--guest-seconds S] [--share-root DIR] [--out DIR]"
    );
    std::process::exit(if why.is_empty() { 0 } else { 2 })
}

fn options() -> Options {
    let mut o = Options {
        runs: 3,
        secs: 5,
        guest_secs: 20,
        quick: false,
        parts: ["loadgen", "native", "guest", "roundtrip"]
            .map(String::from)
            .to_vec(),
        share_root: None,
        out: repo().join("docs/benchmarks/io"),
    };
    let (mut secs, mut gsecs) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        let num = |v: String| {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{a}: not a number: {v}")))
        };
        match a.as_str() {
            "--runs" => o.runs = num(val()),
            "--seconds" => secs = Some(num(val())),
            "--guest-seconds" => gsecs = Some(num(val())),
            "--quick" => o.quick = true,
            "--parts" => o.parts = val().split(',').map(String::from).collect(),
            "--share-root" => o.share_root = Some(PathBuf::from(val())),
            "--out" => o.out = PathBuf::from(val()),
            "--bench" => {} // cargo bench passes it to every bench target
            "-h" | "--help" => usage(""),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    for p in &o.parts {
        if !PARTS.contains(&p.as_str()) {
            usage(&format!("--parts: {}, not {p}", PARTS.join(", ")));
        }
    }
    o.secs = secs.unwrap_or(if o.quick { 2 } else { 5 }) as u32;
    o.guest_secs = gsecs.unwrap_or(if o.quick { 8 } else { 20 }) as u32;
    o
}

fn jobs(o: &Options) -> Vec<(&'static str, &'static str)> {
    let keep = [
        "randread-4k-psync",
        "randwrite-4k-psync",
        "seqread-1m",
        "ssf-randwrite-4k-j1",
        "ssf-randwrite-4k-j2",
    ];
    FIO_JOBS
        .iter()
        .filter(|j| !o.quick || keep.contains(&j.0))
        .copied()
        .collect()
}

/// fio's JSON output: notes may come before it.
fn fio_json(text: &str) -> Value {
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in fio's output: {text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio's JSON: {e}"))
}

/// Read plus write IOPS and MiB/s of fio's (group-reported) first job.
fn fio_figures(v: &Value) -> (f64, f64) {
    let job = &v["jobs"][0];
    let f = |k: &str, d: &str| job[d][k].as_f64().unwrap_or(0.0);
    let iops = f("iops", "read") + f("iops", "write");
    let mib = (f("bw_bytes", "read") + f("bw_bytes", "write")) / (1 << 20) as f64;
    (iops, mib)
}

fn run_fio(dir: &Path, name: &str, args: &[String]) -> Value {
    std::fs::create_dir_all(dir).unwrap();
    let out = Command::new("fio")
        .current_dir(dir)
        .arg(format!("--name={name}"))
        .args(args)
        .args(["--group_reporting", "--output-format=json"])
        .output()
        .expect("fio: apt-get install fio");
    assert!(
        out.status.success(),
        "fio {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fio_json(&String::from_utf8_lossy(&out.stdout))
}

/// A fresh directory for `what`: under --share-root when given, else under `dir`.
fn work_dir(o: &Options, dir: &TestDir, what: &str) -> PathBuf {
    match &o.share_root {
        Some(root) => {
            let p = root.join(format!("vfsd-bench-io-{}-{what}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            p
        }
        None => dir.dir(what),
    }
}

/// Median and half the min-max spread, relative to the median.
fn median(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v[v.len() / 2];
    let spread = if m > 0.0 {
        (v[v.len() - 1] - v[0]) / 2.0 / m
    } else {
        0.0
    };
    (m, spread)
}

/// One run's figures: operations (or IOPS) per second, MiB/s, daemon CPU µs per op.
type Figures = (f64, f64, f64);

struct Record<'a> {
    jsonl: std::fs::File,
    commit: &'a str,
    date: &'a str,
    /// This run's command, saved with each line.
    command: &'a str,
    /// (part, row, column) -> runs' (iops or ops/s, MiB/s, daemon CPU µs per op).
    figures: BTreeMap<(String, String, String), Vec<Figures>>,
}

impl Record<'_> {
    fn add(
        &mut self,
        part: &str,
        row: &str,
        col: &str,
        run: usize,
        fig: (f64, f64, f64),
        raw: Value,
    ) {
        // value: ops/s (or IOPS, or instructions per operation for instr).
        let line = json!({"commit": self.commit, "date": self.date, "command": self.command, "part": part, "row": row,
            "config": col, "run": run, "value": fig.0, "mib_per_s": fig.1,
            "cpu_us_per_op": fig.2, "result": raw});
        writeln!(self.jsonl, "{line}").unwrap();
        eprintln!(
            "io: {part} {row} {col} run {run}: {:.0} ({:.1} MiB/s)",
            fig.0, fig.1
        );
        self.figures
            .entry((part.into(), row.into(), col.into()))
            .or_default()
            .push(fig);
    }
}

/// The load generator cargo built beside vfsd.
fn bench_bin() -> PathBuf {
    let bench = option_env!("CARGO_BIN_EXE_vfsd-bench")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixture::vfsd_bin().with_file_name("vfsd-bench"));
    assert!(
        bench.is_file(),
        "{} missing: cargo build --release --features test-frontend",
        bench.display()
    );
    bench
}

fn loadgen(o: &Options, dir: &TestDir, rec: &mut Record, run: usize) {
    let bench = bench_bin();
    let workloads: Vec<_> = WORKLOADS
        .iter()
        .filter(|w| {
            !o.quick
                || [
                    "randwrite-shared",
                    "randread-shared",
                    "seqread",
                    "lookup-getattr",
                ]
                .contains(&w.0)
        })
        .collect();
    for &&(wname, queues, depth, bs, mib) in &workloads {
        for &(cname, is_vfsd, args) in CONFIGS {
            let share = work_dir(o, dir, "loadgen");
            let kind = if is_vfsd {
                DaemonKind::Vfsd
            } else {
                DaemonKind::Virtiofsd
            };
            let mut argv = vec!["--cache=never".to_string(), "--log-level=error".into()];
            argv.extend(args.split_whitespace().map(String::from));
            let sock = dir.dir("sock").join("loadgen.sock");
            let d = Daemon::start(
                &kind,
                &share,
                &sock,
                &argv,
                &dir.dir("logs").join(format!("{cname}.log")),
            );
            let out = Command::new(&bench)
                .args([
                    "--socket",
                    &sock.to_string_lossy(),
                    "--shared-dir",
                    &share.to_string_lossy(),
                ])
                .args(["--pid", &d.pid().to_string(), "--workload", wname])
                .args([
                    "--queues",
                    &queues.to_string(),
                    "--depth",
                    &depth.to_string(),
                ])
                .args([
                    "--bs",
                    &bs.to_string(),
                    "--file-mib",
                    &mib.to_string(),
                    "--seconds",
                    &o.secs.to_string(),
                ])
                .output()
                .unwrap();
            drop(d);
            assert!(
                out.status.success(),
                "vfsd-bench {wname} on {cname}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: Value = serde_json::from_slice(&out.stdout).expect("vfsd-bench's JSON");
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            rec.add(
                "loadgen",
                wname,
                cname,
                run,
                (f("ops_per_s"), f("mib_per_s"), f("daemon_cpu_us_per_op")),
                v.clone(),
            );
            let _ = std::fs::remove_dir_all(&share);
        }
        let rw = match wname.split('-').next().unwrap() {
            "randwrite" => "randwrite",
            "randread" => "randread",
            "seqread" => "read",
            "seqwrite" => "write",
            _ => continue,
        };
        if !o.parts.iter().any(|p| p == "native") {
            continue;
        }
        // --invalidate=0: fio would drop the files' pages first and read from the disk
        // what the daemons read from the page cache.
        let mut args: Vec<String> = [
            format!("--rw={rw}"),
            format!("--bs={bs}"),
            format!("--size={mib}m"),
            "--ioengine=psync".into(),
            "--direct=0".into(),
            "--invalidate=0".into(),
            format!("--numjobs={}", queues * depth),
            "--thread".into(),
            "--time_based".into(),
            format!("--runtime={}", o.secs),
        ]
        .to_vec();
        args.push(if wname.ends_with("-shared") {
            "--filename=shared".into()
        } else {
            "--filename_format=f.$jobnum".into()
        });
        let native = work_dir(o, dir, "native-eq");
        let v = run_fio(&native, wname, &args);
        let (iops, mib_s) = fio_figures(&v);
        rec.add("loadgen", wname, "native", run, (iops, mib_s, 0.0), v);
        let _ = std::fs::remove_dir_all(&native);
    }
}

fn native(o: &Options, dir: &TestDir, rec: &mut Record, run: usize) {
    for (name, jargs) in jobs(o) {
        // Buffered, as the daemons' own I/O; libaio's depth N becomes N psync threads on
        // one file (buffered libaio would block one request at a time).
        let mut args: Vec<String> = jargs
            .replace("--direct=1", "--direct=0")
            .split_whitespace()
            .map(String::from)
            .collect();
        if let Some(i) = args.iter().position(|a| a == "--ioengine=libaio") {
            let depth = args[i + 1].trim_start_matches("--iodepth=").to_string();
            args.splice(
                i..i + 2,
                [
                    "--ioengine=psync".into(),
                    format!("--numjobs={depth}"),
                    "--thread".into(),
                    format!("--filename={name}.dat"),
                ],
            );
        }
        args.extend([
            "--invalidate=0".into(),
            "--time_based".into(),
            format!("--runtime={}", o.secs),
        ]);
        let d = work_dir(o, dir, "native");
        let v = run_fio(&d, name, &args);
        let (iops, mib) = fio_figures(&v);
        rec.add("fio", name, "native", run, (iops, mib, 0.0), v);
        let _ = std::fs::remove_dir_all(&d);
    }
}

fn guest(o: &Options, rec: &mut Record, run: usize) {
    for (label, kind, args) in [
        ("vfsd", DaemonKind::Vfsd, "--cache=never"),
        (
            "virtiofsd",
            DaemonKind::Virtiofsd,
            "--cache=never --thread-pool-size=4",
        ),
    ] {
        let tdir = TestDir::new(&format!("bench-io-{label}-{run}"));
        let share = work_dir(o, &tdir, "share");
        let mut script = String::from("set -e\nmkdir -p work out\n");
        for (name, jargs) in jobs(o) {
            script += &format!(
                "echo 'guest fio: {name}' >&2\n(cd work && fio --name={name} {jargs} --time_based --runtime={} \
                 --group_reporting --output-format=json --output=../out/{name}.json)\nrm -f work/*\n",
                o.guest_secs
            );
        }
        std::fs::write(share.join("io.sh"), script).unwrap();
        let argv: Vec<&str> = args.split_whitespace().collect();
        let g = Guest::new(&tdir)
            .cpus(2)
            .timeout(Duration::from_secs(3600))
            .share(Share::new(&share, "share0", kind, &argv));
        // Guest::run takes its own slot among the guests (a second here would wait for
        // ever with VFSD_GUEST_JOBS=1).
        let r = g.run("sh io.sh");
        if !matches!(r.status, fixture::Status::Exited(0)) {
            eprintln!("io: the guest through {label}, run {run}, failed ({:?}); its figures are missing\n{}", r.status, r.tail());
            // Not dropped: its logs stay for a look.
            std::mem::forget(tdir);
            continue;
        }
        for (name, _) in jobs(o) {
            let v =
                fio_json(&std::fs::read_to_string(share.join(format!("out/{name}.json"))).unwrap());
            let (iops, mib) = fio_figures(&v);
            rec.add("fio", name, label, run, (iops, mib, 0.0), v);
        }
        let _ = std::fs::remove_dir_all(&share);
    }
}

/// The round trip's row of `op` with `gap` µs between operations.
fn rt_row(op: &str, gap: u32) -> String {
    if gap == 0 {
        format!("{op}, no gap")
    } else {
        format!("{op}, {gap} µs gap")
    }
}

/// One figure of the round trip: vfsd-bench's JSON for `workload` on `daemon` (a line
/// of RT_DAEMONS) or, for None, on the host.
#[allow(clippy::too_many_arguments)]
fn rt_figure(
    bench: &Path,
    dir: &TestDir,
    share: &Path,
    workload: &str,
    gap: u32,
    secs: u32,
    cname: &str,
    daemon: Option<&(&str, bool, &str)>,
) -> Result<Value, String> {
    let mut cmd = Command::new(bench);
    cmd.args(["--shared-dir", &share.to_string_lossy()])
        .args(["--workload", workload, "--depth", "1", "--queues", "1"])
        .args(["--gap-us", &gap.to_string(), "--file-mib", "64"])
        .args(["--seconds", &secs.to_string(), "--warmup-ms", "200"]);
    let d = daemon.map(|&(_, is_vfsd, args)| {
        let kind = if is_vfsd {
            DaemonKind::Vfsd
        } else {
            DaemonKind::Virtiofsd
        };
        let mut argv = vec!["--cache=never".to_string(), "--log-level=error".into()];
        argv.extend(args.split_whitespace().map(String::from));
        let sock = dir.dir("sock").join("rt.sock");
        let log = dir.dir("logs").join(format!("rt-{cname}.log"));
        let d = Daemon::start(&kind, share, &sock, &argv, &log);
        cmd.args(["--socket", &sock.to_string_lossy()])
            .args(["--pid", &d.pid().to_string()]);
        d
    });
    if d.is_none() {
        cmd.arg("--host");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    drop(d);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("vfsd-bench's JSON: {e}"))
}

/// One request at a time: each operation of RT_OPS, with each gap of RT_GAPS, on each
/// daemon of RT_DAEMONS and on the host, interleaved.
fn roundtrip(o: &Options, dir: &TestDir, rec: &mut Record, run: usize) {
    let bench = bench_bin();
    let shares: Vec<PathBuf> = (0..=RT_DAEMONS.len())
        .map(|i| work_dir(o, dir, &format!("rt{i}")))
        .collect();
    for &(row, workload) in RT_OPS {
        for &gap in RT_GAPS {
            let label = rt_row(row, gap);
            let hosts = [("host", None)];
            let daemons = RT_DAEMONS.iter().map(|d| (d.0, Some(d)));
            for (i, (cname, daemon)) in daemons.chain(hosts).enumerate() {
                // A figure that fails (no reply within the run, on a loaded machine) is
                // taken again once, then left out, and said so.
                let v = (0..2).find_map(|_| {
                    let r = rt_figure(
                        &bench, dir, &shares[i], workload, gap, o.secs, cname, daemon,
                    );
                    r.map_err(|e| eprintln!("io: roundtrip {label} {cname}: {e}"))
                        .ok()
                });
                let Some(v) = v else {
                    eprintln!("io: roundtrip {label} {cname}, run {run}: no figure");
                    continue;
                };
                let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
                eprintln!(
                    "io: roundtrip {label} {cname}: p50 {:.1} µs, p99 {:.1} µs, CPU {:.1} µs/op",
                    f("lat_us_p50"),
                    f("lat_us_p99"),
                    f("daemon_cpu_us_per_op")
                );
                rec.add(
                    "roundtrip",
                    &label,
                    cname,
                    run,
                    (f("lat_us_p50"), f("mib_per_s"), f("daemon_cpu_us_per_op")),
                    v.clone(),
                );
            }
        }
    }
    for s in shares {
        let _ = std::fs::remove_dir_all(s);
    }
}

/// callgrind's instruction total of `bin` serving `ops` untar operations.
fn instructions(dir: &TestDir, bin: &Path, ops: u32) -> f64 {
    let share = dir.dir(&format!("instr-{ops}"));
    let sock = dir.dir("sock").join("instr.sock");
    let out = dir.path.join("callgrind.out");
    let _ = std::fs::remove_file(&sock);
    // valgrind can't follow a sandbox's fork; both daemons take these options.
    let mut d = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(bin)
        .arg(format!("--socket-path={}", sock.display()))
        .arg(format!("--shared-dir={}", share.display()))
        .args([
            "--cache=always",
            "--xattr",
            "--sandbox=none",
            "--seccomp=none",
            "--log-level=error",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("valgrind: apt-get install valgrind");
    for _ in 0..300 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        sock.exists(),
        "{} under valgrind made no socket",
        bin.display()
    );
    let st = Command::new(bench_bin())
        .args([
            "--socket",
            &sock.to_string_lossy(),
            "--shared-dir",
            &share.to_string_lossy(),
        ])
        .args([
            "--pid",
            &d.id().to_string(),
            "--workload",
            "untar",
            "--depth",
            "1",
            "--ops",
            &ops.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "vfsd-bench under {}", bin.display());
    // SAFETY: kill on our own child, not yet reaped.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let _ = d.wait();
    let text = std::fs::read_to_string(&out).unwrap();
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .expect("callgrind's totals");
    total.split_whitespace().next().unwrap().parse().unwrap()
}

fn instr(dir: &TestDir, rec: &mut Record) {
    let (a, b) = (1000, 3000);
    for (label, bin) in [
        ("vfsd", fixture::vfsd_bin()),
        ("virtiofsd", fixture::virtiofsd_bin()),
    ] {
        eprintln!("io: instructions per untar operation of {label} ({a} then {b} operations under callgrind)");
        let per_op = (instructions(dir, &bin, b) - instructions(dir, &bin, a)) / f64::from(b - a);
        rec.add(
            "instr",
            "untar",
            label,
            1,
            (per_op, 0.0, 0.0),
            json!({"instructions_per_op": per_op}),
        );
    }
}

fn main() {
    let o = options();
    let (commit, date) = fixture::commit_and_date();
    std::fs::create_dir_all(&o.out).unwrap();
    // The saved lines of the parts this run does not measure are kept, so a run of some
    // parts replaces only theirs on the benchmark page.
    let path = o.out.join("results.jsonl");
    let runs = |p: &str| o.parts.iter().any(|x| x == p);
    // A kept line without a command of its own gets the one of the report it came with,
    // which this run replaces.
    let old_report = std::fs::read_to_string(o.out.join("report.md")).unwrap_or_default();
    let old_cmd = report::written_by(&old_report).map(String::from);
    let kept: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap_or_default();
            let keep = match (v["part"].as_str(), v["config"].as_str()) {
                (Some("loadgen"), _) => !runs("loadgen"),
                (Some("fio"), Some("native")) => !runs("native"),
                (Some("fio"), _) => !runs("guest"),
                (Some(part @ ("roundtrip" | "instr")), _) => !runs(part),
                _ => false,
            };
            if let (Some(m), Some(cmd)) = (v.as_object_mut(), &old_cmd) {
                m.entry("command").or_insert_with(|| json!(cmd));
            }
            keep.then(|| format!("{v}\n"))
        })
        .collect();
    std::fs::write(&path, kept.concat()).unwrap();
    let command = run_command();
    let mut rec = Record {
        jsonl: std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap(),
        commit: &commit,
        date: &date,
        command: &command,
        figures: BTreeMap::new(),
    };
    let dir = TestDir::new("bench-io");
    for run in 1..=o.runs {
        eprintln!("io: run {run} of {}", o.runs);
        if o.parts.iter().any(|p| p == "loadgen") {
            loadgen(&o, &dir, &mut rec, run);
        }
        if o.parts.iter().any(|p| p == "native") {
            native(&o, &dir, &mut rec, run);
        }
        if o.parts.iter().any(|p| p == "guest") {
            guest(&o, &mut rec, run);
        }
        if runs("roundtrip") {
            roundtrip(&o, &dir, &mut rec, run);
        }
    }
    if o.parts.iter().any(|p| p == "instr") {
        instr(&dir, &mut rec);
    }
    write_report(&o, &rec);
    report::write_page(repo());
}

/// The command this run was started with.
fn run_command() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    format!(
        "cargo bench --bench io{}{}",
        if args.is_empty() { "" } else { " -- " },
        args.join(" ")
    )
}

fn write_report(o: &Options, rec: &Record) {
    let mut md = format!(
        "# Data I/O: vfsd, virtiofsd and the host\n\nWritten by `{}` \
         (tests/bench/io.rs) at {}, {}. Each figure is the median of {} runs, ± half the \
         min-max spread; ratios are of medians. Shares: {}. The data: results.jsonl.\n\n",
        rec.command,
        rec.commit,
        rec.date,
        o.runs,
        o.share_root
            .as_ref()
            .map_or("the host's file system under target/".into(), |p| p
                .display()
                .to_string()),
    );
    let cell = |part: &str, row: &str, col: &str| -> Option<(f64, f64, f64, f64)> {
        let mut v = rec
            .figures
            .get(&(part.into(), row.into(), col.into()))?
            .clone();
        let (m, s) = median(&mut v.iter().map(|x| x.0).collect::<Vec<_>>());
        let (mib, _) = median(&mut v.iter().map(|x| x.1).collect::<Vec<_>>());
        let (cpu, _) = median(&mut v.iter_mut().map(|x| x.2).collect::<Vec<_>>());
        Some((m, s, mib, cpu))
    };
    let ratio = |a: Option<(f64, f64, f64, f64)>, b: Option<(f64, f64, f64, f64)>| match (a, b) {
        (Some(a), Some(b)) if b.0 > 0.0 => format!("{:.2}", a.0 / b.0),
        _ => "-".into(),
    };
    if o.parts.iter().any(|p| p == "loadgen") {
        md += &format!(
            "## Load generator\n\n`vfsd-bench` connects to each daemon's socket as a VMM would and plays the guest \
             driver, {} s per figure, `--cache=never`; native is fio at the same concurrency on the host. Operations \
             per second, MiB/s and the daemon's CPU per operation.\n\n\
             | workload | vfsd-default | vfsd-best | virtiofsd-default | virtiofsd-best | native | vfsd / virtiofsd (default) | vfsd / virtiofsd (best) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
            o.secs
        );
        for &(w, ..) in WORKLOADS {
            if !rec.figures.keys().any(|k| k.0 == "loadgen" && k.1 == w) {
                continue;
            }
            let c = |col| cell("loadgen", w, col);
            let show = |x: Option<(f64, f64, f64, f64)>| {
                x.map_or("-".into(), |(m, s, mib, cpu)| {
                    let cpu = if cpu > 0.0 {
                        format!(", {cpu:.1} µs CPU/op")
                    } else {
                        String::new()
                    };
                    format!("{m:.0}/s ±{:.0}%, {mib:.1} MiB/s{cpu}", s * 100.0)
                })
            };
            md += &format!(
                "| {w} | {} | {} | {} | {} | {} | {} | {} |\n",
                show(c("vfsd-default")),
                show(c("vfsd-best")),
                show(c("virtiofsd-default")),
                show(c("virtiofsd-best")),
                show(c("native")),
                ratio(c("vfsd-default"), c("virtiofsd-default")),
                ratio(c("vfsd-best"), c("virtiofsd-best")),
            );
        }
        md += "\n";
    }
    if o.parts.iter().any(|p| p == "guest" || p == "native") {
        md += &format!(
            "## fio in a guest through each daemon, and on the host\n\nA TCG guest with 2 vCPUs, `--cache=never` \
             (virtiofsd with its best pool size, 4), {} s per job; native runs the same jobs buffered on the host, \
             {} s each. The host's page cache serves both sides alike: the guest's ceiling is the emulated CPU.\n\n\
             | job | vfsd | virtiofsd | native | vfsd / virtiofsd | vfsd / native |\n|---|---:|---:|---:|---:|---:|\n",
            o.guest_secs, o.secs
        );
        for (name, _) in jobs(o) {
            let c = |col| cell("fio", name, col);
            let show = |x: Option<(f64, f64, f64, f64)>| {
                x.map_or("-".into(), |(m, s, mib, _)| {
                    format!("{m:.0} IOPS ±{:.0}%, {mib:.1} MiB/s", s * 100.0)
                })
            };
            md += &format!(
                "| {name} | {} | {} | {} | {} | {} |\n",
                show(c("vfsd")),
                show(c("virtiofsd")),
                show(c("native")),
                ratio(c("vfsd"), c("virtiofsd")),
                ratio(c("vfsd"), c("native")),
            );
        }
        let ssf = |col| {
            let one = cell("fio", "ssf-randwrite-4k-j1", col)?.0;
            let two = cell("fio", "ssf-randwrite-4k-j2", col)?.0;
            Some(format!("{:.2}", two / one))
        };
        md += &format!(
            "\nParallel direct writes to one file, IOPS at 2 jobs over 1 job: vfsd {}, virtiofsd {}, native {}.\n",
            ssf("vfsd").unwrap_or("-".into()),
            ssf("virtiofsd").unwrap_or("-".into()),
            ssf("native").unwrap_or("-".into())
        );
    }
    if o.parts.iter().any(|p| p == "roundtrip") {
        let cols: Vec<&str> = RT_DAEMONS.iter().map(|d| d.0).chain(["host"]).collect();
        md += &format!(
            "\n## Round trip\n\nOne request in flight on one queue, {} s per figure: p50 µs (median \
             over runs), daemon CPU µs per operation; host is the syscall itself.\n\n| operation | {} |\n|---|{}\n",
            o.secs,
            cols.join(" | "),
            "---:|".repeat(cols.len())
        );
        for &(row, _) in RT_OPS {
            for &gap in RT_GAPS {
                let label = rt_row(row, gap);
                let cells: Vec<String> = cols
                    .iter()
                    .map(|col| {
                        cell("roundtrip", &label, col).map_or("-".into(), |(p50, s, _, cpu)| {
                            format!("{p50:.1} µs ±{:.0}%, {cpu:.1} µs CPU", s * 100.0)
                        })
                    })
                    .collect();
                md += &format!("| {label} | {} |\n", cells.join(" | "));
            }
        }
    }
    if o.parts.iter().any(|p| p == "instr") {
        let c = |col| cell("instr", "untar", col).map(|x| x.0);
        md += &format!(
            "\n## Instructions per operation\n\nUser-space instructions per operation of the load generator's \
             untar workload (LOOKUP, CREATE, GETXATTR, WRITE, FLUSH, RELEASE, two SETATTRs, UNLINK, FORGET), one \
             request in flight, counted by callgrind (3,000 operations less 1,000, over 2,000), `--cache=always \
             --xattr --sandbox=none --seccomp=none`; the kernel's share is not counted.\n\n\
             | vfsd | virtiofsd | vfsd / virtiofsd |\n|---:|---:|---:|\n| {} | {} | {} |\n",
            c("vfsd").map_or("-".into(), |x| format!("{x:.0}")),
            c("virtiofsd").map_or("-".into(), |x| format!("{x:.0}")),
            ratio(cell("instr", "untar", "vfsd"), cell("instr", "untar", "virtiofsd")),
        );
    }
    std::fs::write(o.out.join("report.md"), md).unwrap();
    eprintln!("io: wrote {}", o.out.join("report.md").display());
}
