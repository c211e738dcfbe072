#!/usr/bin/env python3
"""Writes docs/xfstests.md from the xfstests runs saved under docs/xfstests/ (one run's
summary.json each, with the daemon, the vfsd commit and the date added), the reasons in
docs/xfstests/reasons.tsv and the page's text in docs/xfstests/page.md.

    python3 scripts/xfstests-report.py              # rewrite docs/xfstests.md
    python3 scripts/xfstests-report.py --add DIR/summary.json [--daemon D] [--commit C] [--date YYYY-MM-DD]
                                                    # save a run, then rewrite the page

Running it on unchanged data leaves docs/xfstests.md as it is."""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "xfstests")
PAGE = os.path.join(ROOT, "docs", "xfstests.md")
DAEMONS = ("vfsd", "virtiofsd")


def load_runs():
    runs = []
    for name in sorted(os.listdir(DATA)):
        if name.endswith(".json"):
            with open(os.path.join(DATA, name)) as f:
                run = json.load(f)
            run["file"] = name
            if run.get("daemon") not in DAEMONS:
                sys.exit(f"{name}: 'daemon' must be one of {DAEMONS}")
            runs.append(run)
    # Later runs give a test's row: by date, then file name.
    runs.sort(key=lambda r: (r.get("date") or "", r["file"]))
    return runs


def load_reasons():
    reasons = {}
    with open(os.path.join(DATA, "reasons.tsv")) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            test, _, why = line.partition("\t")
            reasons[test] = why
    return reasons


def merge(runs, daemon):
    """test -> (entry, run) for `daemon`, the latest run winning."""
    rows = {}
    for run in runs:
        if run["daemon"] != daemon:
            continue
        for t in run.get("not_run_here", {}).get("tests", []):
            rows[t] = ({"test": t, "status": "notrun", "seconds": None, "reason": None,
                        "not_run_here": True}, run)
        for t in run["tests"]:
            rows[t["test"]] = (t, run)
    return rows


def test_key(name):
    m = re.match(r"^(\w+)/(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def cell(entry):
    if entry is None:
        return "not run here"
    if entry.get("not_run_here"):
        return "notrun (not run: same FSTYP check)"
    extra = []
    if entry.get("seconds") is not None:
        extra.append(f"{entry['seconds']}s")
    # A converted run keeps a short note in 'reason' only where the page showed one.
    if entry.get("reason") and entry.get("seconds") is None and entry["status"] != "pass":
        extra.append(entry["reason"])
    return entry["status"] + (f" ({', '.join(extra)})" if extra else "")


def version_label(runs):
    versions = sorted({r.get("version") for r in runs if r["daemon"] == "virtiofsd" and r.get("version")})
    return "virtiofsd " + "/".join(versions) if versions else "virtiofsd"


def short(tests):
    nums = [t.split("/", 1)[1] for t in tests]
    if len(nums) <= 1:
        return "generic/" + nums[0] if nums else "none"
    return "generic/" + ", ".join(nums[:-1]) + " and " + nums[-1]


def render(runs, reasons):
    vfsd = merge(runs, "vfsd")
    vd = merge(runs, "virtiofsd")
    vd_label = version_label(runs)
    names = sorted(set(vfsd) | set(vd), key=test_key)

    def counts(rows):
        c = {"pass": 0, "fail": 0, "notrun": 0, "here": 0}
        for t in names:
            if t in rows:
                e = rows[t][0]
                c[e["status"]] = c.get(e["status"], 0) + 1
                c["here"] += bool(e.get("not_run_here"))
        return c

    cv, cd = counts(vfsd), counts(vd)
    lines = ["| daemon | passed | failed | not run |", "| --- | --- | --- | --- |",
             f"| vfsd | {cv['pass']} | {cv['fail']} | {cv['notrun']} |"]
    here = f" ({cd['here']} of them by the same FSTYP check, not run on it)" if cd["here"] else ""
    lines.append(f"| {vd_label} | {cd['pass']} | {cd['fail']} | {cd['notrun']}{here} |")
    counts_md = "\n".join(lines)

    def status(rows, t):
        return rows[t][0]["status"] if t in rows else None

    only_vfsd_fails = [t for t in names if status(vfsd, t) == "fail" and status(vd, t) == "pass"]
    only_vfsd_passes = [t for t in names if status(vfsd, t) == "pass" and status(vd, t) in ("fail", "notrun")]
    diff_md = textwrap.fill(f"Failing on vfsd and passing on {vd_label}: {short(only_vfsd_fails)}. "
               f"Passing on vfsd and not on {vd_label}: {short(only_vfsd_passes)}.", width=90)

    table = [f"| test | vfsd | vfsd commit | {vd_label} | reason (a test that did not pass) |",
             "| --- | --- | --- | --- | --- |"]
    for t in names:
        ev = vfsd.get(t, (None, None))
        ed = vd.get(t, (None, None))
        why = reasons.get(t)
        if why is None:
            for e in (ev[0], ed[0]):
                if e and e["status"] != "pass" and e.get("reason") and not e.get("not_run_here"):
                    why = e["reason"]
                    break
        commit = (ev[1] or {}).get("commit") or ""
        table.append(f"| {t} | {cell(ev[0])} | {commit} | {cell(ed[0])} | {why or ''} |")

    runs_md = ["| file | daemon | vfsd commit | date | tests | passed | failed | not run |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        d = r["daemon"] + (f" {r['version']}" if r.get("version") else "")
        n = len(r["tests"]) + len(r.get("not_run_here", {}).get("tests", []))
        runs_md.append(f"| [{r['file']}](xfstests/{r['file']}) | {d} | {r.get('commit') or ''} | "
                       f"{r.get('date') or ''} | {n} | {r.get('passed', '')} | {r.get('failed', '')} | "
                       f"{r.get('not_run', '')} |")
    return counts_md, diff_md, "\n".join(table), "\n".join(runs_md)


def add(args):
    with open(args.add) as f:
        run = json.load(f)
    info = "\n".join(run.get("info", []))
    daemon = args.daemon
    if not daemon:
        m = re.search(r'^daemon: "?(\w+)', info, re.M)
        daemon = m.group(1) if m else None
    if daemon not in DAEMONS:
        sys.exit(f"say --daemon (one of {DAEMONS}); run.info gives {daemon!r}")
    commit = args.commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    date = args.date or datetime.datetime.fromtimestamp(
        os.path.getmtime(args.add), datetime.timezone.utc).strftime("%Y-%m-%d")
    out = {"daemon": daemon, "commit": commit, "date": date}
    if daemon == "virtiofsd":
        out["version"] = args.version
        if not args.version:
            sys.exit("say --version for a virtiofsd run (e.g. --version 1.14)")
    out.update({k: v for k, v in run.items() if k not in out})
    name = f"{daemon}-{args.version}-{commit}.json" if daemon == "virtiofsd" else f"{daemon}-{commit}.json"
    with open(os.path.join(DATA, name), "w") as f:
        f.write(json.dumps(out, indent=2) + "\n")
    print(f"saved docs/xfstests/{name}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--add", metavar="SUMMARY_JSON", help="save this run under docs/xfstests/ first")
    p.add_argument("--daemon", choices=DAEMONS)
    p.add_argument("--commit", help="the vfsd commit the run was made at (default: HEAD)")
    p.add_argument("--date", help="YYYY-MM-DD (default: the summary's modification time)")
    p.add_argument("--version", help="virtiofsd's version, for a virtiofsd run")
    args = p.parse_args()
    if args.add:
        add(args)
    with open(os.path.join(DATA, "page.md")) as f:
        page = f.read()
    counts_md, diff_md, table, runs_md = render(load_runs(), load_reasons())
    for key, text in (("@@COUNTS@@", counts_md), ("@@DIFFERENCES@@", diff_md),
                      ("@@TABLE@@", table), ("@@RUNS@@", runs_md)):
        if key not in page:
            sys.exit(f"docs/xfstests/page.md lacks {key}")
        page = page.replace(key, text)
    with open(PAGE, "w") as f:
        f.write(page)


if __name__ == "__main__":
    main()
