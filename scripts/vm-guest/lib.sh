# shellcheck shell=sh
# What the guest scripts (scripts/vm-guest/*.sh, run by scripts/vm-test through scripts/vm) share: progress and
# RESULT lines, bounded waits, starting and stopping `pmemblk serve`, finding a disk, asking the host to act, fio
# verify and the kernel-log check. Sourced as `. "$(dirname "$0")/lib.sh"`;
# POSIX sh, since the guest runs the scripts with the host's /bin/sh. Every wait here has a bound and says which
# one passed.
# shellcheck source=guest-java.sh
. "$(dirname "$0")/guest-java.sh" # PMEMBLK_GUEST_CMD: java with the launcher's JVM arguments

GUEST_NAME=${GUEST_NAME:-$(basename "$0" .sh)}
SERVER_PID='' SERVER_RC=''

# Seconds since the guest booted: the clock of every bound (the guest has no network time).
now() { cut -d. -f1 /proc/uptime; }
# A progress line, with the guest's uptime: under emulation the time a step took is often the news. A script that
# runs several scenarios names the current one in PART: the line names it too, and the last one is kept in
# /tmp/progress.PART so that a step failing unexpectedly (errexit) can be named.
say() {
    echo "$GUEST_NAME: [$(cut -d' ' -f1 /proc/uptime)s] ${PART:+$PART: }$*"
    [ -z "${PART:-}" ] || echo "$*" >"/tmp/progress.$PART"
}
# result KEY VALUE: a line the host reads (scripts/vm-test: `result FILE KEY`); RESULT_PREFIX names a scenario
# where one guest runs several.
result() { echo "RESULT ${RESULT_PREFIX:-}$1=$2"; }

# A process that exited but was not reaped (an orphan of a finished subshell) is gone too.
alive() { [ -d "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
wait_gone() {  # wait_gone PID SECONDS: true once PID is gone, false when the bound passed first
    _wt=$(( $(now) + $2 ))
    while alive "$1"; do [ "$(now)" -lt "$_wt" ] || return 1; sleep 0.1; done
}
wait_absent() {  # wait_absent PATH SECONDS
    _wt=$(( $(now) + $2 ))
    while [ -e "$1" ]; do [ "$(now)" -lt "$_wt" ] || return 1; sleep 0.1; done
}
# wait_until PID SECONDS COMMAND...: 0 once COMMAND succeeds, 1 if PID exited first, 2 if the bound passed.
wait_until() {
    _wp=$1 _wt=$(( $(now) + $2 )); shift 2
    until "$@"; do
        alive "$_wp" || return 1
        [ "$(now)" -lt "$_wt" ] || return 2
        sleep 0.1
    done
}

# The server's own lines, without java.util.logging's two-line records.
server_lines() {
    grep -v -E '^(INFO|FINE|[A-Z][a-z]{2} [0-9]+, [0-9]{4} |[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]+ (INFO|FINE))' "$1" 2>/dev/null || true
}

# serve_start LOG ARGS...: `pmemblk serve ARGS` in the background, its output in LOG; sets SERVER_PID.
serve_start() {
    _log=$1; shift
    # shellcheck disable=SC2086 # the command is a word list
    $PMEMBLK_GUEST_CMD serve "$@" >"$_log" 2>&1 &
    SERVER_PID=$!
}
# nbd_serve_start LOG ARGS...: serve_start with the NBD export the guest checks read: pmem0 on the unix socket $SOCK
# (a stale one removed first), no TCP.
nbd_serve_start() {
    _log=$1; shift
    rm -f "$SOCK"
    serve_start "$_log" --set "nbd.socket=$SOCK" --set nbd.port=0 --set nbd.export=pmem0 "$@"
}
# start_server LOG ARGS...: nbd_serve_start, then its ready line waited for (120 s); exits the script when the
# server exited or was not ready in time (serve_ready says which).
start_server() {
    nbd_serve_start "$@"
    serve_ready "$1" 120 || exit 1
}
# serve_ready LOG SECONDS [REGEX]: waits for the server's ready line (default '^ready:'); if the server exits or the
# bound passes first, says which, prints LOG and returns 1. The bounds are generous: a JVM starts slowly under TCG.
serve_ready() {
    _rt=$(now) _rc=0
    wait_until "$SERVER_PID" "$2" grep -s -q -E "${3:-^ready:}" "$1" || _rc=$?
    case $_rc in
        0) say "server ready after $(( $(now) - _rt )) s"; return 0 ;;
        1) say "server exited before it was ready:" ;;
        *) say "server not ready in $2 s:" ;;
    esac
    cat "$1"
    return 1
}
# serve_stop [SECONDS]: SIGTERM and a bounded wait (default 30 s); sets SERVER_RC to its exit status. Returns 1 (and
# SIGKILLs it, SERVER_RC=killed) when it is still running after the bound. Safe under set -e, whatever the server's status.
serve_stop() {
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    # shellcheck disable=SC2034 # SERVER_RC is for the script that sourced this file
    if ! wait_gone "$SERVER_PID" "${1:-30}"; then
        say "server ignored SIGTERM for ${1:-30} s"
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_RC=killed
        return 1
    fi
    # shellcheck disable=SC2034 # the same
    if wait "$SERVER_PID"; then SERVER_RC=0; else SERVER_RC=$?; fi
}

# count WORD...: how many words (a glob's matches: `count /dir/*`, which counts the pattern itself when none match,
# so test the first with -e where none is possible).
count() { echo $#; }

# Prometheus text from the server's metrics port: scrape PORT FILE, then metric_sum FILE METRIC [LABEL-TEXT], the sum
# of METRIC's samples (those whose line contains LABEL-TEXT, e.g. 'route="dma"').
scrape() { curl -fsS --max-time 10 "http://127.0.0.1:$1/metrics" >"$2" 2>/dev/null; }
metric_sum() {
    awk -v m="$2" -v l="${3:-}" '(index($0, m "{") == 1 || index($0, m " ") == 1) && index($0, l) { s += $NF }
        END { printf "%.0f\n", s }' "$1"
}

# vm_disk NAME: the block device of the disk scripts/vm listed as NAME in /mnt/vm/disks (vhost0, vhost1, ..., nbd),
# found through its PCI address (vdX letters follow probe order); fails, saying so on stderr, when it is not there.
vm_disk() {
    _addr=$(awk -v n="$1" '$1 == n { print $2 }' /mnt/vm/disks 2>/dev/null)
    [ -n "$_addr" ] || { echo "vm_disk: no disk '$1' in /mnt/vm/disks ($(awk '{ printf "%s ", $1 }' /mnt/vm/disks 2>/dev/null))" >&2; return 1; }
    for _b in /sys/bus/pci/devices/"$_addr"/virtio*/block/*; do
        [ -e "$_b" ] && { echo "/dev/${_b##*/}"; return 0; }
    done
    echo "vm_disk: disk '$1' (PCI $_addr) has no block device" >&2
    return 1
}

# host_request SECONDS WORD...: asks the host to act while the guest runs (restart the server, read its counters):
# writes the words to $HOST_REQUESTS/req.N (a share of the host's; default /mnt/ctl) and waits at most SECONDS for
# ack.N, which scripts/lib/vm-host.sh writes; prints the host's answer. Returns 0 when the host answered ok, 1
# when it answered fail, 2 when no answer came in time. Both files appear whole (written beside, then renamed); N is
# one more than the requests already made, so scripts running parts in subshells still count right.
HOST_REQUESTS=${HOST_REQUESTS:-/mnt/ctl}
host_request() {
    _hs=$1; shift
    _hn=$(( $(find "$HOST_REQUESTS" -maxdepth 1 -name 'req.*' | wc -l) + 1 ))
    printf '%s\n' "$*" >"$HOST_REQUESTS/.req.$_hn"
    mv "$HOST_REQUESTS/.req.$_hn" "$HOST_REQUESTS/req.$_hn"
    _ht=$(( $(now) + _hs ))
    while [ ! -e "$HOST_REQUESTS/ack.$_hn" ]; do
        [ "$(now)" -lt "$_ht" ] || { echo "host_request: no answer from the host to '$*' in $_hs s" >&2; return 2; }
        sleep 0.1
    done
    tail -n +2 "$HOST_REQUESTS/ack.$_hn"
    [ "$(head -n 1 "$HOST_REQUESTS/ack.$_hn")" = ok ]
}

# The checks below end a scenario through `fail REASON`, which the script that sources this file defines.

# fio verify: random writes of 4k..1m (libaio, direct, iodepth 32), then every block read back and its crc32c checked.
# fio_verify_run NAME FIO-ARGS... runs it (the target and size among the arguments), bounded by FIO_VERIFY_SECS
# (default 300), its report in /tmp/fio-NAME.out; fio_verify_check NAME STATUS fails the scenario unless it ended
# clean; fio_verify NAME FIO-ARGS... is both.
FIO_VERIFY_BSSPLIT=4k/30:16k/20:64k/20:256k/15:1m/15
fio_verify_run() {
    _n=$1; shift
    timeout -k 10 "${FIO_VERIFY_SECS:-300}" fio --name="$_n" --ioengine=libaio --direct=1 --rw=randwrite \
        --bssplit="$FIO_VERIFY_BSSPLIT" --iodepth=32 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --verify_state_save=0 "$@" --output="/tmp/fio-$_n.out" >/dev/null 2>&1
}
fio_verify_check() {
    grep -E '^ *(READ|WRITE):|err=' "/tmp/fio-$1.out" 2>/dev/null | sed "s/^/fio $1| /"
    if [ "$2" != 0 ] || ! grep -q 'err= 0' "/tmp/fio-$1.out" || grep -q 'err= *[1-9]' "/tmp/fio-$1.out"; then
        cat "/tmp/fio-$1.out" 2>/dev/null
        [ "$2" = 124 ] && fail "fio $1 timed out (${FIO_VERIFY_SECS:-300} s)"
        fail "fio $1 failed (exit $2): $(grep -m1 -E 'verify|error|err= *[1-9]' "/tmp/fio-$1.out" 2>/dev/null)"
    fi
}
fio_verify() {
    _fn=$1; shift
    _frc=0
    fio_verify_run "$_fn" "$@" || _frc=$?
    fio_verify_check "$_fn" "$_frc"
}

# Kernel log lines since dmesg_mark that mean an I/O failed or a task hung; check_dmesg fails the scenario on one.
DMESG_MARK=0
dmesg_mark() { DMESG_MARK=$(dmesg | wc -l); }
dmesg_errors() {
    dmesg | tail -n +$((DMESG_MARK + 1)) \
        | grep -E 'I/O error|blk_update_request|Buffer I/O error|EXT4-fs error|blocked for more than|Oops|BUG:|WARNING:|hung_task' || true
}
check_dmesg() {
    _e=$(dmesg_errors)
    [ -z "$_e" ] || { echo "$_e" | sed 's/^/dmesg| /'; fail "kernel log: $(echo "$_e" | head -n 1 | cut -c1-160)"; }
}

# discard_check DEV: on the raw device, a written range discarded and another zeroed (WRITE_ZEROES, or the block
# layer's fallback writes), the zeros read back.
discard_check() {
    head -c 2M /dev/urandom | dd of="$1" bs=1M seek=100 count=2 iflag=fullblock oflag=direct conv=fsync 2>/dev/null \
        || fail "dd write to $1 failed"
    blkdiscard -o 100M -l 1M "$1" || fail "blkdiscard -o 100M -l 1M $1 failed"
    blkdiscard -z -o 101M -l 1M "$1" || fail "blkdiscard -z -o 101M -l 1M $1 failed"
    _nz=$(dd if="$1" bs=1M skip=101 count=1 iflag=direct 2>/dev/null | tr -d '\000' | wc -c)
    [ "$_nz" = 0 ] || fail "$_nz non-zero bytes read back after blkdiscard -z"
}
