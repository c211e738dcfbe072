#!/usr/bin/env bash
# The load generator against native fio at equal concurrency, with a device setting the
# pace instead of the page cache.
#
#   scripts/bench-device.sh [--runs N] [--seconds S] [--out DIR]
#
# The share is ext4 on a loop device that does direct I/O to a file on the host's disk
# (losetup --direct-io=on), so nothing is cached below the filesystem either. Every side
# does O_DIRECT: native fio with --direct=1 and one psync thread per request the load
# generator keeps in flight, the load generator (--direct) through vfsd and through
# virtiofsd, both with --allow-direct-io and --cache never. The same block sizes and file
# sizes on each side. Runs are interleaved across the three, so drift hits all alike; each
# figure is the median of --runs (default 3). Results: DIR/results.jsonl and DIR/report.md
# (default DIR: docs/benchmarks/device). Needs root (losetup, mount), fio and virtiofsd.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3 SECS=3 OUT=docs/benchmarks/device
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=${2:?}; shift 2 ;;
        --seconds) SECS=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-device.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done

say() { printf '[bench-device %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'bench-device.sh: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (a loop device and a mount)"
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
say "building vfsd"
cargo build --release --quiet --features test-frontend

# workload|requests in flight|block size|MiB per file
WORKLOADS=(
    "randread-perjob|1|4096|64"
    "randread-perjob|8|4096|64"
    "randread-perjob|32|4096|16"
    "randwrite-perjob|1|4096|64"
    "randwrite-perjob|8|4096|64"
    "randwrite-perjob|32|4096|16"
    "seqread|1|1048576|256"
    "seqread|4|1048576|128"
    "seqwrite|1|1048576|256"
    "seqwrite|4|1048576|128"
)

W=$(mktemp -d /var/tmp/vfsd-bench-device.XXXXXX)
LOOP= DPID=
cleanup() {
    set +e # every step runs, whatever the one before it returned
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
    mountpoint -q "$W/mnt" && umount "$W/mnt"
    [ -n "$LOOP" ] && losetup -d "$LOOP"
    rm -rf "$W"
}
trap cleanup EXIT
# Room for the largest file set of each side (about 1 GiB each) and ext4's own.
truncate -s 6G "$W/disk.img"
LOOP=$(losetup --direct-io=on -f --show "$W/disk.img") || die "losetup failed"
# losetup falls back to buffered I/O where the backing file system can't do direct I/O.
[ "$(cat "/sys/block/${LOOP#/dev/}/loop/dio" 2>/dev/null)" = 1 ] ||
    die "$LOOP does not do direct I/O to $W/disk.img (its file system refused it)"
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
mkdir -p "$W/mnt"
mount "$LOOP" "$W/mnt"
mkdir -p "$W/mnt/share" "$W/mnt/native"
say "share: ext4 on $LOOP (direct I/O to $W/disk.img)"

mkdir -p "$OUT"
RES=$OUT/results.jsonl
: > "$RES"
total=$(( RUNS * ${#WORKLOADS[@]} * 3 )); n=0
for run in $(seq "$RUNS"); do
    for wl in "${WORKLOADS[@]}"; do
        IFS='|' read -r wname depth bs mib <<<"$wl"
        row="$wname-$bs-x$depth"
        # The daemons take turns going first, run by run.
        order="vfsd virtiofsd"; [ $((run % 2)) = 0 ] && order="virtiofsd vfsd"
        for daemon in $order; do
            n=$((n + 1)); say "$n/$total: $row through $daemon (run $run)"
            start_daemon "$daemon" "--cache never --allow-direct-io" "$W/mnt/share" "$W/sock"
            r=$(target/release/vfsd-bench --socket "$W/sock" --shared-dir "$W/mnt/share" --pid "$DPID" \
                --workload "$wname" --queues 1 --depth "$depth" --bs "$bs" --file-mib "$mib" \
                --seconds "$SECS" --direct)
            kill "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; DPID=
            echo "{\"row\":\"$row\",\"side\":\"$daemon\",\"run\":$run,\"ops_per_s\":$(python3 -c 'import json,sys;print(json.loads(sys.argv[1])["ops_per_s"])' "$r"),\"result\":$r}" >> "$RES"
        done
        n=$((n + 1)); say "$n/$total: $row native, $depth fio jobs (run $run)"
        case $wname in
            randread-*) rw=randread ;; randwrite-*) rw=randwrite ;; seqread) rw=read ;; seqwrite) rw=write ;;
        esac
        # --ramp_time: the load generator leaves its first 0.5 s out too.
        (cd "$W/mnt/native" && fio --name="$row" --rw=$rw --bs="$bs" --size="${mib}m" --ioengine=psync \
            --ramp_time=500ms --direct=1 --numjobs="$depth" --filename_format='f.$jobnum' --thread --time_based \
            --runtime="$SECS" --group_reporting --output-format=json --output="$W/fio.json" >/dev/null)
        ops=$(python3 -c 'import json,sys
t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]
print(j["read"]["iops"] + j["write"]["iops"])' "$W/fio.json")
        echo "{\"row\":\"$row\",\"side\":\"native\",\"run\":$run,\"ops_per_s\":$ops}" >> "$RES"
    done
done

python3 - "$RES" "$OUT/report.md" "$RUNS" "$SECS" <<'PY'
import json, sys, statistics as st, collections
res, out, runs, secs = sys.argv[1:5]
rows = collections.OrderedDict()
for line in open(res):
    j = json.loads(line)
    rows.setdefault(j["row"], collections.defaultdict(list))[j["side"]].append(j["ops_per_s"])
lines = [
    "# The load generator against native, O_DIRECT on a device",
    "",
    f"`scripts/bench-device.sh --runs {runs} --seconds {secs}`: ext4 on a loop device doing direct",
    "I/O to a file on the host's disk. Native: fio, O_DIRECT, one psync thread per request in",
    "flight. The daemons: vfsd-bench --direct, --cache never --allow-direct-io. Medians of",
    f"{runs} interleaved runs, operations per second.",
    "",
    "virtiofsd runs with its default, no thread pool: one request at a time per queue.",
    "",
    "| workload, block size, in flight | native | vfsd | virtiofsd | vfsd/native | virtiofsd/native | vfsd/virtiofsd |",
    "| --- | --- | --- | --- | --- | --- | --- |",
]
for row, s in rows.items():
    m = {k: st.median(v) for k, v in s.items()}
    n, v, o = m.get("native", 0), m.get("vfsd", 0), m.get("virtiofsd", 0)
    r = lambda a, b: f"{a / b:.2f}" if b else "-"
    lines.append(f"| {row} | {n:,.0f} | {v:,.0f} | {o:,.0f} | {r(v, n)} | {r(o, n)} | {r(v, o)} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
say "results: $RES, report: $OUT/report.md"
