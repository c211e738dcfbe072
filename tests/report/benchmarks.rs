//! docs/benchmarks.md and its plots (docs/benchmarks/*/*.svg), from the results the
//! benches save under docs/benchmarks/<workload>/results.jsonl, each line with the commit
//! and date it was measured at. The benches write it at their end; after editing the data
//! by hand: `cargo bench --bench report`.

#[path = "plot.rs"]
mod plot;
#[path = "show.rs"]
pub mod show;

use std::collections::HashMap;
use std::path::Path;

use plot::{Bars, Ceiling, Lines, Result};
use serde_json::{Map, Value};
use show::{show, truthy};

type Line = Map<String, Value>;

/// Rewrites docs/benchmarks.md and the plots under docs/benchmarks/ in the tree at `root`,
/// saying so on stderr; false (and why) where it could not. A bench calls it after saving
/// its results, which a failure here leaves as they are.
pub fn write_page(root: &Path) -> bool {
    match write(root) {
        Ok(()) => {
            eprintln!("report: wrote docs/benchmarks.md");
            true
        }
        Err(e) => {
            eprintln!("report: docs/benchmarks.md is not updated: {e}");
            false
        }
    }
}

fn write(root: &Path) -> Result<()> {
    let data = root.join("docs/benchmarks");
    let mut parts = String::new();
    let mut summary: Vec<(Summary, String)> = vec![];
    for name in [
        "io",
        "gluster",
        "ceph",
        "tree",
        "tree-fewer-requests",
        "tree-noflush",
        "walk",
        "migration",
        "upgrade",
        "crash",
        "tests",
    ] {
        let lines = load(&data, name)?;
        if lines.is_empty() {
            continue;
        }
        let (md, s) = match name {
            "io" => {
                // The round trip has a section of its own, after the rest of the bench's.
                let (rt, rest): (Vec<Line>, Vec<Line>) = lines
                    .iter()
                    .cloned()
                    .partition(|x| text(x, "part") == "roundtrip");
                let (mut md, mut s) = if rest.is_empty() {
                    (String::new(), vec![])
                } else {
                    let (md, mut s) = io_section(&data, name, &rest, &IO)?;
                    for x in &mut s {
                        x.at = Some(measured(&rest, None, false));
                    }
                    (md, s)
                };
                if !rt.is_empty() {
                    let (m, r) = roundtrip_section(&rt);
                    md += &m;
                    s.extend(r);
                }
                (md, s)
            }
            "gluster" => io_section(&data, name, &lines, &GLUSTER)?,
            "ceph" => io_section(&data, name, &lines, &CEPH)?,
            "tree" => tree_section(&data, &lines)?,
            "tree-fewer-requests" | "tree-noflush" => {
                requests_section(name, &lines, &load(&data, "tree")?)?
            }
            "walk" => (walk_section(&data, &lines)?, vec![]),
            "upgrade" => (upgrade_section(&lines), vec![]),
            "crash" => (crash_section(&lines), vec![]),
            "tests" => (tests_section(&lines), vec![]),
            _ => migration_section(&data, &lines)?,
        };
        parts += &md;
        let at = measured(&lines, None, false);
        summary.extend(s.into_iter().map(|s| {
            let at = s.at.clone().unwrap_or_else(|| at.clone());
            (s, at)
        }));
    }
    let rows: Vec<Vec<String>> = summary
        .iter()
        .map(|(s, at)| vec![s.title.clone(), span(&s.rv), span(&s.rn), at.clone()])
        .collect();
    let page = String::from("# Benchmarks\n\n")
        + "<!-- Written by `cargo bench --bench report` from docs/benchmarks/*/results.jsonl: \
           edit tests/report/benchmarks.rs or re-run a bench, not this page. -->\n\n"
        + "vfsd against virtiofsd 1.14, and the limit beside them (native on the host, or the \
           guest's own tmpfs). Every figure was measured on the project's 2-core, 24 GiB \
           machine, guests under QEMU TCG (2 vCPUs, Debian's cloud kernel): absolute figures are \
           far below a KVM host's, so read the ratios, each taken within one run. Each section \
           names the commit and date its figures were measured at and the command that measures \
           them again; the bench rewrites its results.jsonl and this page.\n\n"
        + "Regenerate the page and plots from the saved data: `cargo bench --bench report`.\n\n"
        + "## Summary\n\n"
        + "Each ratio is of speeds, so above 1 vfsd is the faster (for times, the ratio of \
           seconds is turned over); the limit is native or the guest's tmpfs, as each section \
           says. The ranges run over the section's rows.\n\n"
        + &table(
            &[
                "workload",
                "vfsd ÷ virtiofsd (range over rows)",
                "vfsd ÷ limit",
                "measured at",
            ],
            &rows,
        )
        + "\n"
        + parts.trim_end()
        + "\n";
    std::fs::write(root.join("docs/benchmarks.md"), page)?;
    Ok(())
}

/// A section's line in the summary: ratios per row against virtiofsd and against the limit.
struct Summary {
    title: String,
    rv: Vec<Option<f64>>,
    rn: Vec<Option<f64>>,
    /// When its figures were measured, where not the same as the rest of the section's.
    at: Option<String>,
}

impl Summary {
    fn new(title: &str, rv: Vec<Option<f64>>, rn: Vec<Option<f64>>) -> Self {
        let title = title.to_string();
        Summary {
            title,
            rv,
            rn,
            at: None,
        }
    }
}

/// The lines of `workload`'s results.jsonl, each with the command its report.md names
/// where the line has none of its own.
fn load(data: &Path, workload: &str) -> Result<Vec<Line>> {
    let path = data.join(workload).join("results.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(vec![]);
    };
    let mut lines = vec![];
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str(l)? {
            Value::Object(m) => lines.push(m),
            _ => return Err(format!("{}: a line that is not an object", path.display()).into()),
        }
    }
    let report = std::fs::read_to_string(data.join(workload).join("report.md")).unwrap_or_default();
    if let Some(cmd) = written_by(&report) {
        for x in &mut lines {
            x.entry("command").or_insert_with(|| Value::from(cmd));
        }
    }
    Ok(lines)
}

/// The command in the first "Written by `...`" of a bench's report.md.
pub fn written_by(report: &str) -> Option<&str> {
    const MARK: &str = "Written by `";
    let mut rest = report;
    while let Some(i) = rest.find(MARK) {
        rest = &rest[i + MARK.len()..];
        match rest.find('`') {
            Some(0) => continue,
            Some(end) => return Some(&rest[..end]),
            None => return None,
        }
    }
    None
}

fn get<'a>(x: &'a Line, key: &str) -> &'a Value {
    x.get(key).unwrap_or(&Value::Null)
}

fn text(x: &Line, key: &str) -> String {
    show(get(x, key))
}

/// Where the figures come from: commit(s), date(s), and the command (the one saved with
/// the data, else `cmd`).
fn measured(lines: &[Line], cmd: Option<&str>, with_cmd: bool) -> String {
    let sorted_set = |key: &str| {
        let mut v: Vec<String> = lines
            .iter()
            .map(|x| x.get(key).map_or("?".into(), show))
            .collect();
        v.sort();
        v.dedup();
        v.join(", ")
    };
    let mut out = format!("commit {}, {}", sorted_set("commit"), sorted_set("date"));
    let saved = lines[0].get("command").filter(|c| truthy(c)).map(show);
    if let Some(cmd) = saved.or(cmd.map(String::from)).filter(|_| with_cmd) {
        out += &format!(", `{cmd}`");
    }
    out
}

/// (part, row, config) -> the medians over runs of value, MiB/s and CPU µs per operation.
struct Medians(HashMap<(String, String, String), [f64; 3]>);

const VALUE: usize = 0;
const CPU: usize = 2;

impl Medians {
    fn new(lines: &[Line]) -> Self {
        let mut runs: HashMap<_, Vec<&Line>> = HashMap::new();
        for x in lines {
            let key = (text(x, "part"), text(x, "row"), text(x, "config"));
            runs.entry(key).or_default().push(x);
        }
        let fields = ["value", "mib_per_s", "cpu_us_per_op"];
        let m = runs
            .into_iter()
            .map(|(k, v)| {
                let med = fields.map(|f| {
                    median(
                        v.iter()
                            .map(|r| get(r, f).as_f64().unwrap_or(0.0))
                            .collect(),
                    )
                });
                (k, med)
            })
            .collect();
        Medians(m)
    }

    fn get(&self, part: &str, row: &str, config: &str, field: usize) -> Option<f64> {
        let key = (part.to_string(), row.to_string(), config.to_string());
        self.0.get(&key).map(|m| m[field])
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A figure with the precision its size deserves, thousands separated.
fn fmt(v: Option<f64>) -> String {
    let Some(v) = v else { return "-".into() };
    if v.abs() >= 100.0 {
        with_commas(&format!("{v:.0}"))
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn with_commas(digits: &str) -> String {
    let (sign, digits) = digits.strip_prefix('-').map_or(("", digits), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// a ÷ b where both are there and not 0.
fn over(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a != 0.0 && b != 0.0 => Some(a / b),
        _ => None,
    }
}

fn table<S: AsRef<str>>(head: &[&str], rows: &[Vec<S>]) -> String {
    let mut out = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        let cells: Vec<&str> = r.iter().map(AsRef::as_ref).collect();
        out += &format!("| {} |\n", cells.join(" | "));
    }
    out
}

/// The distinct values of `key` in first-seen order.
fn distinct<'a>(lines: impl Iterator<Item = &'a Line>, key: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for x in lines {
        let v = text(x, key);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// A panel of bars per group relative to a limit, leaving out the groups without a figure
/// in any series (no limit to divide by); written to data/workload/file.svg, the page's
/// link to it returned.
fn ratio_bars(
    data: &Path,
    at: (&str, &str),
    groups: &[String],
    series: Vec<(&str, Vec<Option<f64>>)>,
    title: String,
    ylabel: String,
    limit: &str,
) -> Result<String> {
    let keep: Vec<usize> = (0..groups.len())
        .filter(|&i| series.iter().any(|(_, v)| v[i].is_some_and(|x| x != 0.0)))
        .collect();
    let panel = Bars {
        title,
        ylabel,
        groups: keep.iter().map(|&i| groups[i].clone()).collect(),
        series: series
            .iter()
            .map(|(name, v)| {
                (
                    name.to_string(),
                    keep.iter().map(|&i| v[i].unwrap_or(0.0)).collect(),
                )
            })
            .collect(),
        ceiling: Ceiling::Line(1.0, limit.to_string()),
    };
    let width = (90 * keep.len() as u32 + 200).max(600);
    let (workload, file) = at;
    plot::bar_figure(
        &data.join(workload).join(file),
        (width, 360),
        (1, 1),
        &[panel],
    )?;
    Ok(format!("benchmarks/{workload}/{file}"))
}

/// What differs between the io bench's sections: the data's own words.
struct IoSection {
    title: &'static str,
    cmd: &'static str,
    bounds: &'static str,
    limit_cfg: &'static str,
    limit_name: &'static str,
    fio_note: &'static str,
}

const IO: IoSection = IoSection {
    title: "Data I/O on the host's file system",
    cmd: "cargo bench --bench io",
    bounds: "the host's 2 CPUs: native is the page cache with no device in the way, and the load \
             generator shares the cores with the daemon, so a daemon that makes the same syscall \
             and does its own work on top cannot reach native; in the guest, the TCG guest's CPU \
             time per I/O dominates.",
    limit_cfg: "native",
    limit_name: "native",
    fio_note: " (virtiofsd with a pool of 4, its best here); native is the same job run on the \
               host, buffered",
};

const GLUSTER: IoSection = IoSection {
    title: "Data I/O over GlusterFS",
    cmd: "scripts/gluster.sh up && cargo bench --bench io -- --share-root /srv/vfsd-gluster/a \
          --out docs/benchmarks/gluster",
    bounds: "GlusterFS's client (a FUSE mount on the same 2 cores, replica 2 on loopback) for \
             the load generator; in the guest, the TCG guest's own CPU time per I/O.",
    limit_cfg: "tmpfs",
    limit_name: "guest ceiling (vfsd on tmpfs)",
    fio_note: "",
};

const CEPH: IoSection = IoSection {
    title: "Data I/O over CephFS",
    cmd: "scripts/ceph.sh up && cargo bench --bench io -- --share-root /srv/vfsd-ceph/a \
          --out docs/benchmarks/ceph",
    bounds: "ceph-fuse (the host's CephFS client, a FUSE daemon) and the one-node cluster \
             behind it share the 2 cores with the daemon and the load generator; in the guest, \
             the TCG guest's own CPU time per I/O.",
    limit_cfg: "tmpfs",
    limit_name: "guest ceiling (vfsd on tmpfs)",
    fio_note: "",
};

/// The load generator, guest fio and instruction parts of the io bench's results.
fn io_section(
    data: &Path,
    workload: &str,
    lines: &[Line],
    s: &IoSection,
) -> Result<(String, Vec<Summary>)> {
    let m = Medians::new(lines);
    let title = s.title;
    let (mut md, mut summary) = (String::new(), vec![]);
    let rows_of = |part: &str| distinct(lines.iter().filter(|x| text(x, "part") == part), "row");
    let get = |part: &str, row: &str, cfg: &str| m.get(part, row, cfg, VALUE);
    let cpu = |part: &str, row: &str, cfg: &str| m.get(part, row, cfg, CPU);

    let lg = rows_of("loadgen");
    if !lg.is_empty() {
        let (mut rows, mut rv, mut rn, mut dn) = (vec![], vec![], vec![], vec![]);
        for r in &lg {
            let [v, d, b, n] = [
                "vfsd-default",
                "virtiofsd-default",
                "virtiofsd-best",
                "native",
            ]
            .map(|c| get("loadgen", r, c));
            let cpus = format!(
                "{} / {}",
                fmt(cpu("loadgen", r, "vfsd-default")),
                fmt(cpu("loadgen", r, "virtiofsd-default"))
            );
            rows.push(vec![
                r.clone(),
                fmt(v),
                fmt(d),
                fmt(b),
                fmt(n),
                ratio(v, d),
                ratio(v, b),
                ratio(v, n),
                cpus,
            ]);
            rv.push(over(v, d));
            rn.push(over(v, n));
            dn.push(over(d, n));
        }
        let svg = ratio_bars(
            data,
            (workload, "loadgen.svg"),
            &lg,
            vec![("vfsd", rn.clone()), ("virtiofsd", dn)],
            format!("{title}: load generator, ops/s relative to native"),
            "÷ native".into(),
            "native",
        )?;
        md += "### Load generator\n\nOperations per second, medians; vfsd and virtiofsd at their \
               defaults, virtiofsd also at its best pool size (4); native is fio on the host at \
               the same concurrency (a psync thread per request in flight, buffered, as the \
               daemons do). CPU is each daemon's µs per operation. Queues, requests in flight and \
               block size per workload are WORKLOADS in tests/bench/io.rs (4 KiB at 32 in flight \
               for the `-shared` rows and lookup-getattr, 1 MiB at 4 for seqread and seqwrite), \
               `--cache=never`.\n\n";
        md += &table(
            &[
                "workload",
                "vfsd",
                "virtiofsd",
                "virtiofsd, pool 4",
                "native",
                "vfsd ÷ virtiofsd",
                "vfsd ÷ virtiofsd pool 4",
                "vfsd ÷ native",
                "CPU µs/op vfsd / virtiofsd",
            ],
            &rows,
        );
        md += &format!("\n![{title}: load generator]({svg})\n\n");
        summary.push(Summary::new(&format!("{title}: load generator"), rv, rn));
    }

    let fio = rows_of("fio");
    if !fio.is_empty() {
        let has_limit = lines
            .iter()
            .any(|x| text(x, "part") == "fio" && text(x, "config") == s.limit_cfg);
        // Without the section's own limit in the data, native is the limit, and named so.
        let (lim, name) = if has_limit {
            (s.limit_cfg, s.limit_name)
        } else {
            ("native", "native")
        };
        let (mut rows, mut rv, mut rn, mut dn) = (vec![], vec![], vec![], vec![]);
        for r in &fio {
            let (v, d, n) = (
                get("fio", r, "vfsd"),
                get("fio", r, "virtiofsd"),
                get("fio", r, lim),
            );
            let mut row = vec![r.clone(), fmt(v), fmt(d), fmt(n), ratio(v, d), ratio(v, n)];
            if lim != "native" {
                let native = get("fio", r, "native");
                row.extend([fmt(native), ratio(v, native)]);
            }
            rows.push(row);
            rv.push(over(v, d));
            rn.push(over(v, n));
            dn.push(over(d, n));
        }
        let (iops, versus) = (format!("{name} IOPS"), format!("vfsd ÷ {name}"));
        let mut head = vec![
            "fio job",
            "vfsd IOPS",
            "virtiofsd IOPS",
            &iops,
            "vfsd ÷ virtiofsd",
            &versus,
        ];
        if lim != "native" {
            head.extend(["native IOPS", "vfsd ÷ native"]);
        }
        let svg = ratio_bars(
            data,
            (workload, "fio.svg"),
            &fio,
            vec![("vfsd", rn.clone()), ("virtiofsd", dn)],
            format!("{title}: fio in a guest, IOPS relative to {name}"),
            format!("÷ {name}"),
            name,
        )?;
        md += &format!(
            "### fio in a guest\n\nA TCG guest with 2 vCPUs, `--cache=never`{}, medians; {name} \
             is the limit beside the daemons.\n\n",
            s.fio_note
        );
        md += &table(&head, &rows);
        md += &format!("\n![{title}: guest fio]({svg})\n\n");
        summary.push(Summary::new(&format!("{title}: guest fio"), rv, rn));
    }

    if lines.iter().any(|x| text(x, "part") == "instr") {
        let (v, d) = (
            get("instr", "untar", "vfsd"),
            get("instr", "untar", "virtiofsd"),
        );
        md += "### Instructions per operation\n\nUser-space instructions per operation of the \
               load generator's untar workload, one request in flight (callgrind).\n\n";
        md += &table(
            &["vfsd", "virtiofsd", "vfsd ÷ virtiofsd"],
            &[vec![fmt(v), fmt(d), ratio(v, d)]],
        );
        md += "\n";
    }
    let head = format!(
        "## {title}\n\nMeasured at {}. To run again: `{}`.\n\n**What bounds it:** {}\n\n",
        measured(lines, None, true),
        s.cmd,
        s.bounds
    );
    Ok((head + &md, summary))
}

/// The io bench's round trip: one request at a time, per operation and gap, each daemon's
/// p50 and p99 latency and CPU per operation, beside the host's own syscall.
fn roundtrip_section(lines: &[Line]) -> (String, Vec<Summary>) {
    let m = Medians::new(lines);
    let rows = distinct(lines.iter(), "row");
    let cols = distinct(lines.iter(), "config");
    let p50 = |row: &str, col: &str| m.get("roundtrip", row, col, VALUE);
    let cpu = |row: &str, col: &str| m.get("roundtrip", row, col, CPU);
    let p99 = |row: &str, col: &str| {
        let v: Vec<f64> = lines
            .iter()
            .filter(|x| text(x, "row") == row && text(x, "config") == col)
            .filter_map(|x| get(x, "result")["lat_us_p99"].as_f64())
            .collect();
        (!v.is_empty()).then(|| median(v))
    };
    let daemons: Vec<&String> = cols.iter().filter(|c| *c != "host").collect();
    let vfsds: Vec<&String> = daemons
        .iter()
        .copied()
        .filter(|c| c.starts_with("vfsd"))
        .collect();
    // virtiofsd's best configuration, row by row.
    let best = |row: &str| {
        daemons
            .iter()
            .filter(|c| c.starts_with("virtiofsd"))
            .filter_map(|c| p50(row, c))
            .reduce(f64::min)
    };
    let mut head: Vec<String> = vec!["operation".into()];
    head.extend(daemons.iter().map(|c| c.to_string()));
    head.push("host".into());
    head.extend(vfsds.iter().map(|c| format!("{c} ÷ best virtiofsd")));
    head.extend(vfsds.iter().map(|c| format!("{c} ÷ host")));
    let (mut table_rows, mut rv, mut rn) = (vec![], vec![], vec![]);
    for r in &rows {
        let mut row = vec![r.clone()];
        for c in daemons
            .iter()
            .copied()
            .chain(cols.iter().filter(|c| *c == "host"))
        {
            row.push(match p50(r, c) {
                Some(v) => format!("{} / {} ({})", fmt(Some(v)), fmt(p99(r, c)), fmt(cpu(r, c))),
                None => "-".into(),
            });
        }
        if !cols.iter().any(|c| c == "host") {
            row.push("-".into());
        }
        row.extend(vfsds.iter().map(|c| ratio(p50(r, c), best(r))));
        row.extend(vfsds.iter().map(|c| ratio(p50(r, c), p50(r, "host"))));
        table_rows.push(row);
        // Speeds: above 1, vfsd (its defaults) answers sooner.
        rv.push(over(best(r), p50(r, "vfsd")));
        rn.push(over(p50(r, "host"), p50(r, "vfsd")));
    }
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    let title = "Round trip, one request at a time";
    let mut md = format!(
        "## {title}\n\nMeasured at {}. To run again: `cargo bench --bench io -- --parts \
         roundtrip` (as root).\n\n**What bounds it:** the host's own syscall, which every \
         daemon makes on top of taking the request off the ring and putting the reply back.\n\n",
        measured(lines, None, true)
    );
    md += "`vfsd-bench` keeps one request in flight on one queue, `--cache=never`, and \
           times each operation from its submission to its reply; the daemon's CPU is per \
           operation (for CREATE with its RELEASE, UNLINK and FORGET, sent after it and not \
           timed). Each cell is p50 / p99 in µs (CPU µs per operation), medians over the runs. \
           **No gap:** each request follows the last reply at once, so the daemon is awake: \
           its round trip alone. **100 µs gap:** a guest doing one syscall at a time with \
           work in between; the daemon goes idle between requests and its wake-up is in each \
           figure. **host:** the same syscall made on the host, on the same kind of file and \
           paced alike (`fstatat` for LOOKUP and GETATTR, `pread`, `pwrite`, `openat(O_CREAT)` \
           then `close` and `unlink` untimed): the limit. The ratios are of p50s, below 1 \
           faster; best virtiofsd is the quicker of its configurations, row by row. \
           The daemons are RT_DAEMONS in tests/bench/io.rs.\n\n";
    md += &table(&head, &table_rows);
    md += "\n";
    let mut s = Summary::new(&format!("{title}: p50 (best virtiofsd's ÷ vfsd's)"), rv, rn);
    s.at = Some(measured(lines, None, false));
    (md, vec![s])
}

/// The tree bench's figures: the last line of each daemon, mode and step, and of each
/// step on the guest's tmpfs (lines saved later replace earlier ones).
type LastLines<'a> = (
    HashMap<(String, String, String), &'a Line>,
    HashMap<String, &'a Line>,
);

fn last_lines(lines: &[Line]) -> LastLines<'_> {
    let (mut by, mut tmpfs) = (HashMap::new(), HashMap::new());
    for x in lines {
        by.insert((text(x, "daemon"), text(x, "mode"), text(x, "step")), x);
        if text(x, "daemon") == "tmpfs" {
            tmpfs.insert(text(x, "step"), x);
        }
    }
    (by, tmpfs)
}

fn tree_section(data: &Path, lines: &[Line]) -> Result<(String, Vec<Summary>)> {
    let is_tmpfs = |x: &&Line| text(x, "daemon") == "tmpfs";
    let modes = distinct(lines.iter().filter(|x| !is_tmpfs(x)), "mode");
    let steps = distinct(lines.iter(), "step");
    let (by, tmpfs) = last_lines(lines);
    let secs = |x: Option<&&Line>| x.and_then(|x| get(x, "seconds").as_f64());
    let field = |x: Option<&&Line>, key: &str| x.map_or("-".into(), |x| text(x, key));
    let (mut md, mut rv, mut rn, mut panels) = (String::new(), vec![], vec![], vec![]);
    for mode in &modes {
        let (mut rows, mut sv, mut sd, mut sc) = (vec![], vec![], vec![], vec![]);
        for s in &steps {
            let v = by.get(&("vfsd".into(), mode.clone(), s.clone()));
            let d = by.get(&("virtiofsd".into(), mode.clone(), s.clone()));
            let t = tmpfs.get(s);
            let (vs, ds, ts) = (secs(v), secs(d), secs(t));
            let cpu = |x: Option<&&Line>| fmt(x.and_then(|x| get(x, "daemon_cpu_s").as_f64()));
            rows.push(vec![
                s.clone(),
                fmt(vs),
                fmt(ds),
                fmt(ts),
                ratio(ds, vs),
                ratio(ts, vs),
                format!("{} / {}", field(v, "requests"), field(d, "requests")),
                format!("{} / {}", cpu(v), cpu(d)),
            ]);
            sv.push(vs.unwrap_or(0.0));
            sd.push(ds.unwrap_or(0.0));
            sc.push(ts.filter(|t| *t != 0.0));
            if let Some(r) = over(ds, vs) {
                rv.push(Some(r));
            }
            if let Some(r) = over(ts, vs) {
                rn.push(Some(r));
            }
        }
        md += &format!("### `--cache={mode}`\n\n");
        md += &table(
            &[
                "step",
                "vfsd s",
                "virtiofsd s",
                "guest tmpfs s",
                "speed-up (virtiofsd s ÷ vfsd s)",
                "tmpfs s ÷ vfsd s",
                "FUSE requests vfsd / virtiofsd",
                "daemon CPU s vfsd / virtiofsd",
            ],
            &rows,
        );
        md += "\n";
        panels.push(Bars {
            title: format!("cache mode {mode}"),
            ylabel: "seconds (lower is better)".into(),
            groups: steps.clone(),
            series: vec![("vfsd".into(), sv), ("virtiofsd".into(), sd)],
            ceiling: Ceiling::PerGroup(sc, "guest tmpfs (ceiling)".into()),
        });
    }
    let size = (900, 260 * panels.len().max(1) as u32);
    plot::bar_figure(
        &data.join("tree/tree.svg"),
        size,
        (panels.len().max(1), 1),
        &panels,
    )?;
    let cmd = "cargo bench --bench requests";
    let head = format!(
        "## A source tree in a guest, per cache mode\n\nMeasured at {}. To run again: `{cmd}` \
         (`-- --modes auto --daemons vfsd,virtiofsd,tmpfs --steps untar,cat-all` for a part). \
         The daemons' rows and the tmpfs rows may come from different runs: see the commits per \
         line in tree/results.jsonl.\n\n",
        measured(lines, Some(cmd), true)
    )
        + "A TCG guest (2 vCPUs) per daemon and cache mode runs guest-tests/tree-bench.sh on a \
         source tree of 4,683 entries (untar, find, reading every file alone and two at a time, \
         cp -a, rm -rf, two copies and two extractions at once, small files); vfsd has a request \
         queue per vCPU, virtiofsd its one. The same steps on the guest's own tmpfs, with no \
         daemon, are the ceiling. FUSE requests are counted in the guest kernel; times are one \
         run each.\n\n\
         **What bounds it:** the TCG guest's own CPU: its side of each FUSE request costs more \
         than either daemon's, so the speed-up of any daemon is bounded by the tmpfs column.\n\n";
    let md = head + &md + "![tree steps per cache mode](benchmarks/tree/tree.svg)\n\n";
    Ok((
        md,
        vec![Summary::new(
            "Source tree in a guest, per step and cache mode",
            rv,
            rn,
        )],
    ))
}

/// The tree steps with vfsd's options for fewer requests (`--vfsd-args` of the request
/// bench, written to docs/benchmarks/`name`) beside the same run's virtiofsd and tmpfs, if
/// it ran them, and vfsd's defaults from the tree run (`defaults`).
fn requests_section(
    name: &str,
    lines: &[Line],
    defaults: &[Line],
) -> Result<(String, Vec<Summary>)> {
    let is = |x: &Line, d: &str| text(x, "daemon") == d;
    let modes = distinct(lines.iter().filter(|x| !is(x, "tmpfs")), "mode");
    let steps = distinct(lines.iter(), "step");
    let options = lines
        .iter()
        .find(|x| is(x, "vfsd"))
        .map_or(String::new(), |x| text(x, "options"));
    let daemons: Vec<&str> = ["vfsd", "virtiofsd", "tmpfs"]
        .into_iter()
        .filter(|d| lines.iter().any(|x| is(x, d)))
        .collect();
    let with_tmpfs = daemons.contains(&"tmpfs");
    // A run of some of the steps names them in its command.
    let all_steps = distinct(defaults.iter(), "step");
    let only = if steps.iter().all(|s| all_steps.contains(s)) && steps.len() < all_steps.len() {
        format!(" --steps {}", steps.join(","))
    } else {
        String::new()
    };
    let (by, tmpfs) = last_lines(lines);
    let (by_default, _) = last_lines(defaults);
    let req = |x: Option<&&Line>| x.and_then(|x| get(x, "requests").as_f64());
    let secs = |x: Option<&&Line>| x.and_then(|x| get(x, "seconds").as_f64());
    let count = |v: Option<f64>| v.map_or("-".into(), |v| with_commas(&(v as u64).to_string()));
    let (mut md, mut rv, mut rn) = (String::new(), vec![], vec![]);
    for mode in &modes {
        let mut rows = vec![];
        for s in &steps {
            let key = |d: &str| (d.to_string(), mode.clone(), s.clone());
            let (v, d) = (by.get(&key("vfsd")), by.get(&key("virtiofsd")));
            let t = tmpfs.get(s);
            let b = by_default.get(&key("vfsd"));
            let (vs, ds, ts) = (secs(v), secs(d), secs(t));
            let mut row = vec![
                s.clone(),
                count(req(b)),
                count(req(v)),
                count(req(d)),
                ratio(req(v), req(d)),
                fmt(vs),
                fmt(ds),
                ratio(ds, vs),
            ];
            if with_tmpfs {
                row.push(ratio(ts, vs));
            }
            rows.push(row);
            rv.extend(over(ds, vs).map(Some));
            rn.extend(over(ts, vs).map(Some));
        }
        md += &format!("### `--cache={mode}`\n\n");
        let head = [
            "step",
            "vfsd requests, defaults",
            "vfsd requests, with the options",
            "virtiofsd requests",
            "requests vfsd ÷ virtiofsd",
            "vfsd s",
            "virtiofsd s",
            "speed-up (virtiofsd s ÷ vfsd s)",
            "tmpfs s ÷ vfsd s",
        ];
        md += &table(&head[..head.len() - usize::from(!with_tmpfs)], &rows);
        md += "\n";
    }
    let cmd = format!(
        "cargo bench --bench requests -- --modes {} --daemons {}{only} \
         --vfsd-args '{options}' --out docs/benchmarks/{name}",
        modes.join(","),
        daemons.join(",")
    );
    let head = format!(
        "## Fewer requests: the source tree with `{options}`\n\nMeasured at {}. To run again: \
         `{cmd}`. The defaults column is vfsd's requests from \"A source tree in a guest\" \
         (the counts are the guest kernel's and repeat from run to run); {} ran in this run. \
         What each option changes for the guest: docs/features.md (fewer round trips); which \
         requests no daemon can avoid: docs/design.md (requests per file).\n\n",
        measured(lines, None, false),
        daemons[1..].join(" and ")
    );
    Ok((
        head + &md,
        vec![Summary::new(
            &format!("Source tree in a guest, vfsd with `{options}`"),
            rv,
            rn,
        )],
    ))
}

fn int(x: &Line, key: &str) -> i64 {
    get(x, key).as_i64().unwrap_or(0)
}

fn walk_section(data: &Path, lines: &[Line]) -> Result<String> {
    let per_file: Vec<i64> = lines
        .iter()
        .map(|x| (int(x, "peak_rss_kib") * 1024).div_euclid(int(x, "files").max(1)))
        .collect();
    let rows: Vec<Vec<String>> = lines
        .iter()
        .zip(&per_file)
        .map(|(x, per_file)| {
            let rss = get(x, "peak_rss_kib").as_f64().map(|k| k / 1024.0);
            vec![
                text(x, "daemon"),
                with_commas(&int(x, "peak_fds").to_string()),
                rss.map_or("-".into(), |r| fmt(Some(r)) + " MiB"),
                per_file.to_string(),
                text(x, "seconds"),
                text(x, "walk"),
            ]
        })
        .collect();

    let (mut fds, mut rss) = (vec![], vec![]);
    for x in lines {
        let daemon = text(x, "daemon");
        let Ok(csv) = std::fs::read_to_string(data.join("walk").join(format!("{daemon}.csv")))
        else {
            continue;
        };
        let (mut f, mut r) = (vec![], vec![]);
        for l in csv.lines().skip(1).filter(|l| !l.is_empty()) {
            let cols: Vec<f64> = l
                .split(',')
                .map(|c| c.trim().parse().unwrap_or(0.0))
                .collect();
            if let [t, fd, kib] = cols[..] {
                f.push((t, fd));
                r.push((t, kib / 1024.0));
            }
        }
        fds.push((daemon.clone(), f));
        rss.push((daemon, r));
    }
    let panels = [
        Lines {
            title: "open fds".into(),
            xlabel: "seconds".into(),
            series: fds,
            limit: Some((10000.0, "vfsd's bound (half its fd limit of 20,000)".into())),
        },
        Lines {
            title: "RSS (MiB)".into(),
            xlabel: "seconds".into(),
            series: rss,
            limit: None,
        },
    ];
    plot::line_figure(&data.join("walk/walk.svg"), (900, 320), &panels)?;

    let files = with_commas(&int(&lines[0], "files").to_string());
    let cmd = "cargo bench --bench walk";
    let (lo, hi) = (
        per_file.iter().min().unwrap_or(&0),
        per_file.iter().max().unwrap_or(&0),
    );
    let mut md = format!(
        "## fds and memory under a walk of {files} files\n\nMeasured at {}. To run again: \
         `{cmd}` (1,000,000 files by default).\n\n\
         A TCG guest runs `find | wc -l`, then `du -s`, over {files} host-made files \
         (directories of 1,000) on a read-only share, cache mode auto (the guest keeps every \
         inode it has seen); each daemon with its defaults plus `--xattr`. The host samples the \
         open fds and RSS of the daemon's serving process every second (walk/*.csv). vfsd ran \
         with an fd limit of 20,000, so its bound was 10,000.\n\n\
         **What bounds it:** vfsd keeps its nodes' O_PATH fds as a cache bounded by half its fd \
         limit (at most 65,536), and RSS grows with the files the guest knows ({lo}-{hi} bytes \
         each here) until the guest forgets them; the walk's time moves by tens of percent \
         between runs on this machine, so it is not a speed figure.\n\n",
        measured(lines, Some(cmd), true)
    );
    md += &table(
        &[
            "daemon",
            "peak fds",
            "peak RSS",
            "RSS bytes per file",
            "wall s",
            "walk",
        ],
        &rows,
    );
    Ok(md + "\n![fds and RSS during the walk](benchmarks/walk/walk.svg)\n\n")
}

fn upgrade_section(lines: &[Line]) -> String {
    let cmd = "cargo bench --bench upgrade -- --only upgrade";
    let mut md = format!(
        "## Upgrade in place\n\nMeasured at {}. To run again: `{cmd}` (as root).\n\n",
        measured(lines, Some(cmd), false)
    );
    md += "vfsd started from a copy of its binary knows the files a LOOKUP of each found (in \
           directories of 1,000) and holds 64 of them open; a thread sends GETATTRs back to \
           back through the test frontend's socket and virtqueues while the copy is replaced \
           and the supervisor gets SIGUSR2 (docs/upgrade.md). The pause is the largest gap \
           between two answers, over each round; a round ends once the supervisor itself \
           runs the new file.\n\n\
           **What bounds it:** the new process's start (sandbox, its threads) and its load of \
           the state: each node found again by its name, each open file passed over the \
           handover socket. Targets: 100 ms at 1,000 nodes, 1 s at 100,000.\n\n";
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|x| {
            let ms = |k| format!("{:.0} ms", get(x, k).as_f64().unwrap_or(0.0));
            vec![
                with_commas(&int(x, "nodes").to_string()),
                text(x, "rounds"),
                ms("median_ms"),
                ms("max_ms"),
                text(x, "load"),
            ]
        })
        .collect();
    md += &table(
        &[
            "files known",
            "rounds",
            "median pause",
            "max pause",
            "host load (1 min)",
        ],
        &rows,
    );
    md + "\n"
}

fn crash_section(lines: &[Line]) -> String {
    let cmd = "cargo bench --bench upgrade -- --only crash";
    let mut md = format!(
        "## Surviving a crash\n\nMeasured at {}. To run again: `{cmd}` (as root).\n\n",
        measured(lines, Some(cmd), false)
    );
    md += "As for an upgrade, vfsd knows the files a LOOKUP of each found (in directories of \
           1,000) and holds 64 of them open while a thread sends GETATTRs back to back through \
           the test frontend's socket and virtqueues; here the serving process (the \
           supervisor's deepest child) is killed with SIGKILL, ten times on one daemon, as many \
           as the crash-loop bound lets it survive within 60 s (docs/upgrade.md, \"A crash of \
           the serving process\"). The pause is the largest gap between two answers, over each \
           round; a round ends once the dead process's keeper is gone and a new serving process \
           has answered. After each round the vhost-user connection must answer GET_FEATURES, \
           a READ on one of the handles opened before the first kill must return its file's \
           bytes, and a GETATTR of every known node must find it (as must the probing ones); \
           the table counts the rounds where each held (a round that lost the connection has \
           no pause, and ends its node count's rounds).\n\n\
           **What bounds it:** the new process's start (sandbox, its threads), its take of the \
           crash record and the dead process's fds from the keeper (in batches of 200) and its \
           load of the handles and lock owners with those fds and of the nodes, found again by \
           name, then the replay of the frontend's \
           set-up; the requests in flight are answered when the rings start again.\n\n";
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|x| {
            let ms = |k| {
                get(x, k)
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.0} ms"))
            };
            let of = |k| format!("{} of {}", text(x, k), text(x, "rounds"));
            vec![
                with_commas(&int(x, "nodes").to_string()),
                text(x, "rounds"),
                ms("median_ms"),
                ms("max_ms"),
                of("connection_kept"),
                of("read_right"),
                of("all_nodes_answer"),
                text(x, "load"),
            ]
        })
        .collect();
    md += &table(
        &[
            "files known",
            "rounds",
            "median pause",
            "max pause",
            "connection kept",
            "READ right",
            "all nodes answer",
            "host load (1 min)",
        ],
        &rows,
    );
    // A take-over that did not bring every node back leaves the later rounds measuring
    // something else, which the page must say.
    for x in lines {
        let rounds = get(x, "per_round").as_array().cloned().unwrap_or_default();
        let wrong = rounds.iter().enumerate().find(|(_, r)| {
            r.get("nodes_lost").and_then(Value::as_u64).unwrap_or(0) > 0
                || r.get("probe_errors").and_then(Value::as_u64).unwrap_or(0) > 0
        });
        if let Some((i, r)) = wrong {
            let n = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
            md += &format!(
                "\n**Nodes lost** at {} files known: after round {}, {} known nodes were gone to \
                 a GETATTR and {} of the probing GETATTRs failed; that round's take-over and \
                 the later ones did not bring every node back, so their pauses are not those of \
                 a whole take-over.\n",
                with_commas(&int(x, "nodes").to_string()),
                i + 1,
                with_commas(&n("nodes_lost").to_string()),
                with_commas(&n("probe_errors").to_string()),
            );
        }
    }
    md + "\n"
}

/// Figures that tests print beside what they check, saved by hand in
/// docs/benchmarks/tests/results.jsonl: a line per figure, with what it is, the commit and
/// date it was measured at and the command that prints it again.
fn tests_section(lines: &[Line]) -> String {
    let mut md = String::from(
        "## Figures the tests print\n\nSome tests print what they measure beside what they \
         check (`--nocapture` shows it); these figures were saved from such runs, and the \
         command under each prints them again.\n\n",
    );
    for x in lines {
        md += &format!(
            "### {}\n\nMeasured at commit {}, {}. To run again: `{}`.\n\n{}\n\n",
            text(x, "what"),
            text(x, "commit"),
            text(x, "date"),
            text(x, "command"),
            text(x, "figure"),
        );
    }
    md
}

fn migration_section(data: &Path, lines: &[Line]) -> Result<(String, Vec<Summary>)> {
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|x| {
            let total = get(x, "total_ms").as_f64().unwrap_or(0.0) / 1000.0;
            let raw = text(x, "raw");
            vec![
                text(x, "daemon"),
                text(x, "share"),
                format!("{total:.1} s"),
                format!("{} ms", text(x, "downtime_ms")),
                format!("{} MiB", text(x, "ram_mib")),
                text(x, "lines_written"),
                text(x, "result"),
                format!("[{raw}](benchmarks/migration/{raw})"),
            ]
        })
        .collect();
    let on_a_directory = "cargo test --release --test guest -- --include-ignored --nocapture \
                          migration::live_migration_through_a_socket";
    let on_gluster = "scripts/gluster.sh up && cargo test --release --features gluster-tests \
                      --test guest -- --include-ignored --nocapture \
                      gluster::gluster_live_migration";
    let mut md = format!(
        "## Live migration\n\nMeasured at {}. To run again: `{on_a_directory}` for a host \
         directory (fio across the switch), `{on_gluster}` for GlusterFS, and the same with \
         `VFSD_TEST_DAEMON=virtiofsd` in front for virtiofsd 1.14: these guest tests print \
         each migration's total time, downtime and RAM sent from the source's \
         `query-migrate`.\n\n",
        measured(lines, None, false)
    );
    md += "A TCG guest (2 vCPUs, 1 GiB) moves between two QEMU 10.0.2 processes on this host, \
           each with its own daemon, while it writes a line every ~100 ms and, in the fio rows, \
           runs crc32c-verified direct and buffered I/O across the switch.\n\n\
           **What bounds it:** copying the guest's RAM (about 230 MiB in 3-4 passes under TCG); \
           the daemon's own state is a few hundred bytes, and the downtime is QEMU's \
           stop-and-copy.\n\n";
    md += &table(
        &[
            "daemon",
            "share",
            "total",
            "downtime",
            "RAM sent",
            "guest lines",
            "result",
            "raw summary",
        ],
        &rows,
    );

    // Per share (in first-seen order), each daemon's last line.
    let of = |daemon: &str| {
        let mut out: Vec<(String, &Line)> = vec![];
        for x in lines.iter().filter(|x| text(x, "daemon") == daemon) {
            let share = text(x, "share");
            match out.iter_mut().find(|(s, _)| *s == share) {
                Some(slot) => slot.1 = x,
                None => out.push((share, x)),
            }
        }
        out
    };
    let (vf, vd) = (of("vfsd"), of("virtiofsd"));
    let find = |d: &[(String, &Line)], share: &str, key: &str| {
        d.iter()
            .find(|(s, _)| s == share)
            .map(|(_, x)| get(x, key).as_f64().unwrap_or(0.0))
    };
    let rv: Vec<Option<f64>> = vf
        .iter()
        .filter_map(|(s, x)| Some(find(&vd, s, "downtime_ms")? / get(x, "downtime_ms").as_f64()?))
        .map(Some)
        .collect();
    let shares: Vec<&String> = vf.iter().map(|(s, _)| s).collect();
    let panels: Vec<Bars> = [("total_ms", "total (ms)"), ("downtime_ms", "downtime (ms)")]
        .iter()
        .map(|(key, unit)| Bars {
            title: format!("{unit}, lower is better"),
            ylabel: String::new(),
            groups: shares
                .iter()
                .map(|s| s.split(':').next().unwrap_or(s).to_string())
                .collect(),
            series: [("vfsd", &vf), ("virtiofsd", &vd)]
                .iter()
                .map(|(name, d)| {
                    let values = shares
                        .iter()
                        .map(|s| find(d, s, key).unwrap_or(0.0))
                        .collect();
                    (name.to_string(), values)
                })
                .collect(),
            ceiling: Ceiling::None,
        })
        .collect();
    plot::bar_figure(
        &data.join("migration/migration.svg"),
        (900, 320),
        (1, 2),
        &panels,
    )?;
    md += "\n![live migration: total time and downtime](benchmarks/migration/migration.svg)\n";
    let title = "Live migration: downtime (virtiofsd ÷ vfsd, higher is better for vfsd)";
    Ok((md + "\n", vec![Summary::new(title, rv, vec![])]))
}

/// The range of a section's ratios: "min-max", one figure, or "-" for none.
fn span(v: &[Option<f64>]) -> String {
    let v: Vec<f64> = v.iter().flatten().copied().filter(|x| *x != 0.0).collect();
    let (Some(lo), Some(hi)) = (
        v.iter().copied().reduce(f64::min),
        v.iter().copied().reduce(f64::max),
    ) else {
        return "-".into();
    };
    if v.len() == 1 {
        format!("{lo:.2}")
    } else {
        format!("{lo:.2}-{hi:.2}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_later_line_of_a_step_replaces_an_earlier_commits_figures() {
        use super::*;
        let line = |commit: &str, daemon: &str, secs: f64, requests: u32| {
            format!(
                r#"{{"commit":"{commit}","date":"2026-01-0{}","daemon":"{daemon}","mode":"auto","step":"untar","seconds":{secs},"daemon_cpu_s":1.5,"requests":{requests}}}"#,
                if commit == "aaa" { 1 } else { 2 }
            )
        };
        let results = [
            line("aaa", "vfsd", 20.0, 900),
            line("aaa", "virtiofsd", 10.0, 800),
            line("bbb", "vfsd", 5.0, 700),
            r#"{"commit":"bbb","date":"2026-01-02","daemon":"tmpfs","step":"untar","seconds":2.5}"#
                .into(),
        ]
        .join("\n");
        let dir = crate::tree_with(&[("docs/benchmarks/tree/results.jsonl", &results)]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(
            md.contains("| untar | 5.00 | 10.0 | 2.50 | 2.00 | 0.50 | 700 / 800 | 1.50 / 1.50 |\n"),
            "{md}"
        );
        assert!(md.contains(
            "Measured at commit aaa, bbb, 2026-01-01, 2026-01-02, `cargo bench --bench requests`."
        ));
        assert!(md.contains(
            "| Source tree in a guest, per step and cache mode | 2.00 | 0.50 | commit aaa, bbb, 2026-01-01, 2026-01-02 |"
        ));
        assert!(md.contains("](benchmarks/tree/tree.svg)"));
        assert!(dir.path().join("docs/benchmarks/tree/tree.svg").exists());
        // Sections without results are left out.
        assert!(!md.contains("## Data I/O"), "{md}");
    }

    #[test]
    fn a_run_with_options_names_its_daemons_and_steps_in_its_command() {
        use super::*;
        let line = |daemon: &str, step: &str, secs: f64, requests: u32| {
            format!(
                r#"{{"commit":"ccc","date":"2026-01-03","daemon":"{daemon}","options":"--no-posix-lock","mode":"metadata","step":"{step}","seconds":{secs},"requests":{requests}}}"#
            )
        };
        let defaults = ["untar", "cat-all", "create"]
            .map(|s| line("vfsd", s, 4.0, 400).replace("\"options\":\"--no-posix-lock\",", ""))
            .join("\n");
        let some = [
            line("vfsd", "cat-all", 3.0, 300),
            line("virtiofsd", "cat-all", 6.0, 400),
        ]
        .join("\n");
        let dir = crate::tree_with(&[
            ("docs/benchmarks/tree/results.jsonl", &defaults),
            ("docs/benchmarks/tree-noflush/results.jsonl", &some),
        ]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(md.contains(
            "`cargo bench --bench requests -- --modes metadata --daemons vfsd,virtiofsd --steps \
             cat-all --vfsd-args '--no-posix-lock' --out docs/benchmarks/tree-noflush`"
        ), "{md}");
        assert!(md.contains("virtiofsd ran in this run."), "{md}");
        // No tmpfs in the run: no column for it.
        assert!(
            md.contains("| cat-all | 400 | 300 | 400 | 0.75 | 3.00 | 6.00 | 2.00 |\n"),
            "{md}"
        );
    }

    #[test]
    fn io_figures_are_medians_of_the_runs_and_the_command_comes_from_the_report() {
        use super::*;
        let line = |config: &str, run: u32, value: f64| {
            format!(
                r#"{{"commit":"ccc","date":"2026-02-03","part":"loadgen","row":"seqread","config":"{config}","run":{run},"value":{value},"cpu_us_per_op":{}}}"#,
                value / 100.0
            )
        };
        let results = [
            line("vfsd-default", 1, 1000.0),
            line("vfsd-default", 2, 3000.0),
            line("vfsd-default", 3, 2000.0),
            line("virtiofsd-default", 1, 500.0),
            line("virtiofsd-default", 2, 1500.0),
        ]
        .join("\n");
        let report = "# Data I/O\n\nWritten by `cargo bench --bench io -- --quick` at ccc.\n";
        let dir = crate::tree_with(&[
            ("docs/benchmarks/io/results.jsonl", &results),
            ("docs/benchmarks/io/report.md", report),
        ]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(
            md.contains("| seqread | 2,000 | 1,000 | - | - | 2.00 | - | - | 20.0 / 10.0 |\n"),
            "{md}"
        );
        assert!(
            md.contains("Measured at commit ccc, 2026-02-03, `cargo bench --bench io -- --quick`.")
        );
        // No native figure: the ratio to the limit has nothing to span.
        assert!(md.contains("| Data I/O on the host's file system: load generator | 2.00 | - | commit ccc, 2026-02-03 |"));
        assert!(dir.path().join("docs/benchmarks/io/loadgen.svg").exists());
    }

    #[test]
    fn the_round_trip_has_its_own_section_with_p50_p99_cpu_and_the_host_beside() {
        use super::*;
        let line = |row: &str, config: &str, run: u32, p50: f64| {
            format!(
                r#"{{"commit":"rrr","date":"2026-06-07","command":"cargo bench --bench io -- --parts roundtrip","part":"roundtrip","row":"{row}","config":"{config}","run":{run},"value":{p50},"cpu_us_per_op":{},"result":{{"lat_us_p99":{}}}}}"#,
                p50 / 2.0,
                p50 * 3.0
            )
        };
        let mut results = vec![];
        for run in 1..=3 {
            let r = f64::from(run);
            for (config, p50) in [
                ("vfsd", 10.0),
                ("virtiofsd", 30.0),
                ("virtiofsd-pool4", 20.0),
                ("host", 1.0),
            ] {
                results.push(line("GETATTR, 100 µs gap", config, run, p50 * r));
            }
        }
        // A loadgen line measured elsewhere keeps its own command.
        results.push(
            r#"{"commit":"lll","date":"2026-06-01","command":"cargo bench --bench io -- --quick","part":"loadgen","row":"seqread","config":"vfsd-default","run":1,"value":5.0}"#
                .into(),
        );
        let dir = crate::tree_with(&[("docs/benchmarks/io/results.jsonl", &results.join("\n"))]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(
            md.contains(
                "| operation | vfsd | virtiofsd | virtiofsd-pool4 | host | vfsd ÷ best virtiofsd | vfsd ÷ host |\n"
            ),
            "{md}"
        );
        // Medians of the three runs: p50 20, p99 60, CPU 10 for vfsd.
        assert!(
            md.contains(
                "| GETATTR, 100 µs gap | 20.0 / 60.0 (10.0) | 60.0 / 180 (30.0) | 40.0 / 120 (20.0) | 2.00 / 6.00 (1.00) | 0.50 | 10.00 |\n"
            ),
            "{md}"
        );
        assert!(md.contains("Measured at commit rrr, 2026-06-07, `cargo bench --bench io -- --parts roundtrip`."), "{md}");
        assert!(
            md.contains("Measured at commit lll, 2026-06-01, `cargo bench --bench io -- --quick`."),
            "{md}"
        );
        assert!(md.contains("| Round trip, one request at a time: p50 (best virtiofsd's ÷ vfsd's) | 2.00 | 0.10 | commit rrr, 2026-06-07 |"), "{md}");
        assert!(md.contains("| Data I/O on the host's file system: load generator | - | - | commit lll, 2026-06-01 |"), "{md}");
    }

    #[test]
    fn the_crash_section_counts_the_rounds_that_kept_the_connection() {
        use super::*;
        let results = [
            r#"{"commit":"ddd","date":"2026-03-04","nodes":100000,"rounds":3,"load":"1.25","median_ms":95.7,"max_ms":95.7,"pauses_ms":[30.1,95.7],"connection_kept":2,"read_right":1,"all_nodes_answer":1,"per_round":[{"nodes_lost":0,"probe_errors":0},{"nodes_lost":80208,"probe_errors":0},{"nodes_lost":null}]}"#,
            r#"{"commit":"ddd","date":"2026-03-04","nodes":1000,"rounds":3,"load":"1.5","median_ms":null,"max_ms":null,"pauses_ms":[],"connection_kept":0,"read_right":0,"all_nodes_answer":0}"#,
        ]
        .join("\n");
        let dir = crate::tree_with(&[("docs/benchmarks/crash/results.jsonl", &results)]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(md.contains("## Surviving a crash\n"), "{md}");
        assert!(
            md.contains(
                "Measured at commit ddd, 2026-03-04. To run again: \
             `cargo bench --bench upgrade -- --only crash` (as root)."
            ),
            "{md}"
        );
        assert!(
            md.contains("| 100,000 | 3 | 96 ms | 96 ms | 2 of 3 | 1 of 3 | 1 of 3 | 1.25 |\n"),
            "{md}"
        );
        assert!(
            md.contains(
                "**Nodes lost** at 100,000 files known: after round 2, 80,208 known nodes \
                 were gone to a GETATTR and 0 of the probing GETATTRs failed;"
            ),
            "{md}"
        );
        // No round kept the connection: no pause to show, and no nodes to find.
        assert!(
            md.contains("| 1,000 | 3 | - | - | 0 of 3 | 0 of 3 | 0 of 3 | 1.5 |\n"),
            "{md}"
        );
        assert!(!md.contains("at 1,000 files known"), "{md}");
        assert!(!md.contains("## Upgrade in place"), "{md}");
    }

    #[test]
    fn without_the_sections_own_limit_native_is_the_limit_and_named_so() {
        use super::*;
        let line = |config: &str, value: f64| {
            format!(
                r#"{{"commit":"eee","date":"2026-04-05","part":"fio","row":"seqread-1m","config":"{config}","run":1,"value":{value}}}"#
            )
        };
        let results = [
            line("vfsd", 300.0),
            line("virtiofsd", 200.0),
            line("native", 600.0),
        ]
        .join("\n");
        let dir = crate::tree_with(&[("docs/benchmarks/gluster/results.jsonl", &results)]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(
            md.contains("| fio job | vfsd IOPS | virtiofsd IOPS | native IOPS | vfsd ÷ virtiofsd | vfsd ÷ native |\n"),
            "{md}"
        );
        assert!(
            md.contains("| seqread-1m | 300 | 200 | 600 | 1.50 | 0.50 |\n"),
            "{md}"
        );
        assert!(!md.contains("guest ceiling"), "{md}");
    }

    #[test]
    fn each_printed_figure_comes_with_its_commit_and_command() {
        use super::*;
        let results = r#"{"commit":"fff","date":"2026-05-06","what":"A flood","figure":"9 of 10 refused.","command":"cargo test --test it -- flood"}"#;
        let dir = crate::tree_with(&[("docs/benchmarks/tests/results.jsonl", results)]);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(
            md.contains(
                "### A flood\n\nMeasured at commit fff, 2026-05-06. To run again: \
                 `cargo test --test it -- flood`.\n\n9 of 10 refused.\n"
            ),
            "{md}"
        );
    }

    /// The page written from the repository's own results names, in every section, a
    /// command that runs here: each script and bench it names is in the tree.
    #[test]
    fn every_section_of_the_page_can_be_run_again_from_the_tree() {
        use super::*;
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![];
        for dir in std::fs::read_dir(repo.join("docs/benchmarks")).unwrap() {
            let dir = dir.unwrap().path();
            for f in std::fs::read_dir(&dir).into_iter().flatten() {
                let f = f.unwrap().path();
                if let Ok(text) = std::fs::read_to_string(&f) {
                    let rel = f.strip_prefix(repo).unwrap().to_str().unwrap().to_string();
                    files.push((rel, text));
                }
            }
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (&p[..], &t[..])).collect();
        let dir = crate::tree_with(&files);
        assert!(write_page(dir.path()));
        let md = std::fs::read_to_string(dir.path().join("docs/benchmarks.md")).unwrap();
        assert!(!md.contains("git show"), "{md}");
        for section in md.split("\n## ").skip(2) {
            let title = section.lines().next().unwrap();
            assert!(section.contains("To run again: `"), "no command in {title}");
        }
        for word in md.split(|c: char| c.is_whitespace() || c == '`') {
            if let Some(script) = word.strip_prefix("scripts/") {
                assert!(
                    repo.join("scripts").join(script).exists(),
                    "{word} is not in the tree"
                );
            }
        }
        for bench in md.split("cargo bench --bench ").skip(1) {
            let name: String = bench
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            let path = repo.join("tests/bench").join(format!("{name}.rs"));
            assert!(path.exists(), "no bench {name}");
        }
    }

    #[test]
    fn figures_have_the_precision_of_their_size() {
        use super::*;
        assert_eq!(fmt(Some(1234.5)), "1,234");
        assert_eq!(fmt(Some(-1234567.0)), "-1,234,567");
        assert_eq!(fmt(Some(99.96)), "100.0");
        assert_eq!(fmt(Some(12.34)), "12.3");
        assert_eq!(fmt(Some(0.0)), "0.00");
        assert_eq!(fmt(None), "-");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "-");
        assert_eq!(span(&[Some(0.5), None, Some(0.0), Some(1.25)]), "0.50-1.25");
        assert_eq!(span(&[None, Some(2.0)]), "2.00");
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn json_values_print_as_the_tables_show_them() {
        use super::*;
        let v: Value =
            serde_json::from_str(r#"[229.0, 36, 0.00001, 1e16, null, "x", 14.44]"#).unwrap();
        let shown: Vec<String> = v.as_array().unwrap().iter().map(show).collect();
        assert_eq!(
            shown,
            ["229.0", "36", "1e-05", "1e+16", "None", "x", "14.44"]
        );
    }
}
