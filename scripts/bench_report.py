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
