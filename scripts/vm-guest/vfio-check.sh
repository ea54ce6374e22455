#!/bin/sh
# Scenario "vfio", run inside a guest with an emulated NVDIMM and QEMU's edu DMA device behind an emulated Intel
# IOMMU (scripts/vm --nvdimm --vfio-edu). edu is bound to vfio-pci; the server serves device DAX with
# dma.engine=vfio and route.dma.min-bytes=8K, so every 8 KiB request is copied by edu through the IOMMU:
#   patterned 8 KiB writes and reads through the export; metrics: DMA bytes, and the device's own transfer count
#   (its completion interrupts) agrees with them; SIGTERM exits 0 after unmapping; the pattern reads back after a
#   restart; `pmemblk dma check` DMAs to an unmapped IOVA (no byte moves; the kernel logs the DMAR fault); serving
#   an fsdax file with dma.engine=vfio is refused with the fix in the message.
# Lines starting with "RESULT " are read by the host.
set -eu
. "$(dirname "$0")/guest-java.sh" # PMEMBLK_GUEST_CMD: java with the launcher's JVM arguments
J=$PMEMBLK_GUEST_CMD
SOCK=/tmp/nbd.sock
URI="nbd+unix:///pmem0?socket=$SOCK"
PORT=9465
N=${VFIO_REQUESTS:-16}      # 8 KiB requests per pass (3 passes); edu needs ~0.8 s for each
say() { echo "vfio-check: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }

modprobe -a vfio-pci nfit nd_pmem dax_pmem device_dax
ADDR=
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/vendor")" = 0x1234 ] && [ "$(cat "$d/device")" = 0x11e8 ]; then ADDR=${d##*/}; break; fi
done
[ -n "$ADDR" ] || { say "no edu device (1234:11e8) in the guest"; exit 1; }
echo vfio-pci >"/sys/bus/pci/devices/$ADDR/driver_override"
if [ -e "/sys/bus/pci/devices/$ADDR/driver" ]; then echo "$ADDR" >"/sys/bus/pci/devices/$ADDR/driver/unbind"; fi
echo "$ADDR" >/sys/bus/pci/drivers_probe
say "edu at $ADDR bound to $(basename "$(readlink "/sys/bus/pci/devices/$ADDR/driver")"), IOMMU group $(basename "$(readlink "/sys/bus/pci/devices/$ADDR/iommu_group")")"

ndctl create-namespace -f -e namespace0.0 -m devdax --map=mem >/dev/null
[ -c /dev/dax0.0 ] || { say "no /dev/dax0.0 after ndctl create-namespace -m devdax"; exit 1; }
ARGS="--set pmem.path=/dev/dax0.0 --set nbd.socket=$SOCK --set nbd.port=0 --set dma.engine=vfio --set dma.vfio.devices=$ADDR
      --set route.dma.min-bytes=8K --set queues=1 --set queue.depth=16 --set queue.buffer-bytes=32M --set metrics.port=$PORT"

PID=
start_server() {
    rm -f "$SOCK"
    # shellcheck disable=SC2086
    $J serve $ARGS >"/tmp/server-$1.log" 2>&1 &
    PID=$!
    t0=$(cut -d. -f1 /proc/uptime)
    until grep -q '^ready:' "/tmp/server-$1.log"; do
        kill -0 "$PID" 2>/dev/null || { say "server exited:"; cat "/tmp/server-$1.log"; exit 1; }
        [ $(( $(cut -d. -f1 /proc/uptime) - t0 )) -lt 120 ] || { say "server not ready in 120 s"; cat "/tmp/server-$1.log"; exit 1; }
        sleep 0.1
    done
    sed 's/^/server| /' "/tmp/server-$1.log"
}
stop_server() {
    kill -TERM "$PID"
    rc=0; wait "$PID" || rc=$?
    sed 's/^/server| /' "/tmp/server-$1.log" | grep -E 'vfio|ready|pmemblk' | tail -n 3 || true
    echo "RESULT serve_exit_$1=$rc"
    grep -q 'vfio: unmapped' "/tmp/server-$1.log" && echo "RESULT unmapped_$1=yes" || echo "RESULT unmapped_$1=no"
}
# qemu_io_pass write|read: N 8 KiB requests, request i at i*64K with pattern byte i+1.
qemu_io_pass() {
    cmds=''
    i=0
    while [ "$i" -lt "$N" ]; do
        cmds="$cmds -c '$1 -P $((i + 1)) $((i * 65536)) 8k'"
        i=$((i + 1))
    done
    eval "qemu-io -f raw $cmds '$URI'" >"/tmp/qio-$1.out" 2>&1 || { cat "/tmp/qio-$1.out"; return 1; }
    # qemu-io reports "wrote 8192/8192 bytes at offset ..." and "read 8192/8192 ...".
    ! grep -q 'Pattern verification failed' "/tmp/qio-$1.out" && [ "$(grep -c -E "^(wrote|read) 8192/8192" "/tmp/qio-$1.out")" = "$N" ] \
        || { cat "/tmp/qio-$1.out"; return 1; }
}
metric() {  # metric NAME [LABEL-REGEX]: the sum of a metric's samples (matching the label regex)
    awk -v n="$1" -v l="${2:-}" '$1 ~ "^"n"([{]|$)" && $1 ~ l { s += $NF } END { printf "%d\n", s }' /tmp/metrics.txt
}

start_server 1
t0=$(cut -d. -f1 /proc/uptime)
qemu_io_pass write && echo "RESULT written=ok" || echo "RESULT written=bad"
qemu_io_pass read && echo "RESULT read=ok" || echo "RESULT read=bad"
say "$((2 * N)) requests of 8 KiB in $(( $(cut -d. -f1 /proc/uptime) - t0 )) s"
curl -fsS "http://127.0.0.1:$PORT/metrics" >/tmp/metrics.txt || { say "metrics not served"; exit 1; }
grep -E '^pmemblk_(copy_bytes|dma_device|dma_errors|dma_fallbacks)' /tmp/metrics.txt | sed 's/^/metrics| /'
echo "RESULT dma_bytes=$(metric pmemblk_copy_bytes_total 'route="dma"')"
echo "RESULT device_transfers=$(metric pmemblk_dma_device_transfers_total)"
echo "RESULT dma_errors=$(metric pmemblk_dma_errors_total)"
stop_server 1

start_server 2
qemu_io_pass read && echo "RESULT reread=ok" || echo "RESULT reread=bad"
stop_server 2

# The IOMMU proof, through the same layer: a DMA to an IOVA that is no longer mapped.
dmesg -c >/dev/null 2>&1 || true
# shellcheck disable=SC2086
$J dma check --device "$ADDR" >/tmp/check.out 2>&1 && echo "RESULT check=ok" || echo "RESULT check=bad"
sed 's/^/check| /' /tmp/check.out
IOVA=$(sed -n 's/.*DMA to unmapped IOVA \(0x[0-9a-f]*\):.*/\1/p' /tmp/check.out)
echo "RESULT unmapped_iova=${IOVA:-none}"
# The kernel logs the fault from its fault interrupt, shortly after: bounded wait for the line naming the address.
i=0
until dmesg | grep -q 'DMAR:.*fault addr'; do
    i=$((i + 1)); [ "$i" -lt 50 ] || break; sleep 0.1
done
FAULT=$(dmesg | grep -m1 'DMAR:.*fault addr' || true)
echo "RESULT dmar_fault=${FAULT:-none}"

# fsdax: the kernel will not pin it for device DMA; serve must say so and what to use instead.
ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/dev/null
mkfs.ext4 -q -F -b 4096 /dev/pmem0
mkdir -p /mnt/pm && mount -o dax /dev/pmem0 /mnt/pm
rc=0
# shellcheck disable=SC2086
$J serve --set pmem.path=/mnt/pm/pool --set pmem.size=16M --set nbd.socket=$SOCK --set nbd.port=0 --set dma.engine=vfio \
    --set dma.vfio.devices="$ADDR" >/tmp/fsdax.out 2>&1 || rc=$?
sed 's/^/fsdax| /' /tmp/fsdax.out
echo "RESULT fsdax_exit=$rc"
grep -q 'fsdax' /tmp/fsdax.out && grep -q 'device-DAX' /tmp/fsdax.out && echo "RESULT fsdax_message=ok" || echo "RESULT fsdax_message=bad"
umount /mnt/pm
