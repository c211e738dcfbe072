#!/usr/bin/env bash
# Run xfstests (fstests) in a guest against vfsd (or virtiofsd).
#
# Usage: scripts/run-xfstests.sh --xfstests DIR [options] [-- CHECK_ARGS...]
#   --xfstests DIR   a built xfstests tree on the host (git clone + make);
#                    its tools must work on this host (same userland)
#   --daemon D       vfsd (default), virtiofsd or a run-vm.sh template
#   --results DIR    where results go (default: a new dir under $TMPDIR)
#   --accel A        auto (default), kvm or tcg
#   --timeout SECS   overall limit (default 14400)
#   CHECK_ARGS       passed to ./check (default: -g quick)
#
# How it works: the guest has only busybox, so the host's root directory is
# exported read-only as a fourth share ("hostroot") and the test runs
# chrooted into it.  Two more shares back TEST_DEV ("test") and SCRATCH_DEV
# ("scratch"); xfstests mounts them itself with "mount -t virtiofs TAG DIR".
# Host prerequisites for xfstests: its build and run dependencies (xfsprogs,
# attr, acl, bc, fio, ...), and users fsgqa, fsgqa2, 123456-fsgqa as the
# xfstests README describes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
XFSTESTS=
DAEMON=vfsd
RESULTS=
ACCEL=auto
TIMEOUT=14400
while [ $# -gt 0 ]; do
    case $1 in
        --xfstests) XFSTESTS=${2:?}; shift 2 ;;
        --daemon) DAEMON=${2:?}; shift 2 ;;
        --results) RESULTS=${2:?}; shift 2 ;;
        --accel) ACCEL=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) echo "run-xfstests: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
[ -n "$XFSTESTS" ] || { echo "run-xfstests: --xfstests DIR is required" >&2; exit 2; }
XFSTESTS=$(cd "$XFSTESTS" && pwd)
[ -x "$XFSTESTS/check" ] || { echo "run-xfstests: $XFSTESTS/check missing: build xfstests first" >&2; exit 2; }
case $XFSTESTS/ in
    /tmp/*|/run/*|/dev/*|/proc/*|/sys/*|/mnt/*)
        echo "run-xfstests: $XFSTESTS is hidden in the guest (its /tmp, /run, /dev, /proc, /sys and /mnt are" \
             "the guest's own); put the xfstests tree elsewhere, e.g. under /opt or /root" >&2
        exit 2 ;;
esac
[ $# -gt 0 ] || set -- -g quick
RESULTS=${RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/vfsd-xfstests.XXXXXX")}
mkdir -p "$RESULTS/test" "$RESULTS/scratch" "$RESULTS/out"
echo "run-xfstests: results in $RESULTS/out" >&2

exec "$HERE/run-vm.sh" --daemon "$DAEMON" --accel "$ACCEL" --timeout "$TIMEOUT" --mem 4G \
    --share "/:hostroot:ro" \
    --share "$RESULTS/test:test:nomount" \
    --share "$RESULTS/scratch:scratch:nomount" \
    --share "$RESULTS/out:results" \
    --chroot hostroot \
    -- /mnt/guest-tests/xfstests.sh "$XFSTESTS" "$@"
