#!/usr/bin/env bash
# A one-node Ceph cluster with a CephFS file system, mounted by two ceph-fuse clients
# that stand for two hosts sharing it (docs/distributed.md, "CephFS").
#
# Usage: scripts/ceph.sh up|down|status|env [--dir DIR] [--no-netns] [--keep-caches]
#   up      install Ceph if missing (apt), make the cluster under DIR if there is none
#           (one mon, one mgr, one MDS, one file-backed BlueStore OSD, file system
#           "vfsdfs" over two pools of size 1), start what is not running, mount
#           client A and client B, wait for HEALTH_OK.  Idempotent.
#   down    unmount the clients, stop the daemons, remove DIR's cluster.  Idempotent.
#   status  one line per part; exit 0 only if the cluster is healthy and both mounted.
#   env     print CEPH_A=... CEPH_B=... (the two client mounts) for eval.
#
# DIR (default /srv/vfsd-ceph; not under /tmp, which the xfstests guests hide) holds
# the config, keyrings, daemon data, logs, sockets and the mounts a/ and b/.
#
# Network: the daemons listen only on 169.254.44.1, one end of a veth pair whose other
# end (169.254.44.2) sits in the network namespace vfsd-ceph; client B's ceph-fuse runs
# in that namespace (nsenter --net, so its mount is in the host's mount namespace),
# reaching the monitor, MDS and OSD over the pair as a second host would.  Client A
# runs in the host's namespace.  --no-netns puts everything on 127.0.0.1 instead.
#
# Clients mount with fuse_disable_pagecache=true: the host kernel keeps no page cache of
# CephFS files, so what one host writes under a lock the next holder on the other host
# reads.  Without it a process holding an fd open across lock rounds (as vfsd does)
# reads its own stale page cache: a two-host counter under flock or fcntl ends at 301
# of 600.  --keep-caches leaves ceph-fuse's default (applies to mounts made by this up).
set -euo pipefail

DIR=/srv/vfsd-ceph
NETNS=1
NS=vfsd-ceph
DISABLE_PAGECACHE=true
say() { printf 'ceph: %s\n' "$*"; }
die() { printf 'ceph: error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

[ $# -gt 0 ] || usage 2
ACTION=$1; shift
while [ $# -gt 0 ]; do
    case $1 in
        --dir) DIR=${2:?--dir needs a directory}; shift 2 ;;
        --no-netns) NETNS=0; shift ;;
        --keep-caches) DISABLE_PAGECACHE=false; shift ;;
        -h|--help) usage ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
case $ACTION in up|down|status|env) ;; -h|--help) usage ;; *) die "unknown action '$ACTION'" ;; esac
case $DIR in /*) ;; *) die "--dir must be an absolute path" ;; esac

CONF=$DIR/ceph.conf
MNT_A=$DIR/a
MNT_B=$DIR/b
[ "$ACTION" = env ] && { printf 'CEPH_A=%q\nCEPH_B=%q\nCEPH_CONF=%q\n' "$MNT_A" "$MNT_B" "$CONF"; exit 0; }
[ "$(id -u)" = 0 ] || die "needs root (daemons, network namespace, FUSE mounts)"
mkdir -p "$DIR"
exec 9>"$DIR/.lock"   # one of us at a time
flock 9

# The netns choice is made once, at creation, and recorded in the config.
if [ -f "$CONF" ]; then grep -q '^# netns' "$CONF" && NETNS=1 || NETNS=0; fi
if [ "$NETNS" = 1 ]; then IP=169.254.44.1; else IP=127.0.0.1; fi

c() { timeout 30 ceph -c "$CONF" "$@"; }
running() { [ -f "$DIR/run/$1.pid" ] && kill -0 "$(cat "$DIR/run/$1.pid")" 2>/dev/null; }
is_mounted() { findmnt -n -t fuse.ceph-fuse --mountpoint "$1" >/dev/null 2>&1; }
answering() { timeout 10 stat -f "$1" >/dev/null 2>&1; }
health() { c health 2>/dev/null | head -1; }

netns_up() {
    [ "$NETNS" = 1 ] || return 0
    ip netns list | grep -qw "$NS" || ip netns add "$NS"
    if ! ip link show vfsdceph0 >/dev/null 2>&1; then
        ip link add vfsdceph0 type veth peer name vfsdceph1 netns "$NS"
        ip addr add $IP/30 dev vfsdceph0
        ip link set vfsdceph0 up
        ip -n "$NS" addr add 169.254.44.2/30 dev vfsdceph1
        ip -n "$NS" link set vfsdceph1 up
        ip -n "$NS" link set lo up
    fi
}

make_cluster() {
    say "making a cluster under $DIR"
    mkdir -p "$DIR"/{run,log,mon,osd/0,mds/a,mgr/x}
    local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
    cat > "$CONF" <<EOF
$([ "$NETNS" = 1 ] && echo "# netns $NS: client B reaches $IP over a veth pair")
[global]
fsid = $fsid
mon host = [v2:$IP:3300]
ms bind msgr1 = false
run dir = $DIR/run
admin socket = $DIR/run/\$name.\$pid.asok
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
mon data = $DIR/mon/\$id
osd data = $DIR/osd/\$id
mds data = $DIR/mds/\$id
mgr data = $DIR/mgr/\$id
# One OSD: pools of one copy, placement across OSDs rather than hosts, and no
# warnings about what a one-node cluster cannot have.
mon allow pool size one = true
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
mon warn on pool no redundancy = false
auth allow insecure global id reclaim = false
# The data disk is shared with other work: warn only when it is really short.
mon data avail warn = 5
mon data avail crit = 2
# Two cores and others' builds: small caches, fewer threads.
osd memory target = 1073741824
bluestore cache autotune = false
bluestore cache size = 268435456
osd op num shards = 1
osd op num threads per shard = 2
mds cache memory limit = 536870912
[mon]
public addr = $IP
[mgr]
public addr = $IP
[mds]
public addr = $IP
[osd]
public addr = $IP
osd objectstore = bluestore
bluestore block path = $DIR/osd/\$id/block.img
bluestore block create = true
bluestore block size = 32212254720
[client]
keyring = $DIR/admin.keyring
# Each ceph-fuse its own pid file (by pid), so A and B do not collide.
pid file = $DIR/run/\$name.\$pid.pid
EOF
    ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$DIR/admin.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
    ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/admin.keyring" >/dev/null
    monmaptool --create --addv a "[v2:$IP:3300]" --fsid "$fsid" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring" \
        2>"$DIR/log/mkfs.log" || die "ceph-mon --mkfs failed ($DIR/log/mkfs.log)"
    touch "$DIR/.made"
}

start_daemons() {
    running mon.a || { ceph-mon -c "$CONF" -i a 9>&- || die "ceph-mon did not start ($DIR/log/mon.a.log)"; }
    local i
    for i in $(seq 60); do c mon stat >/dev/null 2>&1 && break; sleep 1; done
    c mon stat >/dev/null 2>&1 || die "the monitor does not answer ($DIR/log/mon.a.log)"
    if [ ! -f "$DIR/mgr/x/keyring" ]; then
        c auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
            > "$DIR/mgr/x/keyring"
    fi
    running mgr.x || ceph-mgr -c "$CONF" -i x 9>&- || die "ceph-mgr did not start"
    if [ ! -f "$DIR/osd/0/keyring" ]; then
        local uuid; uuid=$(cat /proc/sys/kernel/random/uuid)
        [ "$(c osd new "$uuid")" = 0 ] || die "ceph osd new did not give osd.0"
        c auth get-or-create osd.0 osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
            > "$DIR/osd/0/keyring"
        ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >>"$DIR/log/mkfs.log" 2>&1 ||
            die "ceph-osd --mkfs failed ($DIR/log/mkfs.log)"
    fi
    running osd.0 || ceph-osd -c "$CONF" -i 0 9>&- 2>>"$DIR/log/osd.0.log" || die "ceph-osd did not start"
    if [ ! -f "$DIR/mds/a/keyring" ]; then
        c auth get-or-create mds.a mon 'profile mds' mgr 'profile mds' mds 'allow *' osd 'allow *' \
            > "$DIR/mds/a/keyring"
    fi
    running mds.a || ceph-mds -c "$CONF" -i a 9>&- >/dev/null || die "ceph-mds did not start"
    if ! c fs ls 2>/dev/null | grep -q 'name: vfsdfs'; then
        say "making file system vfsdfs (pools vfsdfs_meta, vfsdfs_data)"
        c osd pool create vfsdfs_meta 16 >/dev/null 2>&1
        c osd pool create vfsdfs_data 32 >/dev/null 2>&1
        c fs new vfsdfs vfsdfs_meta vfsdfs_data >/dev/null 2>&1 || die "ceph fs new failed"
    fi
}

wait_healthy() {
    local h= end=$((SECONDS + 240))
    while [ $SECONDS -lt $end ]; do
        h=$(health)
        [ "$h" = HEALTH_OK ] && c mds stat 2>/dev/null | grep -q 'up:active' && return 0
        sleep 1
    done
    die "not healthy after 240 s: $h $(c health detail 2>&1 | sed -n 2p | sed 's/^ *//'); mds: $(c mds stat 2>&1)"
}

mount_client() {  # mount_client DIR NAME [netns-prefix...]
    local m=$1 n=$2; shift 2
    if is_mounted "$m" && ! answering "$m"; then
        say "client $n: mounted but not answering; unmounting it"
        umount -l "$m" || die "could not unmount the dead client $m"
    fi
    is_mounted "$m" && return 0
    mkdir -p "$m"
    # fuse_default_permissions=false (the default): the client checks permissions
    # itself, with the caller's groups (fuse_set_user_groups) as the MDS sees them.
    "$@" ceph-fuse -c "$CONF" --id admin --fuse_disable_pagecache=$DISABLE_PAGECACHE "$m" \
        --log-file "$DIR/log/client.$n.log" 9>&- >/dev/null 2>"$DIR/log/client.$n.err" ||
        die "mounting client $n on $m failed ($DIR/log/client.$n.log)"
}

up() {
    if ! command -v ceph-mon >/dev/null || ! command -v ceph-fuse >/dev/null; then
        say "installing Ceph (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common >/dev/null ||
            die "apt-get install ceph failed"
    fi
    netns_up
    [ -f "$DIR/.made" ] || { [ -z "$(ls -A "$DIR" | grep -v '^\.lock$')" ] ||
        die "$DIR is not empty and holds no cluster of this script's; choose another --dir"; make_cluster; }
    start_daemons
    wait_healthy
    mount_client "$MNT_A" A
    if [ "$NETNS" = 1 ]; then mount_client "$MNT_B" B nsenter --net=/run/netns/$NS
    else mount_client "$MNT_B" B; fi
    say "up: client A $MNT_A, client B $MNT_B$([ "$NETNS" = 1 ] && echo " (in netns $NS)"), $(health)"
}

down() {
    local m p f
    for m in "$MNT_A" "$MNT_B"; do
        is_mounted "$m" && { umount "$m" 2>/dev/null || umount -l "$m" || say "could not unmount $m"; }
    done
    [ -d "$DIR/run" ] && for f in "$DIR"/run/*.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        case $(cat /proc/"$p"/comm 2>/dev/null) in ceph-*) kill "$p" ;; esac
    done
    for f in "$DIR"/run/*.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        case $(cat /proc/"$p"/comm 2>/dev/null) in ceph-*) kill -9 "$p" ;; esac
    done
    if ip link show vfsdceph0 >/dev/null 2>&1; then ip link del vfsdceph0; fi
    if ip netns list | grep -qw "$NS"; then ip netns del "$NS"; fi
    # Only a cluster this script made.
    if [ -f "$DIR/.made" ]; then
        rm -rf "${DIR:?}"/{run,log,mon,osd,mds,mgr,a,b} "$DIR"/*.keyring "$DIR/monmap" "$CONF" "$DIR/.made"
    fi
    say "down"
}

status() {
    local ok=0 d m
    for d in mon.a mgr.x osd.0 mds.a; do
        if running "$d"; then say "$d: running (pid $(cat "$DIR/run/$d.pid"))"; else say "$d: not running"; ok=1; fi
    done
    if [ -f "$CONF" ] && running mon.a; then say "health: $(health)"; [ "$(health)" = HEALTH_OK ] || ok=1
    else say "health: no monitor"; ok=1; fi
    for m in "$MNT_A" "$MNT_B"; do
        if ! is_mounted "$m"; then say "client $m: not mounted"; ok=1
        elif ! answering "$m"; then say "client $m: mounted but not answering"; ok=1
        else say "client $m: mounted"; fi
    done
    return $ok
}

case $ACTION in up) up ;; down) down ;; status) status ;; esac
