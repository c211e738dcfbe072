#!/usr/bin/env bash
# Parallel direct writes in a real guest, vfsd vs virtiofsd (issue: parallel writes).
#
#   scripts/ssf.sh [--seconds S] [--jobs "1 2 4"] [--accel tcg|kvm|auto] [--out FILE]
#
# For each daemon, one guest runs fio on ONE shared file: 4k random direct writes
# (psync) with numjobs = 1, 2, 4. Each numjobs runs twice: time-based for IOPS, then a
# verify pass (verify=crc32c, each job on its own region of the same file) that must
# report zero mismatches. An independent observer, strace on the daemon, timestamps
# every pwrite and gives the most writes that were in progress at once; vfsd's own
# counters (--stats) must agree. Prints a table and the SSF scaling figures
# (IOPS at N jobs / IOPS at 1 job), and saves them with this command in --out.
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS="$*"
SECS=10 JOBS="1 2 4" ACCEL=tcg OUT=docs/benchmarks/ssf.md
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECS=${2:?}; shift 2 ;;
        --jobs) JOBS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --out) OUT=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "ssf.sh: unknown option '$1'" >&2; exit 2 ;;
    esac
done
say() { printf '[ssf %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v strace >/dev/null || { echo "ssf.sh: strace not found: apt-get install strace" >&2; exit 1; }
VIRTIOFSD=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd")
[ -x "$VIRTIOFSD" ] || { echo "ssf.sh: virtiofsd not found: cargo install virtiofsd --version 1.14.0 --locked" >&2; exit 1; }
cargo build --release --quiet
W=$(mktemp -d /var/tmp/vfsd-ssf.XXXXXX)
trap 'rm -rf "$W"' EXIT

# Most intervals [start, start+duration] overlapping at one instant, per traced file.
overlap() {
    python3 - "$@" <<'PY'
import re, sys, glob
ev = []
pat = re.compile(r"^(?:\d+ +)?(\d+):(\d+):(\d+\.\d+) (pwritev2?|pwrite64)\((\d+),.*<(\d+\.\d+)>$")
for f in sys.argv[1:]:
    for line in open(f):
        m = pat.match(line.strip())
        if not m:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        d = float(m.group(6))
        ev.append((t, 1)); ev.append((t + d, -1))
ev.sort(key=lambda e: (e[0], e[1]))
cur = peak = 0
for _, k in ev:
    cur += k; peak = max(peak, cur)
print(peak, len(ev) // 2)
PY
}

declare -A IOPS PEAK STATPEAK VERIFY
for daemon in vfsd virtiofsd; do
    for n in $JOBS; do
        share=$W/$daemon-$n; mkdir -p "$share"
        case $daemon in
            vfsd) dcmd="$PWD/target/release/vfsd --socket-path={socket} --shared-dir={dir} --cache never --stats $W/stats-$n.json" ;;
            virtiofsd) dcmd="$VIRTIOFSD --socket-path={socket} --shared-dir={dir} --cache never --sandbox none --thread-pool-size 4" ;;
        esac
        rm -f "$W"/trace*
        cat > "$share/job.sh" <<GUEST
cd "\$VFSD_SHARE"
truncate -s $((n * 16))M ssf
fio --name=ssf --filename=ssf --rw=randwrite --bs=4k --direct=1 --ioengine=psync --numjobs=$n \
    --size=16m --offset_increment=16m --time_based --runtime=$SECS --group_reporting \
    --output-format=json --output=iops.json || exit 1
fio --name=ssfv --filename=ssf --rw=randwrite --bs=4k --direct=1 --ioengine=psync --numjobs=$n \
    --size=4m --offset_increment=16m --verify=crc32c --do_verify=1 --verify_fatal=1 --group_reporting \
    --output-format=json --output=verify.json || exit 1
GUEST
        say "$daemon, numjobs=$n"
        scripts/run-vm.sh --accel "$ACCEL" --cpus 4 --timeout 900 --quiet \
            --daemon "strace -f -qq -tt -T -e trace=pwrite64,pwritev,pwritev2 -o $W/trace -ff $dcmd" \
            --share "$share:share0" -- sh /mnt/share0/job.sh
        # fio may print notes before its JSON: read from the first brace.
        fiojson() { python3 -c "import json,sys;t=open(sys.argv[1]).read();print(json.dumps(json.loads(t[t.index('{'):])))" "$1"; }
        IOPS[$daemon,$n]=$(fiojson "$share/iops.json" | python3 -c "import json,sys;d=json.load(sys.stdin);print(round(sum(j['write']['iops'] for j in d['jobs'])))")
        VERIFY[$daemon,$n]=$(fiojson "$share/verify.json" | python3 -c "import json,sys;d=json.load(sys.stdin);print('ok' if all(j['error']==0 for j in d['jobs']) else 'FAILED')")
        read -r peak writes < <(overlap "$W"/trace*)
        PEAK[$daemon,$n]=$peak
        STATPEAK[$daemon,$n]=$( [ "$daemon" = vfsd ] && python3 -c "import json;print(json.load(open('$W/stats-$n.json'))['peak_writes_in_flight'])" || echo "-")
        say "  IOPS ${IOPS[$daemon,$n]}, verify ${VERIFY[$daemon,$n]}, peak writes in flight (strace) $peak of $writes, vfsd counters ${STATPEAK[$daemon,$n]}"
    done
done

{
    echo "# Shared-file parallel direct writes in a guest"
    echo
    echo "Command: \`scripts/ssf.sh $ARGS\` ($(date -u +%F), $(nproc) host CPUs, accel $ACCEL, guest 4 vCPUs)."
    echo "fio: 4k randwrite, direct=1, psync, one file, ${SECS}s per run; then a verify=crc32c pass."
    echo "\"Peak in flight\": most pwrite calls in progress at once in the daemon, timed by strace (an observer"
    echo "independent of the daemon); for vfsd also its own --stats counter."
    echo
    echo "| daemon | numjobs | IOPS | SSF scaling (÷ 1 job) | verify | peak in flight (strace) | vfsd counter |"
    echo "|---|---|---|---|---|---|---|"
    for daemon in vfsd virtiofsd; do
        for n in $JOBS; do
            base=${IOPS[$daemon,1]:-0}
            scale=$(python3 -c "print(f'{${IOPS[$daemon,$n]} / $base:.2f}' if $base else '')")
            echo "| $daemon | $n | ${IOPS[$daemon,$n]} | $scale | ${VERIFY[$daemon,$n]} | ${PEAK[$daemon,$n]} | ${STATPEAK[$daemon,$n]} |"
        done
    done
} | tee "$OUT"
for daemon in vfsd virtiofsd; do for n in $JOBS; do
    [ "${VERIFY[$daemon,$n]}" = ok ] || { echo "ssf.sh: verify failed for $daemon numjobs=$n" >&2; exit 1; }
done; done
