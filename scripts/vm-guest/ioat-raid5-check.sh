#!/bin/sh
# Scenario "ioat-raid5", run inside the guest by scripts/vm-test (scripts/vm --vfio-user SOCK): pmemblk's software
# I/OAT device (`pmemblk dma-device` on the host) is a PCI function at IOAT_ADDR, and Linux's own ioatdma drives it.
# Phases, in one boot (PHASES, default "fault ioat cpu"):
#   fault a hostile driver in guest userspace (ioat-fault.py: descriptors and rings outside guest RAM, a source that
#         runs past its end, a bad completion address, RESET under load): each answered by a halted channel and a
#         CHANERR bit, nothing copied where a canary would show it; then ioatdma binds and passes its self-test
#         (the device serves the next client)
#   ioat  ioatdma (modprobe, unless the fault phase bound it): bound to IOAT_ADDR, its self-test passed (no
#         "Self-test ... disabling" in dmesg), the device's channels in /sys/class/dma (IOAT_CHANNELS of them), with
#         the RAID operations md needs to reach them (quickdata/cap: pq, pq_val, xor, xor_val, intr; why below); md
#         RAID5 over 4 brd ramdisks (mdadm from Debian, MDADM), fio verify on the array (crc32c, 4k..1m, direct,
#         iodepth 32): md hands its stripe-cache copies to the channels (async_memcpy; CONFIG_ASYNC_TX_DMA=y): the
#         bytes handed to ioatdma's memcpy prep (a kprobe with a hist trigger) are at least what fio wrote, and the
#         device's vectors interrupt; fio's verify and md's `check` (mismatch_cnt 0) then show the device's work
#         right; ext4 on the array with files and sums, e2fsck -fn clean, the sums read back after a remount
#   cpu   the same run on the same array with no DMA channel (raid456 and async_tx unloaded, ioatdma removed, raid456
#         loaded again): the CPU baseline
# Both phases count md's async_memcpy bytes, and the host's device process CPU time (host_request device-cpu).
# The /sys/class/dma counters (memcpy_count, bytes_transferred, in_use) of every channel are printed before and after:
# since Linux 3.19 (the net_dma removal) no generic code adds to memcpy_count/bytes_transferred (async_memcpy and
# ioatdma do not), so they stay 0 here and the kprobe's sum is the one asserted.
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
PHASES=${PHASES:-fault ioat cpu}
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
# The interrupts the device's vectors raised (ioatdma names them ioat-msix, ioat-msi or ioat-intx).
ioat_interrupts() {
    awk '/ioat/ { for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; else break } END { printf "%d\n", s }' /proc/interrupts
}
# device_cpu: the CPU time (clock ticks) the device process on the host has used so far (the host reads it).
device_cpu() {
    _ds=$(host_request 30 device-cpu) || fail "the host could not read the device's CPU time: $_ds"
    echo "$_ds" | sed -n 's/^ticks=\([0-9]*\).*/\1/p' | head -n 1
}

# Copies counted in the guest's kernel (the /sys/class/dma counters do not move): kprobe events with a hist trigger
# each, whose sums survive a full trace buffer. probe NAME SPEC FIELD defines one and sums FIELD (hist vals);
# probe_sum NAME FIELD reads the sum so far (0 when it never fired); probe_hits NAME the hit count.
TRACE=/sys/kernel/tracing
trace_mount() {
    [ -e "$TRACE/kprobe_events" ] || mount -t tracefs nodev "$TRACE" || fail "cannot mount tracefs on $TRACE"
}
probe() {
    echo "$2" >>"$TRACE/kprobe_events" || fail "kprobe '$2' refused: $(tail -n 3 "$TRACE/error_log" 2>/dev/null)"
    echo "hist:keys=common_type:vals=hitcount${3:+,$3}${4:+ $4}" >"/tmp/trigger.$1"
    cat "/tmp/trigger.$1" >"$TRACE/events/pmemblk/$1/trigger" \
        || fail "hist trigger on $1 refused: $(tail -n 3 "$TRACE/error_log" 2>/dev/null)"
    echo 1 >"$TRACE/events/pmemblk/$1/enable"
}
probe_sum() {
    awk -v f="$2:" '{ for (i = 1; i < NF; i++) if ($i == f) s += $(i + 1) } END { printf "%.0f\n", s }' \
        "$TRACE/events/pmemblk/$1/hist"
}
probe_hits() { probe_sum "$1" hitcount; }
probe_remove() {
    for _p in "$@"; do
        echo 0 >"$TRACE/events/pmemblk/$_p/enable"
        echo "!$(cat "/tmp/trigger.$_p")" >"$TRACE/events/pmemblk/$_p/trigger" || true
        echo "-:pmemblk/$_p" >>"$TRACE/kprobe_events"
    done
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
trace_mount

# md_probe: every async_memcpy md asks for (DMA or CPU: async_tx copies on the CPU when it finds no channel);
# async_memcpy(dest, src, dest_offset, src_offset, len, submit): len is the 5th argument (%r8).
md_probe() { probe mdcpy 'p:pmemblk/mdcpy async_memcpy len=%r8:u64' len; }

for phase in $PHASES; do
    case $phase in
    ioat)
        [ -e "/sys/bus/pci/devices/$IOAT_ADDR" ] || fail "no PCI device at $IOAT_ADDR (scripts/vm --vfio-user puts the first at slot 08)"
        say "$IOAT_ADDR: $(cat "/sys/bus/pci/devices/$IOAT_ADDR/vendor"):$(cat "/sys/bus/pci/devices/$IOAT_ADDR/device") class $(cat "/sys/bus/pci/devices/$IOAT_ADDR/class")"
        _t0=$(now)
        if [ -z "$(readlink "/sys/bus/pci/devices/$IOAT_ADDR/driver" 2>/dev/null)" ]; then
            # The probe (and its self-test, 3 s bound in the driver) runs in modprobe's context: done when it returns.
            modprobe ioatdma || fail "modprobe ioatdma failed"
        fi
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
        # md reaches a channel through async_tx only when the device has every RAID operation: Debian's kernel has
        # no CONFIG_ASYNC_TX_ENABLE_CHANNEL_SWITCH, so async_tx looks up DMA_ASYNC_TX, which dmaengine gives a device
        # with memcpy, xor, xor_val, pq, pq_val and interrupt (dmaengine.c device_has_all_tx_types); and ioatdma
        # makes a device whose DMACAPABILITY has neither XOR nor PQ private, out of async_tx's reach altogether
        # (init.c ioat3_dma_probe). ioatdma shows what it registered in quickdata/cap.
        _ch0=$(our_channels | head -n 1)
        _cap=$(cat "/sys/class/dma/$_ch0/quickdata/cap" 2>/dev/null)
        result ioat_cap "$_cap"
        say "ioatdma's capabilities (quickdata/cap): $_cap"
        for _op in pq pq_val xor xor_val intr; do
            case " $_cap " in *" $_op "*) ;; *)
                fail "the device offers no $_op (ioatdma's quickdata/cap: '$_cap'): md's async_tx uses only a DMA device with memcpy, xor, xor_val, pq, pq_val and interrupt (DMA_ASYNC_TX; Debian's kernel has no CONFIG_ASYNC_TX_ENABLE_CHANNEL_SWITCH), and ioatdma registers one without XOR or PQ in DMACAPABILITY as private: the device must offer PQ (DMACAPABILITY bit 9; ioatdma then runs xor as pq with Q disabled) for RAID5 to offload" ;;
            esac
        done
        modprobe raid456 || fail "modprobe raid456 failed"
        counters raid456_loaded
        # ioatdma's memcpy prep: len is the 4th argument (%cx); a NULL return (ring full) sends the copy to the CPU.
        probe ioatcpy 'p:pmemblk/ioatcpy ioat_dma_prep_memcpy_lock len=%cx:u64' len
        # shellcheck disable=SC2016 # $retval is the kprobe syntax's, not the shell's
        probe ioatcpyfail 'r:pmemblk/ioatcpyfail ioat_dma_prep_memcpy_lock ret=$retval:u64' '' 'if ret == 0'
        # Parity on the device: ioatdma's xor and xor_val preps (the pq-engine ones when the device has PQ alone),
        # len the 5th argument of xor (%r8) and the 4th of xor_val (%cx). Those the module lacks are left out.
        XOR_PROBES=''
        for _x in ioat_prep_xor:r8 ioat_prep_pqxor:r8 ioat_prep_xor_val:cx ioat_prep_pqxor_val:cx; do
            _f=${_x%%:*} _n=$(echo "${_x%%:*}" | sed 's/ioat_prep_//')
            if grep -q -w "$_f" /proc/kallsyms; then probe "$_n" "p:pmemblk/$_n $_f len=%${_x#*:}:u64" len; XOR_PROBES="$XOR_PROBES $_n"; fi
        done
        md_probe
        _c0=$(device_cpu) _i0=$(ioat_interrupts)
        raid_run ioat
        _c1=$(device_cpu) _i1=$(ioat_interrupts)
        counters after
        _w=$(fio_written ioat) _dma=$(probe_sum ioatcpy len) _md=$(probe_sum mdcpy len)
        result ioat_dma_bytes "$_dma"
        result ioat_dma_copies "$(probe_hits ioatcpy)"
        result ioat_prep_failed "$(probe_hits ioatcpyfail)"
        result ioat_md_copy_bytes "$_md"
        _xl=''
        for _n in $XOR_PROBES; do _xl="$_xl $_n=$(probe_sum "$_n" len)/$(probe_hits "$_n")"; done
        result ioat_parity "${_xl# }"
        say "ioat: parity work handed to the device (bytes/preps):${_xl:- none probed}"
        result ioat_interrupts "$((_i1 - _i0))"
        result ioat_device_ticks "$((_c1 - _c0))"
        say "ioat: md copied $_md bytes (async_memcpy), $_dma of them handed to ioatdma in $(probe_hits ioatcpy) descriptors ($(probe_hits ioatcpyfail) preps refused: CPU); fio wrote $_w; $((_i1 - _i0)) device interrupts; the device process used $((_c1 - _c0)) clock ticks"
        [ "$_dma" -ge "$_w" ] || fail "ioatdma was handed $_dma bytes of copies during the RAID5 run, fio wrote $_w: md did not offload its copies"
        [ $((_i1 - _i0)) -gt 0 ] || fail "no interrupt from the device's vectors during the run"
        check_dmesg
        # shellcheck disable=SC2086 # a list of names
        probe_remove ioatcpy ioatcpyfail mdcpy $XOR_PROBES
        array_stop
        # async_tx holds every public channel (dmaengine_get) while loaded: raid456 and the async_* modules first.
        modprobe -r raid456 || fail "modprobe -r raid456 failed: $(lsmod | grep -E '^(raid456|async)')"
        rmmod ioatdma || fail "rmmod ioatdma failed: $(lsmod | grep -E '^ioatdma')"
        [ "$(our_channels | wc -l)" = 0 ] || fail "channels of $IOAT_ADDR still in /sys/class/dma after rmmod ioatdma"
        result ioat_removed yes
        say "raid456, async_tx and ioatdma unloaded: no DMA channel left"
        ;;
    fault)
        # A hostile driver in userspace (ioat-fault.py) with no kernel driver bound, then ioatdma: the device must
        # serve the next client after every fault.
        [ -z "$(readlink "/sys/bus/pci/devices/$IOAT_ADDR/driver" 2>/dev/null)" ] || fail "fault: $IOAT_ADDR still has a driver"
        echo 4 >/proc/sys/vm/nr_hugepages
        _rc=0
        /usr/bin/python3 "$(dirname "$0")/ioat-fault.py" "$IOAT_ADDR" >/tmp/fault.out 2>&1 || _rc=$?
        cat /tmp/fault.out
        echo 0 >/proc/sys/vm/nr_hugepages
        [ "$_rc" = 0 ] || fail "fault: $(sed -n 's/^RESULT fault_why=//p' /tmp/fault.out | head -n 1)${_rc:+ (ioat-fault.py exit $_rc: $(tail -n 1 /tmp/fault.out))}"
        dmesg_mark
        modprobe ioatdma || fail "fault: modprobe ioatdma after the faults failed"
        _drv=$(basename "$(readlink "/sys/bus/pci/devices/$IOAT_ADDR/driver" 2>/dev/null)" 2>/dev/null)
        dmesg | tail -n +$((DMESG_MARK + 1)) | grep -i ioat | sed 's/^/dmesg| /'
        [ "$_drv" = ioatdma ] || fail "fault: ioatdma did not bind $IOAT_ADDR after the faults (driver: ${_drv:-none})"
        if dmesg | tail -n +$((DMESG_MARK + 1)) | grep -i ioat | grep -q -i -E 'self-test|disabling'; then
            fail "fault: ioatdma's self-test failed after the faults"
        fi
        _n=$(our_channels | wc -l)
        [ -z "$IOAT_CHANNELS" ] || [ "$_n" = "$IOAT_CHANNELS" ] || fail "fault: $_n channels after the faults, the device has $IOAT_CHANNELS"
        result fault_next_client "ioatdma bound, self-test passed, $_n channels"
        say "fault: ioatdma bound after the faults, self-test passed, $_n channels (the ioat phase goes on with it)"
        ;;
    cpu)
        modprobe raid456 || fail "modprobe raid456 failed"
        [ -z "$(ls /sys/class/dma 2>/dev/null)" ] || fail "a DMA channel is registered for the CPU baseline: $(ls /sys/class/dma)"
        md_probe
        case " $PHASES " in *" ioat "*) _c0=$(device_cpu) ;; esac
        raid_run cpu
        case " $PHASES " in *" ioat "*) _c1=$(device_cpu); result cpu_device_ticks "$((_c1 - _c0))" ;; esac
        result cpu_md_copy_bytes "$(probe_sum mdcpy len)"
        say "cpu: md copied $(probe_sum mdcpy len) bytes (async_memcpy) on the CPU; fio wrote $(fio_written cpu)"
        check_dmesg
        probe_remove mdcpy
        array_stop
        ;;
    *) fail "unknown phase '$phase' (ioat, fault, cpu)" ;;
    esac
done
result status pass
