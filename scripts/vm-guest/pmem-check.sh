#!/bin/sh
# Scenarios "pmem", "dma" and "btt", run by scripts/vm-test inside ONE pair of guests with an emulated NVDIMM
# (scripts/vm --nvdimm): each scenario (NAME) has its own server on its own pool file, $MNT/pool-NAME, on the same
# ext4 -o dax, and the same power cut ends all of them.
#   pmem-check.sh first MARKER NAME...  fsdax namespace, ext4 -o dax; every NAME's server started; for each: ready,
#                               is_pmem (the server's own region line), fio verify=crc32c, [metrics]; then FUA writes
#                               through every server (interleaved, fua.py), MARKER right after the last is acknowledged,
#                               and a wait for the power cut (the host SIGKILLs QEMU), every connection still open
#   pmem-check.sh second NAME...        a new boot on the same NVDIMM: the namespace is still fsdax, the filesystem
#                               mounts, every NAME's server restarts on its pool and its FUA data reads back
# A NAME that fails is reported ("RESULT NAME.why=...") and stopped, and the others go on; the first boot prints
# MARKER when at least one got through, and exits 1 without it when none did. Other lines starting with "RESULT "
# are "RESULT NAME.KEY=VALUE", read by the host.
# Environment (from scripts/vm-test):
#   SERVER=pmemblk|nbdkit   ARGS_NAME="--set k=v ..." (pmemblk only)   PORT_NAME=N the metrics port (0: none)
#   PMEM_TOGETHER=1         start the servers all at once (default; 0: each after the one before is ready)
#   PMEMBLK_GUEST_CMD       how to run the product in the guest (the checkout is read-only here,
#                           so the prebuilt jar is run directly rather than through scripts/pmemblk)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SERVER=${SERVER:-nbdkit}
TOGETHER=${PMEM_TOGETHER:-1}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
MNT=/mnt/pm
SIZE=256M
# A JVM start took 100-165 s under TCG on a busy 2-core host; servers started together share vCPU 0 (guest-java.sh).
READY_ONE=300

sock() { echo "/tmp/nbd-$1.sock"; }
uri() { echo "nbd+unix:///pmem0?socket=/tmp/nbd-$1.sock"; }
args() { eval "echo \"\${ARGS_$1:-}\""; }
port() { eval "echo \"\${PORT_$1:-0}\""; }
pid() { eval "echo \"\${PID_$1:-}\""; }

FAILED=''
failed() { case " $FAILED " in *" $1 "*) return 0 ;; esac; return 1; }
# fail NAME REASON: NAME's reason for the host; its server is ended (the others go on without it).
fail() {
    echo "RESULT $1.why=$2"
    say "$1: FAIL: $2"
    FAILED="$FAILED $1"
    [ -z "$(pid "$1")" ] || kill -KILL "$(pid "$1")" 2>/dev/null || true
}

# start NAME: NAME's server in the background on its pool (PID_NAME, T0_NAME).
start() {
    rm -f "$(sock "$1")"
    if [ "$SERVER" = pmemblk ]; then
        # shellcheck disable=SC2046 # ARGS_NAME is a word list
        serve_start "/tmp/server-$1.log" --set "pmem.path=$MNT/pool-$1" --set "pmem.size=$SIZE" \
            --set "nbd.socket=$(sock "$1")" --set nbd.port=0 --set nbd.export=pmem0 --set "metrics.port=$(port "$1")" \
            $(args "$1")
    else
        [ -e "$MNT/pool-$1" ] || truncate -s "$SIZE" "$MNT/pool-$1"
        nbdkit -f -U "$(sock "$1")" -e pmem0 file "$MNT/pool-$1" >"/tmp/server-$1.log" 2>&1 &
        SERVER_PID=$!
    fi
    eval "PID_$1=$SERVER_PID T0_$1=$(now)"
}

# ready NAME SECONDS: NAME's server serves (pmemblk: its ready line; nbdkit, which prints nothing: its socket);
# fails NAME when it exits or the bound passes first.
ready() {
    _log=/tmp/server-$1.log _rc=0
    if [ "$SERVER" = pmemblk ]; then wait_until "$(pid "$1")" "$2" grep -s -q '^ready:' "$_log" || _rc=$?
    else wait_until "$(pid "$1")" "$2" test -S "$(sock "$1")" || _rc=$?; fi
    case $_rc in
        0) eval "say \"$1: server ready after \$(( \$(now) - T0_$1 )) s\""
           server_lines "$_log" | sed "s/^/server $1| /"
           return 0 ;;
        1) sed "s/^/server $1| /" "$_log"; fail "$1" "server exited before it was ready: $(server_lines "$_log" | tail -n 1)" ;;
        *) sed "s/^/server $1| /" "$_log"; fail "$1" "server not ready in $2 s" ;;
    esac
    return 1
}

# start_all NAME...: every server, all at once (PMEM_TOGETHER=1) or each once the one before is ready; then each
# waited for. Leaves READY, the names that serve.
start_all() {
    READY=''
    if [ "$TOGETHER" = 1 ]; then
        for n in "$@"; do start "$n"; done
        for n in "$@"; do ready "$n" $((READY_ONE * $#)) && READY="$READY $n"; done
    else
        for n in "$@"; do start "$n"; ready "$n" "$READY_ONE" && READY="$READY $n"; done
    fi
}

# first_one NAME: is_pmem, fio verify and the metrics of NAME's server (ready).
first_one() {
    RESULT_PREFIX="$1."
    if [ "$SERVER" = pmemblk ]; then
        # serve names its mapping when it starts: "pmemblk: PmemRegion[PATH, N bytes, is_pmem=B, mapped by M]..."
        result is_pmem "$(sed -n 's/^pmemblk: PmemRegion\[.*, is_pmem=\([a-z]*\),.*/\1/p' "/tmp/server-$1.log" | head -n 1)"
    fi
    # Mixed sizes so both copy routes run; write, then read back and check every block's crc32c.
    if ! fio --name="verify-$1" --ioengine=nbd --uri="$(uri "$1")" --rw=randwrite --bssplit=4k/50:64k/20:1m/30 \
            --size=64M --iodepth=8 --verify=crc32c --verify_fatal=1 --do_verify=1 \
            --output="/tmp/fio-$1.out" >/dev/null 2>&1; then
        cat "/tmp/fio-$1.out"; fail "$1" "fio verify failed: $(grep -m1 -E 'verify|error|err= *[1-9]' "/tmp/fio-$1.out")"; return 1
    fi
    grep -E '^ *(READ|WRITE):' "/tmp/fio-$1.out" | sed "s/^/fio $1| /" || true
    grep -q 'err= 0' "/tmp/fio-$1.out" || { cat "/tmp/fio-$1.out"; fail "$1" "fio reported an error"; return 1; }
    result fio ok
    say "$1: fio done"
    if [ "$(port "$1")" != 0 ]; then
        scrape "$(port "$1")" "/tmp/metrics-$1.txt" || { fail "$1" "metrics not served on port $(port "$1")"; return 1; }
        grep '^pmemblk_copy_bytes_total' "/tmp/metrics-$1.txt" | sed "s/^/metrics $1| /" || true
        result dma_bytes "$(metric_sum "/tmp/metrics-$1.txt" pmemblk_copy_bytes_total 'route="dma"')"
        result cpu_bytes "$(metric_sum "/tmp/metrics-$1.txt" pmemblk_copy_bytes_total 'route="cpu"')"
    fi
}

MODE=${1:-}
[ $# -gt 0 ] && shift
[ "$MODE" = first ] && { MARKER=${1:?marker}; shift; }
[ $# -gt 0 ] || { echo "usage: pmem-check.sh first MARKER NAME... | second NAME..." >&2; exit 2; }
for n in "$@"; do case $n in *[!a-z0-9_]*) echo "pmem-check.sh: bad name '$n'" >&2; exit 2 ;; esac; done

case "$MODE" in
first)
    say "booted"
    ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/tmp/ndctl.json
    grep -q '"mode":"fsdax"' /tmp/ndctl.json || { cat /tmp/ndctl.json; say "namespace not in fsdax mode"; exit 1; }
    result mode fsdax
    say "namespace is fsdax"
    mkfs.ext4 -q -F -b 4096 /dev/pmem0 || { say "mkfs.ext4 failed"; exit 1; }
    mkdir -p "$MNT"
    mount -o dax /dev/pmem0 "$MNT" || { say "mount -o dax failed"; exit 1; }
    grep " $MNT " /proc/mounts | grep -q 'dax=always' || { grep " $MNT " /proc/mounts; say "not a DAX mount"; exit 1; }
    result dax always
    say "ext4 mounted -o dax"
    start_all "$@"
    for n in $READY; do first_one "$n"; done
    RESULT_PREFIX=''
    set --
    for n in $READY; do failed "$n" || set -- "$@" "$n=$(uri "$n")"; done
    [ $# -gt 0 ] || { say "no server got through to the FUA writes"; exit 1; }
    # Ends with MARKER and keeps the connections open: the power is cut with nothing flushed after.
    exec python3 "$HERE/fua.py" write --marker "$MARKER" "$@"
    ;;
second)
    ndctl list -N >/tmp/ndctl.json
    grep -q '"mode":"fsdax"' /tmp/ndctl.json || { cat /tmp/ndctl.json; say "namespace lost its fsdax mode"; exit 1; }
    mkdir -p "$MNT"
    mount -o dax /dev/pmem0 "$MNT" || { say "mount -o dax failed after the power cut"; exit 1; }
    result remount ok
    start_all "$@"
    for n in $READY; do
        python3 "$HERE/fua.py" verify "$n=$(uri "$n")" >"/tmp/fua-$n.out" 2>&1 || fail "$n" "FUA data after the power cut: $(grep -m1 -E 'mismatch|Error|error' "/tmp/fua-$n.out" || echo "fua.py verify failed")"
        sed "/^RESULT /!s/^/fua $n| /" "/tmp/fua-$n.out"
    done
    for n in $READY; do
        failed "$n" && continue
        SERVER_PID=$(pid "$n")
        serve_stop 30 || { sed "s/^/server $n| /" "/tmp/server-$n.log"; fail "$n" "server did not stop within 30 s of SIGTERM"; continue; }
        server_lines "/tmp/server-$n.log" | sed "s/^/server $n| /"
    done
    umount "$MNT" || { say "umount $MNT failed"; exit 1; }
    [ -z "$FAILED" ]
    ;;
*)
    echo "usage: pmem-check.sh first MARKER NAME... | second NAME..." >&2
    exit 2
    ;;
esac
