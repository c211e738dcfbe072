#!/usr/bin/env bash
# Two guests on two "hosts" sharing one distributed file system (issue 14):
# guest A's daemon serves client mount A, guest B's serves client mount B of the
# same GlusterFS volume (scripts/gluster.sh), and they check that
#   coherence  a change made in A (create, overwrite, append, truncate, chmod,
#              rename, unlink) shows in B, and how long it takes, per cache mode
#              (guest-tests/coherence.sh), plus parallel O_DIRECT writes from
#              both guests to one file (pdw);
#   locks      flock conflicts and wake-up and fcntl byte-range conflicts between
#              the guests, and counters incremented by both guests under flock and
#              under fcntl (scripts/guest-locks.sh --cross --two-hosts). Its other
#              steps take flock and a POSIX lock on one file in one process, which
#              GlusterFS refuses (docs/distributed.md); --full runs them anyway.
#
# Usage: scripts/two-hosts.sh [options]
#   --only LIST      coherence,locks (default both)
#   --modes LIST     cache modes for coherence (default auto,always,never,metadata)
#   --full           guest-locks.sh --full instead of --cross
#   --dirs A:B       use these two directories (two client mounts of one file
#                    system) instead of bringing up scripts/gluster.sh's volume
#   --daemon D       vfsd (default) or virtiofsd (metadata is skipped for
#                    virtiofsd 1.14, which has no such mode)
#   --daemon-args A  extra arguments for every daemon
#   --limit S        how long B waits to see a change (default 8 s)
#   --save FILE      also write the delay table to FILE
#   --logs DIR       where logs go (default: new dir in $TMPDIR)
#   --accel A, --kernel P, --initrd P   passed on
# Exit status: 0 every check passed, 1 not, 2 usage or set-up error.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ONLY=coherence,locks
MODES=auto,always,never,metadata
LOCKS_MODE=--cross
DIRS=
DAEMON=vfsd
DAEMON_ARGS=
LIMIT=8
SAVE=
LOGS=
ACCEL=tcg
KERNEL=
INITRD=

say() { printf 'two-hosts: %s\n' "$*"; }
die() { printf 'two-hosts: error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --only) ONLY=${2:?}; shift 2 ;;
        --modes) MODES=${2:?}; shift 2 ;;
        --full) LOCKS_MODE=--full; shift ;;
        --dirs) DIRS=${2:?}; shift 2 ;;
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --limit) LIMIT=${2:?}; shift 2 ;;
        --save) SAVE=${2:?}; shift 2 ;;
        --logs) LOGS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
for t in ${ONLY//,/ }; do case $t in coherence|locks) ;; *) die "--only: unknown part '$t'" ;; esac; done
for m in ${MODES//,/ }; do case $m in auto|always|never|metadata) ;; *) die "--modes: unknown cache mode '$m'" ;; esac; done
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 1 ] || die "--limit wants whole seconds"
wanted() { [[ ",$ONLY," == *",$1,"* ]]; }
wanted coherence || wanted locks || die "--only: nothing to run"
if [ "$DAEMON" = virtiofsd ]; then MODES=$(echo "$MODES" | tr ',' '\n' | grep -vx metadata | paste -sd,); fi
[ -n "$MODES" ] || ! wanted coherence || die "--modes: no cache mode left to test"

if [ -n "$DIRS" ]; then
    A=${DIRS%%:*} B=${DIRS#*:}
    [ "$A" != "$DIRS" ] && [ -d "$A" ] && [ -d "$B" ] || die "--dirs wants two existing directories, A:B"
else
    "$HERE/gluster.sh" up || die "could not bring up the GlusterFS volume (scripts/gluster.sh up)"
    eval "$("$HERE/gluster.sh" env)"
    A=$GLUSTER_A B=$GLUSTER_B
fi
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-two-hosts.XXXXXX")}
mkdir -p "$LOGS"; LOGS=$(cd "$LOGS" && pwd)
if [ -z "$KERNEL" ]; then KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get a guest kernel"; fi
if [ -z "$INITRD" ]; then INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs"; fi
say "client mounts: A $A, B $B; daemon $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS}; logs $LOGS"
FAILED=0

if wanted coherence; then
    # A directory of its own on the shared volume: two runs at once never meet.
    sub=$(basename "$(mktemp -d "$A/vfsd-coherence.XXXXXX")") || die "cannot create a directory in $A"
    SYNC=$(mktemp -d "$LOGS/sync.XXXXXX")
    guest_modes=
    for m in ${MODES//,/ }; do
        mkdir -p "$A/$sub/c-$m"
        guest_modes="$guest_modes $m"
    done
    PDW=; [[ ",$MODES," == *,never,* ]] && PDW=" pdw"   # on the never share
    for _ in $(seq 1 100); do [ -d "$B/$sub/c-${MODES%%,*}" ] && break; sleep 0.1; done
    # Each guest gets one share per cache mode (c-MODE), its own client mount's copy.
    case $DAEMON in
        vfsd) bin=${VFSD_BIN:-$(cd "$HERE/.." && pwd)/target/release/vfsd}; tmpl="$bin --socket-path={socket} --shared-dir={dir} --xattr" ;;
        virtiofsd) bin=$(command -v virtiofsd || echo "$HOME/.cargo/bin/virtiofsd"); tmpl="$bin --socket-path={socket} --shared-dir={dir} --sandbox none --xattr" ;;
        *) die "--daemon: vfsd or virtiofsd" ;;
    esac
    [ -x "$bin" ] || die "$bin not found"
    run_guest() {  # run_guest NAME DIR
        local name=$1 dir=$2 shares=() m
        for m in ${MODES//,/ }; do
            shares+=(--share "$dir/$sub/c-$m:c-$m" --share-args "c-$m" "--cache=$m")
        done
        "$HERE/run-vm.sh" --daemon "$tmpl" ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} \
            --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --mem 1G --timeout 1200 \
            --quiet --keep --log "$LOGS/$name.console.log" --workdir "$LOGS/$name" \
            --share "$SYNC:sync" --share-args sync --cache=never "${shares[@]}" \
            -- "COHERENCE_LIMIT=$LIMIT /guest-tests/coherence.sh $name$guest_modes$PDW" > "$LOGS/$name.run-vm.log" 2>&1
    }
    say "coherence: modes $MODES, then parallel direct writes (two guests booting)"
    start=$(date +%s)
    run_guest A "$A" & PA=$!
    run_guest B "$B" & PB=$!
    wait $PA; RA=$?
    wait $PB; RB=$?
    for g in A B; do
        tr -d '\r' < "$LOGS/$g.console.log" 2>/dev/null | grep '^coherence\[' | grep -v ' DELAY ' | sed 's/^/two-hosts:   /'
    done
    say "coherence: guest A status $RA, guest B status $RB ($(( $(date +%s) - start ))s)"
    [ "$RA" = 0 ] && [ "$RB" = 0 ] || FAILED=1
    # The table: one row per step, one column per mode.
    table=$(tr -d '\r' < "$LOGS/B.console.log" | sed -n 's/^coherence\[B\]: DELAY //p' |
        awk -v modes="$MODES" -v limit="$LIMIT" '
            { d[$1 " " $2] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
            END {
                m = split(modes, ms, ",")
                printf "| step (A changes, B looks) |"; for (i = 1; i <= m; i++) printf " %s |", ms[i]; printf "\n"
                printf "| --- |"; for (i = 1; i <= m; i++) printf " --- |"; printf "\n"
                for (j = 1; j <= n; j++) {
                    printf "| %s |", order[j]
                    for (i = 1; i <= m; i++) {
                        v = d[ms[i] " " order[j]]
                        if (v == "") v = "-"; else if (v == "unseen") v = "not seen in " limit " s"; else v = v " s"
                        printf " %s |", v
                    }
                    printf "\n"
                }
            }')
    echo "$table" | sed 's/^/two-hosts:   /'
    if [ -n "$SAVE" ]; then
        {
            echo "# scripts/two-hosts.sh --only coherence (daemon $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS}), $(date -u +%Y-%m-%dT%H:%MZ)"
            echo "# delay from A's change to B seeing it whole, host clock; B polls every 50 ms, gives up after $LIMIT s"
            echo "$table"
        } > "$SAVE"
        say "table saved to $SAVE"
    fi
    [ "$FAILED" = 0 ] && rm -rf "${A:?}/$sub"
fi

if wanted locks; then
    say "locks: guest-locks.sh $LOCKS_MODE --two-hosts"
    "$HERE/guest-locks.sh" "$LOCKS_MODE" --two-hosts "$A:$B" --daemon "$DAEMON" \
        ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" \
        --logs "$LOGS/locks" > "$LOGS/locks.log" 2>&1
    rc=$?
    grep -E 'guest-locks: (guest|  |PASS|FAIL)' "$LOGS/locks.log" | sed 's/^guest-locks: /two-hosts:   locks: /'
    [ "$rc" = 0 ] || { FAILED=1; say "locks: FAIL (log $LOGS/locks.log)"; }
fi

if [ "$FAILED" = 0 ]; then say "PASS"; else say "FAIL (logs in $LOGS)"; fi
exit "$FAILED"
