#!/usr/bin/env python3
"""Summary of one scripts/run-xfstests.sh run: summary.txt and summary.json.

With --compare A/summary.json B/summary.json: a Markdown table of both runs
side by side (for docs/xfstests.md), and the tests that fail only in B.

Reads, in the results directory: tests.list (the list asked for), out/check.out
(fstests' ./check output of every boot), out/watchdog.log (tests stopped by the
guest's watchdog or lost with the guest: name TAB reason), times.tsv (name,
start, end as the host saw them) and run.info.
"""
import argparse
import json
import os
import re
import sys

TEST_LINE = re.compile(r"^([a-z0-9]+/[0-9]+)(\s.*)?$")


def classify(rest):
    if "[not run]" in rest:
        return "notrun"
    for mark in (" - output mismatch", "[failed", "_check_", "[dumped core]", "no qualified output"):
        if mark in rest:
            return "fail"
    if re.search(r"[0-9]+s\s*$", rest):
        return "pass"
    return "fail"


def parse_check_out(path):
    """name -> (first line after the name, following indented lines)."""
    tests = {}
    current = None
    with open(path, errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            m = TEST_LINE.match(line)
            if m:
                current = m.group(1)
                tests.setdefault(current, [(m.group(2) or "").strip(), []])
                continue
            if current and line.startswith(("    ", "\t")):
                tests[current][1].append(line.strip())
            elif line.strip() and not line.startswith(" "):
                current = None
    return tests


def reason_of(status, rest, details):
    if status == "notrun":
        return rest.split("[not run]", 1)[1].strip()
    if status == "pass":
        return ""
    rest = re.sub(r"^(?:[0-9]+s \.\.\.\s*)", "", rest).strip()
    # "- output mismatch (see .../generic/001.out.bad)": keep the first diff lines too.
    diff = [d for d in details if d[:1] in ("+", "-") and len(d) > 1 and not d.startswith(("---", "+++"))][:3]
    reason = rest or "no result"
    if diff:
        reason += " | " + " / ".join(diff)
    return reason


def compare(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    names = []
    for r in runs:
        for t in r["tests"]:
            if t["test"] not in names:
                names.append(t["test"])
    label = [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    print("| test | " + " | ".join(label) + " | reason (first run that did not pass) |")
    print("| --- | " + " | ".join("---" for _ in runs) + " | --- |")
    for n in names:
        cells, reason = [], ""
        for r in runs:
            t = next((t for t in r["tests"] if t["test"] == n), None)
            if t is None:
                cells.append("-")
                continue
            secs = " (%ss)" % t["seconds"] if t["seconds"] is not None else ""
            cells.append(t["status"] + secs)
            if t["status"] != "pass" and not reason:
                reason = t["reason"].replace("|", "/")[:160]
        print("| %s | %s | %s |" % (n, " | ".join(cells), reason))
    print()
    for r, l in zip(runs, label):
        print("- %s: passed %d, failed %d, not run %d, never started %d of %d; wall %dm%02ds" % (
            l, r["passed"], r["failed"], r["not_run"], r["never_started"], r["total"],
            r["wall_seconds"] // 60, r["wall_seconds"] % 60))
    if len(runs) == 2:
        a = {t["test"]: t["status"] for t in runs[0]["tests"]}
        only = [t["test"] for t in runs[1]["tests"] if t["status"] == "fail" and a.get(t["test"]) == "pass"]
        print("- failing with %s but passing with %s: %s" % (label[1], label[0], ", ".join(only) or "none"))
        only = [t["test"] for t in runs[0]["tests"] if t["status"] == "fail"
                and dict((u["test"], u["status"]) for u in runs[1]["tests"]).get(t["test"]) == "pass"]
        print("- failing with %s but passing with %s: %s" % (label[0], label[1], ", ".join(only) or "none"))
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        return compare(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--wall", type=int, default=0)
    ap.add_argument("--strict-flag", default="0")
    a = ap.parse_args()
    r = a.results
    strict = a.strict_flag == "1"

    with open(os.path.join(r, "tests.list")) as f:
        wanted = [l.strip() for l in f if l.strip()]
    check = parse_check_out(os.path.join(r, "out", "check.out"))
    notes = {}
    wpath = os.path.join(r, "out", "watchdog.log")
    if os.path.exists(wpath):
        with open(wpath, errors="replace") as f:
            for l in f:
                if "\t" in l:
                    name, why = l.rstrip("\n").split("\t", 1)
                    notes.setdefault(name, why)
    times = {}
    tpath = os.path.join(r, "times.tsv")
    if os.path.exists(tpath):
        with open(tpath) as f:
            for l in f:
                p = l.split()
                if len(p) == 3:
                    times[p[0]] = int(p[2]) - int(p[1])
    info = ""
    ipath = os.path.join(r, "run.info")
    if os.path.exists(ipath):
        with open(ipath) as f:
            info = f.read()

    results = []
    for name in wanted:
        if name in check:
            rest, details = check[name]
            status = classify(rest)
            reason = reason_of(status, rest, details)
            if name in notes:
                status, reason = "fail", "watchdog: " + notes[name] if "no progress" in notes[name] else notes[name]
        elif name in notes:
            status, reason = "fail", notes[name]
        else:
            status, reason = "unrun", "never started (the run stopped before it)"
        m = re.search(r"\s([0-9]+)s\s*$", check.get(name, ("", []))[0]) if status == "pass" else None
        results.append({
            "test": name,
            "status": status,
            "reason": reason,
            "seconds": times.get(name),
            "check_seconds": int(m.group(1)) if m else None,
        })

    counts = {s: sum(1 for t in results if t["status"] == s) for s in ("pass", "fail", "notrun", "unrun")}
    ok = counts["fail"] == 0 and counts["unrun"] == 0 and not (strict and counts["notrun"])
    summary = {
        "info": info.strip().splitlines(),
        "total": len(results),
        "passed": counts["pass"],
        "failed": counts["fail"],
        "not_run": counts["notrun"],
        "never_started": counts["unrun"],
        "wall_seconds": a.wall,
        "strict": strict,
        "ok": ok,
        "tests": results,
    }
    with open(os.path.join(r, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")

    out = []
    out.append("xfstests summary (%s)" % r)
    out += ["  " + l for l in info.strip().splitlines()]
    out.append("")
    for t in results:
        secs = "%5ss" % (t["seconds"] if t["seconds"] is not None else "-")
        line = "%-8s %-13s %s" % (t["status"].upper(), t["test"], secs)
        if t["reason"]:
            line += "  " + t["reason"]
        out.append(line)
    out.append("")
    out.append("passed %d, failed %d, not run %d%s of %d; wall time %dm%02ds" % (
        counts["pass"], counts["fail"], counts["notrun"],
        ", never started %d" % counts["unrun"] if counts["unrun"] else "",
        len(results), a.wall // 60, a.wall % 60))
    if strict and counts["notrun"]:
        out.append("--strict: 'not run' counts as a failure in this list")
    out.append("RESULT: %s" % ("PASS" if ok else "FAIL"))
    with open(os.path.join(r, "summary.txt"), "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
