#!/usr/bin/env python3
"""Turns scripts/bench.sh's results.jsonl into report.md, summary.json and PNG plots."""

import argparse
import json
import os
import platform
import statistics
import subprocess
from collections import defaultdict


def fio_figures(fio):
    """IOPS and MiB/s of a fio JSON result (all jobs of the group summed)."""
    iops = bw = 0.0
    for job in fio["jobs"]:
        for d in ("read", "write"):
            iops += job[d]["iops"]
            bw += job[d]["bw_bytes"] / (1 << 20)
    return {"iops": iops, "mib_per_s": bw}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    if len(xs) < 2:
        return ""
    m = med(xs)
    return "±%.0f%%" % (100 * (max(xs) - min(xs)) / 2 / m) if m else ""


def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, host kernel {platform.release()}"


TREE_STEPS = ["untar", "find", "ls-lR", "ls-lR-cold", "cp-a", "rm-rf", "create", "unlink",
              "git-clone", "git-status-clean", "git-status-dirty"]
TREE_ABOUT = {
    "untar": "tar -xf of the tree (from the guest's /tmp)",
    "find": "find over the tree, caches warm from the untar",
    "ls-lR": "ls -lR (a stat of every file), warm",
    "ls-lR-cold": "ls -lR after drop_caches",
    "cp-a": "cp -a of the tree beside it",
    "rm-rf": "rm -rf of the copy",
    "create": "2,000 small files in 20 new directories (shell loop)",
    "unlink": "rm of those files and rmdir of their directories",
    "git-clone": "git clone from a bundle in the share",
    "git-status-clean": "git status --porcelain, clean tree",
    "git-status-dirty": "git status --porcelain, 100 files changed and 20 new",
}


def tree_report(records, a):
    """Report of scripts/bench.sh --tree: per cache mode and step, vfsd vs virtiofsd vs tmpfs."""
    rows = [r for r in records if r["kind"] == "tree"]
    boots = [r for r in records if r["kind"] == "tree-boot"]
    v = defaultdict(lambda: defaultdict(list))  # (cache, daemon, step) -> metric -> [values]
    ops = defaultdict(lambda: defaultdict(list))  # (cache, daemon, step) -> opcode -> [counts]
    userland = sorted({r.get("userland", "") for r in rows})
    def label(r):  # the daemon, and any extra arguments it had (--vfsd-args, --virtiofsd-args)
        return r["daemon"] + (f" {r['args']}" if r.get("args") else "")
    for r in rows:
        key = ("-" if r["daemon"] == "tmpfs" else r["cache"], label(r), r["step"])
        for m in ("seconds", "daemon_cpu_s", "requests", "daemon_requests", "switches_per_req"):
            if r.get(m) is not None:
                v[key][m].append(r[m])
        for k, n in (r.get("ops") or {}).items():
            ops[key][k].append(n)
    steps = [s for s in TREE_STEPS if any(k[2] == s for k in v)]
    steps += sorted({k[2] for k in v} - set(steps))
    modes = [m for m in ("auto", "always", "never", "metadata") if any(k[0] == m for k in v)]
    labels = {k[1] for k in v} - {"tmpfs"}
    daemons = sorted(labels, key=lambda d: (not d.startswith("vfsd"), d))
    # The ratios compare the first vfsd and the first virtiofsd configuration.
    A = next((d for d in daemons if d.startswith("vfsd")), "vfsd")
    B = next((d for d in daemons if d.startswith("virtiofsd")), "virtiofsd")
    have_tmpfs = any(k[1] == "tmpfs" for k in v)

    def m_(cache, d, step, metric):
        return med(v[(cache, d, step)][metric])

    def ok(x):
        return x == x and x is not None

    def ratio(x, y, fmt="%.2f"):
        return (fmt % (x / y)) if ok(x) and ok(y) and y else ""

    def secs(x):
        return f"{x:.2f}" if ok(x) else ""

    def total(cache, d, metric, only=None):
        xs = [m_(cache, d, s, metric) for s in (only or steps)]
        return round(sum(xs), 3) if xs and all(ok(x) for x in xs) else float("nan")

    summary = {"tree": {}}
    md = ["# Tree workload: vfsd, virtiofsd and the guest's tmpfs", ""]
    md += [f"Machine: {machine()}. Guests: QEMU TCG, 2 vCPUs, 1 GiB, Debian's cloud kernel; "
           "KVM hosts will be much faster, compare ratios only.", ""]
    md += [f"Command: `{a.command}` (runs per figure: {a.runs}; each figure is the median, with ± half "
           f"the min-max spread where there are several runs). Source tree: {a.tree_source}. "
           f"vfsd: `{a.vfsd_bin}`; userland in the guest: {', '.join(userland)} "
           "(host: the host's root, read-only, as the guest's root: GNU tar and coreutils, git; "
           "initramfs: busybox, no git).", ""]
    md += ["Each daemon runs as `scripts/run-vm.sh` ships it (vfsd: namespace sandbox, `--xattr`; "
           "virtiofsd 1.14: `--sandbox none --xattr`) plus `--cache MODE`. tmpfs: the same steps on "
           "the guest's own tmpfs, the guest's ceiling; the cache mode does not apply to it, so its "
           "figures repeat in every mode's table.", ""]
    md += [{"ext4": "Each tree share is a fresh ext4 with a journal (mkfs.ext4's defaults) on a loop "
                    "device over a file in /dev/shm, one per share and boot (`--share-fs ext4`).",
            "tmpfs": "Each tree share is a fresh tmpfs of its own (`--share-fs tmpfs`).",
            "host": "The tree shares are directories under /var/tmp on the host's own file system "
                    "(`--share-fs host`)."}.get(a.share_fs, ""), ""]
    if "--same-boot" in a.command.split():
        md += ["`--same-boot`: vfsd and virtiofsd served one guest per run and mode, a share each, "
               "and the guest ran the steps on one share and then on the other (vfsd first in odd "
               "runs), so the boot's host conditions fall on both alike.", ""]
    md += ["Per step: the guest's time (s); the FUSE requests the guest sent to the share "
           "(tracepoint `fuse:fuse_request_send`, which does not see FORGETs), with vfsd's own "
           "count (`--stats`, FORGET and BATCH_FORGET included) in brackets; the daemon's CPU "
           "time (utime+stime of its process tree, read by the host at the guest's step marks, "
           "10 ms resolution) and CPU per guest request; the context switches of the daemon's "
           "threads per guest request (`/proc/PID/task/*/status`, since session 14): the "
           "wake-ups, which cost a virtual machine's idle CPUs more than most requests do.", ""]
    md += ["| step | what |", "|---|---|"] + [f"| {s} | {TREE_ABOUT.get(s, '')} |" for s in steps] + [""]

    if modes:
        md += ["## All steps, per cache mode", "",
               "| cache | " + " | ".join(f"{d} (s)" for d in daemons) + (" | tmpfs (s)" if have_tmpfs else "")
               + " | vfsd/virtiofsd | vfsd/tmpfs | virtiofsd/tmpfs | "
               + " | ".join(f"{d} CPU (s)" for d in daemons) + " | CPU vfsd/virtiofsd | "
               + " | ".join(f"{d} µs/req" for d in daemons) + " |",
               "|---|" + "---|" * (2 * len(daemons) + have_tmpfs + 4 + len(daemons))]
        for c in modes:
            t = {d: total(c, d, "seconds") for d in daemons}
            tt = total("-", "tmpfs", "seconds") if have_tmpfs else float("nan")
            cp = {d: total(c, d, "daemon_cpu_s") for d in daemons}
            rq = {d: total(c, d, "requests") for d in daemons}
            row = [c] + [secs(t[d]) for d in daemons] + ([secs(tt)] if have_tmpfs else [])
            row += [ratio(t.get(A), t.get(B)), ratio(t.get(A), tt), ratio(t.get(B), tt)]
            row += [secs(cp[d]) for d in daemons] + [ratio(cp.get(A), cp.get(B))]
            row += [("%.1f" % (cp[d] * 1e6 / rq[d])) if ok(cp[d]) and ok(rq[d]) and rq[d] else "" for d in daemons]
            md.append("| " + " | ".join(row) + " |")
            summary["tree"][f"{c}/total"] = {"seconds": {**t, "tmpfs": tt}, "daemon_cpu_s": cp, "requests": rq}
        md.append("")

    if modes and A in daemons and B in daemons:
        # The most any saving on vfsd's side could give: if every microsecond of its CPU
        # were on the guest's critical path and went away, the step would take its time
        # minus its CPU. What is left is the guest's own time per request (TCG, the
        # virtqueue round trip, the guest kernel), the same for any daemon.
        md += ["## What bounds the speed-up", "",
               "Speed-up: virtiofsd's time over vfsd's. Ceiling: the speed-up over virtiofsd of a daemon "
               "that took no CPU at all, if the rest of the step's time (the guest's own: TCG, the "
               "virtqueue round trip, the guest kernel) stayed as it was; from virtiofsd's run, its "
               "time over (its time minus its CPU), and from vfsd's, virtiofsd's time over (vfsd's "
               "time minus vfsd's CPU). Guest time per request: the step's time minus the daemon's "
               "CPU, per FUSE request the guest sent.", "",
               "| cache | step | speed-up | ceiling, from virtiofsd's run | ceiling, from vfsd's run "
               "| CPU per request, vfsd / virtiofsd (µs) | guest time per request, vfsd / virtiofsd (µs) |",
               "|---|---|---|---|---|---|---|"]
        for c in modes:
            for s in steps + ["all"]:
                get = (lambda d, m: total(c, d, m)) if s == "all" else (lambda d, m: m_(c, d, s, m))
                t = {d: get(d, "seconds") for d in (A, B)}
                cp = {d: get(d, "daemon_cpu_s") for d in (A, B)}
                rq = {d: get(d, "requests") for d in (A, B)}
                if not all(ok(x) and x for d in (A, B) for x in (t[d], rq[d])) \
                        or not all(ok(cp[d]) and t[d] > cp[d] for d in (A, B)):
                    continue
                name = "**all**" if s == "all" else s
                per = {d: cp[d] * 1e6 / rq[d] for d in (A, B)}
                guest = {d: (t[d] - cp[d]) * 1e6 / rq[d] for d in (A, B)}
                md.append(f"| {c} | {name} | {t[B] / t[A]:.2f} | {t[B] / (t[B] - cp[B]):.2f} | "
                          f"{t[B] / (t[A] - cp[A]):.2f} | {per[A]:.0f} / {per[B]:.0f} | "
                          f"{guest[A]:.0f} / {guest[B]:.0f} |")
        md.append("")

    for c in modes:
        md += [f"## --cache {c}", "",
               "| step | " + ("tmpfs (s) | " if have_tmpfs else "") + " | ".join(f"{d} (s)" for d in daemons)
               + " | vfsd/virtiofsd | vfsd/tmpfs | virtiofsd/tmpfs | requests: "
               + ", ".join(daemons) + " [vfsd --stats] | "
               + " | ".join(f"{d} CPU s (µs/req)" for d in daemons) + " | CPU vfsd/virtiofsd | "
               + "context switches per request: " + ", ".join(daemons) + " |",
               "|---|" + "---|" * (have_tmpfs + len(daemons) + 4 + len(daemons) + 2)]
        for s in steps:
            tt = m_("-", "tmpfs", s, "seconds")
            row = [s] + ([secs(tt) + " " + spread(v[("-", "tmpfs", s)]["seconds"])] if have_tmpfs else [])
            t = {}
            for d in daemons:
                t[d] = m_(c, d, s, "seconds")
                row.append(secs(t[d]) + " " + spread(v[(c, d, s)]["seconds"]))
            row += [ratio(t.get(A), t.get(B)), ratio(t.get(A), tt), ratio(t.get(B), tt)]
            reqs = [f"{m_(c, d, s, 'requests'):,.0f}" if ok(m_(c, d, s, "requests")) else "n/a" for d in daemons]
            dr = m_(c, A, s, "daemon_requests")
            row.append(", ".join(reqs) + (f" [{dr:,.0f}]" if ok(dr) else ""))
            cpus = {}
            for d in daemons:
                cpus[d] = m_(c, d, s, "daemon_cpu_s")
                rq = m_(c, d, s, "requests")
                per = f" ({cpus[d] * 1e6 / rq:.1f})" if ok(cpus[d]) and ok(rq) and rq else ""
                row.append((f"{cpus[d]:.2f}" if ok(cpus[d]) else "") + per)
            row.append(ratio(cpus.get(A), cpus.get(B)))
            sw = [m_(c, d, s, "switches_per_req") for d in daemons]
            row.append(", ".join(f"{x:.2f}" for x in sw) if all(ok(x) for x in sw) else "")
            md.append("| " + " | ".join(row) + " |")
            summary["tree"][f"{c}/{s}"] = {
                d: {m: med(x) for m, x in v[(c, d, s)].items()} for d in daemons}
            if have_tmpfs:
                summary["tree"][f"{c}/{s}"]["tmpfs"] = {"seconds": tt}
        md.append("")
        # What the guest asked for, by opcode (vfsd's guest, the largest first).
        md += [f"Requests by opcode, --cache {c} (guest count, " + " / ".join(daemons) + "):", "",
               "| step | requests |", "|---|---|"]
        for s in steps:
            names = sorted({k for d in daemons for k in ops[(c, d, s)]},
                           key=lambda k: (-max(med(ops[(c, d, s)][k]) if ops[(c, d, s)][k] else 0 for d in daemons), k))
            cell = ", ".join(f"{k} " + " / ".join(f"{med(ops[(c, d, s)][k]):,.0f}" if ops[(c, d, s)][k] else "0" for d in daemons)
                             for k in names)
            md.append(f"| {s} | {cell} |")
        md.append("")

    if boots:
        md += ["## Boots", "", "| daemon | cache | run | run-vm.sh status | wall time (s) | host load average, start and end |",
               "|---|---|---|---|---|---|"]
        md += [f"| {b['daemon']}{' ' + b['args'] if b.get('args') else ''} | {b['cache']} | {b['run']} | {b['status']} | "
               f"{b['wall_s']} | {' - '.join(str(x) for x in b.get('load', [])) or 'n/a'} |" for b in boots]
        md.append("")
        md += ["Guest console lines of each boot: `guest.txt` beside this file; every row: `results.jsonl`.", ""]

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        # The same colour for a configuration in every plot.
        colour = {"tmpfs": "tab:gray", **{d: f"C{i}" for i, d in enumerate(daemons)}}

        def panel_fig(name, title, series_of, value, ylabel, log):
            fig, axes = plt.subplots(len(modes), 1, figsize=(max(7, 0.9 * len(steps)), 2.6 * len(modes)), squeeze=False)
            for ax, c in zip(axes[:, 0], modes):
                series = series_of(c)
                width = 0.8 / max(1, len(series))
                for i, (label, key) in enumerate(series):
                    ax.bar([g + i * width for g in range(len(steps))], [value(key, s) or 0 for s in steps], width,
                           label=label, color=colour[label])
                ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(steps))])
                ax.set_xticklabels(steps, rotation=20, ha="right", fontsize=8)
                ax.set_ylabel(ylabel, fontsize=8)
                if log:
                    ax.set_yscale("log")
                ax.set_title(f"--cache {c}", fontsize=9)
                ax.legend(fontsize=7)
            fig.suptitle(title, fontsize=10)
            fig.tight_layout()
            fig.savefig(os.path.join(a.out, name), dpi=110)
            plt.close(fig)
            md.append(f"![{title}]({name})")

        if modes:
            def val(key, s, metric="seconds"):
                x = m_(key[0], key[1], s, metric)
                return x if ok(x) else None
            panel_fig("tree-time.png", "Tree workload: guest time per step (lower is better)",
                      lambda c: ([("tmpfs", ("-", "tmpfs"))] if have_tmpfs else []) + [(d, (c, d)) for d in daemons],
                      val, "seconds (log)", True)

            def per_req(key, s):
                x, r = m_(key[0], key[1], s, "daemon_cpu_s"), m_(key[0], key[1], s, "requests")
                return x * 1e6 / r if ok(x) and ok(r) and r else None
            panel_fig("tree-cpu.png", "Tree workload: daemon CPU per guest request (lower is better)",
                      lambda c: [(d, (c, d)) for d in daemons], per_req, "µs per request", False)
        md.append("")
    except ImportError:
        md += ["(matplotlib not installed: no plots)", ""]

    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("out")
    ap.add_argument("--command", default="scripts/bench.sh")
    ap.add_argument("--quick", default="0")
    ap.add_argument("--runs", default="3")
    ap.add_argument("--seconds", default="5")
    ap.add_argument("--guest-seconds", default="20")
    ap.add_argument("--gluster", default="0")
    ap.add_argument("--tree", default="0")
    ap.add_argument("--tree-source", default="")
    ap.add_argument("--vfsd-bin", default="target/release/vfsd")
    ap.add_argument("--share-fs", default="host")
    a = ap.parse_args()
    gluster = a.gluster == "1"
    native_name = "native (Gluster mount)" if gluster else "native"

    loadgen = defaultdict(lambda: defaultdict(list))  # (workload, config) -> metric -> [values]
    native_eq = defaultdict(lambda: defaultdict(list))  # loadgen workload -> metric -> [values]
    native_jobs = {}
    fio = defaultdict(lambda: defaultdict(list))  # (job, config) -> metric -> [values]
    text = open(a.results).read()
    dec = json.JSONDecoder()
    records, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        r, pos = dec.raw_decode(text, pos)
        records.append(r)
    if a.tree == "1" or any(r["kind"] == "tree" for r in records):
        tree_report(records, a)
        return
    for r in records:
        if r["kind"] == "native-eq":
            # Named like the load generator's workloads (randread-shared -> RandreadShared).
            w = "".join(p.capitalize() for p in r["workload"].split("-"))
            native_jobs[w] = r["jobs"]
            for m, v in fio_figures(r["fio"]).items():
                native_eq[w][m].append(v)
        elif r["kind"] == "loadgen":
            res = r["result"]
            key = (res["workload"], r["config"])
            for m in ("ops_per_s", "mib_per_s", "lat_us_p50", "lat_us_p99", "lat_us_p999", "daemon_cpu_us_per_op"):
                if res.get(m) is not None:
                    loadgen[key][m].append(res[m])
        else:
            key = (r["job"], r["config"] if r["kind"] == "guest" else "native")
            for m, v in fio_figures(r["fio"]).items():
                fio[key][m].append(v)

    summary = {"loadgen": {}, "fio": {}}
    md = ["# vfsd benchmarks", ""]
    if gluster:
        md = ["# vfsd benchmarks over GlusterFS", "",
              "Share: client mount A of scripts/gluster.sh's loopback volume (replica 2, both bricks on this "
              "machine, with the settings scripts/gluster.sh makes: strict O_DIRECT, no client-side caches, "
              "direct-I/O client mounts). Native: fio on that mount, making the syscalls a "
              "daemon makes for the guest (buffered preadv/pwritev). Guests: fio with O_DIRECT under "
              "--cache never, through vfsd and through virtiofsd, on the same mount.", ""]
    md += [f"Machine: {machine()}. Guest runs: QEMU TCG (`-accel tcg,thread=multi -cpu max`), 2 vCPUs, "
           "Debian's cloud kernel; KVM hosts will be much faster, compare ratios only.", ""]
    md += [f"Command: `{a.command}` (runs per figure: {a.runs}; load generator {a.seconds} s per run, "
           f"guest fio {a.guest_seconds} s per job). Each figure is the median, with ± half the min-max spread.", ""]
    md += ["Load generator: `target/release/vfsd-bench` connects to the daemon's socket as a VMM would and plays "
           "the guest driver. Like the guest kernel, it keeps only one WRITE per inode in flight when the open reply "
           "lacks FOPEN_PARALLEL_DIRECT_WRITES.", ""]

    configs = sorted({c for (_, c) in loadgen})
    workloads = sorted({w for (w, _) in loadgen})
    if workloads:
        md += ["## Load generator", "",
               "Native: fio on the host at the same concurrency (one psync thread per request the load generator "
               "keeps in flight, the same block size and files, buffered as the daemons' own I/O), so "
               "vfsd/native is the fraction of what the host itself reaches with that much parallelism.", "",
               "| workload | " + " | ".join(configs) + " | native, same concurrency | vfsd/virtiofsd (default) | vfsd/virtiofsd (best) | vfsd/native (default) |",
               "|---|" + "---|" * (len(configs) + 4)]
        for w in workloads:
            row = [w]
            for c in configs:
                v = loadgen[(w, c)]
                ops = v["ops_per_s"]
                cpu = med(v["daemon_cpu_us_per_op"])
                row.append(f"{med(ops):,.0f} ops/s {spread(ops)}<br>{med(v['mib_per_s']):.0f} MiB/s, p50 {med(v['lat_us_p50']):.0f} µs, "
                           f"p99 {med(v['lat_us_p99']):.0f} µs, p99.9 {med(v['lat_us_p999']):.0f} µs, CPU {cpu:.1f} µs/op")
                summary["loadgen"][f"{w}/{c}"] = {m: med(x) for m, x in v.items()}
            n = native_eq.get(w)
            n_iops = med(n["iops"]) if n else float("nan")
            row.append(f"{n_iops:,.0f} ops/s {spread(n['iops'])}<br>{med(n['mib_per_s']):.0f} MiB/s, {native_jobs[w]} jobs"
                       if n else "n/a")
            if n:
                summary["loadgen"][f"{w}/native"] = {m: med(x) for m, x in n.items()}
            for kind in ("default", "best"):
                a_ = med(loadgen[(w, f"vfsd-{kind}")]["ops_per_s"])
                b_ = med(loadgen[(w, f"virtiofsd-{kind}")]["ops_per_s"])
                row.append(f"{a_ / b_:.2f}×" if b_ else "")
            a_ = med(loadgen[(w, "vfsd-default")]["ops_per_s"])
            row.append(f"{a_ / n_iops:.2f}" if n_iops == n_iops and n_iops else "")
            md.append("| " + " | ".join(row) + " |")
        md.append("")

    jobs = sorted({j for (j, _) in fio})
    fconfigs = [c for c in ("vfsd", "virtiofsd", "native", "vfsd-tmpfs") if any((j, c) in fio for j in jobs)]
    labels = {"native": native_name, "vfsd-tmpfs": "vfsd on tmpfs (guest ceiling)"}
    if jobs:
        md += ["## fio: guest through each daemon, and native on the host", "",
               "Native runs the same job on the host with buffered I/O (the syscalls the daemons make), "
               "at the same concurrency (numjobs, iodepth) as the guest's job.", ""]
        if "vfsd-tmpfs" in fconfigs:
            md += ["vfsd on tmpfs: the same guest and jobs through vfsd on a tmpfs share, where the host side "
                   "costs next to nothing; what the TCG guest itself reaches is the ceiling for every column "
                   "but native.", ""]
        md += ["| job | " + " | ".join(labels.get(c, c) for c in fconfigs)
               + " | vfsd/virtiofsd | vfsd/" + native_name.split(" (")[0] + " |"
               + (" vfsd/ceiling |" if "vfsd-tmpfs" in fconfigs else ""),
               "|---|" + "---|" * (len(fconfigs) + 2 + ("vfsd-tmpfs" in fconfigs))]
        for j in jobs:
            row = [j]
            for c in fconfigs:
                v = fio[(j, c)]
                row.append(f"{med(v['iops']):,.0f} IOPS {spread(v['iops'])}, {med(v['mib_per_s']):.1f} MiB/s" if v["iops"] else "")
                summary["fio"][f"{j}/{c}"] = {m: med(x) for m, x in v.items()}
            vi, vv, vn = (med(fio[(j, c)]["iops"]) for c in ("vfsd", "virtiofsd", "native"))
            # Empty where a figure is missing (a run without guests has no vfsd column).
            row.append(f"{vi / vv:.2f}×" if vi == vi and vv == vv and vv else "")
            row.append(f"{vi / vn:.2f}" if vi == vi and vn == vn and vn else "")
            if "vfsd-tmpfs" in fconfigs:
                vc = med(fio[(j, "vfsd-tmpfs")]["iops"])
                row.append(f"{vi / vc:.2f}" if vc == vc and vc else "")
            md.append("| " + " | ".join(row) + " |")
        md.append("")
        # Shared-file scaling: numjobs=N IOPS / numjobs=1 IOPS.
        md += ["### Shared-file parallel direct writes (SSF scaling = IOPS at N jobs / IOPS at 1 job)", "",
               "| | " + " | ".join(fconfigs) + " |", "|---|" + "---|" * len(fconfigs)]
        for n in (2, 4):
            row = [f"{n} jobs"]
            for c in fconfigs:
                one, many = med(fio[("ssf-randwrite-4k-j1", c)]["iops"]), med(fio[(f"ssf-randwrite-4k-j{n}", c)]["iops"])
                row.append(f"{many / one:.2f}" if one == one and one and many == many else "")
                summary.setdefault("ssf_scaling", {})[f"{c}/j{n}"] = many / one if one == one and one else None
            md.append("| " + " | ".join(row) + " |")
        md.append("")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        def bars(name, groups, series, values, ylabel, title):
            fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups)), 4))
            width = 0.8 / max(1, len(series))
            for i, s in enumerate(series):
                ax.bar([g + i * width for g in range(len(groups))], [values(gr, s) for gr in groups], width, label=s)
            ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))])
            ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(os.path.join(a.out, name), dpi=110)
            plt.close(fig)
            md.append(f"![{title}]({name})")

        if workloads:
            base = {w: max(med(loadgen[(w, c)]["ops_per_s"]) for c in configs) for w in workloads}
            bars("loadgen.png", workloads, configs, lambda w, c: med(loadgen[(w, c)]["ops_per_s"]) / base[w],
                 "ops/s, relative to the best", "Load generator (higher is better)")
        if jobs:
            basef = {j: max(med(fio[(j, c)]["iops"]) for c in fconfigs if fio[(j, c)]["iops"]) for j in jobs}
            bars("fio.png", jobs, fconfigs, lambda j, c: (med(fio[(j, c)]["iops"]) / basef[j]) if fio[(j, c)]["iops"] else 0,
                 "IOPS, relative to the best", "fio: guest via vfsd / virtiofsd, and native")
        md.append("")
    except ImportError:
        md += ["(matplotlib not installed: no plots)", ""]

    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
