#!/bin/sh
# Scenarios "pmem" and "dma", run inside a guest with an emulated NVDIMM (scripts/vm --nvdimm).
#   pmem-check.sh first MARKER  fsdax namespace, ext4 -o dax, the server on a pool file there,
#                               [info: is_pmem], fio verify=crc32c, [metrics], FUA writes, then MARKER
#                               and a wait for the power cut (the host SIGKILLs QEMU)
#   pmem-check.sh second        a new boot on the same NVDIMM: the namespace is still fsdax, the
#                               filesystem mounts, the server restarts on the pool, FUA data reads back
# Environment (from scripts/vm-test):
#   SERVER=pmemblk|nbdkit   SERVER_ARGS="--set k=v ..." (pmemblk only)   METRICS_PORT=N (0: none)
#   INFO=0                  skip `pmemblk info` (a JVM start: about 9 s under emulation)
#   PMEMBLK_GUEST_CMD       how to run the product in the guest (the checkout is read-only here,
#                           so the prebuilt jar is run directly rather than through scripts/pmemblk)
# Lines starting with "RESULT " are read by the host.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
SERVER=${SERVER:-nbdkit}
SERVER_ARGS=${SERVER_ARGS:-}
METRICS_PORT=${METRICS_PORT:-0}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
MNT=/mnt/pm
POOL=$MNT/pool
SIZE=256M
SOCK=/tmp/nbd.sock
URI="nbd+unix:///pmem0?socket=$SOCK"

start_server() {
    rm -f "$SOCK"
    if [ "$SERVER" = pmemblk ]; then
        # shellcheck disable=SC2086 # SERVER_ARGS is a word list
        serve_start /tmp/server.log --set "pmem.path=$POOL" --set "pmem.size=$SIZE" --set "nbd.socket=$SOCK" \
            --set nbd.port=0 --set nbd.export=pmem0 --set "metrics.port=$METRICS_PORT" $SERVER_ARGS
        # 300 s: a JVM start took 100-165 s under TCG on a busy 2-core host
        serve_ready /tmp/server.log 300 || exit 1
    else
        [ -e "$POOL" ] || truncate -s "$SIZE" "$POOL"
        nbdkit -f -U "$SOCK" -e pmem0 file "$POOL" >/tmp/server.log 2>&1 &
        SERVER_PID=$!
        # nbdkit prints nothing when it serves: its socket is the sign.
        rc=0; wait_until "$SERVER_PID" 120 test -S "$SOCK" || rc=$?
        [ "$rc" = 0 ] || { say "nbdkit not serving $SOCK after 120 s or exited (wait $rc):"; cat /tmp/server.log; exit 1; }
    fi
    server_lines /tmp/server.log | sed 's/^/server| /'
}

stop_server() {
    serve_stop 30 || { cat /tmp/server.log; exit 1; }
}

case "${1:-}" in
first)
    MARKER=${2:?marker}
    say "booted"
    ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/tmp/ndctl.json
    grep -q '"mode":"fsdax"' /tmp/ndctl.json || { cat /tmp/ndctl.json; exit 1; }
    result mode fsdax
    say "namespace is fsdax"
    mkfs.ext4 -q -F -b 4096 /dev/pmem0
    mkdir -p "$MNT"
    mount -o dax /dev/pmem0 "$MNT"
    grep " $MNT " /proc/mounts | grep -q 'dax=always' || { grep " $MNT " /proc/mounts; say "not a DAX mount"; exit 1; }
    result dax always
    say "ext4 mounted -o dax"
    start_server
    if [ "$SERVER" = pmemblk ] && [ "${INFO:-1}" = 1 ]; then
        # shellcheck disable=SC2086 # the command and SERVER_ARGS are word lists
        $PMEMBLK_GUEST_CMD info --set "pmem.path=$POOL" --set "pmem.size=$SIZE" $SERVER_ARGS >/tmp/info.out 2>&1 \
            || { cat /tmp/info.out; exit 1; }
        cat /tmp/info.out
        result is_pmem "$(sed -n 's/^is_pmem=//p' /tmp/info.out | head -n 1)"
        say "info done"
    fi
    # Mixed sizes so both copy routes run; write, then read back and check every block's crc32c.
    if ! fio --name=verify --ioengine=nbd --uri="$URI" --rw=randwrite --bssplit=4k/50:64k/20:1m/30 \
            --size=64M --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
            --output=/tmp/fio.out >/dev/null 2>&1; then
        cat /tmp/fio.out; say "fio failed"; exit 1
    fi
    grep -E '^ *(READ|WRITE):' /tmp/fio.out || true
    grep -q 'err= 0' /tmp/fio.out || { cat /tmp/fio.out; exit 1; }
    result fio ok
    say "fio done"
    if [ "$METRICS_PORT" != 0 ]; then
        scrape "$METRICS_PORT" /tmp/metrics.txt || { say "metrics not served on port $METRICS_PORT"; exit 1; }
        grep '^pmemblk_copy_bytes_total' /tmp/metrics.txt || true
        result dma_bytes "$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="dma"')"
        result cpu_bytes "$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="cpu"')"
    fi
    # Ends with MARKER and keeps the connection open: the power is cut with nothing flushed after.
    exec python3 "$HERE/fua.py" write "$URI" "$MARKER"
    ;;
second)
    ndctl list -N >/tmp/ndctl.json
    grep -q '"mode":"fsdax"' /tmp/ndctl.json || { cat /tmp/ndctl.json; say "namespace lost its fsdax mode"; exit 1; }
    mkdir -p "$MNT"
    mount -o dax /dev/pmem0 "$MNT"
    result remount ok
    start_server
    rc=0
    python3 "$HERE/fua.py" verify "$URI" || rc=$?
    stop_server
    server_lines /tmp/server.log | sed 's/^/server| /'
    umount "$MNT"
    exit $rc
    ;;
*)
    echo "usage: pmem-check.sh first MARKER | second" >&2
    exit 2
    ;;
esac
