#!/bin/sh
# Guest side of `cargo bench --bench requests`: a source-tree workload, one timed step at a time.
#
# Usage: tree-bench.sh DIR CTL [STEPS]
#   DIR    where the work happens: a virtio-fs mount (the share under test) or a directory
#          on the guest's tmpfs
#   CTL    the control share: src.tar (a real source tree, top directory "src") and
#          src.bundle (a git bundle of the same tree) come in; the step marks go out
#   STEPS  comma-separated steps to time (default: all); a step left out that a chosen
#          one needs (untar, cp-a before rm-rf, create before unlink, git-clone before
#          git status) still runs, untimed, and the others are skipped
#
# Steps: untar, find, ls-lR (a stat of every file, the guest's caches warm from the
# untar), ls-lR-cold (the same after drop_caches), cp-a, rm-rf (of the copy), create and
# unlink (2,000 small files in 20 directories), and where the userland has git (a chroot
# into a view of the host's root): git-clone from the bundle in
# DIR, git-status-clean, git-status-dirty (100 files changed, 20 new). Only when named
# (not in "all"): cat-all (read every file), cat-all-p2 (the same, two cat at a time),
# cp-a-x2 (two copies at once), untar-x2 (two extractions at once).
#
# Around each step the guest writes CTL/mark.N ("start STEP", then "end STEP T0 T1 OPS")
# and waits for the host's CTL/ack.N: the host reads the daemon's CPU time and request
# counters then, while the guest is idle. T0 and T1 are the guest's /proc/uptime at the
# step's start and end; OPS are the FUSE requests the guest sent to DIR's connection
# during the step (tracepoint fuse:fuse_request_send, per opcode, "OP=N ..."), empty when
# DIR is no virtio-fs mount or the kernel lacks the tracepoint. Last mark: "done", or
# "fail WHY". Exit status: 0 if every step ran.
set -u
DIR=${1:?usage: tree-bench.sh DIR CTL [STEPS]}
CTL=${2:?usage: tree-bench.sh DIR CTL [STEPS]}
STEPS=${3:-all}
SMALL_DIRS=20
SMALL_PER=100
n=0

say() { echo "tree-bench: $*"; }
mark() {  # mark TEXT: CTL/mark.N (renamed into place, so the host reads it whole), then wait for CTL/ack.N
    n=$((n + 1))
    printf '%s\n' "$*" > "$CTL/.mark.$n" && mv "$CTL/.mark.$n" "$CTL/mark.$n" || { say "cannot write $CTL/mark.$n"; exit 1; }
    w=0
    while [ ! -e "$CTL/ack.$n" ]; do
        w=$((w + 1))
        if [ "$w" -gt 1200 ]; then say "no ack from the host for mark $n in 120 s; going on"; break; fi
        sleep 0.1
    done
}
fail() { say "error: $*"; mark "fail $*"; exit 1; }
now() { read -r t _ < /proc/uptime; echo "$t"; }

# Per-opcode request counts of DIR's FUSE connection, from a histogram trigger.
HIST=
CONN=
dev=$(stat -c %d "$DIR" 2>/dev/null || echo)
if [ -n "$dev" ] && [ "$(stat -f -c %T "$DIR" 2>/dev/null)" != tmpfs ]; then
    # st_dev in the user-space encoding -> the kernel's dev_t (major << 20 | minor), as
    # the tracepoint's "connection" field has it.
    CONN=$(( (((dev >> 8) & 0xfff) << 20) | (dev & 0xff) | ((dev >> 12) & 0xfff00) ))
    tr=/tmp/.tree-bench-tracefs
    mkdir -p "$tr"
    # A run before this one in the same boot (two shares in one guest) left tracefs mounted and
    # the histogram set: it counts every connection, so it serves this run too.
    ev=$tr/events/fuse/fuse_request_send
    if { [ -d "$ev" ] || mount -t tracefs nodev "$tr" 2>/dev/null; } && [ -d "$ev" ]; then
        if grep -q '^hist:keys=connection,opcode' "$ev/trigger" ||
            echo 'hist:keys=connection,opcode:size=2048' > "$ev/trigger"; then
            HIST=$ev/hist
        fi
    fi
    [ -n "$HIST" ] || say "no fuse:fuse_request_send histogram; the guest-side request counts stay empty"
fi
hist() {  # hist FILE: "opcode count" lines of connection CONN
    if [ -n "$HIST" ]; then
        # { connection:         44, opcode:          1 } hitcount:        123
        awk -v c="$CONN" '/^\{/ { gsub(/[{},:]/, " "); if ($2 == c) print $4, $6 }' "$HIST" > "$1"
    else
        : > "$1"
    fi
}
OPNAMES="1=LOOKUP 2=FORGET 3=GETATTR 4=SETATTR 5=READLINK 6=SYMLINK 8=MKNOD 9=MKDIR 10=UNLINK 11=RMDIR
12=RENAME 13=LINK 14=OPEN 15=READ 16=WRITE 17=STATFS 18=RELEASE 20=FSYNC 21=SETXATTR 22=GETXATTR
23=LISTXATTR 24=REMOVEXATTR 25=FLUSH 26=INIT 27=OPENDIR 28=READDIR 29=RELEASEDIR 30=FSYNCDIR 31=GETLK
32=SETLK 33=SETLKW 34=ACCESS 35=CREATE 36=INTERRUPT 37=BMAP 38=DESTROY 39=IOCTL 40=POLL 41=NOTIFY_REPLY
42=BATCH_FORGET 43=FALLOCATE 44=READDIRPLUS 45=RENAME2 46=LSEEK 47=COPY_FILE_RANGE 48=SETUPMAPPING
49=REMOVEMAPPING 50=SYNCFS 51=TMPFILE 52=STATX 53=COPY_FILE_RANGE_64"
opsdiff() {  # the per-opcode difference of two hist files, "NAME=N ..."
    awk -v names="$OPNAMES" 'BEGIN { k = split(names, a, /[ \n]+/); for (i = 1; i <= k; i++) { split(a[i], p, "="); nm[p[1]] = p[2] } }
        NR == FNR { b[$1] = $2; next }
        { d = $2 - b[$1]; if (d > 0) printf "%s=%d ", ($1 in nm) ? nm[$1] : "op" $1, d }' "$1" "$2"
}

chosen() {  # chosen STEP...: is one of them to be timed?
    [ "$STEPS" = all ] && return 0
    named "$@"
}
named() {  # named STEP...: is one of them in STEPS by name (the steps "all" leaves out)?
    for c in "$@"; do
        case ",$STEPS," in *",$c,"*) return 0 ;; esac
    done
    return 1
}
step() {  # step NAME COMMAND...: COMMAND timed between a start and an end mark
    name=$1
    shift
    if ! chosen "$name"; then
        "$@" || fail "step $name (untimed): exit status $?"
        return 0
    fi
    hist /tmp/.tree-bench.h0
    mark "start $name"
    t0=$(now)
    "$@"
    rc=$?
    t1=$(now)
    [ "$rc" = 0 ] || fail "step $name: exit status $rc"
    hist /tmp/.tree-bench.h1
    mark "end $name $t0 $t1 $(opsdiff /tmp/.tree-bench.h0 /tmp/.tree-bench.h1)"
    say "$name: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s"
}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mkfiles() {
    mkdir "$W/small" || return 1
    d=0
    while [ "$d" -lt "$SMALL_DIRS" ]; do
        mkdir "$W/small/d$d" || return 1
        i=0
        while [ "$i" -lt "$SMALL_PER" ]; do
            echo "small file $d/$i" > "$W/small/d$d/f$i" || return 1
            i=$((i + 1))
        done
        d=$((d + 1))
    done
}
rmfiles() {
    d=0
    while [ "$d" -lt "$SMALL_DIRS" ]; do
        rm -f "$W/small/d$d"/* && rmdir "$W/small/d$d" || return 1
        d=$((d + 1))
    done
    rmdir "$W/small"
}
lslr() { ls -lR "$W/src" > /dev/null; }
gstatus() { git -C "$W/repo" status --porcelain > /tmp/.tree-bench.status; }
findall() { find "$W/src" > /tmp/.tree-bench.find; }
# Steps only run when named (not in "all"): reading every file, alone and two at a time,
# and two copies or extractions at once (work a second request queue can take).
catall() { find "$W/src" -type f -exec cat {} + > /dev/null; }
catall_p2() {  # two readers, each on every other file (busybox xargs -P handed cat a directory)
    find "$W/src" -type f > /tmp/.tree-bench.files || return 1
    awk 'NR % 2' /tmp/.tree-bench.files | tr '\n' '\0' | xargs -0 cat > /dev/null & a=$!
    awk 'NR % 2 == 0' /tmp/.tree-bench.files | tr '\n' '\0' | xargs -0 cat > /dev/null; b=$?
    wait $a && [ "$b" = 0 ]
}
cp_twice() {
    cp -a "$W/src" "$W/copy1" & a=$!
    cp -a "$W/src" "$W/copy2"; b=$?
    wait $a && [ "$b" = 0 ] && rm -rf "$W/copy1" "$W/copy2"
}
untar_twice() {
    mkdir -p "$W/x1" "$W/x2" || return 1
    tar -xf /tmp/.tree-bench.tar -C "$W/x1" & a=$!
    tar -xf /tmp/.tree-bench.tar -C "$W/x2"; b=$?
    wait $a && [ "$b" = 0 ] && rm -rf "$W/x1" "$W/x2"
}

W=$DIR/tree-bench
rm -rf "$W"
mkdir -p "$W" || fail "cannot create $W"
cp "$CTL/src.tar" /tmp/.tree-bench.tar || fail "cannot copy $CTL/src.tar"
say "userland: $(tar --version 2>&1 | head -n 1)$(command -v git > /dev/null && echo ", $(git --version)")"

if chosen untar find ls-lR ls-lR-cold cp-a rm-rf; then
    step untar tar -xf /tmp/.tree-bench.tar -C "$W"
fi
if chosen find; then
    step find findall
    say "find: $(wc -l < /tmp/.tree-bench.find) entries"
fi
chosen ls-lR && step ls-lR lslr
if chosen ls-lR-cold; then
    drop_caches
    step ls-lR-cold lslr
fi
named cat-all && step cat-all catall
named cat-all-p2 && step cat-all-p2 catall_p2
chosen cp-a rm-rf && step cp-a cp -a "$W/src" "$W/copy"
chosen rm-rf && step rm-rf rm -rf "$W/copy"
named cp-a-x2 && step cp-a-x2 cp_twice
named untar-x2 && step untar-x2 untar_twice
chosen create unlink && step create mkfiles
chosen unlink && step unlink rmfiles

if ! chosen git-clone git-status-clean git-status-dirty; then
    :
elif command -v git > /dev/null && [ -f "$CTL/src.bundle" ]; then
    export HOME=/tmp/.tree-bench-home GIT_CONFIG_NOSYSTEM=1
    mkdir -p "$HOME"
    git config --global safe.directory '*'
    git config --global user.name vfsd-bench
    git config --global user.email vfsd-bench@example.invalid
    cp "$CTL/src.bundle" "$W/src.bundle" || fail "cannot copy the bundle"
    step git-clone git clone -q "$W/src.bundle" "$W/repo"
    # Settle the index (entries as new as the index itself are "racily clean" and would
    # be read again), so that the clean status is the same for every daemon.
    sleep 1
    git -C "$W/repo" status --porcelain > /dev/null || fail "git status"
    chosen git-status-clean && step git-status-clean gstatus
    git -C "$W/repo" ls-files | awk 'NR % 40 == 1' | head -n 100 > /tmp/.tree-bench.dirty
    while read -r f; do echo "a change" >> "$W/repo/$f"; done < /tmp/.tree-bench.dirty
    i=0
    while [ "$i" -lt 20 ]; do echo "new $i" > "$W/repo/new-file-$i"; i=$((i + 1)); done
    if chosen git-status-dirty; then
        step git-status-dirty gstatus
        say "git status: $(wc -l < /tmp/.tree-bench.status) changed or new entries"
    fi
else
    say "no git in this userland: the git steps are skipped"
fi

rm -rf "$W" /tmp/.tree-bench.tar /tmp/.tree-bench.find /tmp/.tree-bench.status /tmp/.tree-bench.files
mark done
say "done"
