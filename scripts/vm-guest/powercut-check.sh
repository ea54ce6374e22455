#!/bin/sh
# Scenario "powercut", run inside a guest whose /dev/vda is a virtio disk backed by a host file
# (scripts/vm --disk). The server runs on ext4 WITHOUT DAX: what it never msync'ed lives only in this
# guest's page cache, which dies when the host kills QEMU (the host file keeps what reached the disk).
#   powercut-check.sh cut K MARKER_AT MARKER SEED   [dump region K-1 first when K > 0], then load region K
#                                                   with powercut.py and print MARKER after MARKER_AT writes:
#                                                   the host kills QEMU when it sees it, mid-load
#   powercut-check.sh restart K MARKER SEED         [dump region K-1 first when K > 0], then the restart case on
#                                                   region K: plain writes (no FUA, no FLUSH), kill -9 of the
#                                                   server, a new server, one FLUSH acknowledged, MARKER: the host
#                                                   cuts the power; the FLUSH promised every write the killed
#                                                   server acknowledged
#   powercut-check.sh dump K                        read region K back (after the last cut) and stop cleanly
# The server keeps the dirty bitmap "b" (4 KiB granularity) beside the pool: each load checkpoints it once its region is
# zeroed, and each read-back lists its dirty blocks, which powercut-verify.py checks against the writes.
# Region K is K mod 8 (2048 blocks of 4 KiB each; the 64 MiB pool holds eight); each load zeroes its region first. Lines "W/A/F ..." and "B/T ..." are read by
# scripts/vm-guest/powercut-verify.py on the host.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
MNT=/mnt/d
SOCK=/tmp/nbd.sock
URI="nbd+unix:///pmem0?socket=$SOCK"
BLOCKS=2048

mkdir -p "$MNT"
if ! blkid /dev/vda >/dev/null 2>&1; then
    say "mkfs.ext4 on /dev/vda"
    mkfs.ext4 -q -F /dev/vda
fi
mount -t ext4 /dev/vda "$MNT"   # journal replay after a cut; no dax: the page cache is in play
grep " $MNT " /proc/mounts | grep -q dax && { say "unexpected dax mount"; exit 1; }

# pool_server LOG: serve on the pool (lib.sh start_server), with the dirty bitmap "b" at the writes' 4 KiB granularity
# (docs/bitmaps.md): each load checkpoints it once its region is zeroed, and the read-back checks it; sets SERVER_PID.
export PMEMBLK_BITMAP_CTL="$MNT/pool.bitmaps/control.sock"
pool_server() {
    start_server "$1" --set "pmem.path=$MNT/pool" --set pmem.size=64M --set bitmap.dir=auto --set bitmap.names=b \
        --set bitmap.granularity=4K
    say "server ready: $(grep -m1 'PmemRegion' "$1" || true)"
}
pool_server /tmp/server.log

case "$1" in
    cut)
        k=$2
        if [ "$k" -gt 0 ]; then
            say "read-back of cut $((k - 1)) (region $(( (k - 1) % 8 )))"
            /usr/bin/python3 "$HERE/powercut.py" dump "$URI" $(( (k - 1) % 8 * BLOCKS )) "$BLOCKS"
        fi
        say "load $k on region $((k % 8)): the power goes after write $3"
        /usr/bin/python3 "$HERE/powercut.py" write "$URI" $((k % 8 * BLOCKS)) "$BLOCKS" "$3" 100000 "$4" "$5"
        ;;
    restart)
        k=$2
        if [ "$k" -gt 0 ]; then
            say "read-back of cut $((k - 1)) (region $(( (k - 1) % 8 )))"
            /usr/bin/python3 "$HERE/powercut.py" dump "$URI" $(( (k - 1) % 8 * BLOCKS )) "$BLOCKS"
        fi
        # The kernel must not write the pages back on its own while the server restarts (its flusher writes
        # what has been dirty for 30 s, and a JVM start under emulation can take that long): only the new
        # server's FLUSH (or its start) may make them durable, or the case proves nothing.
        echo 0 >/proc/sys/vm/dirty_writeback_centisecs && echo 360000 >/proc/sys/vm/dirty_expire_centisecs
        n=1000
        say "restart case on region $((k % 8)): $n plain writes, kill -9, a new server, one FLUSH, then the power goes"
        /usr/bin/python3 "$HERE/powercut.py" plain "$URI" $((k % 8 * BLOCKS)) "$BLOCKS" "$n" "$4"
        kill -KILL "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null || true
        say "server killed; $(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
        pool_server /tmp/server-2.log
        say "after the new server's start: $(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
        /usr/bin/python3 "$HERE/powercut.py" flush "$URI" "$n" "$3"
        ;;
    dump)
        say "read-back of cut $2 (region $(($2 % 8)))"
        /usr/bin/python3 "$HERE/powercut.py" dump "$URI" $(($2 % 8 * BLOCKS)) "$BLOCKS"
        serve_stop 60 || true
        umount "$MNT"
        ;;
    *) echo "usage: powercut-check.sh cut K MARKER_AT MARKER SEED | restart K MARKER SEED | dump K"; exit 2 ;;
esac
