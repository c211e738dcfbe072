#!/usr/bin/env bash
# Run xfstests (fstests) in a QEMU guest against vfsd, or virtiofsd for comparison.
#
# Usage: scripts/run-xfstests.sh [options] [TESTS...]
#   TESTS: test names (generic/001), '-g GROUP[,GROUP]' (from tests/generic),
#   '-x GROUP' (leave those out), or a file with one name a line ('#' starts a
#   comment).  Default: -g quick.
#
# Options:
#   --daemon D        vfsd (default), virtiofsd, or a run-vm.sh command template
#   --daemon-args A   extra arguments for the daemon (all four shares)
#   --first N         run only the first N tests of the list
#   --results DIR     results directory (default: new dir under ~/.cache/vfsd/xfstests-runs)
#   --test-timeout S  per-test watchdog in the guest (default 600)
#   --strict          a test that reports "not run" counts as a failure (for CI lists)
#   --xfstests DIR    built fstests tree (default: scripts/build-xfstests.sh's)
#   --accel A         tcg (default), kvm or auto
#   --mem SIZE        guest memory (default 4G)
#   --kernel PATH / --initrd PATH   passed on to run-vm.sh
#
# The guest gets four shares from the same daemon: the host's root (read-only,
# the guest builds an overlay root on it with the fstests tree, /etc and /var
# writable and the guest kernel's modules in /lib/modules), "test" and
# "scratch" (TEST_DEV and SCRATCH_DEV, FSTYP=virtiofs, mounted by fstests) and
# "results".  A hung test is killed by the guest's watchdog, its FUSE
# connections aborted, and a fresh guest runs the rest of the list.
#
# Writes DIR/summary.txt and DIR/summary.json (passed, failed, not run with
# reasons, seconds per test) and prints a progress line per test.  Exit status:
# 0 all ran and none failed, 1 failures (or tests left unrun), 2 usage or set-up error.
set -uo pipefail

COMMAND="$0 $*"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${VFSD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vfsd}
DAEMON=vfsd
DAEMON_ARGS=
FIRST=
RESULTS=
PER_TEST=600
STRICT=0
XFSTESTS=
ACCEL=tcg
MEM=4G
KERNEL=
INITRD=
GROUPS_IN=()
GROUPS_OUT=()
NAMES=()

say() { printf 'run-xfstests: %s\n' "$*"; }
die() { printf 'run-xfstests: error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --daemon) DAEMON=${2:?--daemon needs a value}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --first) FIRST=${2:?}; shift 2 ;;
        --results) RESULTS=${2:?}; shift 2 ;;
        --test-timeout) PER_TEST=${2:?}; shift 2 ;;
        --strict) STRICT=1; shift ;;
        --xfstests) XFSTESTS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        -g) GROUPS_IN+=(${2//,/ }); shift 2 ;;
        -x) GROUPS_OUT+=(${2//,/ }); shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; NAMES+=("$@"); break ;;
        -*) die "unknown option '$1' (try --help)" ;;
        *) NAMES+=("$1"); shift ;;
    esac
done
[[ $PER_TEST =~ ^[0-9]+$ ]] && [ "$PER_TEST" -ge 30 ] || die "--test-timeout must be a number of seconds >= 30"
[ -z "$FIRST" ] || [[ $FIRST =~ ^[1-9][0-9]*$ ]] || die "--first must be a positive number"
command -v python3 >/dev/null || die "python3 not found (it writes the summary): apt-get install python3"

# --- The fstests tree, the kernel and its modules --------------------------------
if [ -z "$XFSTESTS" ]; then
    XFSTESTS=$CACHE/xfstests
    [ -x "$XFSTESTS/check" ] || die "no built fstests tree in $XFSTESTS: run scripts/build-xfstests.sh first"
fi
XFSTESTS=$(cd "$XFSTESTS" 2>/dev/null && pwd) || die "--xfstests: no such directory"
[ -x "$XFSTESTS/check" ] && [ -x "$XFSTESTS/ltp/fsstress" ] || die "$XFSTESTS is not a built fstests tree (no check or ltp/fsstress): run scripts/build-xfstests.sh"
case $XFSTESTS/ in
    /tmp/*|/run/*|/dev/*|/proc/*|/sys/*|/mnt/*)
        die "$XFSTESTS is hidden in the guest (/tmp, /run, /dev, /proc, /sys and /mnt are its own there); use the default cache directory" ;;
esac
for u in fsgqa fsgqa2 123456-fsgqa; do
    id "$u" >/dev/null 2>&1 || die "user $u missing: run scripts/build-xfstests.sh (it creates fsgqa, fsgqa2, 123456-fsgqa)"
done
if [ -z "$KERNEL" ]; then
    KERNEL=$("$HERE/fetch-kernel.sh" 2>/dev/null) || KERNEL=$("$HERE/fetch-kernel.sh") || die "could not get the guest kernel (see above)"
fi
KDIR=$(cd "$(dirname "$KERNEL")" && pwd -P)
MODULES=$(VFSD_KERNEL_VERSION=$(basename "$KDIR" | sed 's/-cloud-amd64$//') "$HERE/fetch-kernel.sh" --modules 2>"$CACHE/fetch-modules.log") ||
    { cat "$CACHE/fetch-modules.log" >&2; die "could not get the guest kernel's modules (see above)"; }
case $MODULES in /tmp/*|/run/*|/mnt/*) die "the kernel modules in $MODULES are hidden in the guest; use the default cache directory" ;; esac
if [ -z "$INITRD" ]; then
    # busybox and guest-tests are all the first stage needs; fstests runs on the host's userland.
    INITRD=$("$HERE/build-initramfs.sh" --no-tools) || die "could not build the initramfs (see above)"
fi

# --- The list ----------------------------------------------------------------------
[ ${#GROUPS_IN[@]} -gt 0 ] || [ ${#NAMES[@]} -gt 0 ] || GROUPS_IN=(quick)
LIST=$(mktemp)
trap 'rm -f "$LIST"' EXIT
for n in "${NAMES[@]}"; do
    if [ -f "$n" ]; then
        sed -e 's/#.*//' -e 's/[[:space:]]//g' "$n" | grep . >> "$LIST"
    else
        echo "$n" >> "$LIST"
    fi
done
in_groups() {  # tests of tests/generic in any of the groups "$@"
    awk -v want=" $* " '!/^#/ && NF > 1 { for (i = 2; i <= NF; i++) if (index(want, " " $i " ")) { print "generic/" $1; next } }' \
        "$XFSTESTS/tests/generic/group.list"
}
if [ ${#GROUPS_IN[@]} -gt 0 ]; then
    [ -f "$XFSTESTS/tests/generic/group.list" ] || die "$XFSTESTS/tests/generic/group.list missing: is the tree built?"
    in_groups "${GROUPS_IN[@]}" | sort -V > "$LIST.g"
    [ -s "$LIST.g" ] || die "no tests in group(s) ${GROUPS_IN[*]}"
    cat "$LIST.g" >> "$LIST"; rm -f "$LIST.g"
fi
if [ ${#GROUPS_OUT[@]} -gt 0 ]; then
    in_groups "${GROUPS_OUT[@]}" > "$LIST.x"
    grep -vxF -f "$LIST.x" "$LIST" > "$LIST.k" || true
    mv "$LIST.k" "$LIST"; rm -f "$LIST.x"
fi
awk '!seen[$0]++' "$LIST" > "$LIST.u" && mv "$LIST.u" "$LIST"
[ -n "$FIRST" ] && { head -n "$FIRST" "$LIST" > "$LIST.f"; mv "$LIST.f" "$LIST"; }
while read -r t; do
    [[ $t =~ ^[a-z0-9]+/[0-9]+$ ]] || die "'$t' is not a test name (like generic/001)"
    [ -f "$XFSTESTS/tests/$t" ] || die "no test $t in $XFSTESTS/tests"
done < "$LIST"
TOTAL=$(wc -l < "$LIST")
[ "$TOTAL" -gt 0 ] || die "the test list is empty"

# --- Results directory ---------------------------------------------------------------
if [ -z "$RESULTS" ]; then
    mkdir -p "$CACHE/xfstests-runs"
    RESULTS=$(mktemp -d "$CACHE/xfstests-runs/$(date +%Y%m%d-%H%M%S)-XXXX")
fi
mkdir -p "$RESULTS" || die "cannot create $RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
rm -rf "$RESULTS/out" "$RESULTS/test" "$RESULTS/scratch"
mkdir -p "$RESULTS/out" "$RESULTS/test" "$RESULTS/scratch" "$RESULTS/boots"
cp "$LIST" "$RESULTS/tests.list"
OUT=$RESULTS/out/check.out
NOTES=$RESULTS/out/watchdog.log   # the guest's watchdog and the host both note here
TIMES=$RESULTS/times.tsv
: > "$OUT"; : > "$NOTES"; : > "$TIMES"
{
    echo "daemon: $DAEMON${DAEMON_ARGS:+ $DAEMON_ARGS}"
    [ "$DAEMON" = vfsd ] && echo "vfsd binary: ${VFSD_BIN:-$REPO/target/release/vfsd}"
    echo "kernel: $(basename "$KDIR"); accel: $ACCEL; mem: $MEM; per-test watchdog: ${PER_TEST}s"
    echo "fstests: $XFSTESTS ($(cat "$XFSTESTS/.vfsd-built" 2>/dev/null || echo 'not built by build-xfstests.sh'))"
    echo "command: $COMMAND"
} > "$RESULTS/run.info"
say "$TOTAL test(s) against $DAEMON; results in $RESULTS"

# --- Progress: follow check's output on the host ---------------------------------------
declare -A T_START=()
DONE=0
N_PASS=0; N_FAIL=0; N_NOTRUN=0
RUN_START=$(date +%s)
classify() {  # classify LINE -> pass | notrun | fail
    case $1 in
        *'[not run]'*) echo notrun ;;
        *' - output mismatch'*|*'[failed'*|*'_check_'*|*'[dumped core]'*|*'no qualified output'*) echo fail ;;
        *) if [[ $1 =~ [0-9]+s[[:space:]]*$ ]]; then echo pass; else echo fail; fi ;;
    esac
}
progress() {  # looks at check.out once; prints finished tests
    local now lines n last_partial i line name st
    now=$(date +%s)
    mapfile -t lines < <(grep -E '^[a-z0-9]+/[0-9]+' "$OUT" 2>/dev/null)
    n=${#lines[@]}
    last_partial=0
    if [ "$n" -gt 0 ] && [ -s "$OUT" ] && [ "$(tail -c1 "$OUT" | od -An -c | tr -d ' ')" != '\n' ] &&
       tail -n1 "$OUT" | grep -qE '^[a-z0-9]+/[0-9]+'; then
        last_partial=1
    fi
    for ((i = 0; i < n; i++)); do
        name=${lines[$i]%% *}
        [ -n "${T_START[$name]:-}" ] || T_START[$name]=$now
    done
    for ((i = DONE; i < n - last_partial; i++)); do
        line=${lines[$i]}
        name=${line%% *}
        st=$(classify "$line")
        case $st in pass) N_PASS=$((N_PASS + 1)) ;; fail) N_FAIL=$((N_FAIL + 1)) ;; notrun) N_NOTRUN=$((N_NOTRUN + 1)) ;; esac
        printf '%s\t%s\t%s\n' "$name" "${T_START[$name]}" "$now" >> "$TIMES"
        DONE=$((DONE + 1))
        say "[$DONE/$TOTAL $(( (now - RUN_START) / 60 ))m] $(printf '%-12s %-7s %4ss' "$name" "$st" "$(( now - T_START[$name] ))") (pass $N_PASS, fail $N_FAIL, not run $N_NOTRUN)"
    done
}

# --- Boots: one guest for the list; a new one for the rest after a hang -------------------
remaining() {  # tests of the list with no line in check.out yet
    grep -oE '^[a-z0-9]+/[0-9]+' "$OUT" | sort -u > "$RESULTS/.seen"
    grep -vxF -f "$RESULTS/.seen" "$RESULTS/tests.list" || true
}
# The host-root share is infrastructure, not under test.  It is a view of the
# host's root file system alone: a non-recursive bind of / in a mount namespace
# of this run's own (so no daemon walks into the host's /proc, /sys or /dev,
# and vfsd's namespace sandbox, which cannot pivot_root into '/' itself, works).
# --cache always keeps the guest's page cache of binaries and libraries across
# opens (with 'auto' every exec reads bash and libc again), which makes
# fstests' fork/exec-heavy scripts much faster under TCG.
ROOTDEV=$(stat -c %d /)
for p in "$XFSTESTS" "$MODULES"; do
    [ "$(stat -c %d "$p")" = "$ROOTDEV" ] ||
        die "$p is not on the root file system, so the guest cannot see it (set VFSD_CACHE to a directory on /)"
done
command -v unshare >/dev/null || die "unshare not found: apt-get install util-linux"
VIEW=$CACHE/hostroot-view
mkdir -p "$VIEW"
case $DAEMON in
    vfsd|virtiofsd) HOSTROOT_ARGS=(--share-args hostroot "--cache always") ;;
    *) HOSTROOT_ARGS=() ;;
esac
VM=
trap 'rm -f "$LIST"; [ -n "$VM" ] && kill "$VM" 2>/dev/null && wait "$VM" 2>/dev/null' EXIT
trap 'say "interrupted"; exit 130' INT TERM
BOOT=0
FLAKES=0
STATUS=0
while :; do
    remaining > "$RESULTS/out/tests.list"
    [ -s "$RESULTS/out/tests.list" ] || break
    BOOT=$((BOOT + 1))
    left=$(wc -l < "$RESULTS/out/tests.list")
    # Overall limit for this guest: the watchdog fires long before, this only
    # catches a guest that is wedged as a whole.
    limit=$(( 900 + left * 120 + PER_TEST ))
    say "boot $BOOT: $left test(s) left"
    before=$(grep -cE '^[a-z0-9]+/[0-9]+' "$OUT")
    unshare --mount --propagation private -- bash -c 'mount --bind / "$0" && exec "$@"' "$VIEW" \
    "$HERE/run-vm.sh" --daemon "$DAEMON" ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} "${HOSTROOT_ARGS[@]}" \
        --accel "$ACCEL" --mem "$MEM" --kernel "$KERNEL" --initrd "$INITRD" \
        --timeout "$limit" --quiet --log "$RESULTS/boots/console-$BOOT.log" --workdir "$RESULTS/boots/work-$BOOT" \
        --share "$VIEW:hostroot:ro" \
        --share "$RESULTS/test:test:nomount" \
        --share "$RESULTS/scratch:scratch:nomount" \
        --share "$RESULTS/out:results" \
        -- "/guest-tests/xfstests.sh $XFSTESTS $MODULES $PER_TEST" > "$RESULTS/boots/run-vm-$BOOT.log" 2>&1 &
    VM=$!
    last_size=-1; last_change=$(date +%s)
    while kill -0 "$VM" 2>/dev/null; do
        sleep 2
        progress
        size=$(stat -c %s "$OUT")
        if [ "$size" != "$last_size" ]; then last_size=$size; last_change=$(date +%s); fi
        # The guest's watchdog should act first; this is for a guest that cannot.
        if [ $(( $(date +%s) - last_change )) -ge $(( PER_TEST + 300 )) ]; then
            say "no output from the guest for $(( PER_TEST + 300 ))s; stopping it"
            kill "$VM" 2>/dev/null
        fi
    done
    wait "$VM"; rc=$?
    VM=
    progress
    after=$(grep -cE '^[a-z0-9]+/[0-9]+' "$OUT")
    # A test line without its result: the guest died in the middle of it.
    if [ -s "$OUT" ] && [ "$(tail -c1 "$OUT" | od -An -c | tr -d ' ')" != '\n' ]; then
        cur=$(tail -n1 "$OUT" | grep -oE '^[a-z0-9]+/[0-9]+' || true)
        echo >> "$OUT"
        if [ -n "$cur" ] && ! grep -q "^$cur	" "$NOTES"; then
            why="the guest stopped during the test (run-vm.sh exit status $rc: $(grep -m1 -E 'run-vm: (FAILED|TIMEOUT|error)' "$RESULTS/boots/run-vm-$BOOT.log" | sed 's/^run-vm: //'))"
            printf '%s\t%s\n' "$cur" "$why" >> "$NOTES"
        fi
        progress
    fi
    case $rc in
        0) ;;
        3) say "boot $BOOT: the watchdog stopped $(tail -n1 "$NOTES" | cut -f1): $(tail -n1 "$NOTES" | cut -f2-)" ;;
        *)
            say "boot $BOOT: run-vm.sh exit status $rc (log: $RESULTS/boots/run-vm-$BOOT.log)"
            grep -E 'run-vm: (error|FAILED|TIMEOUT)|xfstests(-check)?(\.sh)?: error' "$RESULTS/boots/run-vm-$BOOT.log" "$RESULTS/boots/console-$BOOT.log" 2>/dev/null | head -n 5 | sed 's/^/run-xfstests:   /'
            if [ "$after" = "$before" ]; then
                # Nothing ran: a boot flake or a set-up error. Once more, then give up.
                FLAKES=$((FLAKES + 1))
                if [ "$FLAKES" -ge 2 ]; then say "no test ran in two boots in a row; giving up"; STATUS=1; break; fi
            fi ;;
    esac
    [ "$after" != "$before" ] && FLAKES=0
    [ "$BOOT" -lt $(( TOTAL + 2 )) ] || { say "too many boots; giving up"; STATUS=1; break; }
done
rm -f "$RESULTS/.seen"

# --- Summary -------------------------------------------------------------------------------
python3 "$HERE/xfstests_summary.py" --results "$RESULTS" --wall $(( $(date +%s) - RUN_START )) \
    --strict-flag "$STRICT" || die "writing the summary failed"
cat "$RESULTS/summary.txt"
if grep -q '^RESULT: FAIL' "$RESULTS/summary.txt"; then STATUS=1; fi
exit "$STATUS"
