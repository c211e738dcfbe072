# Sourced by the two-guest tests (coherence.sh, locks.sh), on top of lib.sh: the
# marker files the two guests (and the host) meet by on a shared sync directory.
# The caller sets TEST (its name in messages), ROLE (A or B), OTHER (the other
# role) and S (the sync directory); AWAIT_SECS is await's default limit.

NAME="$TEST[$ROLE]" MARKS=$S
. /guest-tests/lib.sh
START=$(date +%s)

# The counts, printed and written to S/ROLE.summary for the host to collect.
summary() {
    counts "$(( $(date +%s) - START ))s"
    echo "$PASS $FAIL" > "$S/$ROLE.summary"
}
finish() {
    [ "$PASS" -gt 0 ] || bad "no check ran"
    summary
    passed; exit $?
}
# Give up, and tell the other guest to, through S/ROLE.abort.
abort() { bad "$*"; marker "$ROLE.abort"; finish; }
mark() { marker "$ROLE.$1" || abort "cannot create marker $ROLE.$1"; }
await() {  # await NAME [SECS]: wait for S/NAME, written by the other guest or the host
    n=0 lim=$(( ${2:-${AWAIT_SECS:-300}} * 20 ))
    while [ ! -e "$S/$1" ]; do
        [ -e "$S/$OTHER.abort" ] && abort "the other guest ($OTHER) gave up"
        [ -e "$S/host.abort" ] && abort "the host gave up"
        n=$((n + 1))
        [ $n -ge $lim ] && abort "timed out waiting for $1"
        usleep 50000
    done
}
barrier() { mark "$1"; await "$OTHER.$1" "${2:-}"; }
