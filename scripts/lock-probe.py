#!/usr/bin/env python3
"""Third-party lock probes for scripts/guest-migrate.sh --probe-locks.

  lock-probe.py probe --name A --dir SHARE/mig --stop FILE --out LOG [--watch FILE]
                      [--backoff-ms 20]
      A host process on one mount: in a loop until FILE exists, non-blocking attempts
      on the guest's three locked files: flock(LOCK_EX|LOCK_NB) on flock-file,
      fcntl F_SETLK write 0-EOF on posix-file, F_OFD_SETLK write 0-EOF on ofd-file.
      A success is logged and released at once; that kind then rests for --backoff-ms
      (so the probe does not hold the lock most of the time and starve the daemon
      that retakes it; vfsd retries every 20 ms). After a refused POSIX or OFD attempt
      it asks F_GETLK / F_OFD_GETLK who holds it and logs each change of holder pid
      (GlusterFS reports the holder's host pid through either mount). --watch names a
      file of "NAME PID" lines (re-read as it changes): the time each PID exits (gone
      or a zombie) is logged. Each log line starts with the wall-clock time (epoch s).
      Per kind and second, the longest gap between two attempts is logged (the
      resolution). At the end: attempts and successes per kind.

  lock-probe.py report --log LOG... --release NAME=DAEMONLOG...
      Figures (one "key: value" a line): per probe and kind the attempts and
      successes; per source daemon release (its "frontend disconnected" or "Client
      disconnected" log line, else its exit seen by a probe) and kind: when a probe
      first got the lock after it, the last time, when every probe that got it saw it
      busy again, and (POSIX, OFD) when a new holder pid showed; the window in ms.
      Exit status 0; "successes-total: N" tells the caller whether anything got in.
"""
import argparse
import datetime
import errno
import fcntl
import os
import re
import struct
import sys
import time

KINDS = ("flock", "posix", "ofd")
FILES = {"flock": "flock-file", "posix": "posix-file", "ofd": "ofd-file"}
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
FLOCK = "hhqqi4x"  # struct flock on x86_64: type, whence, start, len, pid


def flock_arg(t):
    return struct.pack(FLOCK, t, os.SEEK_SET, 0, 0, 0)


def probe(a):
    out = open(a.out, "a", buffering=1)

    def log(msg, t=None):
        out.write("%.6f %s %s\n" % (time.time() if t is None else t, a.name, msg))

    fds = {k: os.open(os.path.join(a.dir, FILES[k]), os.O_RDWR) for k in KINDS}
    attempts = dict.fromkeys(KINDS, 0)
    successes = dict.fromkeys(KINDS, 0)
    state = dict.fromkeys(KINDS, None)       # busy / free / error N
    holder = dict.fromkeys(KINDS, None)
    rest_until = dict.fromkeys(KINDS, 0.0)
    last_try = dict.fromkeys(KINDS, None)
    gap = {k: [None, 0.0, 0] for k in KINDS}  # second, longest gap, attempts
    watch, watch_mtime, exited = {}, None, set()
    log("start pid %d dir %s backoff %d ms" % (os.getpid(), a.dir, a.backoff_ms))
    backoff = a.backoff_ms / 1000.0
    n = 0

    def attempt(k):
        fd = fds[k]
        try:
            if k == "flock":
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif k == "posix":
                fcntl.fcntl(fd, fcntl.F_SETLK, flock_arg(fcntl.F_WRLCK))
            else:
                fcntl.fcntl(fd, F_OFD_SETLK, flock_arg(fcntl.F_WRLCK))
        except OSError as e:
            return "busy" if e.errno in (errno.EAGAIN, errno.EACCES) else "error %s" % errno.errorcode.get(e.errno, e.errno)
        t = time.time()
        if k == "flock":
            fcntl.flock(fd, fcntl.LOCK_UN)
        elif k == "posix":
            fcntl.fcntl(fd, fcntl.F_SETLK, flock_arg(fcntl.F_UNLCK))
        else:
            fcntl.fcntl(fd, F_OFD_SETLK, flock_arg(fcntl.F_UNLCK))
        return ("free", t, time.time())

    def who(k):
        try:
            r = fcntl.fcntl(fds[k], fcntl.F_GETLK if k == "posix" else F_OFD_GETLK, flock_arg(fcntl.F_WRLCK))
        except OSError as e:
            return "getlk-error %s" % errno.errorcode.get(e.errno, e.errno)
        typ, _, start, ln, pid = struct.unpack(FLOCK, r)
        if typ == fcntl.F_UNLCK:
            return "none"
        # whose: the holder's socket path (a daemon's), while it still runs
        try:
            argv = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
            sock = [x.split(b"=", 1)[1] for x in argv if x.startswith(b"--socket-path=")]
            return "pid %d (%s)" % (pid, os.path.basename(sock[0]).decode() if sock else os.path.basename(argv[0]).decode())
        except (OSError, IndexError, ValueError):
            return "pid %d" % pid

    while True:
        n += 1
        if n % 16 == 0:
            if os.path.exists(a.stop):
                break
            if a.watch:
                try:
                    m = os.stat(a.watch).st_mtime_ns
                except OSError:
                    m = None
                if m is not None and m != watch_mtime:
                    watch_mtime = m
                    for line in open(a.watch):
                        p = line.split()
                        if len(p) == 2 and p[0] not in watch:
                            watch[p[0]] = int(p[1])
                            log("watch %s pid %s" % (p[0], p[1]))
        for name, pid in watch.items():
            if name in exited:
                continue
            try:
                st = open("/proc/%d/stat" % pid).read()
                gone = st.rsplit(")", 1)[1].split()[0] in ("Z", "X")
            except OSError:
                gone = True
            if gone:
                exited.add(name)
                log("exited %s pid %d" % (name, pid))
        now = time.time()
        tried = False
        for k in KINDS:
            if now < rest_until[k]:
                continue
            tried = True
            t0 = time.time()
            r = attempt(k)
            attempts[k] += 1
            # the longest gap between two attempts, per second
            sec = int(t0)
            g = gap[k]
            if g[0] != sec:
                if g[0] is not None:
                    log("gap %s %d %.3f ms %d attempts" % (k, g[0], g[1] * 1000, g[2]))
                gap[k] = g = [sec, 0.0, 0]
            if last_try[k] is not None:
                g[1] = max(g[1], t0 - last_try[k])
            g[2] += 1
            last_try[k] = t0
            if isinstance(r, tuple):
                successes[k] += 1
                if state[k] != "free":
                    log("state %s free" % k, r[1])
                    state[k] = "free"
                log("granted %s held %.3f ms (attempt %d)" % (k, (r[2] - r[1]) * 1000, attempts[k]), r[1])
                rest_until[k] = time.time() + backoff
                continue
            if r != state[k]:
                log("state %s %s" % (k, r), t0)
                state[k] = r
            if r == "busy" and k != "flock":
                h = who(k)
                if h != holder[k]:
                    holder[k] = h
                    log("holder %s %s" % (k, h))
        if not tried:
            time.sleep(max(0.0, min(rest_until.values()) - time.time()))
    for k in KINDS:
        g = gap[k]
        if g[0] is not None:
            log("gap %s %d %.3f ms %d attempts" % (k, g[0], g[1] * 1000, g[2]))
        log("end %s attempts %d successes %d" % (k, attempts[k], successes[k]))
    return 0


RUN_GAP = 0.2   # s
TS = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")


def release_time(path):
    """The daemon's 'frontend disconnected' (vfsd) / 'Client disconnected' (virtiofsd)."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return None
    for line in lines:
        if re.search(r"frontend disconnected|client disconnected", line, re.I):
            m = TS.match(line)
            if m:
                s = m.group(1)
                fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in s else "%Y-%m-%dT%H:%M:%S"
                return datetime.datetime.strptime(s, fmt).replace(tzinfo=datetime.timezone.utc).timestamp()
    return None


def report(a):
    ev = []   # (t, probe, words)
    for path in a.log:
        for line in open(path):
            p = line.split()
            if len(p) >= 3:
                ev.append((float(p[0]), p[1], p[2:]))
    ev.sort(key=lambda e: e[0])
    probes = sorted({e[1] for e in ev})
    figs = []

    def fig(k, v):
        figs.append("%s: %s" % (k, v))

    total = 0
    for pr in probes:
        parts, span = [], [e[0] for e in ev if e[1] == pr]
        for e in ev:
            if e[1] == pr and e[2][0] == "end":
                k, att, suc = e[2][1], int(e[2][3]), int(e[2][5])
                total += suc
                parts.append("%s %d attempts (%.0f/s), %d granted" % (k, att, att / max(1e-3, span[-1] - span[0]), suc))
        fig("lock probe via mount %s (%.1f s)" % (pr, span[-1] - span[0]), "; ".join(parts))
    fig("lock probe successes-total", str(total))

    rel = []
    for spec in a.release:
        name, path = spec.split("=", 1)
        t = release_time(path)
        ex = [e[0] for e in ev if e[2][0] == "exited" and e[2][1] == name]
        src = "log line"
        if ex and (t is None or ex[0] < t):
            t, src = ex[0], "exit seen by a probe" + ("" if t is None else ", before its log line's ms")
        if t is None:
            fig("lock window after %s" % name, "no release time (no disconnect line, no exit seen)")
            continue
        rel.append((t, name))
        fig("daemon %s released (%s)" % (name, src), "%s UTC%s" % (
            datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3],
            "; process gone (seen by a probe) %+.0f ms later" % ((ex[0] - t) * 1000) if ex and src == "log line" else ""))
    rel.sort()
    probe_pids = {e[2][2] for e in ev if e[2][0] == "start"}
    start = ev[0][0] if ev else 0
    first_rel = rel[0][0] if rel else float("inf")
    for k in KINDS:
        before = [e for e in ev if e[2][0] == "granted" and e[2][1] == k and e[0] < first_rel - 0.05]
        if before:
            fig("lock probe %s granted before any release" % k,
                "%d times (first %+.0f ms after the probes started): the host could take the guest's lock while its daemon held it" % (len(before), (before[0][0] - start) * 1000))
    for i, (t, name) in enumerate(rel):
        end = rel[i + 1][0] if i + 1 < len(rel) else float("inf")
        for k in KINDS:
            win = [e for e in ev if t <= e[0] < end]
            got = [e for e in win if e[2][0] == "granted" and e[2][1] == k]
            # holder pids seen before this release (the old holder); a new one: the taker
            # (not a probe: one probe sees another's grant)
            old = {e[2][3] for e in ev if e[0] < t and e[2][0] == "holder" and e[2][1] == k and e[2][2] == "pid"} | probe_pids
            new = [e for e in win if e[2][0] == "holder" and e[2][1] == k and e[2][2] == "pid" and e[2][3] not in old]
            hold = ""
            if new:
                hold = "; a new holder, %s, first seen %+.0f ms after the release (by probe %s)" % (" ".join(new[0][2][2:]), (new[0][0] - t) * 1000, new[0][1])
            if not got:
                # the resolution: the longest gap between attempts, in the seconds around it
                gaps = [float(e[2][3]) for e in ev if e[2][0] == "gap" and e[2][1] == k and abs(int(e[2][2]) + 0.5 - t) <= 1.5]
                fig("lock window %s after %s's release" % (k, name),
                    "none seen: 0 granted, every attempt busy (longest gap between attempts around the release: %s)%s" % (
                        "%.1f ms" % max(gaps) if gaps else "unknown", hold))
                continue
            # free runs: grants less than RUN_GAP apart (two probes collide, and a probe
            # rests after a grant, so one refused attempt between grants means nothing)
            runs = [[got[0]]]
            for e in got[1:]:
                if e[0] - runs[-1][-1][0] < RUN_GAP:
                    runs[-1].append(e)
                else:
                    runs.append([e])
            run = runs[0]
            last = run[-1][0]
            ends = []
            for pr in {e[1] for e in run}:
                b = [e[0] for e in win if e[1] == pr and e[0] > last - 1e-9 and e[2][:3] == ["state", k, "busy"]]
                ends.append(b[0] if b else None)
            closed = None if None in ends else max(ends)
            by = ", ".join("%s %d" % (pr, sum(1 for e in run if e[1] == pr)) for pr in sorted({e[1] for e in run}))
            later = ""
            if len(runs) > 1:
                later = "; %d later free moment(s), %d grants, from %+.0f ms" % (
                    len(runs) - 1, sum(len(r) for r in runs[1:]), (runs[1][0][0] - t) * 1000)
            fig("lock window %s after %s's release" % (k, name),
                "%s ms: %d granted (%s), first %+.0f ms, last %+.0f ms after the release, %s%s%s" % (
                    "%.0f" % ((closed - t) * 1000) if closed else "open",
                    len(run), by, (run[0][0] - t) * 1000, (last - t) * 1000,
                    "busy again through every probe granted it %+.0f ms after it" % ((closed - t) * 1000) if closed else "never busy again while probed",
                    hold, later))
    for f in figs:
        print(f)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--name", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--watch")
    p.add_argument("--backoff-ms", type=int, default=20)
    r = sub.add_parser("report")
    r.add_argument("--log", action="append", default=[])
    r.add_argument("--release", action="append", default=[])
    a = ap.parse_args()
    return probe(a) if a.cmd == "probe" else report(a)


if __name__ == "__main__":
    sys.exit(main())
