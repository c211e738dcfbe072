#!/usr/bin/env bash
# Side-by-side benchmarks: vfsd vs virtiofsd vs the host itself, in one run.
#
#   scripts/bench.sh [--quick] [--runs N] [--no-loadgen] [--no-native] [--no-guest] [--out DIR]
#   scripts/bench.sh --gluster [--runs N] [--out DIR]
#   scripts/bench.sh --tree [--modes auto,always,never,metadata] [--daemons vfsd,virtiofsd,tmpfs]
#                    [--runs N] [--userland host|initramfs] [--tree-source TARBALL] [--steps LIST]
#                    [--vfsd-args ARGS] [--virtiofsd-args ARGS] [--same-boot]
#                    [--share-fs ext4|tmpfs|host] [--out DIR]
#
# 1. Load generator (vfsd-bench plays the guest driver on the vhost-user socket) against
#    each daemon at its default and best settings, and native fio at the same concurrency
#    (numjobs = the requests it keeps in flight, same block size and files).
# 2. Native: the same fio jobs as the guest runs, on the host, in the directory that is
#    shared. Native runs make the syscalls a daemon makes for the guest: buffered preadv
#    and pwritev (the daemons drop O_DIRECT unless --allow-direct-io), so the host's page
#    cache serves both sides alike.
# 3. Guest fio matrix through scripts/run-vm.sh, same kernel and VM for both daemons.
#
# --gluster: the same on a GlusterFS volume (scripts/gluster.sh up; client mount A):
#    native fio on the mount, a guest through vfsd and a guest through virtiofsd on it;
#    1 MiB sequential read and write, 4k random read and write, shared-file direct
#    writes at 1 and 2 jobs. The load generator runs only 1 MiB sequential read and write
#    with one request in flight, against native fio's one psync job: the daemon's own
#    share of the gap, without the TCG guest. Default DIR: docs/benchmarks/gluster.
# --tree: a source-tree workload in a real guest (guest-tests/tree-bench.sh): untar of a
#    real source tree (the pinned fstests tarball, ../shared/xfstests/xfstests-*.tar.xz,
#    4,683 entries; else --tree-source, else a few crates from the local cargo cache), find,
#    ls -lR warm and after drop_caches, cp -a, rm -rf, 2,000 small files created and
#    unlinked, and git clone from a bundle in the share, git status clean and dirty. For each
#    cache mode of --modes (default all four) a guest through vfsd and one through virtiofsd,
#    each as run-vm.sh ships it plus --cache MODE, and once per run the same steps on the
#    guest's tmpfs. Per step: the guest's time, the daemon's CPU time (utime+stime of its
#    process tree, read by the host at the guest's step marks), the FUSE requests the guest
#    sent (tracepoint fuse:fuse_request_send), and vfsd's own count (--stats, on SIGUSR1).
#    --userland host (default) runs the steps chrooted into a read-only view of the host's
#    root, so GNU tar, coreutils and git; initramfs: busybox, without git. --steps times only
#    those steps (what they need still runs, untimed); --vfsd-args and --virtiofsd-args go on
#    that daemon's command line for the share under test. VFSD_BIN picks the vfsd binary
#    (default: target/release/vfsd, built). Default DIR: docs/benchmarks/tree.
#    --same-boot: vfsd and virtiofsd serve one guest each run and mode, a share each, and
#    the guest runs the steps on one share and then on the other (vfsd first in odd runs,
#    virtiofsd first in even ones), so what one boot's host gives or takes (the CPU cost
#    of a wake-up, steal time) falls on both daemons alike.
#   --share-fs: what each tree share is on. ext4 (default): a fresh ext4 with a journal,
#    as mkfs.ext4 makes it, on a loop device over a file in /dev/shm, one per share and
#    boot, so one daemon's deletions never slow the other's creates. tmpfs: a fresh tmpfs
#    per share. host: a directory under /var/tmp on the host's own file system (before
#    session 17); on a host whose ext4 has no journal, a create there scans the inodes
#    deleted in the last 30 s, and costs 10 to 25 times as much after a rm -rf.
# Each figure is the median of --runs runs (default 3), runs interleaved across daemons so
# drift hits all alike. Results: DIR/results.jsonl, then scripts/bench_report.py writes
# DIR/report.md and DIR/*.png (default DIR: docs/benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

ARGS="$*"
QUICK=0 RUNS=3 LOADGEN=1 NATIVE=1 GUEST=1 OUT= GLUSTER=0
TREE=0 TREE_MODES=auto,always,never,metadata TREE_DAEMONS=vfsd,virtiofsd,tmpfs TREE_USERLAND=host TREE_SOURCE=
TREE_STEPS=all TREE_VFSD_ARGS= TREE_VIRTIOFSD_ARGS= TREE_SAME_BOOT=0 TREE_SHARE_FS=ext4
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1; shift ;;
        --runs) RUNS=${2:?}; shift 2 ;;
        --no-loadgen) LOADGEN=0; shift ;;
        --no-native) NATIVE=0; shift ;;
        --no-guest) GUEST=0; shift ;;
        --out) OUT=${2:?}; shift 2 ;;
        --gluster) GLUSTER=1; shift ;;
        --tree) TREE=1; shift ;;
        --modes) TREE_MODES=${2:?}; shift 2 ;;
        --daemons) TREE_DAEMONS=${2:?}; shift 2 ;;
        --userland) TREE_USERLAND=${2:?}; shift 2 ;;
        --tree-source) TREE_SOURCE=${2:?}; shift 2 ;;
        --steps) TREE_STEPS=${2:?}; shift 2 ;;
        --vfsd-args) TREE_VFSD_ARGS=${2?}; shift 2 ;;
        --virtiofsd-args) TREE_VIRTIOFSD_ARGS=${2?}; shift 2 ;;
        --same-boot) TREE_SAME_BOOT=1; shift ;;
        --share-fs) TREE_SHARE_FS=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
SECS=5; GSECS=20; [ $QUICK = 1 ] && { SECS=2; GSECS=8; }
[ -n "$OUT" ] || { if [ $GLUSTER = 1 ]; then OUT=docs/benchmarks/gluster; elif [ $TREE = 1 ]; then OUT=docs/benchmarks/tree; else OUT=docs/benchmarks; fi; }

say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# fio's JSON as one line (it may print notes before the JSON itself).
onejson() { python3 -c 'import json,sys;t=open(sys.argv[1]).read();print(json.dumps(json.loads(t[t.index("{"):])))' "$1"; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
if [ $TREE = 1 ]; then
    # ---- --tree: the source-tree workload (guest-tests/tree-bench.sh) -------------------
    CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
    IFS=, read -r -a TMODES <<<"$TREE_MODES"
    IFS=, read -r -a TDAEMONS <<<"$TREE_DAEMONS"
    for m in "${TMODES[@]}"; do
        case $m in auto|always|never|metadata) ;; *) die "--modes: '$m' is no cache mode (auto, always, never, metadata)" ;; esac
    done
    for d in "${TDAEMONS[@]}"; do
        case $d in vfsd|virtiofsd|tmpfs) ;; *) die "--daemons: '$d' is none of vfsd, virtiofsd, tmpfs" ;; esac
    done
    case $TREE_USERLAND in host|initramfs) ;; *) die "--userland: host or initramfs" ;; esac
    case $TREE_SHARE_FS in ext4|tmpfs|host) ;; *) die "--share-fs: ext4, tmpfs or host" ;; esac
    if [ "$TREE_SHARE_FS" = ext4 ]; then
        command -v mkfs.ext4 >/dev/null || die "--share-fs ext4: no mkfs.ext4 (apt-get install e2fsprogs, or use --share-fs tmpfs)"
        [ -e /dev/loop-control ] || die "--share-fs ext4: no loop devices here (/dev/loop-control); use --share-fs tmpfs or host"
    fi
    if [ "$TREE_SAME_BOOT" = 1 ]; then
        [[ ",$TREE_DAEMONS," == *,vfsd,* && ",$TREE_DAEMONS," == *,virtiofsd,* ]] ||
            die "--same-boot: --daemons must name both vfsd and virtiofsd"
    fi
    [[ $TREE_STEPS =~ ^[a-zA-Z,-]+$ ]] || die "--steps: a comma-separated list of step names"
    if [ -z "${VFSD_BIN:-}" ]; then
        say "building vfsd"
        cargo build --release --quiet
        VFSD_BIN=$REPO/target/release/vfsd
    fi
    [ -x "$VFSD_BIN" ] || die "VFSD_BIN=$VFSD_BIN is not executable"
    VFSD_BIN=$(realpath "$VFSD_BIN")
    export VFSD_BIN
    "$VFSD_BIN" --help | grep -q -- --stats-interval || die "$VFSD_BIN has no --stats-interval"
    if [ "$TREE_USERLAND" = host ]; then
        command -v git >/dev/null || die "--userland host: the host has no git (install it, or use --userland initramfs)"
        command -v unshare >/dev/null || die "unshare not found: apt-get install util-linux"
        [ -d /mnt ] || die "--userland host: the host has no /mnt, where the guest's shares appear in the chroot"
    fi

    # The source tree, as src.tar (top directory "src") and a git bundle of it, made once.
    if [ -z "$TREE_SOURCE" ]; then
        for t in "$REPO"/../shared/xfstests/xfstests-*.tar.xz; do [ -f "$t" ] && TREE_SOURCE=$t; done
    fi
    SRC=$CACHE/tree-source
    if [ -n "$TREE_SOURCE" ]; then
        [ -r "$TREE_SOURCE" ] || die "--tree-source $TREE_SOURCE: not readable"
        TREE_SOURCE=$(cd "$(dirname "$TREE_SOURCE")" && pwd)/$(basename "$TREE_SOURCE")
        KEY="$(basename "$TREE_SOURCE") $(stat -c %s "$TREE_SOURCE")"
    else
        KEY="crates"
    fi
    if [ "$(cat "$SRC/.key" 2>/dev/null)" != "$KEY" ] || [ ! -f "$SRC/src.bundle" ]; then
        say "preparing the source tree in $SRC (once)"
        rm -rf "$SRC"; mkdir -p "$SRC/x"
        if [ -n "$TREE_SOURCE" ]; then
            tar -xf "$TREE_SOURCE" -C "$SRC/x"
            set -- "$SRC"/x/*
            [ $# = 1 ] && [ -d "$1" ] || die "--tree-source: $TREE_SOURCE should hold one top directory"
            mv "$1" "$SRC/src"
        else
            # No tarball: crate sources from the local cargo cache, largest first, until
            # the tree has 4,000 entries.
            mkdir -p "$SRC/src"
            for c in $(ls -S "$HOME"/.cargo/registry/cache/*/*.crate 2>/dev/null); do
                tar -xzf "$c" -C "$SRC/src"
                [ "$(find "$SRC/src" | wc -l)" -ge 4000 ] && break
            done
            [ "$(find "$SRC/src" | wc -l)" -ge 1000 ] || die "no source tree: pass --tree-source TARBALL"
        fi
        rmdir "$SRC/x"
        tar -C "$SRC" -cf "$SRC/src.tar" src
        git -C "$SRC/src" -c init.defaultBranch=main init -q
        git -C "$SRC/src" add -A -f
        git -C "$SRC/src" -c user.name=vfsd-bench -c user.email=vfsd-bench@example.invalid \
            commit -q -m "source tree for scripts/bench.sh --tree"
        git -C "$SRC/src" bundle create -q "$SRC/src.bundle" --all
        rm -rf "$SRC/src"
        echo "$KEY" > "$SRC/.key"
    fi
    ENTRIES=$(tar -tf "$SRC/src.tar" | wc -l)
    say "source tree: ${TREE_SOURCE:-crates from the cargo cache}, $ENTRIES entries"

    KERNEL=$(scripts/fetch-kernel.sh) || die "no guest kernel"
    # Busybox and guest-tests only; an image of its own, so no other run's is rebuilt under it.
    INITRD=$(scripts/build-initramfs.sh --no-tools -o "$CACHE/initramfs-tree.cpio.gz") || die "no initramfs"
    W=$(mktemp -d /var/tmp/vfsd-tree.XXXXXX)
    MON=
    # share_up DIR: a tree share at DIR on a file system of its own (--share-fs); share_down
    # DIR: gone again. The ext4 images live in /dev/shm, so their I/O stays in memory.
    share_up() {
        mkdir -p "$1"
        case $TREE_SHARE_FS in
            host) ;;
            tmpfs) mount -t tmpfs -o size=2g,mode=0755 vfsd-tree "$1" || die "--share-fs tmpfs: mounting a tmpfs at $1 failed" ;;
            ext4)
                local img; img=/dev/shm/vfsd-tree-$(basename "$W")-$(basename "$1").img
                truncate -s 2G "$img"
                mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img" ||
                    die "--share-fs ext4: mkfs.ext4 $img failed"
                mount -o loop "$img" "$1" ||
                    die "--share-fs ext4: mounting $img at $1 failed (no free loop device?); use --share-fs tmpfs or host"
                rmdir "$1/lost+found"  # so the share holds what the steps make, as on tmpfs
                ;;
        esac
    }
    share_down() {
        if mountpoint -q "$1"; then umount "$1" || umount -l "$1"; fi
        rm -rf "$1"
        rm -f "/dev/shm/vfsd-tree-$(basename "$W")-$(basename "$1").img"
    }
    # shellcheck disable=SC2086  # MON: the monitors' pids, one or more
    trap '[ -n "$MON" ] && kill $MON 2>/dev/null; for s in "$W"/share-*; do [ -e "$s" ] && share_down "$s"; done; rm -rf "$W"' EXIT
    mkdir -p "$OUT"
    RES=$OUT/results.jsonl
    : > "$RES"
    : > "$OUT/guest.txt"

    # The host side of the step marks: at "start STEP" it asks vfsd for its counters
    # (SIGUSR1 -> --stats file) and then reads the daemon's CPU time, at "end STEP ..." the
    # CPU time first and the counters after, so the dumps themselves count in no step;
    # then it acks. One row per step into results.jsonl.
    cat > "$W/monitor.py" <<'PY'
import argparse, json, os, signal, sys, time
ap = argparse.ArgumentParser()
for o in ("ctl", "sock", "stats", "daemon", "cache", "run", "out", "userland", "args"):
    ap.add_argument("--" + o, default="")
a = ap.parse_args()
TCK = os.sysconf("SC_CLK_TCK")

def procs():
    ps = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            st = open(f"/proc/{p}/stat").read()
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        ps[int(p)] = (int(f[1]), int(f[11]) + int(f[12]), cmd)
    return ps

def tree():
    """The daemon serving --sock and all its descendants (vfsd's sandbox child)."""
    if not a.sock:
        return set(), {}
    ps, want, s = procs(), a.sock.encode(), set()
    for pid, (_, _, cmd) in ps.items():
        if b"--socket-path=" + want in cmd or any(cmd[i] == b"--socket-path" and cmd[i + 1] == want for i in range(len(cmd) - 1)):
            s.add(pid)
    grew = True
    while grew:
        grew = False
        for pid, (pp, _, _) in ps.items():
            if pp in s and pid not in s:
                s.add(pid)
                grew = True
    return s, ps

def cpu():
    s, ps = tree()
    return sum(ps[p][1] for p in s) / TCK if s else None

def threads():
    """Per thread name (comm, digits dropped so a pool's workers add up): CPU seconds and
    voluntary and involuntary context switches: the sleeps and wake-ups behind each
    request, and the preemptions by other threads (the guest's vCPUs)."""
    s, _ = tree()
    by = {}
    for p in s:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                st = open(f"/proc/{p}/task/{t}/stat").read()
                status = open(f"/proc/{p}/task/{t}/status").read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")].rstrip("0123456789-_") or "?"
            f = st[st.rindex(")") + 2:].split()
            sw = {l.split(":")[0]: int(l.split()[1]) for l in status.splitlines() if "ctxt_switches:" in l}
            c, vol, inv = by.get(name, (0.0, 0, 0))
            by[name] = (c + (int(f[11]) + int(f[12])) / TCK,
                        vol + sw.get("voluntary_ctxt_switches", 0),
                        inv + sw.get("nonvoluntary_ctxt_switches", 0))
    return by

def thread_delta(t0, t1):
    """Per thread name: [CPU s, voluntary, involuntary switches] between two `threads()`
    readings."""
    d = {}
    for k, (c, vol, inv) in t1.items():
        c0, vol0, inv0 = t0.get(k, (0.0, 0, 0))
        if round(c - c0, 2) or vol - vol0 or inv - inv0:
            d[k] = [round(c - c0, 2), vol - vol0, inv - inv0]
    return d

def steal():
    """The host's steal time so far (s, all CPUs): time its hypervisor ran something else
    while a thread here was charged for it, which inflates a step's daemon CPU."""
    try:
        f = open("/proc/stat").readline().split()
        return int(f[8]) / TCK
    except (OSError, IndexError, ValueError):
        return None

def read_stats():
    try:
        return json.loads(open(a.stats).read())
    except (OSError, ValueError):
        return None

def dump():
    """A fresh --stats dump: SIGUSR1 to the daemon's top process, then wait for a file
    written after it (a later uptime than the file had before the signal: a dump written
    for another reason, such as vfsd's first one at start, is not taken for it)."""
    if not a.stats:
        return None
    before = read_stats()
    u0 = before.get("uptime_s", -1.0) if before else -1.0
    s, ps = tree()
    for p in s:
        if ps[p][0] not in s:
            os.kill(p, signal.SIGUSR1)
    end = time.time() + 10
    while time.time() < end:
        st = read_stats()
        if st is not None and st.get("uptime_s", -1.0) > u0:
            time.sleep(0.02)
            if read_stats() == st:
                return st
        time.sleep(0.02)
    print(f"bench.sh --tree: no fresh --stats dump from {a.stats}", file=sys.stderr)
    return None

def counts(st):
    return {k: v["count"] for k, v in st["opcodes"].items()} if st else None

def handler_us(st):  # time spent in vfsd's handlers so far, per opcode (µs; count times mean)
    return {k: v["count"] * v["avg_us"] for k, v in st["opcodes"].items()} if st else None

# vfsd's counters of how requests were served (inline on the queue thread or by the pool).
SERVED = ("served_alone", "opens_handed_off", "served_inline", "no_reply_on_queue_thread", "reads_on_queue_thread", "reads_handed_off", "reads_served_alone", "reads_direct")
def served(st):
    return {k: st[k] for k in SERVED if isinstance(st.get(k), int)} if st else None

n, cpu0, ops0 = 1, None, None
out = open(a.out, "a")
while True:
    m = os.path.join(a.ctl, f"mark.{n}")
    if not os.path.exists(m):
        if os.path.exists(os.path.join(a.ctl, ".stop")):
            break
        time.sleep(0.05)
        continue
    w = open(m).read().split()
    if w and w[0] == "start":
        d0 = dump()
        ops0, sv0, us0 = counts(d0), served(d0), handler_us(d0)
        cpu0, th0, st0 = cpu(), threads(), steal()
    elif w and w[0] == "end":
        cpu1, th1, st1 = cpu(), threads(), steal()
        d1 = dump()
        ops1, sv1, us1 = counts(d1), served(d1), handler_us(d1)
        step, t0, t1 = w[1], float(w[2]), float(w[3])
        gops = {k: int(v) for k, v in (x.split("=") for x in w[4:])}
        row = {"kind": "tree", "daemon": a.daemon, "cache": a.cache, "run": int(a.run), "userland": a.userland,
               "step": step, "seconds": round(t1 - t0, 3)}
        if a.args:
            row["args"] = a.args
        if a.daemon != "tmpfs":
            req = sum(gops.values()) if gops else None
            dcpu = round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None
            dops = {k: v - (ops0 or {}).get(k, 0) for k, v in ops1.items() if v - (ops0 or {}).get(k, 0)} if ops1 is not None else None
            dreq = sum(dops.values()) if dops is not None else None
            row.update({"daemon_cpu_s": dcpu, "requests": req, "daemon_requests": dreq,
                        "cpu_us_per_req": round(dcpu * 1e6 / req, 2) if dcpu is not None and req else None,
                        "ops": gops, "daemon_ops": dops})
            if st0 is not None and st1 is not None:
                row["host_steal_s"] = round(st1 - st0, 2)
            td = thread_delta(th0, th1)
            sw = sum(vol + inv for _, vol, inv in td.values())
            row.update({"daemon_threads": td, "daemon_switches": sw,
                        "switches_per_req": round(sw / req, 2) if req else None})
            if sv0 is not None and sv1 is not None:
                row["daemon_served"] = {k: sv1[k] - sv0.get(k, 0) for k in sv1}
            if us0 is not None and us1 is not None:
                row["daemon_handler_us"] = {k: round(v - us0.get(k, 0)) for k, v in us1.items() if round(v - us0.get(k, 0))}
        out.write(json.dumps(row) + "\n")
        out.flush()
    elif w and w[0] == "fail":
        print(f"bench.sh --tree: the guest failed: {' '.join(w[1:])}", file=sys.stderr)
    open(os.path.join(a.ctl, f"ack.{n}"), "w").close()
    n += 1
PY

    if [ "$TREE_USERLAND" = host ]; then
        VIEW=$W/hostroot-view
        mkdir -p "$VIEW"
    fi
    # daemon_args DAEMON: what --vfsd-args or --virtiofsd-args add for it (the rows' "args").
    daemon_args() { case $1 in vfsd) echo "$TREE_VFSD_ARGS" ;; virtiofsd) echo "$TREE_VIRTIOFSD_ARGS" ;; esac; }
    # tree_boot MODE RUN DAEMON...: one guest, a share for each DAEMON at --cache MODE (tmpfs,
    # alone: on the guest's tmpfs, MODE unused), the steps on each share in turn; results
    # appended to $RES.
    tree_boot() {
        local mode=$1 run=$2; shift 2
        local k d sfx label labels=() ctls=() mons=() stats=() cmd=() rd= vm rc t load0 wrap=() shares=() sargs=() script chroot=() vt=
        # The k-th daemon's shares: tree and ctl, then treeb and ctlb.
        local sfxs=("" b)
        vm=$W/vm-$run-$mode-$1
        script=/guest-tests/tree-bench.sh
        [ "$TREE_USERLAND" = host ] && script=/mnt/guest-tests/tree-bench.sh
        # Shares tree, treeb, ... first, so the k-th daemon's socket is fs$k.sock.
        k=0
        for d in "$@"; do
            sfx=${sfxs[$k]}
            label=$d-$mode-$run
            [ "$d" = tmpfs ] && label=tmpfs-$run
            labels+=("$label") ctls+=("$W/ctl-$label")
            mkdir -p "$W/ctl-$label"
            cp "$SRC/src.tar" "$SRC/src.bundle" "$W/ctl-$label/"
            if [ "$d" = tmpfs ]; then
                rd=vfsd stats+=("")
                cmd+=("sh $script /tmp /mnt/ctl $TREE_STEPS")
            else
                share_up "$W/share-$label"
                shares+=(--share "$W/share-$label:tree$sfx")
                local a="--cache $mode"
                if [ "$d" = vfsd ]; then
                    stats+=("$W/stats-$label.json")
                    a="$a --stats $W/stats-$label.json --stats-interval 86400"
                else
                    stats+=("")
                    vt="$vt tree$sfx"
                fi
                local more; more=$(daemon_args "$d")
                a="$a${more:+ $more}"
                sargs+=(--share-args "tree$sfx" "$a")
                cmd+=("sh $script /mnt/tree$sfx /mnt/ctl$sfx $TREE_STEPS")
                if [ -z "$rd" ]; then rd=$d; elif [ "$rd" != "$d" ]; then rd=mixed; fi
            fi
            k=$((k + 1))
        done
        for k in "${!ctls[@]}"; do
            shares+=(--share "${ctls[$k]}:ctl${sfxs[$k]}")
            sargs+=(--share-args "ctl${sfxs[$k]}" "--cache never")
        done
        if [ "$rd" = mixed ]; then
            # One guest, two daemons: virtiofsd for its tree share, vfsd for the others.
            rd="$W/daemon-$run-$mode.sh {tag} {socket} {dir}"
            cat > "$W/daemon-$run-$mode.sh" <<DAEMON
#!/bin/bash
tag=\$1 sock=\$2 dir=\$3; shift 3
case " $vt " in
    *" \$tag "*) exec $(printf %q "$VIRTIOFSD") --socket-path="\$sock" --shared-dir="\$dir" --sandbox none --xattr "\$@" ;;
esac
exec $(printf %q "$VFSD_BIN") --socket-path="\$sock" --shared-dir="\$dir" --xattr "\$@"
DAEMON
            chmod +x "$W/daemon-$run-$mode.sh"
        fi
        if [ "$TREE_USERLAND" = host ]; then
            shares+=(--share "$VIEW:hostroot:ro")
            sargs+=(--share-args hostroot "--cache always")
            chroot=(--chroot hostroot)
            # A view of the host's root file system alone (a non-recursive bind in a mount
            # namespace of this boot's own), as scripts/run-xfstests.sh makes it.
            wrap=(unshare --mount --propagation private -- bash -c 'mount --bind / "$0" && exec "$@"' "$VIEW")
        fi
        say "tree: ${labels[*]}"
        k=0
        for d in "$@"; do
            local sock=; [ "$d" != tmpfs ] && sock=$vm/fs$k.sock
            python3 "$W/monitor.py" --ctl "${ctls[$k]}" --sock "$sock" --stats "${stats[$k]}" --daemon "$d" --cache "$mode" \
                --run "$run" --out "$RES" --userland "$TREE_USERLAND" --args "$(daemon_args "$d")" &
            mons+=($!)
            k=$((k + 1))
        done
        MON="${mons[*]}"
        t=$(date +%s)
        load0=$(cut -d' ' -f1 /proc/loadavg)
        rc=0
        # Every share's steps run, and the guest's status is the first failure's.
        local gcmd="rc=0" c
        for c in "${cmd[@]}"; do gcmd="$gcmd; $c || rc=\$?"; done
        "${wrap[@]}" scripts/run-vm.sh --daemon "$rd" --kernel "$KERNEL" --initrd "$INITRD" --mem 1G --cpus 2 \
            --timeout 3600 --quiet --workdir "$vm" --log "$W/console-$run-$mode.log" "${shares[@]}" "${sargs[@]}" \
            "${chroot[@]}" -- "$gcmd; exit \$rc" > "$W/run-vm-$run-$mode.log" 2>&1 || rc=$?
        for c in "${ctls[@]}"; do touch "$c/.stop"; done
        for c in "${mons[@]}"; do wait "$c" || true; done
        MON=
        t=$(( $(date +%s) - t ))
        { echo "== ${labels[*]} (run-vm.sh exit status $rc, ${t}s)"; tr -d '\r' < "$W/console-$run-$mode.log" 2>/dev/null | grep '^tree-bench:'; } >> "$OUT/guest.txt"
        for d in "$@"; do
            echo "{\"kind\":\"tree-boot\",\"daemon\":\"$d\",\"cache\":\"$mode\",\"run\":$run,\"status\":$rc,\"wall_s\":$t,\"load\":[$load0,$(cut -d' ' -f1 /proc/loadavg)],\"args\":$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$(daemon_args "$d")")}" >> "$RES"
        done
        if [ "$rc" != 0 ]; then
            say "tree: ${labels[*]} failed (status $rc); its rows are missing. run-vm.sh said:"
            grep -E 'run-vm: (error|FAILED|TIMEOUT)' "$W/run-vm-$run-$mode.log" | head -n 5 >&2 || true
            tr -d '\r' < "$W/console-$run-$mode.log" 2>/dev/null | tail -n 15 >&2 || true
        fi
        for label in "${labels[@]}"; do
            rm -rf "$W/ctl-$label" "$W/stats-$label.json"
            [ -e "$W/share-$label" ] && share_down "$W/share-$label"
        done
        rm -rf "$vm" "$W/daemon-$run-$mode.sh"
        return 0
    }
    T0=$(date +%s)
    for run in $(seq "$RUNS"); do
        for d in "${TDAEMONS[@]}"; do
            if [ "$d" = tmpfs ]; then tree_boot - "$run" tmpfs; fi
        done
        for mode in "${TMODES[@]}"; do
            if [ "$TREE_SAME_BOOT" = 1 ]; then
                if [ $((run % 2)) = 1 ]; then tree_boot "$mode" "$run" vfsd virtiofsd; else tree_boot "$mode" "$run" virtiofsd vfsd; fi
                continue
            fi
            for d in "${TDAEMONS[@]}"; do
                if [ "$d" != tmpfs ]; then tree_boot "$mode" "$run" "$d"; fi
            done
        done
    done
    say "tree: all boots in $(( $(date +%s) - T0 ))s; writing the report"
    python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib || true
    python3 scripts/bench_report.py "$RES" "$OUT" --tree 1 --command "scripts/bench.sh $ARGS" --runs "$RUNS" \
        --tree-source "$(basename "${TREE_SOURCE:-crates}") ($ENTRIES entries)" --vfsd-bin "$VFSD_BIN" \
        --share-fs "$TREE_SHARE_FS"
    say "done: $OUT/report.md"
    exit 0
fi
say "building vfsd"
cargo build --release --quiet --features test-frontend
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: > "$RES"
if [ $GLUSTER = 1 ]; then
    scripts/gluster.sh up >&2 || die "could not bring up the GlusterFS volume (scripts/gluster.sh up)"
    eval "$(scripts/gluster.sh env)"
    W=$(mktemp -d "$GLUSTER_A/vfsd-bench.XXXXXX")
else
    W=$(mktemp -d /var/tmp/vfsd-bench.XXXXXX)
fi
DPID=
TMPFS_SHARE=
# The load generator's socket: on the host, never inside the share (a GlusterFS mount).
SOCKD=$(mktemp -d "${TMPDIR:-/tmp}/vfsd-bench-sock.XXXXXX")
cleanup() { [ -n "$DPID" ] && kill "$DPID" 2>/dev/null; rm -rf "$W" "$SOCKD" ${TMPFS_SHARE:+"$TMPFS_SHARE"}; }
trap cleanup EXIT

# name|daemon|arguments. "default" is each daemon as shipped plus --cache never (so the
# guest does direct I/O, as the workloads need); "best" sets the pool size that did best
# for that daemon in scripts/pool-sweep.sh (vfsd: 8, its default on 2 CPUs; virtiofsd: 4).
CONFIGS=(
    "vfsd-default|vfsd|--cache never"
    "vfsd-best|vfsd|--cache never --thread-pool-size 8"
    "virtiofsd-default|virtiofsd|--cache never"
    "virtiofsd-best|virtiofsd|--cache never --thread-pool-size 4"
)
# Over GlusterFS reads can't be tried without blocking (RWF_NOWAIT is refused), so each
# one is handed to a worker; "inline" (no pool) shows what that hand-off costs.
[ $GLUSTER = 1 ] && CONFIGS+=("vfsd-inline|vfsd|--cache never --thread-pool-size 0")
# workload|queues|depth|bs|file MiB
WORKLOADS=(
    "randwrite-shared|1|32|4096|64"
    "randwrite-perjob|1|8|4096|16"
    "randread-shared|1|32|4096|64"
    "randread-perjob|1|8|4096|16"
    "seqread|1|4|1048576|256"
    "seqwrite|1|4|1048576|256"
    "lookup-getattr|1|32|4096|1"
    "create-unlink|1|16|4096|1"
)
if [ $GLUSTER = 1 ]; then
    # The guest's seqread-1m and seqwrite-1m: one psync job, one request in flight.
    WORKLOADS=("seqread|1|1|1048576|256" "seqwrite|1|1|1048576|256")
elif [ $QUICK = 1 ]; then
    WORKLOADS=("${WORKLOADS[0]}" "${WORKLOADS[2]}" "${WORKLOADS[4]}" "${WORKLOADS[6]}")
fi

if [ $LOADGEN = 1 ]; then
    mkdir -p "$W/share"
    total=$(( RUNS * ${#WORKLOADS[@]} * ${#CONFIGS[@]} )); n=0
    for run in $(seq "$RUNS"); do
        for wl in "${WORKLOADS[@]}"; do
            IFS='|' read -r wname q depth bs mib <<<"$wl"
            for cfg in "${CONFIGS[@]}"; do
                IFS='|' read -r cname daemon args <<<"$cfg"
                n=$((n + 1))
                say "loadgen $n/$total: $wname on $cname (run $run)"
                start_daemon "$daemon" "$args" "$W/share" "$SOCKD/sock"
                r=$(target/release/vfsd-bench --socket "$SOCKD/sock" --shared-dir "$W/share" --pid "$DPID" \
                    --workload "$wname" --queues "$q" --depth "$depth" --bs "$bs" --file-mib "$mib" \
                    --seconds "$SECS")
                wait "$DPID" 2>/dev/null || true; DPID=
                echo "{\"kind\":\"loadgen\",\"config\":\"$cname\",\"run\":$run,\"result\":$r}" >> "$RES"
            done
            # Native at the same concurrency: one fio thread per request the load
            # generator keeps in flight, the same block size and files, buffered
            # preadv/pwritev as the daemons make them.
            case $wname in
                randwrite-*) rw=randwrite ;; randread-*) rw=randread ;;
                seqread) rw=read ;; seqwrite) rw=write ;; *) rw= ;;
            esac
            if [ $NATIVE = 1 ] && [ -n "$rw" ]; then
                jobs=$(( q * depth ))
                files=(--filename_format='f.$jobnum')
                [[ $wname == *-shared ]] && files=(--filename=shared)
                say "native fio at the same concurrency: $wname, $jobs jobs (run $run)"
                mkdir -p "$W/native-eq"
                # --invalidate=0: fio would drop the files' pages first, and read from the disk
                # what the daemons read from the page cache.
                (cd "$W/native-eq" && fio --name="$wname" --rw=$rw --bs="$bs" --size="${mib}m" --ioengine=psync \
                    --direct=0 --invalidate=0 --numjobs="$jobs" "${files[@]}" --thread --time_based --runtime="$SECS" \
                    --group_reporting --output-format=json --output="$W/native-eq.json" >/dev/null)
                echo "{\"kind\":\"native-eq\",\"config\":\"native\",\"workload\":\"$wname\",\"jobs\":$jobs,\"run\":$run,\"fio\":$(onejson "$W/native-eq.json")}" >> "$RES"
                rm -rf "$W/native-eq"
            fi
        done
    done
fi

# fio job definitions shared by the native and guest runs: name|fio arguments
FIO_JOBS=(
    "randread-4k-psync|--rw=randread --bs=4k --ioengine=psync --direct=1 --size=64m"
    "randread-4k-libaio16|--rw=randread --bs=4k --ioengine=libaio --iodepth=16 --direct=1 --size=64m"
    "randwrite-4k-psync|--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m"
    "randwrite-4k-libaio16|--rw=randwrite --bs=4k --ioengine=libaio --iodepth=16 --direct=1 --size=64m"
    "seqread-1m|--rw=read --bs=1m --ioengine=psync --direct=1 --size=256m"
    "seqwrite-1m|--rw=write --bs=1m --ioengine=psync --direct=1 --size=256m"
    "ssf-randwrite-4k-j1|--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=1"
    "ssf-randwrite-4k-j2|--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=2"
    "ssf-randwrite-4k-j4|--rw=randwrite --bs=4k --ioengine=psync --direct=1 --size=64m --filename=ssf --numjobs=4"
)
if [ $GLUSTER = 1 ]; then
    # 4k random read and write, 1 MiB sequential read and write, shared-file direct writes at 1 and 2 jobs.
    FIO_JOBS=("${FIO_JOBS[0]}" "${FIO_JOBS[2]}" "${FIO_JOBS[4]}" "${FIO_JOBS[5]}" "${FIO_JOBS[6]}" "${FIO_JOBS[7]}")
elif [ $QUICK = 1 ]; then
    FIO_JOBS=("${FIO_JOBS[0]}" "${FIO_JOBS[2]}" "${FIO_JOBS[4]}" "${FIO_JOBS[6]}" "${FIO_JOBS[7]}")
fi

if [ $NATIVE = 1 ]; then
    mkdir -p "$W/native"
    for run in $(seq "$RUNS"); do
        for j in "${FIO_JOBS[@]}"; do
            IFS='|' read -r jname jargs <<<"$j"
            say "native fio: $jname (run $run)"
            # shellcheck disable=SC2086
            # Buffered, as the daemons' own I/O; libaio's queue depth N becomes N psync
            # threads on one file (buffered libaio would block one request at a time).
            nargs=${jargs//--direct=1/--direct=0}
            if [[ $nargs =~ --ioengine=libaio\ --iodepth=([0-9]+) ]]; then
                d=${BASH_REMATCH[1]}
                nargs=${nargs/--ioengine=libaio --iodepth=$d/--ioengine=psync --numjobs=$d --thread --filename=$jname.dat}
            fi
            (cd "$W/native" && fio --name="$jname" $nargs --invalidate=0 --time_based --runtime="$SECS" --group_reporting \
                --output-format=json --output="$W/native.json" >/dev/null)
            echo "{\"kind\":\"native\",\"config\":\"native\",\"job\":\"$jname\",\"run\":$run,\"fio\":$(onejson "$W/native.json")}" >> "$RES"
            rm -f "$W/native"/*
        done
    done
fi

# --gluster adds vfsd on a tmpfs share: the same guest and jobs where the host side costs
# next to nothing, so its figures are what the TCG guest itself can reach.
GUEST_CONFIGS=(vfsd virtiofsd)
[ $GLUSTER = 1 ] && GUEST_CONFIGS+=(vfsd-tmpfs)
guest_share() {  # guest_share CONFIG: the share directory of that guest configuration
    if [ "$1" = vfsd-tmpfs ]; then echo "$TMPFS_SHARE"; else echo "$W/guest-$1"; fi
}
if [ $GUEST = 1 ]; then
    for gname in "${GUEST_CONFIGS[@]}"; do
        [ "$gname" = vfsd-tmpfs ] && TMPFS_SHARE=$(mktemp -d /dev/shm/vfsd-bench.XXXXXX)
        gshare=$(guest_share "$gname")
        mkdir -p "$gshare/jobs" "$gshare/out"
        for j in "${FIO_JOBS[@]}"; do
            IFS='|' read -r jname jargs <<<"$j"
            echo "fio --name=$jname $jargs --time_based --runtime=$GSECS --group_reporting --output-format=json \"\$@\"" > "$gshare/jobs/$jname"
        done
        # In the guest: each job once as run $1, JSON results onto the share.
        cat > "$gshare/run.sh" <<'GUEST'
#!/bin/sh
cd "$VFSD_SHARE" || exit 1
mkdir -p work
for j in jobs/*; do
  n=$(basename "$j")
  echo "guest fio: $n run $1" >&2
  (cd work && sh "../$j" --output="../out/$n.$1.json") || exit 1
  rm -f work/*
done
GUEST
    done
    # One guest per configuration and run, the configurations taking turns, so drift
    # over the run (the host, the volume) hits each alike.
    for run in $(seq "$RUNS"); do
        for gname in "${GUEST_CONFIGS[@]}"; do
            dname=${gname%-tmpfs}
            gshare=$(guest_share "$gname")
            if [ "$dname" = vfsd ]; then dargs="--cache never"; else dargs="--cache never --thread-pool-size 4"; fi
            say "guest fio on $gname, run $run of $RUNS (this takes a while under TCG)"
            if ! scripts/run-vm.sh --daemon "$dname" --daemon-args "$dargs" --cpus 2 --timeout 3600 \
                --share "$gshare:share0" --quiet -- sh /mnt/share0/run.sh "$run"; then
                say "guest run $run on $gname failed; its figures are missing from the report"
            fi
        done
    done
    for gname in "${GUEST_CONFIGS[@]}"; do
        for f in "$(guest_share "$gname")"/out/*.json; do
            [ -e "$f" ] || continue
            b=$(basename "$f" .json); jname=${b%.*}; run=${b##*.}
            echo "{\"kind\":\"guest\",\"config\":\"$gname\",\"job\":\"$jname\",\"run\":$run,\"fio\":$(onejson "$f")}" >> "$RES"
        done
    done
fi

say "writing the report"
python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib
python3 scripts/bench_report.py "$RES" "$OUT" --gluster "$GLUSTER" \
    --command "scripts/bench.sh $ARGS" --quick "$QUICK" --runs "$RUNS" --seconds "$SECS" --guest-seconds "$GSECS"
say "done: $OUT/report.md"
