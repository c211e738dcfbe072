#!/usr/bin/env bash
# Locks in real guests (issue 11): two guests, each with its own vfsd on the
# same host directory, plus a process on the host, run guest-tests/locks.sh
# (see its header for the scenarios).  Uses scripts/two-guests.sh; the host's
# part (holding locks, kill -9 of guest A's QEMU) is played by this script.
#
# Usage: scripts/guest-locks.sh [--quick|--full|--counter] [options]
#   --quick        flock conflict and wake-up, fcntl ranges, a host process (default)
#   --full         also the counters (N increments per guest under flock, under
#                  fcntl, and without locks) and kill -9 of guest A's QEMU
#   --cross        s1, s2 and the counters, for --two-hosts on a file system whose
#                  client turns flock into a whole-file POSIX lock (GlusterFS, NFS),
#                  where s3 and s5's flock plus POSIX lock on one file conflict
#   --counter      only the flock counter (use with --daemon-args --no-flock for
#                  the contrast where the guests arbitrate flock locally)
#   -n N           increments per guest (default 1000)
#   --daemon D     vfsd (default), virtiofsd or a run-vm.sh template
#   --daemon-args A  extra daemon arguments
#   --cache MODE   the daemons' cache mode (default never: every lookup reaches the
#                  host at once; auto and always work too, markers then show
#                  within the entry timeout)
#   --accel A      tcg (default), kvm, auto
#   --kernel P, --initrd P, --logs DIR (default: new dir in $TMPDIR)
#   --no-retry     do not run the pair again after an infrastructure failure
#   --two-hosts DIR_A:DIR_B  guest A's daemon (and the host's lock holder) work in
#                  DIR_A, guest B's in DIR_B: two client mounts of one
#                  distributed file system, standing for two hosts
#                  (scripts/gluster.sh env); each run gets a fresh subdirectory
# Exit status: 0 all checks passed, 1 not.  Figures ("FIGURE name value") are
# printed at the end.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
MODE=quick
N=1000
DAEMON=vfsd
DAEMON_ARGS=
ACCEL=tcg
KERNEL=
INITRD=
LOGS=
RETRY=1
TWO_HOSTS=
CACHE_MODE=never

say() { printf 'guest-locks: %s\n' "$*"; }
die() { printf 'guest-locks: error: %s\n' "$*" >&2; exit 2; }

if [ "${1:-}" = --host-role ]; then
    # --- The host's part, run by two-guests.sh beside the guests ---------------
    MODE=$2 LOCK=$3
    S=$TWO_SHARE/sync
    host_await() {  # host_await SECS NAME...
        local lim=$(( $1 * 20 )) n=0 f
        shift
        for f in "$@"; do
            while [ ! -e "$S/$f" ]; do
                if [ -e "$S/A.abort" ] || [ -e "$S/B.abort" ]; then echo "a guest gave up"; exit 1; fi
                n=$((n + 1))
                if [ $n -ge $lim ]; then echo "timed out waiting for $f"; : > "$S/host.abort"; exit 1; fi
                sleep 0.05
            done
        done
    }
    [ "$MODE" = counter ] || [ "$MODE" = cross ] && exit 0
    host_await 900 A.s3-ready B.s3-ready
    echo "s3: host takes flock LOCK_EX and wr 0-99 on host-file"
    "$LOCK" -m "$S/host.s3-held" -u "$S/host.s3-release" -s "$S/host.s3-releasing" "$TWO_SHARE/host-file" ex wr:0:100 &
    holder=$!
    host_await 180 A.s3-waiting B.s3-waiting
    sleep 3
    : > "$S/host.s3-release"
    wait "$holder" || echo "host lock holder failed"
    echo "s3: host released"
    [ "$MODE" = full ] || exit 0
    host_await 1800 B.s5-waiting
    sleep 3
    qemu=$(pgrep -P "$TWO_RUNVM_A" qemu-system | head -n1)   # comm is cut to 15 characters
    [ -n "$qemu" ] || { echo "s5: guest A's QEMU not found (run-vm.sh pid $TWO_RUNVM_A)"; : > "$S/host.abort"; exit 1; }
    : > "$S/host.s5-killing"
    kill -9 "$qemu"
    echo "s5: kill -9 of guest A's QEMU (pid $qemu) at $("$LOCK" now)"
    # When did A's vfsd go away?
    for _ in $(seq 1 100); do
        pgrep -f -- "$TWO_WORK/A/fs0.sock" >/dev/null || break
        sleep 0.05
    done
    echo "s5: A's daemon gone at $("$LOCK" now)"
    exit 0
fi

while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick; shift ;;
        --full) MODE=full; shift ;;
        --counter) MODE=counter; shift ;;
        --cross) MODE=cross; shift ;;
        -n) N=${2:?}; shift 2 ;;
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --cache) CACHE_MODE=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --logs) LOGS=${2:?}; shift 2 ;;
        --no-retry) RETRY=0; shift ;;
        --two-hosts) TWO_HOSTS=${2:?--two-hosts needs DIR_A:DIR_B}; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
[[ $N =~ ^[0-9]+$ ]] || die "-n wants a number"
case $CACHE_MODE in auto|always|never|metadata) ;; *) die "--cache: auto, always, never or metadata, not '$CACHE_MODE'" ;; esac
if [ -n "$TWO_HOSTS" ]; then
    HOST_A=${TWO_HOSTS%%:*} HOST_B=${TWO_HOSTS#*:}
    [ -d "$HOST_A" ] && [ -d "$HOST_B" ] && [ "$HOST_A" != "$TWO_HOSTS" ] ||
        die "--two-hosts wants two existing directories, DIR_A:DIR_B"
fi
command -v "${CC:-cc}" >/dev/null || die "a C compiler is needed for the host's lock tool (apt-get install gcc)"
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-locks.XXXXXX")}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
LOCK=$LOGS/vfsd-lock-host
"${CC:-cc}" -O2 -Wall -o "$LOCK" "$REPO/guest-tests/src/vfsd-lock.c" || die "compiling the host's vfsd-lock failed"
if [ -z "$KERNEL" ]; then KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get a guest kernel"; fi
if [ -z "$INITRD" ]; then INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs"; fi

EXPECT_A=0
[ "$MODE" = full ] && EXPECT_A=125   # the host kills guest A's QEMU
attempt=1
while :; do
    RUN=$LOGS/run$attempt
    rm -rf "$RUN"; mkdir -p "$RUN"
    if [ -n "$TWO_HOSTS" ]; then
        # A directory of its own on the shared volume: two runs at once never meet.
        SHARE_A=$(mktemp -d "$HOST_A/vfsd-locks.XXXXXX") || die "cannot create a directory in $HOST_A"
        SHARE_B=$HOST_B/$(basename "$SHARE_A")
        mkdir -p "$SHARE_A/sync"
        # The other mount may see the new directory a moment later (its own caches).
        for _ in $(seq 1 100); do [ -d "$SHARE_B/sync" ] && break; sleep 0.1; done
        [ -d "$SHARE_B/sync" ] || die "$SHARE_B/sync did not appear through the second mount"
    else
        SHARE_A=$RUN/share SHARE_B=$RUN/share
        mkdir -p "$SHARE_A/sync"
    fi
    say "mode $MODE, N=$N, daemon $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS} --cache=$CACHE_MODE, attempt $attempt, logs $RUN${TWO_HOSTS:+, guest A in $SHARE_A, guest B in $SHARE_B}"
    "$HERE/two-guests.sh" --share "$SHARE_A" --share-b "$SHARE_B" --workdir "$RUN" \
        --cmd-a "/guest-tests/locks.sh A $MODE $N" --cmd-b "/guest-tests/locks.sh B $MODE $N" \
        --host "$(printf '%q ' "$0" --host-role "$MODE" "$LOCK")" \
        --expect-a "$EXPECT_A" --daemon "$DAEMON" --daemon-args "--cache=$CACHE_MODE${DAEMON_ARGS:+ $DAEMON_ARGS}" \
        --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --timeout 1800 | tee "$RUN/two-guests.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 3 ] && [ "$RETRY" = 1 ] && [ "$attempt" = 1 ]; then
        say "a guest run failed outside the test (status 3 from two-guests.sh); running the pair once more"
        attempt=2
        continue
    fi
    break
done

# Each guest's own verdict (A's summary is written before it is killed in --full).
verdict=0
for g in A B; do
    if read -r p f < "$SHARE_A/sync/$g.summary" 2>/dev/null; then
        say "guest $g: $p checks passed, $f failed"
        [ "$f" = 0 ] || verdict=1
    else
        say "guest $g: no summary (it did not get to the end)"
        verdict=1
    fi
done
[ "$rc" = 0 ] || verdict=1
echo
say "figures (seconds; counters are totals of 2 x $N):"
sed -n 's/^\([AB]\)| locks\[[AB]\]: FIGURE \(.*\)/guest-locks:   guest \1: \2/p' "$RUN/two-guests.log"
if [ "$MODE" = full ] && [ -f "$RUN/host.log" ]; then
    k=$(sed -n 's/^s5: kill -9 .* at \([0-9.]*\)$/\1/p' "$RUN/host.log")
    g=$(sed -n "s/^s5: A's daemon gone at \([0-9.]*\)$/\1/p" "$RUN/host.log")
    [ -n "$k" ] && [ -n "$g" ] && say "  A's vfsd exit after kill -9: $(awk -v a="$g" -v b="$k" 'BEGIN {printf "%.3f", a - b}') (host-side poll, 50 ms steps)"
fi
[ -n "$TWO_HOSTS" ] && [ "$verdict" = 0 ] && rm -rf "$SHARE_A"
if [ "$verdict" = 0 ]; then say "PASS ($MODE)"; else say "FAIL ($MODE); logs in $RUN"; fi
exit "$verdict"
