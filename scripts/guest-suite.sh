#!/usr/bin/env bash
# Run guest tests against one or more vhost-user-fs daemons, each test in a fresh
# QEMU guest.  Ends with "N passed, M failed"; exits 1 if any test failed.  By
# default it runs only the self-tests of scripts/run-vm.sh, the interactive runner: every
# other check has a Rust test in tests/guest/ (scripts/test.sh runs them with cargo);
# --only runs any of them from shell, e.g. to compare daemons in one run (--daemon
# virtiofsd --daemon vfsd), and --share-root runs them on another file system. The
# GlusterFS runs and xfstests lists are Rust tests too (docs/distributed.md, docs/xfstests.md).
#
# The guests run on the system's QEMU (10 after scripts/setup.sh), except
# smoke-qemu72: the smoke test on bookworm's QEMU 7.2, unpacked into the cache
# by scripts/fetch-qemu.sh ($VFSD_QEMU72 names another binary).
#
# Usage: scripts/guest-suite.sh [options]
#   --daemon D        vfsd (default), virtiofsd, or a run-vm.sh command
#                     template; repeat to compare daemons in one run
#   --only LIST       comma-separated subset of (default selftest):
#                     selftest,smoke,smoke-qemu72,setid,fdwalk,features,fio,pjdfstest,fsx,
#                     stress-locks,migrate,libvirt (locks: tests/guest/locks.rs). stress-locks: stress-ng's locka,
#                     lockf and lockofd stressors, two instances each, two passes as
#                     root and one as a user; a lock wait left unanswered fails it,
#                     but a killed child's wait that its parent waits for is broken
#                     and counted apart (guest-tests/stress-locks.sh; about 2 minutes). migrate: live migration between two
#                     QEMU on this host, over a unix socket and through a file
#                     (scripts/guest-migrate.sh; about 3 minutes). libvirt: libvirt 11
#                     starts the daemon as its virtiofs <binary>; virsh save/restore and
#                     managedsave/start with the guest's open fd and (vfsd) its locks
#                     (scripts/libvirt-migrate.sh; about a minute; libvirtd must run:
#                     scripts/setup.sh starts it)
#   --accel A         tcg (default), kvm or auto
#   --qemu PATH       QEMU binary for every guest but smoke-qemu72's (default:
#                     $VFSD_QEMU, else qemu-system-x86_64 from PATH)
#   --fsx-ops N       fsx operations, buffered run (default 60000)
#   --fsx-direct-ops N  fsx operations, O_DIRECT run (default 20000)
#   --fio-runtime S   seconds per time-based fio job (default 8)
#   --queues N        num-request-queues per device (default 1)
#   --daemon-args A   extra arguments for every daemon command
#   --logs DIR        where to keep logs (default: a new dir under $TMPDIR)
#   --kernel PATH / --initrd PATH   passed on to run-vm.sh
#   --share-root DIR  make each test's share a fresh directory under DIR (e.g. a
#                     client mount of a distributed file system) instead of under
#                     the logs directory
# Typical time under TCG on 2 cores: about 6-7 minutes per daemon, 3 more
# for migrate, 1 for libvirt.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DAEMONS=()
ONLY=
SHARE_ROOT=
ACCEL=tcg
FSX_OPS=60000
FSX_DIRECT_OPS=20000
FIO_RUNTIME=8
QUEUES=1
DAEMON_ARGS=
LOGS=
KERNEL=
INITRD=

say() { printf 'guest-suite: %s\n' "$*"; }
die() { printf 'guest-suite: error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --daemon) DAEMONS+=("${2:?--daemon needs a value}"); shift 2 ;;
        --only) ONLY=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --qemu) export VFSD_QEMU=${2:?--qemu needs the path of a QEMU binary}; shift 2 ;;
        --fsx-ops) FSX_OPS=${2:?}; shift 2 ;;
        --fsx-direct-ops) FSX_DIRECT_OPS=${2:?}; shift 2 ;;
        --fio-runtime) FIO_RUNTIME=${2:?}; shift 2 ;;
        --queues) QUEUES=${2:?}; shift 2 ;;
        --daemon-args) DAEMON_ARGS=${2?}; shift 2 ;;
        --logs) LOGS=${2:?}; shift 2 ;;
        --kernel) KERNEL=${2:?}; shift 2 ;;
        --initrd) INITRD=${2:?}; shift 2 ;;
        --share-root) SHARE_ROOT=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
[ ${#DAEMONS[@]} -gt 0 ] || DAEMONS=(vfsd)
wanted() { [[ ",$ONLY," == *",$1,"* ]]; }
if [ -n "$SHARE_ROOT" ]; then
    ONLY=${ONLY:-smoke,setid,fio,pjdfstest,fsx}
fi
# The rest of the default set are Rust tests now (tests/guest/, run by cargo test as root:
# scripts/test.sh); --only still runs any of them here, e.g. to compare daemons.
ONLY=${ONLY:-selftest}
for t in ${ONLY//,/ }; do
    case $t in selftest|smoke|smoke-qemu72|setid|fdwalk|features|fio|pjdfstest|fsx|stress-locks|migrate|libvirt) ;;
        *) die "--only: unknown test '$t'" ;; esac
done
if [ -n "$SHARE_ROOT" ]; then
    # It makes its own shares.
    wanted migrate && die "migrate makes its own share; leave it out with --share-root"
fi
if [ -n "$SHARE_ROOT" ]; then
    [ -d "$SHARE_ROOT" ] || die "--share-root $SHARE_ROOT: no such directory"
    SHARE_ROOT=$(cd "$SHARE_ROOT" && pwd)
fi

# Check the daemons before spending time on anything else.
for d in "${DAEMONS[@]}"; do
    case $d in
        vfsd)
            bin=${VFSD_BIN:-$REPO/target/release/vfsd}
            [ -x "$bin" ] || die "$bin not found: run 'cargo build --release' first (or use --daemon virtiofsd)"
            "$bin" --help >/dev/null 2>&1 || die "'$bin --help' failed; is the binary broken?"
            ;;
        virtiofsd)
            command -v virtiofsd >/dev/null || [ -x "$HOME/.cargo/bin/virtiofsd" ] ||
                die "virtiofsd not found: cargo install virtiofsd --version 1.14.0 --locked"
            ;;
    esac
done

# The QEMU of every guest (run-vm.sh and the host-side tests' guests read VFSD_QEMU) and
# smoke-qemu72's: their versions go into the output.
qemu_version() { "$1" --version 2>/dev/null | sed -n '1s/^QEMU emulator version \([^ ]*\).*/\1/p' | grep . || echo unknown; }
SUITE_QEMU=${VFSD_QEMU:-${QEMU:-qemu-system-x86_64}}
command -v "$SUITE_QEMU" >/dev/null || die "$SUITE_QEMU not found: run scripts/setup.sh (QEMU 10)"
SUITE_QEMU_VERSION=$(qemu_version "$SUITE_QEMU")
QEMU72= QEMU72_VERSION=
if wanted smoke-qemu72; then
    QEMU72=${VFSD_QEMU72:-}
    if [ -z "$QEMU72" ]; then
        QEMU72=$("$HERE/fetch-qemu.sh") || die "could not get bookworm's QEMU 7.2 for smoke-qemu72 (see above; scripts/setup.sh fetches it)"
    fi
    [ -x "$QEMU72" ] || die "QEMU 7.2 binary $QEMU72 not found"
    QEMU72_VERSION=$(qemu_version "$QEMU72")
fi

SUITE_START=$(date +%s)
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-guest-suite.XXXXXX")}
mkdir -p "$LOGS"
say "logs in $LOGS"
say "QEMU $SUITE_QEMU_VERSION ($(command -v "$SUITE_QEMU"))${QEMU72:+; smoke-qemu72 on QEMU $QEMU72_VERSION ($QEMU72)}"
if [ -z "$KERNEL" ]; then
    KERNEL=$("$HERE/fetch-kernel.sh") || die "could not fetch the guest kernel (see above)"
fi
if [ -z "$INITRD" ]; then
    INITRD=$("$HERE/build-initramfs.sh") || die "could not build the initramfs (see above)"
fi

PASSED=0
FAILED=0
RESULTS=()

label_of() {  # a short name for a daemon spec
    case $1 in
        vfsd|virtiofsd) echo "$1${SHARE_ROOT:+@$(basename "$SHARE_ROOT")}" ;;
        *) basename "${1%% *}" ;;
    esac
}

# run_test DAEMON LABEL NAME EXPECTED_RC TIMEOUT GUEST_COMMAND [DAEMON_ARGS] [PREPARE]
# Sets TEST_DIR (kept share + logs) and TEST_RC. DAEMON_ARGS go after --daemon-args's.
# PREPARE, a function name, runs on the host with the fresh share as $1 before the boot.
# TEST_QEMU, when set, is the QEMU binary (run-vm.sh --qemu) instead of the suite's.
TEST_QEMU=
run_test() {
    local daemon=$1 label=$2 name=$3 expect=$4 timeout=$5 cmd=$6
    local args="$DAEMON_ARGS${7:+ $7}"
    TEST_DIR=$LOGS/$label/$name
    TEST_SHARE=$TEST_DIR/share
    [ -n "$SHARE_ROOT" ] && TEST_SHARE=$SHARE_ROOT/vfsd-suite-$(basename "$LOGS")-$label-$name
    rm -rf "$TEST_DIR" "$TEST_SHARE"; mkdir -p "$TEST_DIR" "$TEST_SHARE"
    [ -n "${8:-}" ] && "$8" "$TEST_SHARE"
    local start=$(date +%s)
    printf 'guest-suite: [%s] %-18s ... ' "$label" "$name"
    "$HERE/run-vm.sh" --daemon "$daemon" ${args:+--daemon-args "$args"} ${TEST_QEMU:+--qemu "$TEST_QEMU"} \
        --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --queues "$QUEUES" \
        --timeout "$timeout" --quiet --log "$TEST_DIR/console.log" --workdir "$TEST_DIR/work" \
        --share "$TEST_SHARE:share0" -- "$cmd" > "$TEST_DIR/run-vm.log" 2>&1
    TEST_RC=$?
    TEST_SECS=$(( $(date +%s) - start ))
    TEST_OK=0
    [ "$TEST_RC" = "$expect" ] && TEST_OK=1
}

# count_result LABEL NAME WHAT: prints PASS or FAIL for TEST_OK and counts it; WHAT names
# the exit status on a failure. Succeeds only for a pass.
count_result() {
    if [ "$TEST_OK" = 1 ]; then
        echo "PASS (${TEST_SECS}s)"; PASSED=$((PASSED + 1)); RESULTS+=("PASS [$1] $2 (${TEST_SECS}s)")
    else
        echo "FAIL (${TEST_SECS}s, $3 exit status $TEST_RC)"; FAILED=$((FAILED + 1)); RESULTS+=("FAIL [$1] $2 (${TEST_SECS}s)")
        return 1
    fi
}

finish_test() {  # finish_test LABEL NAME [extra failure reason]
    local label=$1 name=$2 why=${3:-}
    [ -n "$why" ] && TEST_OK=0
    if count_result "$label" "$name" run-vm.sh; then
        rm -rf "$TEST_SHARE"
    else
        [ -n "$why" ] && say "  $why"
        say "  log: $TEST_DIR/console.log and $TEST_DIR/run-vm.log"
        grep -h 'run-vm: \(error\|FAILED\|TIMEOUT\)' "$TEST_DIR/run-vm.log" | sed 's/^/guest-suite:   /'
        if [ -f "$TEST_DIR/console.log" ]; then
            tr -d '\r' < "$TEST_DIR/console.log" | grep -E 'FAIL|ERROR|error|panic|verify:' | head -n 25 | sed 's/^/guest-suite:   | /'
        fi
    fi
}

show() {  # print matching console lines of the last test, indented
    [ -f "$TEST_DIR/console.log" ] && tr -d '\r' < "$TEST_DIR/console.log" | grep -E "$1" | sed 's/^/guest-suite:     /'
}

# host_test LABEL NAME LOG FAIL_PATTERN COMMAND...: a test that runs its own guests (a
# host-side script). "{dir}" in COMMAND's words becomes the test's directory (TEST_DIR),
# made afresh. COMMAND's output goes to TEST_DIR/LOG; on failure the lines matching
# FAIL_PATTERN are shown.
host_test() {
    local label=$1 name=$2 log=$3 pattern=$4; shift 4
    TEST_DIR=$LOGS/$label/$name
    rm -rf "$TEST_DIR"; mkdir -p "$TEST_DIR"
    printf 'guest-suite: [%s] %-18s ... ' "$label" "$name"
    local start=$(date +%s)
    "${@//\{dir\}/$TEST_DIR}" > "$TEST_DIR/$log" 2>&1
    TEST_RC=$?
    TEST_SECS=$(( $(date +%s) - start ))
    TEST_OK=0; [ "$TEST_RC" = 0 ] && TEST_OK=1
    if ! count_result "$label" "$name" "$(basename "$1")"; then
        say "  log: $TEST_DIR/$log"
        grep -E "$pattern" "$TEST_DIR/$log" | head -n 25 | sed 's/^/guest-suite:   | /'
    fi
}

for daemon in "${DAEMONS[@]}"; do
    label=$(label_of "$daemon")
    say "=== daemon: $label ==="

    if wanted selftest; then
        run_test "$daemon" "$label" selftest-fail 3 120 /guest-tests/selftest-fail.sh
        finish_test "$label" "selftest-fail" "$([ "$TEST_OK" = 1 ] || echo "expected run-vm.sh to return 3 for a failing guest test, got $TEST_RC")"
        run_test "$daemon" "$label" selftest-timeout 124 25 /guest-tests/selftest-hang.sh
        finish_test "$label" "selftest-timeout" "$([ "$TEST_OK" = 1 ] || echo "expected run-vm.sh to time out (124), got $TEST_RC")"
    fi

    # smoke_test NAME: guest-tests/smoke.sh, then host-side checks of what it wrote.
    smoke_test() {
        local name=$1 why= s
        run_test "$daemon" "$label" "$name" 0 600 /guest-tests/smoke.sh
        if [ "$TEST_OK" = 1 ]; then
            # Did the data reach the host's directory?
            s=$TEST_SHARE
            if ! (cd "$s/smoke-keep" && md5sum --quiet -c ../smoke-manifest.md5) >/dev/null 2>&1; then
                why="host-side check: files written by the guest differ on the host (md5sum -c $s/smoke-manifest.md5)"
            elif [ "$(stat -c %s "$s/smoke-keep/sparse" 2>/dev/null)" != $((4101 * 1048576)) ] ||
                 [ "$(dd if="$s/smoke-keep/sparse" bs=1M skip=4100 2>/dev/null | md5sum)" != "$(md5sum < "$s/smoke-keep/random-1m")" ]; then
                why="host-side check: the sparse file past 4 GiB is wrong on the host"
            fi
        fi
        finish_test "$label" "$name" "$why"
        show '^smoke: [0-9]+ checks|^smoke: SKIP'
    }

    if wanted smoke; then
        smoke_test smoke
    fi

    if wanted smoke-qemu72; then
        # The same on bookworm's QEMU 7.2: the oldest VMM kept working (vhost-user
        # protocol features it lacks, its vhost-user-fs-pci quirks).
        TEST_QEMU=$QEMU72
        smoke_test smoke-qemu72
        TEST_QEMU=
        grep -h '^run-vm: booting:' "$TEST_DIR/run-vm.log" 2>/dev/null | tail -n1 | sed 's/^run-vm: /guest-suite:     /'
    fi

    if wanted setid; then
        # One boot per cache mode (the guest kernel takes a different write path in
        # each), each with a file-handle mode, so non-root creates are covered with
        # handles too.
        modes="never:mandatory auto:prefer always:never"
        # On a share root that may be a FUSE client mount (GlusterFS), vfsd refuses
        # mandatory file handles at start (tests/it/fuse_host.rs).
        [ -n "$SHARE_ROOT" ] && modes="never:never auto:prefer always:prefer"
        for mode in $modes; do
            cache=${mode%:*} handles=${mode#*:}
            run_test "$daemon" "$label" "setid-$cache" 0 300 \
                "/guest-tests/setid.sh cache=$cache,handles=$handles" \
                "--cache=$cache --inode-file-handles=$handles"
            finish_test "$label" "setid-$cache"
            show '^setid: [0-9]+ checks'
        done
    fi

    if wanted fdwalk; then
        # The tree is host-made (60 directories of 100 files), as a user's data is.
        fdwalk_tree() {
            python3 -c 'import os, sys
t = os.path.join(sys.argv[1], "fdwalk-tree")
for d in range(60):
    os.makedirs(os.path.join(t, "d%d" % d))
    for f in range(100):
        with open(os.path.join(t, "d%d" % d, "f%d" % f), "w") as o:
            o.write("%d/%d\n" % (d, f))
os.chmod(t, 0o777)' "$1"
        }
        # Issue 21: a 6,000-file tree at --rlimit-nofile=1024 in each file-handle mode
        # (the default cache mode keeps every inode the guest has seen referenced).
        modes="never prefer mandatory"
        [ -n "$SHARE_ROOT" ] && modes="never prefer"
        for handles in $modes; do
            run_test "$daemon" "$label" "fdwalk-$handles" 0 600 \
                "/guest-tests/fdwalk.sh handles=$handles" \
                "--rlimit-nofile=1024 --inode-file-handles=$handles" fdwalk_tree
            finish_test "$label" "fdwalk-$handles"
            show '^fdwalk: [0-9]+ checks'
        done
        # Rootless (libvirt's session VMs): vfsd as an unprivileged user with --uid-map,
        # so the default prefer can't reopen handles and finds files by name.
        if [ "$daemon" = vfsd ] && [ -z "$SHARE_ROOT" ]; then
            run_test "$HERE/rootless-daemon.sh {socket} {dir}" "$label" fdwalk-rootless 0 600 \
                "/guest-tests/fdwalk.sh rootless" "--rlimit-nofile=1024" fdwalk_tree
            finish_test "$label" fdwalk-rootless
            show '^fdwalk: [0-9]+ checks'
        fi
    fi

    if wanted features; then
        # Issue 12's features in one boot, each section with the options it needs.
        run_test "$daemon" "$label" features 0 600 "/guest-tests/features.sh" \
            "--cache=never --allow-mmap --posix-acl --translate-uid=map:65534:3000:1 --translate-gid=map:65534:3000:1 --xattrmap=:prefix:all:security.:user.virtiofs.::ok:all:::"
        why=
        k=$TEST_SHARE/features-keep
        if [ "$TEST_OK" = 1 ]; then
            # Host-side checks: the translated owner and the mapped xattr name.
            [ "$(stat -c %u:%g "$k/nobody-file" 2>/dev/null)" = 3000:3000 ] ||
                why="host-side check: nobody's file is owned by $(stat -c %u:%g "$k/nobody-file" 2>&1), not 3000:3000"
            [ "$(getfattr --only-values -n user.virtiofs.security.selinux "$k/labelled" 2>/dev/null)" = guest_label ] ||
                why="host-side check: security.selinux is not under user.virtiofs.security.selinux on the host"
        fi
        finish_test "$label" features "$why"
        show '^features: [0-9]+ checks'
    fi

    if wanted fio; then
        stats=
        # On a share root (a distributed file system), show what vfsd's READ path
        # learnt: RWF_NOWAIT given up once per host file system, not per request.
        [ -n "$SHARE_ROOT" ] && [ "$daemon" = vfsd ] && stats="--stats $LOGS/$label-fio-stats.json"
        run_test "$daemon" "$label" fio 0 900 "/guest-tests/fio.sh -t $FIO_RUNTIME" "$stats"
        finish_test "$label" fio
        show '^fio: (PASS|FAIL|[0-9]+ job)'
        if [ -n "$stats" ] && [ -s "$LOGS/$label-fio-stats.json" ]; then
            python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); r=s["opcodes"].get("READ",{}).get("count",0) if isinstance(s["opcodes"],dict) else "?"
print("guest-suite:     vfsd --stats: nowait_unsupported %s, READ requests %s, reads handed off %s, reads on the queue thread %s (no-wait) and %s (lone)" % (s["nowait_unsupported"], r, s["reads_handed_off"], s["reads_on_queue_thread"], s.get("reads_served_alone", 0)))' "$LOGS/$label-fio-stats.json" || true
        fi
    fi

    if wanted pjdfstest; then
        run_test "$daemon" "$label" pjdfstest 0 900 /guest-tests/pjdfstest.sh
        finish_test "$label" pjdfstest
        show '^pjdfstest: ([0-9]+ passed|FLAKY|KNOWN)'
        # Known failures of the host file system count too when daemons are compared.
        tr -d '\r' < "$TEST_DIR/console.log" 2>/dev/null |
            sed -n 's/^pjdfstest: FAILED //p; s/^pjdfstest: KNOWN \([^ ]*\).*/\1/p' | sort > "$LOGS/$label/pjdfstest.failed"
        tr -d '\r' < "$TEST_DIR/console.log" 2>/dev/null | sed -n 's/^pjdfstest: \([0-9]* passed.*\)/\1/p' | tail -n1 > "$LOGS/$label/pjdfstest.counts"
    fi

    if wanted fsx; then
        run_test "$daemon" "$label" fsx 0 1200 "/guest-tests/fsx.sh -N $FSX_OPS -D $FSX_DIRECT_OPS"
        finish_test "$label" fsx
        show '^fsx: (PASS|FAIL|SKIP)'
    fi

    if wanted stress-locks; then
        # A cycle of POSIX lock waits among the stressors' processes must end (EDEADLK),
        # never hang them; vfsd's --stats show how many it broke.
        stats=
        [ "$daemon" = vfsd ] && stats="--stats $LOGS/$label-stress-locks-stats.json"
        run_test "$daemon" "$label" stress-locks 0 300 "/guest-tests/stress-locks.sh -t 4 -r 2" "$stats"
        finish_test "$label" stress-locks
        show '^stress-locks: '
        if [ -n "$stats" ] && [ -s "$LOGS/$label-stress-locks-stats.json" ]; then
            python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))
print("guest-suite:     vfsd --stats: lock_edeadlk %s, lock_enolck %s" % (s.get("lock_edeadlk", "?"), s.get("lock_enolck", "?")))' "$LOGS/$label-stress-locks-stats.json" || true
        fi
    fi

    if wanted migrate && [ "$daemon" != vfsd ] && [ "$daemon" != virtiofsd ]; then
        say "[$label] migrate: not run (scripts/guest-migrate.sh starts vfsd or virtiofsd itself, not a run-vm.sh template)"
    elif wanted migrate; then
        # Live migration between two QEMU on this host, a daemon each on one share: the
        # guest writes through an open fd and holds flock, POSIX and OFD locks (about 1.5
        # minutes each; 168 s for both on 2 busy cores). The variants (rounds, extras,
        # migration modes, --expect-fail): scripts/guest-migrate.sh --help. vfsd also
        # carries a lock wait across (--extras waiter); virtiofsd drops it unanswered.
        # Through the socket, fio with verify runs across the switch too (the dirty log;
        # about 20 s more).
        for via in unix file; do
            extras=; [ "$via" = unix ] && extras=fio
            [ "$daemon" = vfsd ] && extras=waiter${extras:+,$extras}
            host_test "$label" "migrate-$via" guest-migrate.log 'FAIL|error' "$HERE/guest-migrate.sh" \
                --daemon "$daemon" ${DAEMON_ARGS:+--daemon-args "$DAEMON_ARGS"} --via "$via" \
                ${extras:+--extras "$extras"} \
                --accel "$ACCEL" --kernel "$KERNEL" --initrd "$INITRD" --results {dir}/results
            grep -E '^guest-migrate:   .*(downtime|device state)' "$TEST_DIR/guest-migrate.log" | sed "s/^guest-migrate:   /guest-suite:     migrate-$via: /"
        done
    fi

    if wanted libvirt && [ "$daemon" != vfsd ] && [ "$daemon" != virtiofsd ]; then
        say "[$label] libvirt: not run (libvirt starts vfsd or virtiofsd itself, not a run-vm.sh template)"
    elif wanted libvirt; then
        # libvirt 11 runs the daemon from <binary>: save/restore and managedsave/start of
        # a guest writing through an open fd; vfsd also with <lock posix flock> on, its
        # locks held on the host across (virtiofsd's are guest-local).
        lvlocks=; [ "$daemon" = vfsd ] && lvlocks=--locks
        host_test "$label" libvirt libvirt.log 'FAIL|error' "$HERE/libvirt-migrate.sh" \
            --daemon "$daemon" --test save,managedsave $lvlocks \
            --kernel "$KERNEL" --results {dir}/results
        grep -E '^\[(save|managedsave) ' "$TEST_DIR/libvirt.log" | grep -E 'virsh|guest ' | sed 's/^/guest-suite:     libvirt: /'
    fi
done

echo
say "summary ($(( $(date +%s) - SUITE_START ))s, accel $ACCEL, QEMU $SUITE_QEMU_VERSION${QEMU72:+ (smoke-qemu72: $QEMU72_VERSION)}, logs in $LOGS):"
for r in "${RESULTS[@]}"; do say "  $r"; done
if wanted pjdfstest; then
    say "pjdfstest:"
    for daemon in "${DAEMONS[@]}"; do
        label=$(label_of "$daemon")
        say "  $(printf '%-12s' "$label") $(cat "$LOGS/$label/pjdfstest.counts" 2>/dev/null || echo 'no result')"
    done
    if [ ${#DAEMONS[@]} -gt 1 ]; then
        ref=$(label_of "${DAEMONS[0]}")
        for daemon in "${DAEMONS[@]:1}"; do
            label=$(label_of "$daemon")
            only=$(comm -13 "$LOGS/$ref/pjdfstest.failed" "$LOGS/$label/pjdfstest.failed" 2>/dev/null)
            if [ -n "$only" ]; then
                say "  failing with $label but passing with $ref:"
                echo "$only" | sed 's/^/guest-suite:     /'
            else
                say "  no pjdfstest test fails with $label that passes with $ref"
            fi
        done
    fi
fi
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
