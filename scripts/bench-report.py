#!/usr/bin/env python3
"""Writes docs/benchmarks.md and its plots (docs/benchmarks/*/*.png) from the results the
benches save under docs/benchmarks/<workload>/results.jsonl, each line with the commit and
date it was measured at. The benches run it at their end; run it by hand after editing the
data: python3 scripts/bench-report.py. Needs matplotlib (apt-get install
python3-matplotlib)."""

import json
import os
import re
import statistics
import sys
from collections import defaultdict

try:
    import matplotlib
except ImportError:  # another python3 first on PATH: try the distribution's
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "benchmarks")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")


def load(workload):
    path = os.path.join(DATA, workload, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    # The benches name the command they ran in their report.md.
    report = os.path.join(DATA, workload, "report.md")
    if os.path.exists(report):
        m = re.search(r"Written by `([^`]+)`", open(report).read())
        if m:
            for x in lines:
                x.setdefault("command", m.group(1))
    return lines


def measured(lines, cmd=None, with_cmd=True):
    """Where the figures come from: commit(s), date(s), and the command (the one saved
    with the data, else cmd)."""
    commits = sorted({str(x.get("commit", "?")) for x in lines})
    dates = sorted({str(x.get("date", "?")) for x in lines})
    out = f"commit {', '.join(commits)}, {', '.join(dates)}"
    cmd = lines[0].get("command") or cmd
    return out + (f", `{cmd}`" if cmd and with_cmd else "")


def medians(lines):
    """(part, row, config) -> median value, MiB/s and CPU µs per operation."""
    runs = defaultdict(list)
    for x in lines:
        runs[(x["part"], x["row"], x["config"])].append(x)
    return {
        k: {
            f: statistics.median(r.get(f, 0) or 0 for r in v)
            for f in ("value", "mib_per_s", "cpu_us_per_op")
        }
        for k, v in runs.items()
    }


def fmt(v, unit=""):
    if v is None:
        return "-"
    s = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return s + unit


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(head, rows):
    out = "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
    return out + "".join("| " + " | ".join(map(str, r)) + " |\n" for r in rows)


def bars(path, groups, series, title, ylabel, ceiling=None, ceiling_label=None):
    """Grouped bars: series is [(label, [value per group])]; ceiling a value per group
    (drawn as a black line over the group) or one for all (a dashed line)."""
    # Rows without a figure in any series (no limit to divide by) are left out.
    keep = [i for i in range(len(groups)) if any(v[i] for _, v in series)]
    groups = [groups[i] for i in keep]
    series = [(label, [vals[i] for i in keep]) for label, vals in series]
    if isinstance(ceiling, list):
        ceiling = [ceiling[i] for i in keep]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(groups) + 2), 3.6))
    w = 0.8 / len(series)
    for i, (label, vals) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * w for g in range(len(groups))]
        ax.bar(xs, [v or 0 for v in vals], w, label=label)
    if isinstance(ceiling, (int, float)):
        ax.axhline(ceiling, color="black", linestyle="--", label=ceiling_label)
    elif ceiling:
        for g, c in enumerate(ceiling):
            if c:
                ax.hlines(c, g - 0.45, g + 0.45, color="black", linewidth=2,
                          label=ceiling_label if g == 0 else None)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return os.path.relpath(path, os.path.dirname(PAGE))


def io_section(workload, lines, title, cmd, bounds, limit_cfg="native", limit_name="native", fio_note=""):
    """The load generator and guest fio parts of the io bench's results."""
    m = medians(lines)
    md, summary = "", []
    rows_of = lambda part: list(dict.fromkeys(x["row"] for x in lines if x["part"] == part))
    get = lambda part, row, cfg: m.get((part, row, cfg), {}).get("value")
    cpu = lambda part, row, cfg: m.get((part, row, cfg), {}).get("cpu_us_per_op")
    lg = rows_of("loadgen")
    if lg:
        rows, rv, rn = [], [], []
        for r in lg:
            v, d, b, n = (get("loadgen", r, c) for c in
                          ("vfsd-default", "virtiofsd-default", "virtiofsd-best", "native"))
            rows.append([r, fmt(v), fmt(d), fmt(b), fmt(n), ratio(v, d), ratio(v, b), ratio(v, n),
                         f"{fmt(cpu('loadgen', r, 'vfsd-default'))} / {fmt(cpu('loadgen', r, 'virtiofsd-default'))}"])
            rv.append(v / d if v and d else None)
            rn.append(v / n if v and n else None)
        png = bars(os.path.join(DATA, workload, "loadgen.png"), lg,
                   [("vfsd", rn), ("virtiofsd", [get("loadgen", r, "virtiofsd-default") / get("loadgen", r, "native")
                                                 if get("loadgen", r, "virtiofsd-default") and get("loadgen", r, "native") else None for r in lg])],
                   f"{title}: load generator, ops/s relative to native", "÷ native", 1.0, "native")
        md += f"### Load generator\n\nOperations per second, medians; vfsd and virtiofsd at their defaults, virtiofsd also at its best pool size (4); native is fio on the host at the same concurrency (a psync thread per request in flight, buffered, as the daemons do). CPU is each daemon's µs per operation. Queues, requests in flight and block size per workload are WORKLOADS in tests/bench/io.rs (4 KiB at 32 in flight for the `-shared` rows and lookup-getattr, 1 MiB at 4 for seqread and seqwrite; the GlusterFS rows name theirs), `--cache=never`.\n\n"
        md += table(["workload", "vfsd", "virtiofsd", "virtiofsd, pool 4", "native", "vfsd ÷ virtiofsd",
                     "vfsd ÷ virtiofsd pool 4", "vfsd ÷ native", "CPU µs/op vfsd / virtiofsd"], rows)
        md += f"\n![{title}: load generator]({png})\n\n"
        summary.append((f"{title}: load generator", rv, rn))
    fio = rows_of("fio")
    if fio:
        cfgs = {x["config"] for x in lines if x["part"] == "fio"}
        lim = limit_cfg if limit_cfg in cfgs else "native"
        rows, rv, rn = [], [], []
        for r in fio:
            v, d, n = get("fio", r, "vfsd"), get("fio", r, "virtiofsd"), get("fio", r, lim)
            extra = [fmt(get("fio", r, "native")), ratio(v, get("fio", r, "native"))] if lim != "native" else []
            rows.append([r, fmt(v), fmt(d), fmt(n), ratio(v, d), ratio(v, n)] + extra)
            rv.append(v / d if v and d else None)
            rn.append(v / n if v and n else None)
        head = ["fio job", "vfsd IOPS", "virtiofsd IOPS", f"{limit_name} IOPS", "vfsd ÷ virtiofsd", f"vfsd ÷ {limit_name}"]
        if lim != "native":
            head += ["native IOPS", "vfsd ÷ native"]
        png = bars(os.path.join(DATA, workload, "fio.png"), fio,
                   [("vfsd", rn), ("virtiofsd", [get("fio", r, "virtiofsd") / get("fio", r, lim)
                                                 if get("fio", r, "virtiofsd") and get("fio", r, lim) else None for r in fio])],
                   f"{title}: fio in a guest, IOPS relative to {limit_name}", f"÷ {limit_name}", 1.0, limit_name)
        md += f"### fio in a guest\n\nA TCG guest with 2 vCPUs, `--cache=never`{fio_note}, medians; {limit_name} is the limit beside the daemons.\n\n"
        md += table(head, rows) + f"\n![{title}: guest fio]({png})\n\n"
        summary.append((f"{title}: guest fio", rv, rn))
    instr = [x for x in lines if x["part"] == "instr"]
    if instr:
        v, d = get("instr", "untar", "vfsd"), get("instr", "untar", "virtiofsd")
        md += "### Instructions per operation\n\nUser-space instructions per operation of the load generator's untar workload, one request in flight (callgrind).\n\n"
        md += table(["vfsd", "virtiofsd", "vfsd ÷ virtiofsd"], [[fmt(v), fmt(d), ratio(v, d)]]) + "\n"
    head = f"## {title}\n\nMeasured at {measured(lines, cmd)}. To run again: `{cmd}`.\n\n**What bounds it:** {bounds}\n\n"
    return head + md, summary


def device_section(lines):
    m = medians(lines)
    rows_ = list(dict.fromkeys(x["row"] for x in lines))
    get = lambda r, c: m.get(("device", r, c), {}).get("value")
    rows, rv, rn, rd = [], [], [], []
    for r in rows_:
        v, d, n = get(r, "vfsd"), get(r, "virtiofsd"), get(r, "native")
        rows.append([r, fmt(n), fmt(v), fmt(d), ratio(v, n), ratio(d, n), ratio(v, d)])
        rv.append(v / d if v and d else None)
        rn.append(v / n if v and n else None)
        rd.append(d / n if d and n else None)
    png = bars(os.path.join(DATA, "device", "device.png"), rows_, [("vfsd", rn), ("virtiofsd", rd)],
               "O_DIRECT on a device: ops/s relative to native", "÷ native", 1.0, "native")
    cmd = "git show 7da17a8:scripts/bench-device.sh > /tmp/bench-device.sh && bash /tmp/bench-device.sh --runs 3"
    md = (f"## The load generator against a device\n\nMeasured at {measured(lines, cmd)}. That script is not in the tree any more; to run it again: `{cmd}`.\n\n"
          "The share is ext4 on a loop device doing direct I/O to a file on the host's disk; every side does O_DIRECT: native fio with a psync thread per request in flight, and the load generator (`--direct`) through each daemon, both `--cache never --allow-direct-io`. Rows are workload, block size and requests in flight; medians of 3 interleaved runs, ops/s.\n\n"
          "**What bounds it:** the device sets the pace; what is left is per-request CPU on 2 cores that the load generator shares with the daemon, and virtiofsd without a pool serves one request at a time per queue.\n\n")
    md += table(["workload", "native", "vfsd", "virtiofsd", "vfsd ÷ native", "virtiofsd ÷ native", "vfsd ÷ virtiofsd"], rows)
    return md + f"\n![device]({png})\n\n", [("Load generator against a device (O_DIRECT)", rv, rn)]


def tree_section(lines):
    modes = list(dict.fromkeys(x["mode"] for x in lines if x["daemon"] != "tmpfs"))
    steps = list(dict.fromkeys(x["step"] for x in lines))
    by = {(x["daemon"], x.get("mode"), x["step"]): x for x in lines}
    tm = {x["step"]: x for x in lines if x["daemon"] == "tmpfs"}
    md, rv, rn = "", [], []
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.6 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        rows = []
        sv, sd, sc = [], [], []
        for s in steps:
            v, d = by.get(("vfsd", mode, s)), by.get(("virtiofsd", mode, s))
            t = tm.get(s)
            vs, ds, ts = (x and x["seconds"] for x in (v, d, t))
            rows.append([s, fmt(vs), fmt(ds), fmt(ts), ratio(ds, vs), ratio(ts, vs),
                         f"{v['requests'] if v else '-'} / {d['requests'] if d else '-'}",
                         f"{fmt(v and v['daemon_cpu_s'])} / {fmt(d and d['daemon_cpu_s'])}"])
            sv.append(vs)
            sd.append(ds)
            sc.append(ts)
            if vs and ds:
                rv.append(ds / vs)
            if vs and ts:
                rn.append(ts / vs)
        md += f"### `--cache={mode}`\n\n" + table(
            ["step", "vfsd s", "virtiofsd s", "guest tmpfs s", "speed-up (virtiofsd s ÷ vfsd s)",
             "tmpfs s ÷ vfsd s", "FUSE requests vfsd / virtiofsd", "daemon CPU s vfsd / virtiofsd"], rows) + "\n"
        w = 0.4
        ax.bar([i - w / 2 for i in range(len(steps))], [x or 0 for x in sv], w, label="vfsd")
        ax.bar([i + w / 2 for i in range(len(steps))], [x or 0 for x in sd], w, label="virtiofsd")
        for i, c in enumerate(sc):
            if c:
                ax.hlines(c, i - 0.45, i + 0.45, color="black", linewidth=2,
                          label="guest tmpfs (ceiling)" if i == 0 else None)
        ax.set_title(f"cache mode {mode}", fontsize=9)
        ax.set_ylabel("seconds (lower is better)", fontsize=8)
        ax.set_xticks(range(len(steps)))
        ax.set_xticklabels(steps, fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DATA, "tree", "tree.png"), dpi=80)
    plt.close(fig)
    cmd = "cargo bench --bench requests"
    head = (f"## A source tree in a guest, per cache mode\n\nMeasured at {measured(lines, cmd)}. To run again: `{cmd}` "
            "(`-- --modes auto --daemons vfsd,virtiofsd,tmpfs --steps untar,cat-all` for a part). The daemons' rows and the tmpfs rows "
            "may come from different runs: see the commits per line in tree/results.jsonl.\n\n"
            "A TCG guest (2 vCPUs) per daemon and cache mode runs guest-tests/tree-bench.sh on a source tree of 4,683 entries "
            "(untar, find, reading every file alone and two at a time, cp -a, rm -rf, two copies and two extractions at once, "
            "small files); vfsd has a request queue per vCPU, virtiofsd its one. The same steps on the guest's own tmpfs, with "
            "no daemon, are the ceiling. FUSE requests are counted in the guest kernel; times are one run each.\n\n"
            "**What bounds it:** the TCG guest's own CPU: its side of each FUSE request costs more than either daemon's, "
            "so the speed-up of any daemon is bounded by the tmpfs column.\n\n")
    return head + md + "![tree steps per cache mode](benchmarks/tree/tree.png)\n\n", [("Source tree in a guest, per step and cache mode", rv, rn)]


def walk_section(lines):
    rows = []
    for x in lines:
        rows.append([x["daemon"], f"{x['peak_fds']:,}", fmt(x["peak_rss_kib"] / 1024, " MiB"),
                     f"{x['peak_rss_kib'] * 1024 // x['files']}", x["seconds"], x["walk"]])
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for x in lines:
        path = os.path.join(DATA, "walk", f"{x['daemon']}.csv")
        if os.path.exists(path):
            t, f, r = [], [], []
            for line in open(path).read().split("\n")[1:]:
                if line:
                    s, fd, rss = line.split(",")
                    t.append(float(s))
                    f.append(int(fd))
                    r.append(int(rss) / 1024)
            a.plot(t, f, label=x["daemon"])
            b.plot(t, r, label=x["daemon"])
    a.axhline(10000, color="black", linestyle="--", label="vfsd's bound (half its fd limit of 20,000)")
    a.set_title("open fds", fontsize=9)
    b.set_title("RSS (MiB)", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("seconds", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DATA, "walk", "walk.png"), dpi=80)
    plt.close(fig)
    cmd = "cargo bench --bench walk"
    per_file = [x["peak_rss_kib"] * 1024 // x["files"] for x in lines]
    md = (f"## fds and memory under a walk of {lines[0]['files']:,} files\n\nMeasured at {measured(lines, cmd)}. To run again: `{cmd}` "
          "(1,000,000 files by default).\n\n"
          f"A TCG guest runs `find | wc -l`, then `du -s`, over {lines[0]['files']:,} host-made files (directories of 1,000) "
          "on a read-only share, cache mode auto (the guest keeps every inode it has seen); each daemon with its defaults plus `--xattr`. "
          "The host samples the open fds and RSS of the daemon's serving process every second (walk/*.csv). vfsd ran with an fd limit "
          "of 20,000, so its bound was 10,000.\n\n"
          "**What bounds it:** vfsd keeps its nodes' O_PATH fds as a cache bounded by half its fd limit (at most 65,536), and RSS grows "
          f"with the files the guest knows ({min(per_file)}-{max(per_file)} bytes each here) until the guest forgets them; the walk's "
          "time moves by tens of percent between runs on this machine, so it is not a speed figure.\n\n")
    md += table(["daemon", "peak fds", "peak RSS", "RSS bytes per file", "wall s", "walk"], rows)
    return md + "\n![fds and RSS during the walk](benchmarks/walk/walk.png)\n\n"


def migration_section(lines):
    rows = [[x["daemon"], x["share"], f"{x['total_ms'] / 1000:.1f} s", f"{x['downtime_ms']} ms", f"{x['ram_mib']} MiB",
             x["lines_written"], x["result"], f"`{x['command']}`", f"[{x['raw']}](benchmarks/migration/{x['raw']})"] for x in lines]
    cmd = "cargo test --release --test guest -- --include-ignored --nocapture migration::live_migration_through_a_socket"
    commit = lines[0]["commit"]
    md = (f"## Live migration\n\nMeasured at {measured(lines, with_cmd=False)} with the commands in the table "
          f"(`git show {commit}:scripts/guest-migrate.sh`; the vfsd and virtiofsd 1.14 rows alike). The guest tests that migrate "
          f"print the same figures: `{cmd}` "
          "(and `VFSD_TEST_DAEMON=virtiofsd` for virtiofsd).\n\n"
          "A TCG guest (2 vCPUs, 1 GiB) moves between two QEMU 10.0.2 processes on this host, each with its own daemon, while it "
          "writes a line every ~100 ms and, in the fio rows, runs crc32c-verified direct and buffered I/O across the switch.\n\n"
          "**What bounds it:** copying the guest's RAM (about 230 MiB in 3-4 passes under TCG); the daemon's own state is a few "
          "hundred bytes, and the downtime is QEMU's stop-and-copy.\n\n")
    md += table(["daemon", "share", "total", "downtime", "RAM sent", "guest lines", "result", "command", "raw summary"], rows)
    vf = {x["share"]: x for x in lines if x["daemon"] == "vfsd"}
    vd = {x["share"]: x for x in lines if x["daemon"] == "virtiofsd"}
    rv = [vd[s]["downtime_ms"] / vf[s]["downtime_ms"] for s in vf if s in vd]
    shares = list(vf)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, key, unit in ((axes[0], "total_ms", "total (ms)"), (axes[1], "downtime_ms", "downtime (ms)")):
        for i, (name, d) in enumerate((("vfsd", vf), ("virtiofsd", vd))):
            ax.bar([g + (i - 0.5) * 0.4 for g in range(len(shares))], [d[x][key] if x in d else 0 for x in shares], 0.4, label=name)
        ax.set_xticks(range(len(shares)))
        ax.set_xticklabels([x.split(":")[0] for x in shares], fontsize=8)
        ax.set_title(f"{unit}, lower is better", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(DATA, "migration", "migration.png"), dpi=80)
    plt.close(fig)
    md += "\n![live migration: total time and downtime](benchmarks/migration/migration.png)\n"
    return md + "\n", [("Live migration: downtime (virtiofsd ÷ vfsd, higher is better for vfsd)", rv, [])]


def span(v):
    v = [x for x in v if x]
    if not v:
        return "-"
    return f"{min(v):.2f}" if len(v) == 1 else f"{min(v):.2f}-{max(v):.2f}"


def main():
    parts, summary = [], []
    sections = [
        ("io", lambda l: io_section("io", l, "Data I/O on the host's file system", "cargo bench --bench io",
                                     "the host's 2 CPUs: native is the page cache with no device in the way, and the load generator "
                                     "shares the cores with the daemon, so a daemon that makes the same syscall and does its own work "
                                     "on top cannot reach native; in the guest, the TCG guest's CPU time per I/O dominates.",
                                     fio_note=" (virtiofsd with a pool of 4, its best here); native is the same job run on the host, buffered")),
        ("gluster", lambda l: io_section("gluster", l, "Data I/O over GlusterFS",
                                          "scripts/gluster.sh up && cargo bench --bench io -- --share-root /srv/vfsd-gluster/a --out docs/benchmarks/gluster",
                                          "GlusterFS's client (a FUSE mount on the same 2 cores, replica 2 on loopback) for the load generator; "
                                          "in the guest, the TCG guest itself, whose ceiling is vfsd serving the guest from a tmpfs.",
                                          limit_cfg="tmpfs", limit_name="guest ceiling (vfsd on tmpfs)")),
        ("ceph", lambda l: io_section("ceph", l, "Data I/O over CephFS",
                                       "scripts/ceph.sh up && cargo bench --bench io -- --share-root /srv/vfsd-ceph/a --out docs/benchmarks/ceph",
                                       "ceph-fuse (the host's CephFS client, a FUSE daemon) and the one-node cluster behind it share the 2 cores "
                                       "with the daemon and the load generator; in the guest, the TCG guest itself, whose ceiling is vfsd serving "
                                       "the guest from a tmpfs.",
                                       limit_cfg="tmpfs", limit_name="guest ceiling (vfsd on tmpfs)")),
        ("device", device_section),
        ("tree", tree_section),
        ("walk", lambda l: (walk_section(l), [])),
        ("migration", migration_section),
    ]
    for name, fn in sections:
        lines = load(name)
        if not lines:
            continue
        md, s = fn(lines)
        parts.append(md)
        summary += [(t, rv, rn, measured(lines, with_cmd=False)) for t, rv, rn in s]
    page = (
        "# Benchmarks\n\n"
        "<!-- Written by scripts/bench-report.py from docs/benchmarks/*/results.jsonl: edit the script or re-run a bench, not this page. -->\n\n"
        "vfsd against virtiofsd 1.14, and the limit beside them (native on the host, or the guest's own ceiling). Every figure was "
        "measured on the project's 2-core, 24 GiB machine, guests under QEMU TCG (2 vCPUs, Debian's cloud kernel): absolute figures "
        "are far below a KVM host's, so read the ratios, each taken within one run. Each section names the commit and date its "
        "figures were measured at and the command that measures them again; the bench rewrites its results.jsonl and this page.\n\n"
        "Regenerate the page and plots from the saved data: `python3 scripts/bench-report.py`.\n\n"
        "## Summary\n\n"
        "Each ratio is of speeds, so above 1 vfsd is the faster (for times, the ratio of seconds is turned over); the limit is "
        "native, the guest's tmpfs or the guest's ceiling, as each section says. The ranges run over the section's rows.\n\n"
        + table(["workload", "vfsd ÷ virtiofsd (range over rows)", "vfsd ÷ limit", "measured at"],
                [[t, span(rv), span(rn), m] for t, rv, rn, m in summary])
        + "\n" + "".join(parts)
    )
    with open(PAGE, "w") as f:
        f.write(page)
    print(f"bench-report: wrote {os.path.relpath(PAGE, ROOT)}")


if __name__ == "__main__":
    main()
