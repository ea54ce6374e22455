#!/bin/sh
# Scenarios "vhost" and "vhost-restart", run inside the guest by scripts/vm-test (through scripts/vm
# --vhost-user-blk SOCK --vhost-reconnect): the disk is a vhost-user-blk server on the host (pmemblk serve with
# vhost.socket, or qemu-storage-daemon as a reference), 2 virtqueues, and the host restarts or kills that server when
# this script asks (host_request, scripts/lib/vm-host.sh). One boot each:
#   vhost-check.sh functional  on the raw disk: blkdiscard of a written range and blkdiscard -z (the device offers
#                              both: zeros read back); fio verify (crc32c, 4k..1m, libaio, direct, iodepth 32), one
#                              job pinned to each vCPU so both virtqueues carry requests (their interrupts counted);
#                              the host's metrics: both copy routes used (pmemblk); mkfs.ext4, files with sha256 sums;
#                              the server restarted by the host (SIGTERM, same file) under the running guest; caches
#                              dropped, e2fsck -fn clean, every sum verified
#   vhost-check.sh restart     fio verify on the raw disk, 2 jobs; after its first writes the host SIGKILLs the
#                              server and starts a new one (QEMU reconnects): fio must end clean, with I/O held
#                              across the gap, and the kernel log without an I/O error
#   vhost-check.sh wcache      the guest turns its write cache off (cache_type "write through": it then sends no
#                              FLUSH and takes every completed write as durable); the host SIGKILLs the server and
#                              starts a new one (QEMU reconnect=1 sends no SET_CONFIG); the guest writes 4 blocks;
#                              the host's power cut of the server's view: the pages of the disk file the server
#                              still holds dirty (not written back) are what a power cut now loses, and must be none
#   vhost-check.sh dmakill     the server copies through a device process on the host (dma.engine=vfio-user); fio
#                              verify in 2 MiB requests; once the DMA route carried 16 MiB the host SIGKILLs the
#                              device and starts it again, fio still running: fio ends clean, and the DMA route grows
#                              again after the return
#   vhost-check.sh backup      (after functional, pmemblk with the dirty bitmap b) the host takes a full copy over the
#                              server's NBD socket, this guest writes at random (4 KiB, direct) and discards 1 MiB on
#                              the raw disk, the host copies the dirty blocks of a checkpoint onto the full copy: its
#                              sha256 must equal the disk's
#   Modes may be given together (vhost-check.sh wcache restart): one boot runs each in turn; a wcache failure is its
#   own result (RESULT wcache_why=...) and the next mode still runs.
# Output: RESULT lines (the host's scripts/vm-test reads them), "RESULT why=..." when a step failed.
# Environment: BACKEND (pmemblk or qsd: qemu-storage-daemon has no copy routes), DISK_BYTES (the export's size).
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
MNT=/mnt/vhost
BACKEND=${BACKEND:-pmemblk}
# fio writes a verify state file into its working directory; /tmp is the writable one here.
cd /tmp || exit 1

fail() { result why "$*"; say "FAIL: $*"; exit 1; }

FIO_VERIFY_SECS=600
dmesg_mark
DEV=$(vm_disk vhost0) || fail "no vhost-user-blk disk in the guest ($(vm_disk vhost0 2>&1))"
VD=${DEV#/dev/}

# The disk as the guest sees it: its size, 2 hardware queues, each with its own interrupt (virtioN-req.Q).
check_disk() {
    _sz=$(blockdev --getsize64 "$DEV")
    [ "$_sz" = "${DISK_BYTES:-$_sz}" ] || fail "$DEV has $_sz bytes, the export $DISK_BYTES"
    _q=$(count "/sys/block/$VD/mq"/*)
    result queues "$_q"
    [ "$_q" = 2 ] || fail "$DEV has $_q hardware queues, want 2 (vhost-user-blk-pci num-queues=2)"
    VIRTIO=$(basename "$(readlink -f "/sys/block/$VD/device")")
    say "$DEV: $_sz bytes, $_q queues, block size $(blockdev --getss "$DEV"), $VIRTIO"
}
# queue_interrupts: "N0 N1", the interrupts each virtqueue has raised so far (summed over the CPUs).
queue_interrupts() {
    for _qi in 0 1; do
        awk -v q="$VIRTIO-req.$_qi" '$NF == q { for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break }
            END { printf "%d ", s }' /proc/interrupts
    done
}

# fio_verify2 NAME SIZE-PER-JOB: fio verify (lib.sh) in two jobs, each pinned to its own vCPU (so on its own
# virtqueue: blk-mq maps a CPU to a queue) and its own SIZE-PER-JOB of the disk.
fio_verify2() {
    fio_verify_run "$1" --filename="$DEV" --numjobs=2 --cpus_allowed=0-1 --cpus_allowed_policy=split --size="$2" \
        --offset_increment="$2"
}

functional() {
    check_disk
    _dm=$(cat "/sys/block/$VD/queue/discard_max_bytes") _zm=$(cat "/sys/block/$VD/queue/write_zeroes_max_bytes")
    result discard_max "$_dm"; result write_zeroes_max "$_zm"
    [ "$_dm" -gt 0 ] || fail "$DEV offers no discard (queue/discard_max_bytes=0): VIRTIO_BLK_F_DISCARD not negotiated"
    [ "$_zm" -gt 0 ] || fail "$DEV offers no write zeroes (queue/write_zeroes_max_bytes=0): blkdiscard -z would only write zeros itself"
    discard_check "$DEV"
    result discard ok
    say "blkdiscard and blkdiscard -z: ok (zeros read back)"

    _i0=$(queue_interrupts)
    _rc=0; fio_verify2 verify 64M || _rc=$?
    fio_verify_check verify "$_rc"
    _i1=$(queue_interrupts)
    # shellcheck disable=SC2086 # two numbers each
    _iq=$(echo $_i0 $_i1 | awk '{ print $3 - $1, $4 - $2 }')
    result queue_interrupts "$_iq"
    say "fio verify clean; interrupts per virtqueue during it: $_iq"
    case "$_iq" in 0\ *|*\ 0) fail "a virtqueue raised no interrupt during fio verify ($_iq): both queues were not used" ;; esac
    result fio verified

    if [ "$BACKEND" = pmemblk ]; then
        host_request 60 metrics >/tmp/metrics.txt || fail "the host could not read the server's metrics: $(cat /tmp/metrics.txt)"
        _d=$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="dma"')
        _c=$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="cpu"')
        grep -E '^pmemblk_(copy_bytes_total|dma_errors_total)' /tmp/metrics.txt | sed 's/^/metrics| /'
        result dma_bytes "$_d"; result cpu_bytes "$_c"
        if [ "$_d" -le 0 ] || [ "$_c" -le 0 ]; then fail "copy routes not both used: dma=$_d cpu=$_c bytes"; fi
    fi

    mkfs.ext4 -q -F "$DEV"
    mkdir -p "$MNT"
    mount "$DEV" "$MNT"
    for s in 4K 64K 1M 8M 32M; do head -c "$s" /dev/urandom >"$MNT/file-$s"; done
    (cd "$MNT" && sha256sum file-* >/tmp/vhost.sums)
    sed 's/^/SUM /' /tmp/vhost.sums
    umount "$MNT"
    timeout 120 e2fsck -fn "$DEV" >/tmp/fsck1.out 2>&1 || { cat /tmp/fsck1.out; fail "e2fsck -fn not clean before the restart"; }

    _ans=$(host_request 300 restart) || fail "the host could not restart the server: $_ans"
    say "host: $_ans"
    result restart "$_ans"
    # Nothing of the disk may come from this guest's caches: what is read next comes from the new server.
    blockdev --flushbufs "$DEV"
    echo 3 >/proc/sys/vm/drop_caches
    timeout 300 e2fsck -fn "$DEV" >/tmp/fsck2.out 2>&1 || { cat /tmp/fsck2.out; fail "e2fsck -fn not clean after the server restart"; }
    result fsck clean
    mount -o ro "$DEV" "$MNT"
    (cd "$MNT" && sha256sum -c --quiet /tmp/vhost.sums) || fail "sha256 sums differ after the server restart"
    result verified "$(wc -l </tmp/vhost.sums)"
    umount "$MNT"
    check_dmesg
    result dmesg clean
}

backup() {
    _ans=$(host_request 300 backup full) || fail "the host's full copy: $_ans"
    say "host: $_ans"
    timeout 300 fio --name=backup --filename="$DEV" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --size=256M \
        --io_size=1M --iodepth=16 --randrepeat=0 --norandommap --output=/tmp/fio-backup.out >/dev/null 2>&1 \
        || { cat /tmp/fio-backup.out; fail "fio's random writes to $DEV failed"; }
    blkdiscard -o $((300 << 20)) -l $((1 << 20)) "$DEV" || fail "blkdiscard of 1 MiB of $DEV failed"
    _ans=$(host_request 300 backup increment) || fail "the host's incremental copy: $_ans"
    say "host: $_ans"
    result backup_detail "$_ans"
    result backup equal
}

restart() {
    check_disk
    # 2 x 192 MiB of writes, then all read back; the kill comes once 32 MiB are written, so most of the writes
    # and all the reads are still to come when the server goes.
    fio_verify2 kill 192M &
    FPID=$!
    _want=$((32 * 2048)) _t=$(( $(now) + 300 )) _w=0
    while [ "$_w" -lt "$_want" ]; do
        alive "$FPID" || { cat /tmp/fio-kill.out; fail "fio ended before 32 MiB were written ($_w sectors)"; }
        [ "$(now)" -lt "$_t" ] || fail "fio wrote only $_w sectors in 300 s"
        sleep 0.1
        _w=$(awk '{ print $7 }' "/sys/block/$VD/stat")
    done
    _ans=$(host_request 300 kill) || fail "the host could not kill and restart the server: $_ans"
    say "host: $_ans (after $_w sectors written)"
    result kill "$_ans"
    result killed_after_sectors "$_w"
    alive "$FPID" || { cat /tmp/fio-kill.out; fail "fio had ended by the time the new server was ready: nothing was in flight across the kill"; }
    _rc=0
    wait "$FPID" || _rc=$?
    fio_verify_check kill "$_rc"
    result fio verified
    check_dmesg
    result dmesg clean
}

# wcache_write NAME SECTOR...: 4 KiB of fresh random data at each 4 KiB-aligned SECTOR, O_DIRECT, one write each.
wcache_write() {
    _wn=$1; shift
    for _ws in "$@"; do
        head -c 4096 /dev/urandom >"/tmp/wcache-$_wn-$_ws"
        dd if="/tmp/wcache-$_wn-$_ws" of="$DEV" bs=4096 seek=$((_ws / 8)) oflag=direct conv=notrunc status=none \
            || return 1
    done
}

# A failure of the wcache steps: its own result, and the cache back to writeback for the steps after it.
wfail() {
    result wcache_why "$*"; say "FAIL (wcache): $*"
    [ -w "/sys/block/$VD/cache_type" ] && echo "write back" >"/sys/block/$VD/cache_type"
    return 1
}

wcache() {
    check_disk
    _ct=/sys/block/$VD/cache_type
    # Writable only when the driver negotiated VIRTIO_BLK_F_CONFIG_WCE (virtio_blk's cache_type attribute).
    [ -w "$_ct" ] || { wfail "no writable $_ct: VIRTIO_BLK_F_CONFIG_WCE not negotiated"; return; }
    result wcache_initial "$(cat "$_ct")"
    echo "write through" >"$_ct" || { wfail "writing 'write through' to $_ct failed"; return; }
    [ "$(cat "$_ct")" = "write through" ] || { wfail "$_ct reads '$(cat "$_ct")' after 'write through' was written (the device refused the change)"; return; }
    [ "$(cat "/sys/block/$VD/queue/write_cache")" = "write through" ] || { wfail "queue/write_cache is '$(cat "/sys/block/$VD/queue/write_cache")': the kernel still sends FLUSH"; return; }
    wcache_write before 204800 204808 || { wfail "writes before the kill failed"; return; }
    _ans=$(host_request 300 kill) || { wfail "the host could not kill and restart the server: $_ans"; return; }
    say "host: $_ans"
    [ "$(cat "$_ct")" = "write through" ] || { wfail "$_ct reads '$(cat "$_ct")' after the reconnect"; return; }
    _base=$(host_request 60 dirty) || { wfail "the host could not read the server's dirty pages: $_base"; return; }
    [ "$_base" = 0 ] || { wfail "the new server holds $_base KiB of the disk dirty before the guest wrote: the check cannot tell"; return; }
    # 4 writes the guest takes as durable when they complete (no FLUSH follows: its cache is off)
    wcache_write after 409600 409608 409616 409624 || { wfail "writes after the restart failed"; return; }
    _lost=$(host_request 60 dirty) || { wfail "the host could not read the server's dirty pages: $_lost"; return; }
    result wcache_lost_kib "$_lost"
    [ "$_lost" = 0 ] || { wfail "a power cut of the server's view after its restart loses $_lost KiB of the 16 KiB the guest wrote with its write cache off: the new server served them writeback (no msync before the completion)"; return; }
    for _ws in 204800 204808 409600 409608 409616 409624; do
        _f=$(ls /tmp/wcache-*-"$_ws")
        dd if="$DEV" bs=4096 skip=$((_ws / 8)) count=1 iflag=direct status=none | cmp -s - "$_f" \
            || { wfail "sector $_ws does not read back what the guest wrote"; return; }
    done
    echo "write back" >"$_ct"
    result wcache durable
    say "write through kept across the server's SIGKILL and restart: the 4 writes after it durable when they completed (0 KiB dirty)"
}

# dma_now: DMA_NOW and CPU_NOW, the bytes the server's copy routes carried so far (its metrics, through the host).
dma_now() {
    host_request 30 metrics >/tmp/metrics.txt || fail "the host could not read the server's metrics: $(cat /tmp/metrics.txt)"
    DMA_NOW=$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="dma"')
    CPU_NOW=$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="cpu"')
}
# fio_2m NAME SIZE: fio verify on the raw disk in 2 MiB requests (each one request the server routes to DMA), write
# then read back (crc32c), 4 in flight.
fio_2m() {
    timeout -k 10 "$FIO_VERIFY_SECS" fio --name="$1" --filename="$DEV" --ioengine=libaio --direct=1 --rw=write \
        --bs=2M --iodepth=4 --size="$2" --verify=crc32c --verify_fatal=1 --do_verify=1 --verify_state_save=0 \
        --output="/tmp/fio-$1.out" >/dev/null 2>&1
}

# dmakill: the server copies through the device process (dma.engine=vfio-user); once the DMA route has carried
# 16 MiB of fio's 2 MiB requests the host SIGKILLs the device (the server must say the copies it held are redone by
# the CPU) and starts it again (the server must say it is back), all while fio runs; fio ends clean, and a second fio
# after the return grows the DMA route again (the host compares it with the bytes at the return).
dmakill() {
    check_disk
    # 480 MiB of the 512, written then read back (~30 s here): it outlasts the kill and the device's restart (a JVM
    # start, ~8 s)
    fio_2m dmakill 480M &
    FPID=$!
    _ans=$(host_request 240 dma-cycle $((16 << 20))) || { kill "$FPID" 2>/dev/null; fail "the device's kill and restart: $_ans"; }
    say "host: $_ans"
    result dma_cycle "$_ans"
    alive "$FPID" || { cat /tmp/fio-dmakill.out; fail "fio had ended before the device was back: the kill and the restart were not both under load"; }
    dma_now
    result cpu_at_return "$CPU_NOW"
    _rc=0
    wait "$FPID" || _rc=$?
    fio_verify_check dmakill "$_rc"
    fio_2m again 64M
    fio_verify_check again $?
    dma_now
    result dma_after "$DMA_NOW"; result cpu_after "$CPU_NOW"
    grep -E '^pmemblk_(copy_bytes_total|dma_)' /tmp/metrics.txt | sed 's/^/metrics| /'
    result fio verified
    check_dmesg
    result dmesg clean
}

[ $# -gt 0 ] || { echo "usage: vhost-check.sh functional|backup|restart|wcache|dmakill..." >&2; exit 2; }
for _mode in "$@"; do
    case "$_mode" in
        functional) functional ;;
        backup) backup ;;
        restart) restart ;;
        wcache) wcache || true ;;
        dmakill) dmakill ;;
        *) echo "usage: vhost-check.sh functional|backup|restart|wcache|dmakill..." >&2; exit 2 ;;
    esac
done
