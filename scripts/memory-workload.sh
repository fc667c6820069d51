#!/bin/bash
# The daemon's memory under a bounded mixed workload (docs/MEMORY.md):
# 8 writers, 4 readers, 2 renamers and 2 rewriters, each a fixed number
# of rounds, then `birch sync` and drop_caches, then an idle spell. Prints
# the daemon's RSS (VmRSS) at each step and its memory figures from
# `birch stats --json`. As root (drop_caches).
#
#   scripts/memory-workload.sh [ROUNDS] [-o OPTIONS]
#
# ROUNDS (default 200) scales every loop; OPTIONS go to `birch mount -o`
# (e.g. memory_idle=0 to never give memory back, node_cache=64M).
set -euo pipefail
rounds=${1:-200}
shift || true
options=()
if [ "${1:-}" = "-o" ]; then
    options=(-o "$2")
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
birch=${BIRCH:-$repo/target/release/birch}
work=$(mktemp -d /tmp/birch-memory.XXXXXX)
mnt=$work/mnt
mkdir "$mnt"
"$birch" mkfs "$work/image" --size 4G >/dev/null
"$birch" mount -f "$work/image" "$mnt" "${options[@]}" 2>"$work/daemon.log" &
daemon=$!
cleanup() {
    umount "$mnt" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do
    grep -q " $mnt " /proc/mounts && break
    sleep 0.1
done
rss() { awk '/VmRSS/ { printf "%.1f MiB", $2 / 1024 }' "/proc/$daemon/status"; }
memory() {
    "$birch" stats --json "$mnt" | tr -d ' ,"' | grep '^memory_' | tr '\n' ' '
    echo
}
echo "mounted:          RSS $(rss)"

for d in w0 w1 w2 w3 w4 w5 w6 w7 ra rb; do mkdir "$mnt/$d"; done
writer() { # files of 4 KiB to 1 MiB, every 4th fsynced, the oldest removed
    local dir=$mnt/w$1
    for i in $(seq "$rounds"); do
        local kib=$(( (i * 37 + $1 * 11) % 256 * 4 + 4 ))
        if (( i % 4 == 0 )); then
            dd if=/dev/zero of="$dir/f$i" bs=1K count="$kib" conv=fsync status=none
        else
            head -c "${kib}K" /dev/urandom >"$dir/f$i"
        fi
        (( i > 40 )) && rm -f "$dir/f$(( i - 40 ))"
    done
}
reader() {
    for _ in $(seq $(( rounds / 4 ))); do
        find "$mnt" -type f -print0 2>/dev/null | xargs -0 cat >/dev/null 2>&1 || true
    done
}
renamer() { # 200 small files moved back and forth between two dirs
    local name=r$1
    for i in $(seq 200); do echo "$i" >"$mnt/ra/$name-$i"; done
    for _ in $(seq $(( rounds / 2 ))); do
        for i in $(seq 200); do mv "$mnt/ra/$name-$i" "$mnt/rb/$name-$i"; done
        for i in $(seq 200); do mv "$mnt/rb/$name-$i" "$mnt/ra/$name-$i"; done
    done
}
rewriter() { # 4 KiB overwrites inside a 64 MiB file
    local f=$mnt/rewrite$1
    head -c 64M /dev/zero >"$f"
    for i in $(seq $(( rounds * 20 ))); do
        dd if=/dev/urandom of="$f" bs=4K count=1 seek=$(( (i * 7919) % 16384 )) \
            conv=notrunc status=none
    done
}
start=$(date +%s)
peak=0
pids=()
for n in 0 1 2 3 4 5 6 7; do writer $n & pids+=($!); done
for n in 0 1 2 3; do reader & pids+=($!); done
for n in 0 1; do renamer $n & pids+=($!); done
for n in 0 1; do rewriter $n & pids+=($!); done
while kill -0 "${pids[@]}" 2>/dev/null; do
    kib=$(awk '/VmRSS/ { print $2 }' "/proc/$daemon/status")
    (( kib > peak )) && peak=$kib
    sleep 1
done
wait "${pids[@]}" 2>/dev/null || true
echo "workload:         $(( $(date +%s) - start )) s, peak RSS $(( peak / 1024 )) MiB"
echo "after workload:   RSS $(rss)"
echo "  $(memory)"
"$birch" sync "$mnt"
sync
echo 3 >/proc/sys/vm/drop_caches
sleep 1
echo "sync+drop_caches: RSS $(rss)"
echo "  $(memory)"
sleep 15
echo "idle 15 s:        RSS $(rss)"
echo "  $(memory)"
