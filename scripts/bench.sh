#!/usr/bin/env bash
# Side-by-side benchmarks: vfsd vs virtiofsd vs the host itself, in one run.
#
#   scripts/bench.sh [--quick] [--runs N] [--no-loadgen] [--no-native] [--no-guest] [--out DIR]
#   scripts/bench.sh --gluster [--runs N] [--out DIR]
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
# Each figure is the median of --runs runs (default 3), runs interleaved across daemons so
# drift hits all alike. Results: DIR/results.jsonl, then scripts/bench_report.py writes
# DIR/report.md and DIR/*.png (default DIR: docs/benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

ARGS="$*"
QUICK=0 RUNS=3 LOADGEN=1 NATIVE=1 GUEST=1 OUT= GLUSTER=0
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1; shift ;;
        --runs) RUNS=${2:?}; shift 2 ;;
        --no-loadgen) LOADGEN=0; shift ;;
        --no-native) NATIVE=0; shift ;;
        --no-guest) GUEST=0; shift ;;
        --out) OUT=${2:?}; shift 2 ;;
        --gluster) GLUSTER=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
SECS=5; GSECS=20; [ $QUICK = 1 ] && { SECS=2; GSECS=8; }
[ -n "$OUT" ] || { if [ $GLUSTER = 1 ]; then OUT=docs/benchmarks/gluster; else OUT=docs/benchmarks; fi; }

say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# fio's JSON as one line (it may print notes before the JSON itself).
onejson() { python3 -c 'import json,sys;t=open(sys.argv[1]).read();print(json.dumps(json.loads(t[t.index("{"):])))' "$1"; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
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
