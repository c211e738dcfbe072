#!/usr/bin/env bash
# A GlusterFS volume on loopback, mounted by two independent FUSE clients that
# stand for two hosts sharing one distributed file system.
#
# Usage: scripts/gluster.sh up|down|status|env [options]
#   up       install GlusterFS if missing (apt), start glusterd (pid file under
#            the state directory), create and start a replica-2 volume with both
#            bricks on this machine, set the options below, mount client A and
#            client B.  Idempotent: what is already up is left as it is.
#   down     unmount the clients, stop and delete the volume, stop glusterd if
#            this script started it, remove the bricks.  Idempotent.
#   status   what is up, one line each; exit 0 only if both clients are mounted.
#   env      print GLUSTER_A=... GLUSTER_B=... (the two client mounts) for eval.
#
# Options:
#   --dir DIR       where bricks, mounts and state live (default /srv/vfsd-gluster;
#                   not under /tmp, which the xfstests guests hide)
#   --volume NAME   volume name (default vfsdvol)
#   --set K=V       an extra volume option (repeatable; applied on every 'up')
#
# Volume options set on every 'up' (docs/distributed.md says why):
#   performance.strict-o-direct=on  an O_DIRECT write goes to the bricks as one:
#       without it, write-behind acknowledges an unaligned O_DIRECT write and
#       loses it at close (close fails with EINVAL).
#   performance.write-behind, quick-read, stat-prefetch, open-behind, io-cache,
#   read-ahead = off  no client-side copy of data or attributes: what one host
#       writes under a lock, the next lock holder on another host reads.
# Client mounts: direct-io-mode=enable, attribute-, entry- and negative-timeout=0:
#   the host kernel keeps no page cache or attributes of the volume either
#   (without them the two-host lock counters lose increments: the second host
#   reads the counter from its own page cache).
# --keep-caches leaves GlusterFS's own defaults (for comparison).
#
# Only loopback: the bricks are named by this machine's host name, which must
# resolve to a loopback address (the Gluster CLI refuses "localhost" and
# 127.0.0.1 as brick hosts), and the clients mount localhost:/VOLUME.
#
# Only what it made: 'up' refuses a volume of that name it did not create (it
# records the volume id under DIR/state), and 'down' deletes only a volume, bricks
# and a glusterd it recorded as its own.  On a host with systemd, installing the
# package may start glusterd.service; this script then uses that glusterd and
# leaves it running.
set -euo pipefail

DIR=/srv/vfsd-gluster
VOL=vfsdvol
EXTRA_SET=()
KEEP_CACHES=0

say() { printf 'gluster: %s\n' "$*"; }
die() { printf 'gluster: error: %s\n' "$*" >&2; exit 2; }

[ $# -gt 0 ] || die "usage: scripts/gluster.sh up|down|status|env [--dir DIR] [--volume NAME] [--set K=V]"
ACTION=$1; shift
while [ $# -gt 0 ]; do
    case $1 in
        --dir) DIR=${2:?--dir needs a directory}; shift 2 ;;
        --volume) VOL=${2:?--volume needs a name}; shift 2 ;;
        --set) EXTRA_SET+=("${2:?--set needs KEY=VALUE}"); shift 2 ;;
        --keep-caches) KEEP_CACHES=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (try --help)" ;;
    esac
done
case $ACTION in up|down|status|env) ;; -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown action '$ACTION': up, down, status or env" ;; esac
[[ $VOL =~ ^[A-Za-z0-9_-]{1,64}$ ]] || die "--volume: letters, digits, '_' and '-' only"
case $DIR in /*) ;; *) die "--dir must be an absolute path" ;; esac
for kv in "${EXTRA_SET[@]}"; do [[ $kv == ?*=?* ]] || die "--set wants KEY=VALUE, got '$kv'"; done

STATE=$DIR/state
BRICKS=$DIR/bricks
MNT_A=$DIR/a
MNT_B=$DIR/b
PIDFILE=$STATE/glusterd.pid

[ "$ACTION" = env ] && { printf 'GLUSTER_A=%q\nGLUSTER_B=%q\nGLUSTER_VOLUME=%q\n' "$MNT_A" "$MNT_B" "$VOL"; exit 0; }
[ "$(id -u)" = 0 ] || die "needs root (glusterd, bricks, FUSE mounts)"
OWNED=$STATE/volume       # "NAME ID" of the volume this script created
MARK=.vfsd-gluster        # in brick directories this script made
mkdir -p "$STATE"
# One of us at a time (two 'up's would both make bricks; a 'down' would pull the mounts).
exec 9>"$STATE/lock"
flock 9

is_mounted() { findmnt -n -t fuse.glusterfs --mountpoint "$1" >/dev/null 2>&1; }
glusterd_pid() {  # the running glusterd's pid, or nothing
    local p
    for p in $(pgrep -x glusterd); do
        # A zombie (an earlier glusterd whose parent has not reaped it) does not count.
        [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" = Z ] || { echo "$p"; return; }
    done
}
vol_exists() { gluster --mode=script volume info "$VOL" >/dev/null 2>&1; }
vol_id() { gluster --mode=script volume info "$VOL" 2>/dev/null | sed -n 's/^Volume ID: //p'; }
vol_ours() { [ -f "$OWNED" ] && [ "$(cat "$OWNED")" = "$VOL $(vol_id)" ]; }
vol_started() { gluster --mode=script volume info "$VOL" 2>/dev/null | grep -q '^Status: Started'; }

status() {
    local ok=0 p
    p=$(glusterd_pid)
    if [ -n "$p" ]; then
        say "glusterd: running (pid $p$([ -f "$PIDFILE" ] && [ "$(cat "$PIDFILE")" = "$p" ] && echo ', started by this script'))"
    else
        say "glusterd: not running"; ok=1
    fi
    if [ -n "$p" ] && vol_exists; then
        say "volume $VOL: $(gluster --mode=script volume info "$VOL" | sed -n 's/^Status: //p'), $(gluster --mode=script volume info "$VOL" | sed -n 's/^Type: //p')"
    else
        say "volume $VOL: absent"; ok=1
    fi
    for m in "$MNT_A" "$MNT_B"; do
        if ! is_mounted "$m"; then say "client $m: not mounted"; ok=1
        elif ! stat "$m" >/dev/null 2>&1; then say "client $m: mounted but not answering (scripts/gluster.sh up remounts it)"; ok=1
        else say "client $m: mounted"; fi
    done
    return $ok
}

up() {
    if ! command -v glusterd >/dev/null || ! command -v glusterfs >/dev/null; then
        say "installing glusterfs-server, glusterfs-client, attr (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            glusterfs-server glusterfs-client attr >/dev/null ||
            die "apt-get install glusterfs-server glusterfs-client failed (see above)"
    fi
    local host addr
    host=$(hostname)
    addr=$(getent hosts "$host" | awk '{print $1; exit}')
    case $addr in
        127.*|::1) ;;
        "") die "host name '$host' does not resolve; add '127.0.1.1 $host' to /etc/hosts" ;;
        *) die "host name '$host' resolves to $addr, not loopback; this script keeps Gluster on loopback (add '127.0.1.1 $host' to /etc/hosts)" ;;
    esac
    # A client whose glusterfs process died (a reboot of glusterd, a killed client)
    # leaves its mount behind, answering ENOTCONN: unmount it so it is mounted afresh.
    for m in "$MNT_A" "$MNT_B"; do
        if is_mounted "$m" && ! stat "$m" >/dev/null 2>&1; then
            say "client $m: mounted but not answering (its client process is gone); unmounting it"
            umount -l "$m" || die "could not unmount the dead client mount $m"
        fi
    done
    mkdir -p "$STATE" "$BRICKS" "$MNT_A" "$MNT_B"
    if [ -z "$(glusterd_pid)" ]; then
        say "starting glusterd (pid file $PIDFILE, log $STATE/glusterd.log)"
        # 9>&-: the daemons must not inherit the lock's fd, or it is never released.
        glusterd -p "$PIDFILE" --log-file="$STATE/glusterd.log" 9>&- || die "glusterd did not start (log: $STATE/glusterd.log)"
        for _ in $(seq 1 50); do gluster --mode=script volume list >/dev/null 2>&1 && break; sleep 0.2; done
        gluster --mode=script volume list >/dev/null 2>&1 || die "glusterd does not answer (log: $STATE/glusterd.log)"
    fi
    if ! vol_exists; then
        say "creating volume $VOL: replica 2, bricks $host:$BRICKS/b1 and $host:$BRICKS/b2"
        # A brick directory left by an earlier volume of ours carries that volume's id:
        # start clean, but never touch a directory this script did not make.
        for b in "$BRICKS/b1" "$BRICKS/b2"; do
            if [ -e "$b" ]; then
                [ -e "$b/$MARK" ] || [ -e "$BRICKS/$MARK.${b##*/}" ] ||
                    die "$b exists and was not made by this script; choose another --dir"
                rm -rf "$b"
            fi
            : > "$BRICKS/$MARK.${b##*/}"
        done
        gluster --mode=script volume create "$VOL" replica 2 \
            "$host:$BRICKS/b1" "$host:$BRICKS/b2" force >/dev/null || die "volume create failed"
        echo "$VOL $(vol_id)" > "$OWNED"
    fi
    vol_ours || die "volume $VOL exists but was not created by this script (in $DIR); choose another --volume"
    local kv opts=() mopts=
    if [ "$KEEP_CACHES" = 0 ]; then
        opts=(performance.write-behind=off performance.quick-read=off performance.stat-prefetch=off
              performance.open-behind=off performance.io-cache=off performance.read-ahead=off)
        mopts=-odirect-io-mode=enable,attribute-timeout=0,entry-timeout=0,negative-timeout=0
    fi
    for kv in performance.strict-o-direct=on "${opts[@]}" "${EXTRA_SET[@]}"; do
        gluster --mode=script volume set "$VOL" "${kv%%=*}" "${kv#*=}" >/dev/null || die "volume set $kv failed"
    done
    if ! vol_started; then
        say "starting volume $VOL"
        gluster --mode=script volume start "$VOL" >/dev/null 9>&- || die "volume start failed"
    fi
    for m in "$MNT_A" "$MNT_B"; do
        if ! is_mounted "$m"; then
            # Each mount is its own glusterfs client process: its own caches, its own
            # FUSE connection, like a second host.
            mount -t glusterfs $mopts "localhost:/$VOL" "$m" 9>&- || die "mounting client $m failed (log: /var/log/glusterfs/)"
        fi
    done
    say "up: client A $MNT_A, client B $MNT_B (volume $VOL)"
}

down() {
    local m
    for m in "$MNT_A" "$MNT_B"; do
        if is_mounted "$m"; then
            umount "$m" 2>/dev/null || umount -l "$m" || say "could not unmount $m"
        fi
    done
    local gone=1
    if [ -n "$(glusterd_pid)" ] && vol_exists; then
        if vol_ours; then
            vol_started && { gluster --mode=script volume stop "$VOL" force >/dev/null || say "volume stop failed"; }
            gluster --mode=script volume delete "$VOL" >/dev/null || { say "volume delete failed"; gone=0; }
        else
            say "volume $VOL was not created by this script: left alone"; gone=0
        fi
    fi
    [ "$gone" = 1 ] && rm -f "$OWNED"
    if [ -f "$PIDFILE" ]; then
        local p f
        p=$(cat "$PIDFILE")
        if [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = glusterd ]; then
            kill "$p"
            for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$p" 2>/dev/null && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = glusterd ] && kill -9 "$p"
        fi
        rm -f "$PIDFILE"
        # glusterd leaves its volume's brick processes and self-heal daemon running.
        for f in /var/run/gluster/vols/"$VOL"/*.pid /var/run/gluster/shd/"$VOL"/*.pid; do
            [ -f "$f" ] || continue
            p=$(cat "$f")
            case $(cat /proc/"$p"/comm 2>/dev/null) in glusterfs|glusterfsd) kill "$p" ;; esac
        done
    fi
    # Bricks only if this script made them and the volume is gone.
    if [ "$gone" = 1 ]; then
        for b in b1 b2; do
            [ -e "$BRICKS/$MARK.$b" ] && rm -rf "${BRICKS:?}/$b" "$BRICKS/$MARK.$b"
        done
        rmdir "$BRICKS" 2>/dev/null || true
    fi
    say "down"
}

case $ACTION in
    up) up ;;
    down) down ;;
    status) status ;;
esac
