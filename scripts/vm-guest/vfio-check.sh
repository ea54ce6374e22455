#!/bin/sh
# Scenario "vfio", run inside a guest with an emulated NVDIMM and QEMU's edu DMA device behind an emulated Intel
# IOMMU (scripts/vm --nvdimm --vfio-edu). edu is bound to vfio-pci; the server serves device DAX with
# dma.engine=vfio, route.dma.bounce=true and route.dma.min-bytes=8K, so every 8 KiB request is copied by edu through the IOMMU:
#   patterned 8 KiB writes and reads through the export; metrics: DMA bytes, and the device's own transfer count
#   (its completion interrupts) agrees with them; SIGTERM exits 0 after unmapping; the pattern reads back after a
#   restart; `pmemblk dma check` DMAs to an unmapped IOVA (no byte moves; the kernel logs the DMAR fault); serving
#   an fsdax file with dma.engine=vfio is refused with the fix in the message.
# Lines starting with "RESULT " are read by the host.
set -eu
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
SOCK=/tmp/nbd.sock
URI="nbd+unix:///pmem0?socket=$SOCK"
PORT=9465
N=${VFIO_REQUESTS:-16}      # 8 KiB requests per pass (3 passes); edu needs ~0.8 s for each

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
ARGS="--set pmem.path=/dev/dax0.0 --set dma.engine=vfio --set dma.vfio.devices=$ADDR
      --set route.dma.bounce=true --set route.dma.min-bytes=8K --set queues=1 --set queue.depth=16 --set queue.buffer-bytes=32M --set metrics.port=$PORT"

dax_server() {  # dax_server N: serve on the device DAX node (lib.sh start_server), its log N
    # shellcheck disable=SC2086 # ARGS is a word list
    start_server "/tmp/server-$1.log" $ARGS
    sed 's/^/server| /' "/tmp/server-$1.log"
}
stop_server() {
    serve_stop 60 || SERVER_RC=timeout
    sed 's/^/server| /' "/tmp/server-$1.log" | grep -E 'vfio|ready|pmemblk' | tail -n 3 || true
    result "serve_exit_$1" "$SERVER_RC"
    if grep -q 'vfio: unmapped' "/tmp/server-$1.log"; then result "unmapped_$1" yes; else result "unmapped_$1" no; fi
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
    if grep -q 'Pattern verification failed' "/tmp/qio-$1.out" \
        || [ "$(grep -c -E "^(wrote|read) 8192/8192" "/tmp/qio-$1.out")" != "$N" ]; then
        cat "/tmp/qio-$1.out"; return 1
    fi
}

dax_server 1
t0=$(cut -d. -f1 /proc/uptime)
if qemu_io_pass write; then result written ok; else result written bad; fi
if qemu_io_pass read; then result read ok; else result read bad; fi
say "$((2 * N)) requests of 8 KiB in $(( $(cut -d. -f1 /proc/uptime) - t0 )) s"
scrape "$PORT" /tmp/metrics.txt || { say "metrics not served on port $PORT"; exit 1; }
grep -E '^pmemblk_(copy_bytes|dma_device|dma_errors|dma_fallbacks)' /tmp/metrics.txt | sed 's/^/metrics| /'
result dma_bytes "$(metric_sum /tmp/metrics.txt pmemblk_copy_bytes_total 'route="dma"')"
result device_transfers "$(metric_sum /tmp/metrics.txt pmemblk_dma_device_transfers_total)"
result dma_errors "$(metric_sum /tmp/metrics.txt pmemblk_dma_errors_total)"
stop_server 1

dax_server 2
if qemu_io_pass read; then result reread ok; else result reread bad; fi
stop_server 2

# The IOMMU proof, through the same layer: a DMA to an IOVA that is no longer mapped.
dmesg -c >/dev/null 2>&1 || true
# shellcheck disable=SC2086 # the command is a word list
if $PMEMBLK_GUEST_CMD dma check --device "$ADDR" >/tmp/check.out 2>&1; then result check ok; else result check bad; fi
sed 's/^/check| /' /tmp/check.out
IOVA=$(sed -n 's/.*DMA to unmapped IOVA \(0x[0-9a-f]*\):.*/\1/p' /tmp/check.out)
result unmapped_iova "${IOVA:-none}"
# The kernel logs the fault from its fault interrupt, shortly after: bounded wait for the line naming the address.
dmar_fault() { dmesg | grep -q 'DMAR:.*fault addr'; }
wait_until $$ 5 dmar_fault || true   # $$: no process to outlive, only the 5 s bound
FAULT=$(dmesg | grep -m1 'DMAR:.*fault addr' || true)
result dmar_fault "${FAULT:-none}"

# fsdax: the kernel will not pin it for device DMA; serve must say so and what to use instead.
ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/dev/null
mkfs.ext4 -q -F -b 4096 /dev/pmem0
mkdir -p /mnt/pm && mount -o dax /dev/pmem0 /mnt/pm
rc=0
# shellcheck disable=SC2086 # the command is a word list
$PMEMBLK_GUEST_CMD serve --set pmem.path=/mnt/pm/pool --set pmem.size=16M --set nbd.socket=$SOCK --set nbd.port=0 --set dma.engine=vfio \
    --set dma.vfio.devices="$ADDR" >/tmp/fsdax.out 2>&1 || rc=$?
sed 's/^/fsdax| /' /tmp/fsdax.out
result fsdax_exit "$rc"
if grep -q 'fsdax' /tmp/fsdax.out && grep -q 'device-DAX' /tmp/fsdax.out; then result fsdax_message ok; else result fsdax_message bad; fi
umount /mnt/pm
