#!/bin/sh
# Scenario "devdax", run inside a guest with an emulated NVDIMM (scripts/vm --nvdimm): the namespace in
# device-DAX mode (/dev/dax0.0, no filesystem), `pmemblk info` on it (is_pmem, size), `pmemblk serve` on it,
# a qemu-io FUA pattern write and read through the export, and SIGTERM exiting 0.
# Lines starting with "RESULT " are read by the host.
set -eu
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
SOCK=/tmp/nbd.sock

modprobe -a nfit nd_pmem dax_pmem device_dax
ndctl create-namespace -f -e namespace0.0 -m devdax --map=mem >/dev/null
[ -c /dev/dax0.0 ] || { say "no /dev/dax0.0 after ndctl create-namespace -m devdax"; exit 1; }
# shellcheck disable=SC2086 # the command is a word list
$PMEMBLK_GUEST_CMD info --set pmem.path=/dev/dax0.0 >/tmp/info.out 2>&1 || { cat /tmp/info.out; exit 1; }
sed 's/^/info| /' /tmp/info.out
result is_pmem "$(sed -n 's/^is_pmem=//p' /tmp/info.out)"
result size "$(sed -n 's/^size=\([0-9]*\).*/\1/p' /tmp/info.out)"
serve_start /tmp/server.log --set pmem.path=/dev/dax0.0 --set nbd.socket=$SOCK --set nbd.port=0
serve_ready /tmp/server.log 120 || exit 1
qemu-io -f raw -c 'write -P 0x5a -f 1M 1M' -c 'flush' -c 'read -P 0x5a 1M 1M' "nbd+unix:///pmem0?socket=$SOCK" >/tmp/qio.out 2>&1
cat /tmp/qio.out
if grep -q "Pattern verification failed" /tmp/qio.out || ! grep -q "read 1048576/1048576" /tmp/qio.out; then
    say "pattern mismatch"; exit 1
fi
result pattern ok
serve_stop 60 || exit 1
result serve_exit "$SERVER_RC"
