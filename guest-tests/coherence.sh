#!/bin/sh
# Coherence between two guests on two "hosts": guest A changes a file
# through its share, guest B, whose daemon serves another client mount of the
# same distributed file system, waits until it sees the change whole, and the
# delay is measured on the host's clock.
#
# Usage (in the guest): /guest-tests/coherence.sh A|B MODE... [pdw]
# Run by tests/guest/gluster.rs (two guests at once).  For each MODE
# (auto, always, never, metadata) the guest has a share /mnt/c-MODE served
# with --cache=MODE; /mnt/sync is a local directory both daemons serve with
# --cache=never, for the markers.  "pdw" adds the parallel direct writes.
#
# Per mode, steps (B first reads or stats what A is about to change, so that
# the old state is in B's caches):
#   create    A writes and closes a new 256 KiB file; B: it exists, whole (md5)
#   overwrite A rewrites it in place (same size); B: the new md5
#   append    A appends 4 KiB; B: the new size and md5
#   truncate  A truncates it to 1000 bytes; B: the new size
#   chmod     A sets mode 0600; B: the new mode
#   rename    A renames it; B: the old name gone, the new one there
#   unlink    A removes it; B: the name gone
# The delay is the host mtime of B's "seen" marker minus that of A's "done"
# marker (one clock, the host's; resolution about 50 ms, B's polling step).
# B gives up after LIMIT seconds (default 8) and reports "not seen".
#
# pdw (parallel direct writes): a 64 MiB file made on the host side; A writes
# its first half and B its second half with O_DIRECT fio jobs (2 each) at the
# same time, then each verifies the whole file (crc32c headers): no lost or
# torn writes across the two hosts.
#
# Prints "coherence[R]: DELAY mode step seconds|unseen" lines and
# "coherence[R]: N checks passed, M failed"; exit 0 only if every check passed.
# Checks: under "never" every step shows within 3 s, under "auto" within 4 s
# (the daemon's 0 or 1 s timeouts, GlusterFS's own 1 s metadata cache, and up
# to a second of polling under TCG); under "always" and "metadata" a new file
# must show (a failed lookup is not cached), the rest is measured, not
# required (their 1-day timeouts are the documented trade); pdw verifies.

ROLE=${1:?usage: coherence.sh A|B MODE... [pdw]}
shift
case $ROLE in A) OTHER=B ;; B) OTHER=A ;; *) echo "coherence: role must be A or B"; exit 2 ;; esac
S=/mnt/sync
LIMIT=${COHERENCE_LIMIT:-8}
TEST=coherence
. /guest-tests/sync.sh
md5() { md5sum < "$1" 2>/dev/null | cut -d' ' -f1; }
size() { stat -c %s "$1" 2>/dev/null; }

# B: poll until the condition (a shell expression) holds, then mark seen
watch() {  # watch MODE STEP CONDITION
    await "A.$1.$2.done"
    n=0 lim=$(( LIMIT * 20 ))
    while ! eval "$3"; do
        n=$((n + 1))
        if [ $n -ge $lim ]; then
            mark "$1.$2.unseen"; say "DELAY $1 $2 unseen"
            case $1:$2 in
                never:*|auto:*|*:create) bad "$1 $2: not seen within $LIMIT s" ;;
                *) ok ;;
            esac
            return
        fi
        usleep 50000
    done
    mark "$1.$2.seen"
    if ! d=$(vfsd-lock mtime "$S/B.$1.$2.seen" "$S/A.$1.$2.done" |
        awk 'NR == 1 {a = $1} NR == 2 {b = $1} END {if (NR != 2) exit 1; printf "%.2f", a - b}'); then
        bad "$1 $2: could not read the markers' host times (vfsd-lock mtime)"; return
    fi
    say "DELAY $1 $2 $d"
    case $1 in never) b=3 ;; auto) b=4 ;; *) b=$LIMIT ;; esac
    if awk -v d="$d" -v b="$b" 'BEGIN {exit !(d >= 0 && d <= b)}'; then ok; else bad "$1 $2: seen after $d s (bound $b s)"; fi
}

# A: wait until B has primed its caches, change, mark done, wait for B's verdict
change() {  # change MODE STEP COMMAND
    await "B.$1.$2.primed"
    eval "$3" || bad "$1 $2: the change failed on A"
    mark "$1.$2.done"
    n=0
    while [ ! -e "$S/B.$1.$2.seen" ] && [ ! -e "$S/B.$1.$2.unseen" ]; do
        [ -e "$S/B.abort" ] && abort "guest B gave up"
        n=$((n + 1)); [ $n -ge $(( (LIMIT + 60) * 20 )) ] && abort "$1 $2: no verdict from B"
        usleep 50000
    done
    ok
}

run_mode() {
    m=$1 D=/mnt/c-$1
    [ -d "$D" ] || abort "no share /mnt/c-$m"
    F=$D/coh-file G=$D/coh-renamed
    say "mode $m"
    if [ "$ROLE" = A ]; then
        rm -f "$F" "$G"
        dd if=/dev/urandom of=/tmp/c1 bs=1k count=256 2>/dev/null
        dd if=/dev/urandom of=/tmp/c2 bs=1k count=256 2>/dev/null
        dd if=/dev/urandom of=/tmp/c3 bs=1k count=4 2>/dev/null
        cat /tmp/c1 > /tmp/c-create; cat /tmp/c2 > /tmp/c-over; cat /tmp/c2 /tmp/c3 > /tmp/c-append
        for f in create over append; do md5 /tmp/c-$f > "$S/A.$m.md5-$f"; done
        mark "$m.ready"
        change "$m" create "cat /tmp/c1 > $F"
        change "$m" overwrite "dd if=/tmp/c2 of=$F conv=notrunc 2>/dev/null"
        change "$m" append "cat /tmp/c3 >> $F"
        change "$m" truncate "truncate -s 1000 $F"
        change "$m" chmod "chmod 600 $F"
        change "$m" rename "mv $F $G"
        change "$m" unlink "rm $G"
    else
        await "A.$m.ready"
        want_create=$(cat "$S/A.$m.md5-create") want_over=$(cat "$S/A.$m.md5-over") want_append=$(cat "$S/A.$m.md5-append")
        ls "$D" > /dev/null; [ -e "$F" ]
        mark "$m.create.primed"
        watch "$m" create '[ "$(md5 $F)" = "$want_create" ]'
        md5 "$F" > /dev/null
        mark "$m.overwrite.primed"
        watch "$m" overwrite '[ "$(md5 $F)" = "$want_over" ]'
        md5 "$F" > /dev/null
        mark "$m.append.primed"
        watch "$m" append '[ "$(size $F)" = 266240 ] && [ "$(md5 $F)" = "$want_append" ]'
        size "$F" > /dev/null
        mark "$m.truncate.primed"
        watch "$m" truncate '[ "$(size $F)" = 1000 ]'
        stat -c %a "$F" > /dev/null
        mark "$m.chmod.primed"
        watch "$m" chmod '[ "$(stat -c %a $F 2>/dev/null)" = 600 ]'
        stat "$F" > /dev/null
        mark "$m.rename.primed"
        watch "$m" rename '[ ! -e $F ] && [ -e $G ]'
        stat "$G" > /dev/null
        mark "$m.unlink.primed"
        watch "$m" unlink '[ ! -e $G ]'
    fi
}

pdw() {
    D=/mnt/c-never P=$D/pdw-file
    say "pdw: parallel O_DIRECT writes to one file from both guests"
    if [ "$ROLE" = A ]; then
        rm -f "$P"; truncate -s 64M "$P" || abort "pdw: cannot create $P"
        mark pdw.ready
    else
        await A.pdw.ready
        n=0; while [ "$(size $P)" != 67108864 ]; do n=$((n + 1)); [ $n -ge 200 ] && abort "pdw: $P not seen"; usleep 50000; done
    fi
    barrier pdw.go
    if [ "$ROLE" = A ]; then off=0; else off=32m; fi
    t0=$(cut -d' ' -f1 /proc/uptime)
    if fio --name=pdw-$ROLE --filename="$P" --rw=write --bs=64k --direct=1 --ioengine=psync \
        --offset="$off" --numjobs=2 --offset_increment=16m --size=16m \
        --verify=crc32c --do_verify=0 --verify_state_save=0 --group_reporting > /tmp/pdw.out 2>&1; then ok
    else bad "pdw: fio write failed: $(tail -n 5 /tmp/pdw.out | tr '\n' ' ')"; fi
    t1=$(cut -d' ' -f1 /proc/uptime)
    say "pdw: wrote 32 MiB in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s ($(sed -n 's/.*WRITE: bw=\([^ ]*\).*/\1/p' /tmp/pdw.out))"
    barrier pdw.written
    # Each guest checks both halves: its own and the other host's.
    for half in 0 32m; do
        if fio --name=pdw-check --filename="$P" --rw=write --bs=64k --direct=1 --ioengine=psync \
            --offset="$half" --numjobs=2 --offset_increment=16m --size=16m \
            --verify=crc32c --verify_only --verify_state_load=0 > /tmp/pdw-v.out 2>&1; then ok
        else bad "pdw: verify of the half at $half failed: $(grep -m3 -i 'verify\|bad' /tmp/pdw-v.out | tr '\n' ' ')"; fi
    done
    barrier pdw.checked
    [ "$ROLE" = A ] && rm -f "$P"
}

mark up
barrier start 600
say "both guests up; modes: $*"
for m in "$@"; do
    case $m in
        auto|always|never|metadata) run_mode "$m" ;;
        pdw) pdw ;;
        *) abort "unknown mode '$m'" ;;
    esac
done
barrier end
finish
