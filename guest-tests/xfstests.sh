#!/bin/sh
# Run xfstests (fstests) against virtio-fs.  Runs inside the guest, chrooted
# into a read-only export of the host's root file system (see
# scripts/run-xfstests.sh), so xfstests finds its full userland (bash, perl,
# xfs_io, ...) there.
# Usage: xfstests.sh XFSTESTS_DIR [check arguments, e.g. -g quick or generic/001]
# Environment (defaults): TEST_DEV=test TEST_DIR=/mnt/test
#   SCRATCH_DEV=scratch SCRATCH_MNT=/mnt/scratch RESULT_BASE=/mnt/results/results
XFSTESTS=${1:?usage: xfstests.sh XFSTESTS_DIR [check args]}
shift
[ -x "$XFSTESTS/check" ] || { echo "xfstests.sh: $XFSTESTS/check not found: build xfstests on the host first (make)"; exit 2; }

export FSTYP=virtiofs
export TEST_DEV=${TEST_DEV:-test}
export TEST_DIR=${TEST_DIR:-/mnt/test}
export SCRATCH_DEV=${SCRATCH_DEV:-scratch}
export SCRATCH_MNT=${SCRATCH_MNT:-/mnt/scratch}
# The xfstests tree is read-only here; results go to the writable results share.
export RESULT_BASE=${RESULT_BASE:-/mnt/results/results}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p "$TEST_DIR" "$SCRATCH_MNT" "$RESULT_BASE"

# xfstests expects TEST_DEV mounted on TEST_DIR before it starts.
mount -t virtiofs "$TEST_DEV" "$TEST_DIR" || { echo "xfstests.sh: cannot mount tag $TEST_DEV"; exit 2; }
id fsgqa >/dev/null 2>&1 || echo "xfstests.sh: note: no user fsgqa on the host; tests that need it will be skipped"

cd "$XFSTESTS" || exit 2
echo "xfstests.sh: FSTYP=$FSTYP TEST_DEV=$TEST_DEV SCRATCH_DEV=$SCRATCH_DEV; ./check $*"
./check "$@"
rc=$?
umount "$TEST_DIR" 2>/dev/null
exit $rc
