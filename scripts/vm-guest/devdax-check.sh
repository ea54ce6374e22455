#!/bin/sh
# Scenario "devdax", run inside a guest with an emulated NVDIMM (scripts/vm --nvdimm): the namespace in
# device-DAX mode (/dev/dax0.0, no filesystem), `pmemblk serve` on it (is_pmem and size from the region line it prints
# when it starts: what `pmemblk info` would print, without a JVM start of its own), a qemu-io FUA pattern write and
# read through the export, and SIGTERM exiting 0.
# Lines starting with "RESULT " are read by the host.
set -eu
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
SOCK=/tmp/nbd.sock
# However this ends, no server is left holding /dev/dax0.0 (vm-test may run vfio-check.sh next in the same guest).
trap '[ -z "$SERVER_PID" ] || kill -KILL "$SERVER_PID" 2>/dev/null || true' EXIT

modprobe -a nfit nd_pmem dax_pmem device_dax
ndctl create-namespace -f -e namespace0.0 -m devdax --map=mem >/dev/null
[ -c /dev/dax0.0 ] || { say "no /dev/dax0.0 after ndctl create-namespace -m devdax"; exit 1; }
serve_start /tmp/server.log --set pmem.path=/dev/dax0.0 --set nbd.socket=$SOCK --set nbd.port=0
serve_ready /tmp/server.log 120 || exit 1
server_lines /tmp/server.log | sed 's/^/server| /'
# "pmemblk: PmemRegion[/dev/dax0.0, N bytes, is_pmem=B, mapped by M], ..." (printed before the ready line)
result is_pmem "$(sed -n 's/^pmemblk: PmemRegion\[.*, is_pmem=\([a-z]*\),.*/\1/p' /tmp/server.log | head -n 1)"
result size "$(sed -n 's/^pmemblk: PmemRegion\[[^,]*, \([0-9]*\) bytes,.*/\1/p' /tmp/server.log | head -n 1)"
qemu-io -f raw -c 'write -P 0x5a -f 1M 1M' -c 'flush' -c 'read -P 0x5a 1M 1M' "nbd+unix:///pmem0?socket=$SOCK" >/tmp/qio.out 2>&1
cat /tmp/qio.out
if grep -q "Pattern verification failed" /tmp/qio.out || ! grep -q "read 1048576/1048576" /tmp/qio.out; then
    say "pattern mismatch"; exit 1
fi
result pattern ok
serve_stop 60 || exit 1
SERVER_PID=''
result serve_exit "$SERVER_RC"
