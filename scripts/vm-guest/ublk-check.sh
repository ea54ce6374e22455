#!/bin/sh
# Scenarios "ublk", "ublk-recovery", "ublk-pmem" and "ublk-nbd", run inside ONE guest with an emulated
# NVDIMM (scripts/vm --nvdimm) by scripts/vm-test: `ublk-check.sh SCENARIO...`. Each scenario runs in a
# subshell of its own, so one that fails is cleaned up after (server stopped, filesystems unmounted) and
# the next still runs; every wait is bounded. The order is fixed, whatever the arguments' order:
#   ublk-nbd       the same fio job (4k randrw, libaio, direct, iodepth 32, fixed runtime) on the kernel's
#                  /dev/pmem0 (fsdax namespace, before the filesystem goes on it), then, with the server on a
#                  pool file on ext4 -o dax on that namespace, on /dev/ublkbN and on /dev/nbd0 (the kernel's
#                  nbd-client on the same server's unix socket); IOPS, MB/s and the ratios as RESULT lines
#   ublk-pmem      the server on ext4 -o dax (its region line: is_pmem=true), fio verify=crc32c through /dev/ublkbN,
#                  ublk request counters; again with dma.engine=soft, route.dma.bounce=true and
#                  route.dma.min-bytes=65536: both copy routes used (pmemblk_copy_bytes_total)
#   ublk           the server on a tmpfs file: no /dev/ublk-control -> exit 1 naming modprobe ublk_drv; block
#                  size and capacity; blkdiscard and blkdiscard -z on the raw device; mkfs.ext4, files with
#                  fsync and sha256 sums, fio verify (bssplit 4k..1m) on the filesystem, fstrim, e2fsck -fn;
#                  SIGTERM (exit 0, /dev/ublkbN and /dev/ublkcN gone), serve again (now with the dirty bitmap b),
#                  e2fsck, sums verified; an incremental backup of this guest's writes to /dev/ublkbN over the
#                  server's NBD socket (bitmap_backup); another process deletes the device (STOP_DEV, DEL_DEV):
#                  DEL_DEV returns and serve exits 4; no I/O error in the kernel log
#   ublk-recovery  first ublk.recovery=false (ublk.id=7): kill -9 removes /dev/ublkb7 and ends the I/O waiting
#                  on it, and the next serve with ublk.id=7 makes a new device and serves: the recovery part's, with
#                  ublk.recovery=true: fio verify on /dev/ublkb7, the server kill -9'ed mid-run, the device stays,
#                  serve again with ublk.id=7: fio completes and verifies, no I/O error in the kernel log;
#                  killed again: a serve on another file with ublk.id=7 exits 1 naming the inode of the file
#                  the device serves (the device stays waiting), a serve on that file resumes it
# Output: per scenario "RESULT NAME.status=pass|fail", on failure "RESULT NAME.why=...", "RESULT NAME.secs=N",
# and the scenario's figures as "RESULT NAME.KEY=VALUE". The host (scripts/vm-test) reads them.
# Environment: PMEMBLK_GUEST_CMD / PMEMBLK_GUEST_JAVA_OPTS as in pmem-check.sh; UBLK_RATE_SECS (fio runtime
# of each ublk-nbd measurement, default 10).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
RATE_SECS=${UBLK_RATE_SECS:-10}
READY_SECS=${UBLK_READY_SECS:-300} # serve took 15 s under TCG on a quiet host, 50 s on a busy one, 150+ with four guests on 2 cores
SOCK=/tmp/nbd.sock
PM=/mnt/pm            # ext4 -o dax on the NVDIMM's fsdax namespace
FS=/mnt/ublk          # ext4 on /dev/ublkbN
# fio writes a verify state file into its working directory; /tmp is the writable one here.
cd /tmp || exit 1

PART=setup RESULT_PREFIX=setup.
# Progress lines name the scenario (lib.sh's say with PART set).
# fail REASON: the scenario's one-line reason for the host, then out of the scenario's subshell.
fail() { result why "$*"; : >"/tmp/why.$PART"; say "FAIL: $*"; exit 1; }

# Every process a scenario starts in the background is noted here, so it can be ended if the scenario fails.
track() { echo "$1" >>"/tmp/pids.$PART"; }

show_log() { say "server log $SLOG:"; sed 's/^/server| /' "$SLOG"; }
last_line() { server_lines "$SLOG" | tail -n 1; }

# diagnose PID: what a stuck server is doing, for the log: each thread's kernel stack (a ublk control
# command or I/O wait shows there) and a Java thread dump (SIGQUIT: into the server's log), then ublk nodes.
diagnose() {
    alive "$1" || return 0
    say "diagnosis of pid $1:"
    for _task in /proc/"$1"/task/*; do
        echo "diag| task ${_task##*/} $(cat "$_task/comm" 2>/dev/null) wchan=$(cat "$_task/wchan" 2>/dev/null)"
        grep -v -E 'do_syscall_64|entry_SYSCALL|futex_wait|__futex|do_futex' "$_task/stack" 2>/dev/null | sed 's/^/diag|   /'
    done
    kill -QUIT "$1" 2>/dev/null
    _t=$(( $(now) + 20 ))
    until grep -q '^JNI global refs' "$SLOG" 2>/dev/null; do [ "$(now)" -lt "$_t" ] || break; sleep 0.2; done
    sed -n '/^Full thread dump/,/^JNI global refs/p' "$SLOG" | grep -v '^$' | sed 's/^/diag| /'
    # shellcheck disable=SC2012 # a listing for a person to read, not parsed
    ls -l /dev/ublk* 2>/dev/null | sed 's/^/diag| /'
    dmesg | tail -n 15 | sed 's/^/diag| dmesg: /'
}

SPID='' DEV='' DEVID='' SLOG=''
# ublk_server LOGNAME ARGS...: `serve` with ublk on (plus ARGS) in the background; waits, bounded, for its
# "ready: /dev/ublkbN" line; sets SPID, DEV, DEVID.
ublk_server() {
    SLOG=/tmp/server-$1.log; shift
    nbd_serve_start "$SLOG" --set ublk.enabled=true "$@"
    SPID=$SERVER_PID
    track "$SPID"
    _t0=$(now) _rc=0
    wait_until "$SPID" "$READY_SECS" grep -s -q '^ready: /dev/ublkb[0-9]' "$SLOG" || _rc=$?
    case $_rc in
        1) _rc=0; wait "$SPID" || _rc=$?
           show_log; fail "serve exited ($_rc) without a ublk device: $(last_line)" ;;
        2) diagnose "$SPID"; show_log; fail "serve printed no 'ready: /dev/ublkbN' in ${READY_SECS}s: $(last_line)" ;;
    esac
    DEV=$(sed -n 's/^ready: \(\/dev\/ublkb[0-9][0-9]*\).*/\1/p' "$SLOG" | tail -n 1)
    DEVID=${DEV#/dev/ublkb}
    [ -b "$DEV" ] || { show_log; fail "serve printed 'ready: $DEV' but $DEV is not a block device"; }
    server_lines "$SLOG" | sed 's/^/server| /'
    say "serve ready after $(( $(now) - _t0 ))s: $DEV (pid $SPID)"
}

# stop_server: SIGTERM; the server must exit 0 and take /dev/ublkbN and /dev/ublkcN with it.
stop_server() {
    kill -TERM "$SPID"
    wait_gone "$SPID" 60 || { diagnose "$SPID"; show_log; fail "serve still running 60 s after SIGTERM: $(last_line)"; }
    _rc=0; wait "$SPID" || _rc=$?
    [ "$_rc" = 0 ] || { show_log; fail "serve exited $_rc on SIGTERM (want 0): $(last_line)"; }
    wait_absent "$DEV" 10 || fail "$DEV still present 10 s after serve exited on SIGTERM"
    wait_absent "/dev/ublkc$DEVID" 10 || fail "/dev/ublkc$DEVID still present 10 s after serve exited on SIGTERM"
    say "serve stopped (SIGTERM, exit 0); $DEV and /dev/ublkc$DEVID gone"
}

# kill_at_requests PORT N SECONDS FIO-OUTPUT: SIGKILLs the server (SPID) once its metrics on PORT count N ublk
# requests, while fio (FPID) still runs: the kill lands with I/O in flight. Sets KILLED_AFTER.
kill_at_requests() {
    _t=$(( $(now) + $3 )) _n=0
    while :; do
        alive "$FPID" || { cat "$4"; fail "fio ended before the kill (after $_n ublk requests)"; }
        if scrape "$1" "/tmp/metrics-$1.txt"; then _n=$(metric_sum "/tmp/metrics-$1.txt" pmemblk_ublk_requests_total); fi
        [ "$_n" -lt "$2" ] || break
        [ "$(now)" -lt "$_t" ] || fail "fio did not reach $2 ublk requests in $3 s (metric: $_n)"
        sleep 0.2
    done
    kill9_server
    KILLED_AFTER=$_n
}
kill9_server() {  # kill -9 of the server (SPID), waited for (bounded)
    kill -9 "$SPID"
    wait_gone "$SPID" 30 || fail "serve still alive 30 s after kill -9"
    wait "$SPID" 2>/dev/null || true
}

ensure_fsdax() {  # the NVDIMM's namespace in fsdax mode: /dev/pmem0 (once per boot)
    [ -e /tmp/.fsdax ] && return 0
    modprobe -a nfit nd_pmem dax_pmem
    ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/tmp/ndctl.json
    grep -q '"mode":"fsdax"' /tmp/ndctl.json || { cat /tmp/ndctl.json; fail "ndctl: namespace not in fsdax mode"; }
    [ -b /dev/pmem0 ] || fail "no /dev/pmem0 after ndctl create-namespace"
    touch /tmp/.fsdax
}
ensure_dax_mount() {  # ext4 -o dax on /dev/pmem0 at $PM (once per boot)
    mountpoint -q "$PM" && return 0
    ensure_fsdax
    mkfs.ext4 -q -F -b 4096 /dev/pmem0
    mkdir -p "$PM"
    mount -o dax /dev/pmem0 "$PM"
    grep " $PM " /proc/mounts | grep -q 'dax=always' || { grep " $PM " /proc/mounts; fail "$PM is not a DAX mount"; }
    say "ext4 -o dax on /dev/pmem0 at $PM"
}

# ---------------------------------------------------------------------------------------------
# ublk-nbd: fio_rate NAME TARGET: the comparison job on TARGET; sets RATE_IOPS.
fio_rate() {
    _name=$1 _target=$2 _rc=0
    timeout -k 10 $((RATE_SECS + 90)) fio --name="$_name" --filename="$_target" --ioengine=libaio --direct=1 \
        --rw=randrw --rwmixread=50 --bs=4k --iodepth=32 --size=128M --runtime="$RATE_SECS" --time_based \
        --ramp_time=2 --randrepeat=0 --norandommap --output-format=json --output="/tmp/rate-$_name.json" \
        >/dev/null 2>&1 || _rc=$?
    [ "$_rc" = 0 ] || { cat "/tmp/rate-$_name.json" 2>/dev/null; fail "fio on $_target failed (exit $_rc)"; }
    _r=$(python3 "$HERE/fio-rate.py" "/tmp/rate-$_name.json") || fail "cannot read fio's JSON for $_target"
    # shellcheck disable=SC2086 # three words
    set -- $_r
    [ "$3" = 0 ] || fail "fio on $_target reported error $3"
    RATE_IOPS=$1
    result "${_name}_iops" "$1"
    result "${_name}_mbps" "$2"
    say "$_name ($_target): $1 IOPS, $2 MB/s"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "n/a" }'; }

part_ublk_nbd() {
    ensure_fsdax
    say "comparison job: 4k randrw 50/50, libaio, direct=1, iodepth 32, ${RATE_SECS}s (after 2 s ramp), 128 MiB range"
    fio_rate pmem0 /dev/pmem0
    P_IOPS=$RATE_IOPS
    ensure_dax_mount
    ublk_server nbd --set "pmem.path=$PM/pool" --set pmem.size=256M --set metrics.port=9471
    result queues "$(count "/sys/block/ublkb$DEVID/mq"/*)"
    fio_rate ublk "$DEV"
    U_IOPS=$RATE_IOPS
    # The kernel's NBD client on the same server; as many connections as the ublk device has queues.
    nbd-client -d /dev/nbd0 >/dev/null 2>&1 || true
    _c=$(count "/sys/block/ublkb$DEVID/mq"/*)
    timeout 60 nbd-client -unix "$SOCK" -N pmem0 -b 4096 -connections "$_c" /dev/nbd0 >/tmp/nbd-client.out 2>&1 \
        || { cat /tmp/nbd-client.out; fail "nbd-client could not connect /dev/nbd0 to $SOCK: $(tail -n 1 /tmp/nbd-client.out)"; }
    _sz=$(blockdev --getsize64 /dev/nbd0)
    [ "$_sz" = 268435456 ] || fail "/dev/nbd0 has $_sz bytes, want 268435456"
    say "/dev/nbd0 connected ($_c connections)"
    result nbd_connections "$_c"
    fio_rate nbd /dev/nbd0
    N_IOPS=$RATE_IOPS
    timeout 30 nbd-client -d /dev/nbd0 >/dev/null 2>&1 || fail "nbd-client -d /dev/nbd0 failed"
    stop_server
    # Same block size on all three: the MB/s ratios equal the IOPS ratios.
    result ublk_vs_nbd "$(ratio "$U_IOPS" "$N_IOPS")"
    result ublk_vs_pmem0 "$(ratio "$U_IOPS" "$P_IOPS")"
    check_dmesg
}

# ---------------------------------------------------------------------------------------------
part_ublk_pmem() {
    ensure_dax_mount
    ublk_server pmem --set "pmem.path=$PM/pool" --set pmem.size=256M --set metrics.port=9472
    # serve names its mapping when it starts (what `pmemblk info` prints, without a JVM start of its own):
    # "pmemblk: PmemRegion[PATH, N bytes, is_pmem=B, mapped by M], ..."
    _p=$(sed -n 's/^pmemblk: PmemRegion\[.*, is_pmem=\([a-z]*\),.*/\1/p' "$SLOG" | head -n 1)
    result is_pmem "$_p"
    [ "$_p" = true ] || fail "serve reports is_pmem=${_p:-none} on ext4 -o dax"
    fio_verify pmem --filename="$DEV" --size=128M
    scrape 9472 /tmp/metrics-pmem.txt || fail "metrics not served on port 9472"
    grep -E '^pmemblk_(ublk_requests_total|copy_bytes_total)' /tmp/metrics-pmem.txt | sed 's/^/metrics| /'
    _u=$(metric_sum /tmp/metrics-pmem.txt pmemblk_ublk_requests_total)
    result ublk_requests "$_u"
    [ "$_u" -gt 0 ] || fail "pmemblk_ublk_requests_total is ${_u}: fio's I/O did not go through ublk"
    stop_server

    ublk_server pmem-dma --set "pmem.path=$PM/pool" --set pmem.size=256M --set metrics.port=9473 \
        --set dma.engine=soft --set route.dma.bounce=true --set route.dma.min-bytes=65536
    fio_verify pmem-dma --filename="$DEV" --size=128M
    scrape 9473 /tmp/metrics-dma.txt || fail "metrics not served on port 9473"
    grep -E '^pmemblk_(ublk_requests_total|copy_bytes_total)' /tmp/metrics-dma.txt | sed 's/^/metrics| /'
    _d=$(metric_sum /tmp/metrics-dma.txt pmemblk_copy_bytes_total 'route="dma"')
    _c=$(metric_sum /tmp/metrics-dma.txt pmemblk_copy_bytes_total 'route="cpu"')
    _u=$(metric_sum /tmp/metrics-dma.txt pmemblk_ublk_requests_total)
    result dma_bytes "$_d"; result cpu_bytes "$_c"; result dma_ublk_requests "$_u"
    [ "$_u" -gt 0 ] || fail "with dma.engine=soft: pmemblk_ublk_requests_total is $_u"
    if [ "$_d" -le 0 ] || [ "$_c" -le 0 ]; then fail "copy routes not both used: dma=$_d cpu=$_c bytes"; fi
    stop_server
    check_dmesg
}

# ---------------------------------------------------------------------------------------------
part_ublk() {
    POOL=/tmp/ublk-pool
    rm -f "$POOL"
    # Without /dev/ublk-control serve must say how to get it and exit 1 (the module only unloads with no
    # ublk device left, which holds when the scenarios before this one cleaned up).
    if modprobe -r ublk_drv 2>/dev/null && [ ! -e /dev/ublk-control ]; then
        _rc=0
        # shellcheck disable=SC2086
        timeout 150 $PMEMBLK_GUEST_CMD serve --set "pmem.path=$POOL" --set pmem.size=256M --set "nbd.socket=$SOCK" \
            --set nbd.port=0 --set ublk.enabled=true >/tmp/server-noctl.log 2>&1 || _rc=$?
        sed 's/^/server| /' /tmp/server-noctl.log
        [ "$_rc" = 1 ] || fail "without /dev/ublk-control serve exited $_rc (want 1)"
        grep -q 'modprobe ublk_drv' /tmp/server-noctl.log || fail "without /dev/ublk-control serve did not name 'modprobe ublk_drv'"
        result no_control "exit 1 naming modprobe ublk_drv"
        say "without /dev/ublk-control: exit 1, names modprobe ublk_drv"
    else
        result no_control "not-checked"
        say "ublk_drv could not be unloaded: the no-/dev/ublk-control check is skipped"
    fi
    modprobe ublk_drv
    [ -c /dev/ublk-control ] || fail "no /dev/ublk-control after modprobe ublk_drv"
    rm -f "$POOL"

    ublk_server fs1 --set "pmem.path=$POOL" --set pmem.size=256M
    _ss=$(blockdev --getss "$DEV") _sz=$(blockdev --getsize64 "$DEV")
    result block_size "$_ss"
    [ "$_ss" = 4096 ] || fail "$DEV logical block size $_ss, want 4096 (ublk.block-size default)"
    [ "$_sz" = 268435456 ] || fail "$DEV has $_sz bytes, want 268435456"
    _dm=$(cat "/sys/block/ublkb$DEVID/queue/discard_max_bytes")
    [ "$_dm" -gt 0 ] || fail "$DEV does not advertise discard (queue/discard_max_bytes=0)"
    # Raw device, before mkfs.
    discard_check "$DEV"
    say "blkdiscard and blkdiscard -z on the raw device: ok (zeros read back)"

    mkfs.ext4 -q -F "$DEV"
    mkdir -p "$FS"
    mount "$DEV" "$FS"
    for s in 4K 64K 1M 8M 32M; do
        head -c "$s" /dev/urandom >"$FS/file-$s"
        sync "$FS/file-$s"          # fsync
    done
    (cd "$FS" && sha256sum file-* >/tmp/ublk.sums)
    sed 's/^/SUM /' /tmp/ublk.sums
    fio_verify fs --directory="$FS" --filename=fio.dat --size=128M
    rm -f "$FS/fio.dat"
    _tr=$(fstrim -v "$FS") || fail "fstrim $FS failed"
    say "$_tr"
    result fstrim "$(echo "$_tr" | sed -n 's/.*(\([0-9]*\) bytes) trimmed.*/\1/p')"
    umount "$FS"
    timeout 120 e2fsck -fn "$DEV" >/tmp/fsck1.out 2>&1 || { cat /tmp/fsck1.out; fail "e2fsck -fn not clean before the restart"; }
    stop_server

    ublk_server fs2 --set "pmem.path=$POOL" --set pmem.size=256M --set bitmap.dir=auto --set bitmap.names=b
    timeout 120 e2fsck -fn "$DEV" >/tmp/fsck2.out 2>&1 || { cat /tmp/fsck2.out; fail "e2fsck -fn not clean after the restart"; }
    mount "$DEV" "$FS"
    (cd "$FS" && sha256sum -c --quiet /tmp/ublk.sums) || fail "sha256 sums differ after the server restart"
    result verified "$(wc -l </tmp/ublk.sums)"
    umount "$FS"
    bitmap_backup "$DEV"
    external_delete
    check_dmesg
}

# external_delete: another process deletes the device the server (SPID) serves, as ublksrv's `ublk del` does
# (STOP_DEV, then DEL_DEV, which waits until the server has closed /dev/ublkcN). The server must let go, so that
# the DEL_DEV returns, say that the device was stopped by another process, and exit 4 (not go on saying it serves).
external_delete() {
    _del=0
    timeout 60 /usr/bin/python3 "$HERE/ublk-ctl.py" del "$DEVID" >/tmp/ublk-ctl.out 2>&1 || _del=$?
    sed 's/^/ublk-ctl| /' /tmp/ublk-ctl.out
    [ "$_del" != 124 ] || { diagnose "$SPID"; show_log; fail "DEL_DEV of $DEV from another process still waiting after 60 s: the server holds /dev/ublkc$DEVID"; }
    [ "$_del" = 0 ] || fail "ublk-ctl.py del $DEVID failed ($_del)"
    wait_gone "$SPID" 60 || { diagnose "$SPID"; show_log; fail "serve still running 60 s after another process deleted $DEV"; }
    _rc=0; wait "$SPID" || _rc=$?
    [ "$_rc" = 4 ] || { show_log; fail "serve exited $_rc after another process deleted $DEV (want 4): $(last_line)"; }
    grep -q "stopped by another process" "$SLOG" || { show_log; fail "serve did not say its device was stopped by another process"; }
    wait_absent "$DEV" 10 || fail "$DEV still present after the external delete"
    wait_absent "/dev/ublkc$DEVID" 10 || fail "/dev/ublkc$DEVID still present after the external delete"
    result external_delete "serve exit 4"
    say "another process deleted $DEV: DEL_DEV returned, serve exited 4 naming it"
}

# bitmap_backup DEV: an incremental backup of what this guest writes to DEV (the ublk device of a server with the
# dirty bitmap b, its pool POOL), over the server's NBD socket (docs/bitmaps.md): a checkpoint (the full copy's
# boundary; its frozen half dropped), a full copy with nbdcopy, random 4 KiB writes and a discard on DEV, a
# checkpoint, the dirty blocks copied onto the full copy with scripts/pmemblk-backup: its sha256 must be DEV's.
# The control socket is asked with bitmapctl.py: no JVM start in the guest.
bitmap_backup() {
    _ctl="$POOL.bitmaps/control.sock" _uri="nbd+unix:///pmem0?socket=$SOCK" _copy=/tmp/backup.img
    _f=$(/usr/bin/python3 "$HERE/bitmapctl.py" "$_ctl" checkpoint b) || fail "bitmap checkpoint b: $_f"
    /usr/bin/python3 "$HERE/bitmapctl.py" "$_ctl" remove "$_f" >/dev/null || fail "bitmap remove $_f failed"
    timeout 300 nbdcopy "$_uri" "$_copy" || fail "nbdcopy $_uri $_copy failed"
    timeout 300 fio --name=backup --filename="$1" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --size=256M \
        --io_size=1M --iodepth=16 --randrepeat=0 --norandommap --output=/tmp/fio-backup.out >/dev/null 2>&1 \
        || { cat /tmp/fio-backup.out; fail "fio's random writes to $1 failed"; }
    blkdiscard -o $((200 << 20)) -l $((1 << 20)) "$1" || fail "blkdiscard of 1 MiB of $1 failed"
    _f=$(/usr/bin/python3 "$HERE/bitmapctl.py" "$_ctl" checkpoint b) || fail "bitmap checkpoint b: $_f"
    _n=$(timeout 300 /usr/bin/python3 "$HERE/../pmemblk-backup" "$_uri" "$_f" "$_copy") \
        || fail "pmemblk-backup $_uri $_f failed: $_n"
    _a=$(sha256sum <"$_copy" | cut -d' ' -f1)
    _b=$(dd if="$1" iflag=direct bs=1M 2>/dev/null | sha256sum | cut -d' ' -f1)
    rm -f "$_copy"
    [ "$_a" = "$_b" ] || fail "after pmemblk-backup copied $_n bytes from $_f: sha256 of the copy $_a, of $1 $_b"
    if [ "$_n" -le 0 ] || [ "$_n" -ge 268435456 ]; then fail "the increment from $_f is $_n bytes: not a part of $1"; fi
    result backup "$_n"
    say "incremental backup from $_f: $_n bytes copied onto the full copy, sha256 equal to $1's"
}

# ---------------------------------------------------------------------------------------------
part_ublk_recovery() {
    POOL=/tmp/recovery-pool
    rm -f "$POOL"
    ID=7
    # Another device may hold id 7 after a failed scenario: say so instead of failing obscurely.
    [ ! -e "/dev/ublkc$ID" ] || fail "/dev/ublkc$ID exists before the scenario"
    # Without recovery the device goes away with its server, and the same id can be served again: first, so that the
    # next serve on the id is the recovery part's first (a new device, not a resumed one), which saves a JVM start.
    ublk_server norec --set "pmem.path=$POOL" --set pmem.size=256M --set metrics.port=9476 \
        --set ublk.id="$ID" --set ublk.recovery=false
    [ "$DEV" = "/dev/ublkb$ID" ] || fail "ublk.id=$ID but serve created $DEV"
    timeout -k 5 200 fio --name=norec --filename="$DEV" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
        --iodepth=32 --size=48M --runtime=150 --time_based --output=/tmp/fio-norec.out >/dev/null 2>&1 &
    FPID=$!
    track "$FPID"
    kill_at_requests 9476 1000 120 /tmp/fio-norec.out
    wait_absent "$DEV" 30 || fail "$DEV still present 30 s after kill -9 with ublk.recovery=false"
    wait_gone "$FPID" 30 || fail "fio on $DEV still running 30 s after its device went away"
    wait "$FPID" 2>/dev/null || true
    say "kill -9 with ublk.recovery=false: $DEV gone, fio ended"
    # Its I/O errors were expected; from here on the kernel must log none.
    dmesg_mark
    ublk_server rec1 --set "pmem.path=$POOL" --set pmem.size=256M --set metrics.port=9474 \
        --set ublk.id="$ID" --set ublk.recovery=true
    [ "$DEV" = "/dev/ublkb$ID" ] || fail "ublk.id=$ID but serve created $DEV"
    if grep -q ', recovered)' "$SLOG"; then
        fail "serve with ublk.id=$ID after the kill -9 with ublk.recovery=false resumed a device instead of making a new one"
    fi
    result norecovery "ok"
    # 4k random writes, then all read back: long enough to kill the server while writes are in flight.
    timeout -k 10 400 fio --name=recovery --filename="$DEV" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --iodepth=32 --size=96M --verify=crc32c --verify_fatal=1 --do_verify=1 --verify_state_save=0 \
        --output=/tmp/fio-recovery.out >/dev/null 2>&1 &
    FPID=$!
    track "$FPID"
    # Kill once the server has taken 3000 requests (an eighth of the writes).
    kill_at_requests 9474 3000 180 /tmp/fio-recovery.out
    result killed_after "$KILLED_AFTER"
    say "serve killed (SIGKILL) after $KILLED_AFTER ublk requests"
    [ -b "$DEV" ] || fail "$DEV vanished after kill -9 with ublk.recovery=true"
    alive "$FPID" || { cat /tmp/fio-recovery.out; fail "fio ended while no server ran (its I/O was not held)"; }
    _gap0=$(now)
    ublk_server rec2 --set "pmem.path=$POOL" --set pmem.size=256M --set metrics.port=9475 \
        --set ublk.id="$ID" --set ublk.recovery=true
    [ "$DEV" = "/dev/ublkb$ID" ] || fail "recovery with ublk.id=$ID came up as $DEV"
    result recovered_after "$(( $(now) - _gap0 ))s"
    wait_gone "$FPID" 300 || { diagnose "$SPID"; fail "fio still running 300 s after the recovered server was ready"; }
    _rc=0; wait "$FPID" || _rc=$?
    grep -E '^ *(READ|WRITE):|err=' /tmp/fio-recovery.out | sed 's/^/fio recovery| /'
    if [ "$_rc" != 0 ] || ! grep -q 'err= 0' /tmp/fio-recovery.out; then
        cat /tmp/fio-recovery.out
        fail "fio across the recovery failed (exit $_rc): $(grep -m1 -E 'verify|error|err=' /tmp/fio-recovery.out)"
    fi
    check_dmesg
    result fio "verified"

    # Recovery only onto the file the device serves: killed again, a server on another file with ublk.id=7 is
    # refused, naming the inode of the file the device was serving, and leaves the device waiting; a server on
    # that file then resumes it.
    _ino=$(stat -c %i "$POOL")
    kill9_server
    [ -b "$DEV" ] || fail "$DEV vanished after the second kill -9 with ublk.recovery=true"
    # The other file has the same size and block size, which is all recovery checked before.
    rm -f /tmp/other-pool "$SOCK"
    # shellcheck disable=SC2086
    $PMEMBLK_GUEST_CMD serve --set pmem.path=/tmp/other-pool --set pmem.size=256M --set "nbd.socket=$SOCK" \
        --set nbd.port=0 --set nbd.export=pmem0 --set ublk.enabled=true --set ublk.id="$ID" --set ublk.recovery=true \
        >/tmp/server-other.log 2>&1 &
    _op=$!
    track "$_op"
    _t0=$(now)
    while alive "$_op"; do
        if grep -q '^ready: /dev/ublkb' /tmp/server-other.log; then
            server_lines /tmp/server-other.log | sed 's/^/server| /'
            fail "serve on another file of the same size resumed $DEV: the filesystem on it now reads another file's data"
        fi
        [ $(( $(now) - _t0 )) -lt "$READY_SECS" ] || { diagnose "$_op"; fail "serve on another file neither exited nor got ready in ${READY_SECS}s"; }
        sleep 0.2
    done
    _rc=0; wait "$_op" || _rc=$?
    rm -f /tmp/other-pool
    server_lines /tmp/server-other.log | sed 's/^/server| /'
    [ "$_rc" = 1 ] || fail "serve on another file with ublk.id=$ID exited $_rc (want 1: refused, the device waiting for its own file)"
    grep -q "waiting for recovery of another backing file: it was serving inode $_ino " /tmp/server-other.log \
        || fail "serve on another file did not name inode $_ino, the file the device was serving: $(server_lines /tmp/server-other.log | tail -n 1 | cut -c1-200)"
    [ -b "$DEV" ] || fail "$DEV gone after the refused serve on another file"
    result other_file "refused, naming inode $_ino"
    say "serve on another file with ublk.id=$ID: exit 1, names inode $_ino; $DEV still waiting"
    ublk_server rec3 --set "pmem.path=$POOL" --set pmem.size=256M --set ublk.id="$ID" --set ublk.recovery=true
    [ "$DEV" = "/dev/ublkb$ID" ] || fail "recovery onto the right file with ublk.id=$ID came up as $DEV"
    grep -q ', recovered)' "$SLOG" || fail "serve on the device's own file did not resume it: $(last_line)"
    timeout 60 dd if="$DEV" of=/dev/null bs=1M count=8 iflag=direct 2>/dev/null || fail "read from the resumed $DEV failed"
    result same_file "resumed"
    stop_server
}

# ---------------------------------------------------------------------------------------------
# run_part NAME: the scenario in a subshell with errexit; whatever it leaves behind is ended.
run_part() {
    PART=$1 RESULT_PREFIX=$1.
    _t0=$(now)
    : >"/tmp/pids.$PART"
    rm -f "/tmp/why.$PART" "/tmp/progress.$PART"
    dmesg_mark
    say "start"
    ( set -e
      case $PART in
          ublk-nbd) part_ublk_nbd ;;
          ublk-pmem) part_ublk_pmem ;;
          ublk) part_ublk ;;
          ublk-recovery) part_ublk_recovery ;;
      esac )
    _rc=$?
    # Clean-up for the next scenario: filesystems on ublk and NBD first (while a server may still answer),
    # then the processes (SIGTERM lets a server delete its device), then the NBD client.
    if mountpoint -q "$FS" 2>/dev/null; then timeout 30 umount "$FS" 2>/dev/null || umount -l "$FS" 2>/dev/null; fi
    while read -r p; do alive "$p" && kill -TERM "$p" 2>/dev/null; done <"/tmp/pids.$PART"
    while read -r p; do wait_gone "$p" 30 || kill -KILL "$p" 2>/dev/null; done <"/tmp/pids.$PART"
    [ -e /sys/block/nbd0/pid ] && timeout 30 nbd-client -d /dev/nbd0 >/dev/null 2>&1
    if [ "$_rc" = 0 ]; then
        result status pass
    else
        result status fail
        [ -e "/tmp/why.$PART" ] \
            || result why "a step failed (exit $_rc) after: $(cat "/tmp/progress.$PART" 2>/dev/null)"
    fi
    result secs "$(( $(now) - _t0 ))"
    say "end (status $_rc)"
}

modprobe -a ublk_drv nbd || { result why "modprobe ublk_drv nbd failed"; exit 1; }
[ -c /dev/ublk-control ] || { result why "no /dev/ublk-control after modprobe ublk_drv"; exit 1; }
want() { case " $ARGS " in *" $1 "*) return 0 ;; esac; return 1; }
ARGS=" $* "
want ublk-nbd && run_part ublk-nbd
want ublk-pmem && run_part ublk-pmem
want ublk && run_part ublk
want ublk-recovery && run_part ublk-recovery
mountpoint -q "$PM" && umount "$PM"
exit 0
