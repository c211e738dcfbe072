#!/bin/sh
# Idmapped bind mounts of virtio-fs shares (FUSE_ALLOW_IDMAP), each compared with the same
# steps on an idmapped mount of the guest's own tmpfs: what users of the mapped range
# create, append to, chown and chmod there, and what the plain mount shows of it.
# The idmapping: ids 0-999 as they are, 1000 on the share shows as 2000 on the mount.
# Usage: idmap.sh DIR...   (each a share's mount point; the work goes in DIR/t)
MAP="0 0 1000,1000 2000 1"

# steps BASE MNT: the operations, then what they left, as lines to compare.
steps() {
    b=$1 m=$2
    mkdir -p "$b/t" "$m" && chmod 777 "$b/t" || return 1
    vfsd-idmap mount "$b/t" "$m" "$MAP" || { echo "mount failed"; return 1; }
    vfsd-idmap as 2000:2000 sh -c "echo data > $m/user && mkdir $m/userdir && ln -s user $m/userlink && chmod 6755 $m/user"
    echo "user creates: $?"
    # A non-root owner's append drops the set-id bits.
    vfsd-idmap as 2000:2000 sh -c "echo more >> $m/user"
    echo "user appends: $?"
    echo "user reads: $(vfsd-idmap as 2000:2000 cat "$m/user" | tr '\n' ' ')"
    echo root > "$m/root" && chown 2000:2000 "$m/root"
    echo "root creates and chowns to 2000: $?"
    vfsd-idmap as 2000:2000 sh -c "echo x >> $m/root"
    echo "user appends to the chowned file: $?"
    vfsd-idmap as 4000:4000 touch "$m/unmapped" 2>/dev/null
    echo "unmapped user creates: $?"
    : > "$b/t/plain" && chown 1000:1000 "$b/t/plain"
    vfsd-idmap as 2000:2000 chmod 600 "$m/plain"
    echo "user chmods a file the plain mount gave to 1000: $?"
    for f in user userdir userlink root plain unmapped; do
        echo "plain $f: $(stat -c '%u:%g %a' "$b/t/$f" 2>&1 | sed 's/.*No such.*/absent/')"
        echo "mapped $f: $(stat -c '%u:%g %a' "$m/$f" 2>&1 | sed 's/.*No such.*/absent/')"
    done
    umount "$m"
}

mkdir -p /tmp/ref && mount -t tmpfs tmpfs /tmp/ref || exit 1
ref=$(steps /tmp/ref /tmp/ref-mapped)
echo "$ref" | sed 's/^/idmap: tmpfs: /'
fail=0 n=0
for d in "$@"; do
    n=$((n + 1))
    out=$(steps "$d" "/tmp/mapped$n")
    echo "$out" | sed "s|^|idmap: $d: |"
    if [ "$out" = "$ref" ]; then
        echo "idmap: $d: as on tmpfs"
    else
        echo "idmap: $d: FAIL, differs from tmpfs:"
        echo "$ref" > /tmp/ref.txt
        echo "$out" > /tmp/out.txt
        diff /tmp/ref.txt /tmp/out.txt | sed 's/^/idmap:   /'
        fail=$((fail + 1))
    fi
done
echo "idmap: $((n - fail)) of $n shares as on tmpfs"
[ "$fail" = 0 ]
