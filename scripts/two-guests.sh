#!/usr/bin/env bash
# Boot two guests at once, each with its own daemon on the SAME host directory,
# run a command in each (and optionally one on the host beside them), and
# collect both results.  Two scripts/run-vm.sh runs in the background, with
# work directories A/ and B/ under --workdir and one shared --share DIR.
#
# Usage: scripts/two-guests.sh --share DIR --cmd-a CMD --cmd-b CMD [options]
#   --share DIR       the host directory both daemons serve (tag share0; the
#                     guests see it at /mnt/share0 = $VFSD_SHARE)
#   --share-b DIR     guest B's daemon serves DIR instead: the same files seen
#                     through another client mount of a distributed file
#                     system, standing for a second host (scripts/gluster.sh)
#   --sync DIR        also give both guests a share "sync" of the local DIR
#                     (mounted at /mnt/sync, served with --cache=never by each
#                     daemon): a channel with no caching between the guests,
#                     for tests that measure the caching of share0
#   --share0-args A   daemon arguments for share0 only (e.g. its cache mode)
#   --cmd-a CMD, --cmd-b CMD   guest commands (sh -c, in the share)
#   --host CMD        also run CMD on the host (bash -c, its own process group)
#                     while the guests run; it sees TWO_SHARE, TWO_WORK and
#                     TWO_RUNVM_A / TWO_RUNVM_B (the run-vm.sh pids; QEMU is
#                     their child: pgrep -P "$TWO_RUNVM_A" qemu-system).
#                     Stopped when both guests have ended.
#   --expect-a RC, --expect-b RC   expected run-vm.sh status (default 0; e.g.
#                     125 for a guest the host kills on purpose)
#   --workdir DIR     where A/, B/ and the logs go (default: new dir in $TMPDIR)
#   --daemon D, --daemon-args A, --accel A (default tcg), --kernel P,
#   --initrd P, --timeout S (default 900), --mem SIZE (default 1G)
#                     passed to both run-vm.sh runs
#
# Prints each guest's command output (prefixed "A| " / "B| ") and its status.
# Exit status: 0 both as expected; 1 a guest command failed (reported a
# status other than expected); 3 a run failed for another reason (timeout,
# a guest that did not come up or did not report, a daemon crash: run-vm.sh
# status 120, 124 or 125 when not expected) - worth one retry; 2 usage.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SHARE=
SHARE_B=
SYNC=
SHARE0_ARGS=
CMD_A=
CMD_B=
HOST_CMD=
EXPECT_A=0
EXPECT_B=0
WORKDIR=
DAEMON=vfsd
DAEMON_ARGS=
ACCEL=tcg
KERNEL=
INITRD=
TIMEOUT=900
MEM=1G

say() { printf 'two-guests: %s\n' "$*"; }
die() { printf 'two-guests: error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --share) SHARE=${2:?}; shift 2 ;;
        --share-b) SHARE_B=${2:?}; shift 2 ;;
        --sync) SYNC=${2:?}; shift 2 ;;
        --share0-args) SHARE0_ARGS=${2?}; shift 2 ;;
        --cmd-a) CMD_A=${2:?}; shift 2 ;;
        --cmd-b) CMD_B=${2:?}; shift 2 ;;
        --host) HOST_CMD=${2:?}; shift 2 ;;
        --expect-a) EXPECT_A=${2:?}; shift 2 ;;
        --expect-b) EXPECT_B=${2:?}; shift 2 ;;
        --workdir) WORKDIR=${2:?}; shift 2 ;;
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
[ -n "$SHARE" ] && [ -d "$SHARE" ] || die "--share DIR (an existing directory) is required"
[ -n "$CMD_A" ] && [ -n "$CMD_B" ] || die "--cmd-a and --cmd-b are required"
SHARE=$(cd "$SHARE" && pwd)
SHARE_B=${SHARE_B:-$SHARE}
[ -d "$SHARE_B" ] || die "--share-b $SHARE_B: no such directory"
SHARE_B=$(cd "$SHARE_B" && pwd)
if [ -n "$SYNC" ]; then
    [ -d "$SYNC" ] || die "--sync $SYNC: no such directory"
    SYNC=$(cd "$SYNC" && pwd)
fi
WORK=${WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-two.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
# Resolve kernel and initramfs once, so the two runs do not build them at the same time.
if [ -z "$KERNEL" ]; then KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get a guest kernel"; fi
if [ -z "$INITRD" ]; then INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs"; fi

run_one() {  # run_one NAME CMD DIR: one run-vm.sh in the background; sets PID_<NAME>
    local name=$1 cmd=$2 dir=$3 extra=()
    rm -rf "$WORK/$name"
    [ -n "$SHARE0_ARGS" ] && extra+=(--share-args share0 "$SHARE0_ARGS")
    [ -n "$SYNC" ] && extra+=(--share "$SYNC:sync" --share-args sync --cache=never)
    "$HERE/run-vm.sh" --daemon "$DAEMON" ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} \
        --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --mem "$MEM" \
        --timeout "$TIMEOUT" --quiet --keep --log "$WORK/$name.console.log" --workdir "$WORK/$name" \
        --share "$dir:share0" "${extra[@]}" -- "$cmd" > "$WORK/$name.run-vm.log" 2>&1 &
    eval "PID_$name=\$!"
}

HOST_PID=
cleanup() {
    [ -n "$HOST_PID" ] && kill -- "-$HOST_PID" 2>/dev/null
    [ -n "${PID_A:-}" ] && kill "$PID_A" 2>/dev/null
    [ -n "${PID_B:-}" ] && kill "$PID_B" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

say "work directory $WORK; share $SHARE$([ "$SHARE_B" != "$SHARE" ] && echo " (guest B: $SHARE_B)")${SYNC:+; sync share $SYNC}"
start=$(date +%s)
run_one A "$CMD_A" "$SHARE"
run_one B "$CMD_B" "$SHARE_B"
if [ -n "$HOST_CMD" ]; then
    TWO_SHARE=$SHARE TWO_WORK=$WORK TWO_RUNVM_A=$PID_A TWO_RUNVM_B=$PID_B \
        setsid bash -c "$HOST_CMD" > "$WORK/host.log" 2>&1 &
    HOST_PID=$!
fi
wait "$PID_A"; RC_A=$?; PID_A=
wait "$PID_B"; RC_B=$?; PID_B=
HOST_RC=
if [ -n "$HOST_PID" ]; then
    # Give the host command a moment to finish its own bookkeeping, then stop it.
    for _ in $(seq 1 20); do kill -0 "$HOST_PID" 2>/dev/null || break; sleep 0.5; done
    kill -- "-$HOST_PID" 2>/dev/null
    wait "$HOST_PID"; HOST_RC=$?; HOST_PID=
fi
secs=$(( $(date +%s) - start ))

show_guest() {  # the guest command's output from the console log
    tr -d '\r' < "$WORK/$1.console.log" 2>/dev/null |
        sed -n '/^vfsd-init: running:/,/^VFSD-RESULT:/p' | grep -v '^VFSD-RESULT:' | sed "s/^/$1| /"
    grep -h 'run-vm: \(error\|FAILED\|TIMEOUT\)' "$WORK/$1.run-vm.log" | sed "s/^/$1| /"
}
show_guest A
show_guest B
[ -n "$HOST_CMD" ] && sed 's/^/host| /' "$WORK/host.log"
say "guest A: run-vm.sh status $RC_A (expected $EXPECT_A); guest B: status $RC_B (expected $EXPECT_B)${HOST_RC:+; host command status $HOST_RC}; ${secs}s"
say "logs: $WORK/{A,B}.console.log, {A,B}.run-vm.log, {A,B}/daemon0.log${HOST_CMD:+, host.log}"
infra=0 failed=0
for g in A B; do
    eval "rc=\$RC_$g want=\$EXPECT_$g"
    [ "$rc" = "$want" ] && continue
    case $rc in 120|124|125) infra=1 ;; *) failed=1 ;; esac
done
[ "$failed" = 1 ] && exit 1
[ "$infra" = 1 ] && exit 3
exit 0
