#!/bin/sh
# Scenario "ioat-raid5", run inside the guest by scripts/vm-test (scripts/vm --vfio-user SOCK): pmemblk's software
# I/OAT device (`pmemblk dma-device` on the host) is a PCI function at IOAT_ADDR, and Linux's own ioatdma drives it.
# Phases, in one boot (PHASES, default "ioat cpu"):
#   ioat  modprobe ioatdma: bound to IOAT_ADDR, its self-test passed (no "Self-test ... disabling" in dmesg), the
#         device's channels in /sys/class/dma (IOAT_CHANNELS of them); md RAID5 over 4 brd ramdisks (mdadm from
#         Debian, MDADM), fio verify on the array (crc32c, 4k..1m, direct, iodepth 32): md hands its stripe-cache
#         copies to the public DMA_MEMCPY channels (async_memcpy; CONFIG_ASYNC_TX_DMA=y), so the device's own count
#         of bytes copied (asked of the host: host_request device-stats) grows by at least what fio wrote, and the
#         device's vectors interrupt; then `check` (mismatch_cnt 0), ext4 on the array with files and sums,
#         e2fsck -fn clean, the sums read back after a remount
#   cpu   the same run on the same array with no DMA channel (raid456 and async_tx unloaded, ioatdma removed, raid456 loaded
#         again): the CPU baseline; the device's count must not move
# The /sys/class/dma counters (memcpy_count, bytes_transferred, in_use) of every channel are printed before and after:
# since Linux 3.19 nothing but a few drivers' own code adds to memcpy_count/bytes_transferred (async_memcpy and
# ioatdma do not), so they stay 0 here and the device's count is the one asserted.
# Output: RESULT lines for the host (scripts/vm-test), "RESULT why=..." when a step failed.
# Environment: IOAT_ADDR (PCI address, default 0000:00:08.0), IOAT_CHANNELS (expected count), MDADM (the mdadm to
# run), RD_MIB (size of each ramdisk), FIO_MIB (bytes fio writes), PHASES.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
IOAT_ADDR=${IOAT_ADDR:-0000:00:08.0}
IOAT_CHANNELS=${IOAT_CHANNELS:-}
MDADM=${MDADM:-mdadm}
RD_MIB=${RD_MIB:-128}
FIO_MIB=${FIO_MIB:-256}
PHASES=${PHASES:-ioat cpu}
MD=md0
MNT=/mnt/r5
cd /tmp || exit 1

fail() { result why "$*"; say "FAIL: $*"; exit 1; }

# The channels the device registered: /sys/class/dma/dmaNchanM whose device is IOAT_ADDR.
our_channels() {
    for _c in /sys/class/dma/dma*chan*; do
        [ -e "$_c" ] || continue
        [ "$(basename "$(readlink -f "$_c/device")")" = "$IOAT_ADDR" ] && echo "${_c##*/}"
    done
}
# counters LABEL: every channel's memcpy_count, bytes_transferred and in_use on one line (and RESULT LABEL=...).
counters() {
    _line=''
    for _ch in $(our_channels); do
        _line="$_line $_ch:memcpy_count=$(cat "/sys/class/dma/$_ch/memcpy_count"),bytes_transferred=$(cat "/sys/class/dma/$_ch/bytes_transferred"),in_use=$(cat "/sys/class/dma/$_ch/in_use")"
    done
    result "sysfs_$1" "${_line# }"
    say "/sys/class/dma $1:${_line:- (no channel of $IOAT_ADDR)}"
}
# sum_counter NAME: the sum of NAME (memcpy_count, bytes_transferred) over our channels.
sum_counter() {
    _s=0
    for _ch in $(our_channels); do _s=$((_s + $(cat "/sys/class/dma/$_ch/$1"))); done
    echo "$_s"
}
# The interrupts the device's vectors raised (ioatdma names them ioat-msix, ioat-msi or ioat-intx).
ioat_interrupts() {
    awk '/ioat/ { for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break } END { printf "%d\n", s }' /proc/interrupts
}
# device_bytes: what the device itself says it copied (the host reads it from the device process).
device_bytes() {
    _ds=$(host_request 30 device-stats) || fail "the host could not read the device's counters: $_ds"
    echo "$_ds" | sed -n 's/.*bytes=\([0-9]*\).*/\1/p' | head -n 1
}
fio_written() {  # bytes fio wrote, from its report's "WRITE: ... io=NNNMiB" (MiB or KiB)
    sed -n 's/^ *WRITE:.* io=\([0-9.]*\)\([KMG]\)iB.*/\1 \2/p' "/tmp/fio-$1.out" | head -n 1 \
        | awk '{ m = ($2 == "K") ? 1024 : ($2 == "M") ? 1048576 : 1073741824; printf "%.0f\n", $1 * m }'
}
fio_bw() {  # "WRITE bw, READ bw" as fio prints them
    _w=$(sed -n 's/^ *WRITE: bw=\([^ ]*\) .*/\1/p' "/tmp/fio-$1.out" | head -n 1)
    _r=$(sed -n 's/^ *READ: bw=\([^ ]*\) .*/\1/p' "/tmp/fio-$1.out" | head -n 1)
    echo "write $_w, verify read $_r"
}

# array_create: RAID5 over the 4 ramdisks, chunk 64 KiB, parity taken as clean (brd reads zeros: consistent).
array_create() {
    for _r in 0 1 2 3; do "$MDADM" --zero-superblock "/dev/ram$_r" >/dev/null 2>&1 || true; done
    "$MDADM" --create "/dev/$MD" --run --level=5 --raid-devices=4 --chunk=64 --assume-clean \
        /dev/ram0 /dev/ram1 /dev/ram2 /dev/ram3 >/tmp/mdadm.out 2>&1 || { cat /tmp/mdadm.out; fail "mdadm --create failed: $(tail -n 1 /tmp/mdadm.out)"; }
    [ -b "/dev/$MD" ] || fail "no /dev/$MD after mdadm --create"
    say "$(grep -A1 "^$MD" /proc/mdstat)"
}
array_stop() {
    "$MDADM" --stop "/dev/$MD" >/tmp/mdadm-stop.out 2>&1 || { cat /tmp/mdadm-stop.out; fail "mdadm --stop failed"; }
}
# check_parity PHASE: md's own check (reads every stripe, recomputes parity), bounded; mismatch_cnt must be 0.
check_parity() {
    echo check >"/sys/block/$MD/md/sync_action"
    _t0=$(now)
    check_idle() { [ "$(cat "/sys/block/$MD/md/sync_action")" = idle ]; }
    wait_until $$ 300 check_idle || fail "$1: md check still running after 300 s ($(cat "/sys/block/$MD/md/sync_completed"))"
    _mm=$(cat "/sys/block/$MD/md/mismatch_cnt")
    result "${1}_mismatch_cnt" "$_mm"
    say "$1: check done in $(( $(now) - _t0 )) s, mismatch_cnt $_mm"
    [ "$_mm" = 0 ] || fail "$1: md check found mismatch_cnt=$_mm (parity does not match the data)"
}
# raid_run PHASE: fio verify on the array, md's check, then ext4 with files, e2fsck, the files read back.
raid_run() {
    array_create
    _t0=$(now)
    _rc=0
    FIO_VERIFY_SECS=600 fio_verify_run "$1" --filename="/dev/$MD" --size="${FIO_MIB}M" || _rc=$?
    fio_verify_check "$1" "$_rc"
    result "${1}_fio_secs" "$(( $(now) - _t0 ))"
    result "${1}_fio_bw" "$(fio_bw "$1")"
    result "${1}_fio_written" "$(fio_written "$1")"
    say "$1: fio verify on /dev/$MD clean in $(( $(now) - _t0 )) s: $(fio_bw "$1")"
    check_parity "$1"
    fs_check "$1"
}
fs_check() {
    mkfs.ext4 -q -F "/dev/$MD" || fail "mkfs.ext4 /dev/$MD failed"
    mkdir -p "$MNT"
    mount "/dev/$MD" "$MNT" || fail "mount /dev/$MD failed"
    for _i in 1 2 3 4 5 6 7 8; do head -c 4M /dev/urandom >"$MNT/f$_i"; done
    (cd "$MNT" && sha256sum f* >/tmp/r5.sums)
    sync
    umount "$MNT" || fail "umount $MNT failed"
    _rc=0
    e2fsck -fn "/dev/$MD" >/tmp/e2fsck.out 2>&1 || _rc=$?
    sed 's/^/e2fsck| /' /tmp/e2fsck.out
    result "${1}_e2fsck_rc" "$_rc"
    [ "$_rc" = 0 ] || fail "e2fsck -fn /dev/$MD exit $_rc: $(tail -n 1 /tmp/e2fsck.out)"
    mount -o ro "/dev/$MD" "$MNT" || fail "mount -o ro /dev/$MD failed"
    echo 3 >/proc/sys/vm/drop_caches
    (cd "$MNT" && sha256sum -c --quiet /tmp/r5.sums) || fail "a file's sha256 differs after the remount"
    umount "$MNT"
    result "${1}_fsck" clean
    say "$1: ext4 on /dev/$MD: 8 files of 4 MiB, e2fsck -fn clean, sums verified after a remount"
}

dmesg_mark
modprobe brd rd_nr=4 rd_size=$((RD_MIB * 1024)) || fail "modprobe brd failed"
"$MDADM" --version >/tmp/mdadm-version 2>&1 || fail "$MDADM does not run: $(cat /tmp/mdadm-version)"
say "$(cat /tmp/mdadm-version); 4 ramdisks of $RD_MIB MiB"

for phase in $PHASES; do
    case $phase in
    ioat)
        [ -e "/sys/bus/pci/devices/$IOAT_ADDR" ] || fail "no PCI device at $IOAT_ADDR (scripts/vm --vfio-user puts the first at slot 08)"
        say "$IOAT_ADDR: $(cat "/sys/bus/pci/devices/$IOAT_ADDR/vendor"):$(cat "/sys/bus/pci/devices/$IOAT_ADDR/device") class $(cat "/sys/bus/pci/devices/$IOAT_ADDR/class")"
        _t0=$(now)
        modprobe ioatdma || fail "modprobe ioatdma failed"
        # The probe (and its self-test, 3 s bound in the driver) runs in modprobe's context: done when it returns.
        dmesg | grep -i -E 'ioat|dca' | sed 's/^/dmesg| /'
        _drv=$(basename "$(readlink "/sys/bus/pci/devices/$IOAT_ADDR/driver" 2>/dev/null)" 2>/dev/null)
        result ioat_driver "${_drv:-none}"
        [ "$_drv" = ioatdma ] || fail "ioatdma did not bind $IOAT_ADDR (driver: ${_drv:-none})"
        if dmesg | grep -i 'ioat' | grep -q -i -E 'self-test|disabling'; then
            fail "ioatdma's self-test failed: $(dmesg | grep -i 'ioat' | grep -i -m1 -E 'self-test|disabling')"
        fi
        result selftest passed
        _n=$(our_channels | wc -l)
        result channels "$_n"
        say "ioatdma bound in $(( $(now) - _t0 )) s: $_n channels: $(our_channels | tr '\n' ' ')"
        [ "$_n" -gt 0 ] || fail "no channel of $IOAT_ADDR in /sys/class/dma"
        [ -z "$IOAT_CHANNELS" ] || [ "$_n" = "$IOAT_CHANNELS" ] || fail "$_n channels in /sys/class/dma, the device has $IOAT_CHANNELS"
        counters before
        modprobe raid456 || fail "modprobe raid456 failed"
        counters raid456_loaded
        _d0=$(device_bytes) _i0=$(ioat_interrupts) _s0=$(sum_counter bytes_transferred)
        raid_run ioat
        _d1=$(device_bytes) _i1=$(ioat_interrupts) _s1=$(sum_counter bytes_transferred)
        counters after
        _w=$(fio_written ioat)
        result device_bytes "$_d0 $_d1"
        result ioat_interrupts "$_i0 $_i1"
        result sysfs_bytes "$_s0 $_s1"
        say "device: $((_d1 - _d0)) bytes copied during the run (fio wrote $_w), ioat interrupts $((_i1 - _i0)), sysfs bytes_transferred $((_s1 - _s0))"
        [ $((_d1 - _d0)) -ge "$_w" ] || fail "the device copied $((_d1 - _d0)) bytes during the RAID5 run, fio wrote $_w: md did not hand its copies to ioatdma"
        [ $((_i1 - _i0)) -gt 0 ] || fail "no interrupt from the device's vectors during the run"
        check_dmesg
        array_stop
        # async_tx holds every public channel (dmaengine_get) while loaded: raid456 and the async_* modules first.
        modprobe -r raid456 || fail "modprobe -r raid456 failed: $(lsmod | grep -E '^(raid456|async)')"
        rmmod ioatdma || fail "rmmod ioatdma failed: $(lsmod | grep -E '^ioatdma')"
        [ "$(our_channels | wc -l)" = 0 ] || fail "channels of $IOAT_ADDR still in /sys/class/dma after rmmod ioatdma"
        result ioat_removed yes
        say "raid456, async_tx and ioatdma unloaded: no DMA channel left"
        ;;
    cpu)
        modprobe raid456 || fail "modprobe raid456 failed"
        [ -z "$(ls /sys/class/dma 2>/dev/null)" ] || fail "a DMA channel is registered for the CPU baseline: $(ls /sys/class/dma)"
        case " $PHASES " in *" ioat "*) _d0=$(device_bytes) ;; esac
        raid_run cpu
        case " $PHASES " in *" ioat "*)
            _d1=$(device_bytes)
            result cpu_device_bytes "$_d0 $_d1"
            [ "$_d1" = "$_d0" ] || fail "the device copied $((_d1 - _d0)) bytes during the CPU baseline" ;;
        esac
        check_dmesg
        array_stop
        ;;
    *) fail "unknown phase '$phase' (ioat, cpu)" ;;
    esac
done
result status pass
