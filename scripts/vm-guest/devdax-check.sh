#!/bin/sh
# Scenario "devdax", run inside a guest with an emulated NVDIMM (scripts/vm --nvdimm): the namespace in
# device-DAX mode (/dev/dax0.0, no filesystem), `pmemblk info` on it (is_pmem, size), `pmemblk serve` on it,
# a qemu-io FUA pattern write and read through the export, and SIGTERM exiting 0.
# Lines starting with "RESULT " are read by the host.
set -eu
. "$(dirname "$0")/guest-java.sh" # PMEMBLK_GUEST_CMD: java with the launcher's JVM arguments
J=$PMEMBLK_GUEST_CMD
SOCK=/tmp/nbd.sock
say() { echo "devdax-check: [$(cut -d' ' -f1 /proc/uptime)s] $*"; }

modprobe -a nfit nd_pmem dax_pmem device_dax
ndctl create-namespace -f -e namespace0.0 -m devdax --map=mem >/dev/null
[ -c /dev/dax0.0 ] || { say "no /dev/dax0.0 after ndctl create-namespace -m devdax"; exit 1; }
# shellcheck disable=SC2086 # J is a word list
$J info --set pmem.path=/dev/dax0.0 >/tmp/info.out 2>&1 || { cat /tmp/info.out; exit 1; }
sed 's/^/info| /' /tmp/info.out
echo "RESULT is_pmem=$(sed -n 's/^is_pmem=//p' /tmp/info.out)"
echo "RESULT size=$(sed -n 's/^size=\([0-9]*\).*/\1/p' /tmp/info.out)"
# shellcheck disable=SC2086
$J serve --set pmem.path=/dev/dax0.0 --set nbd.socket=$SOCK --set nbd.port=0 >/tmp/server.log 2>&1 &
PID=$!
t0=$(cut -d. -f1 /proc/uptime)
until grep -q '^ready:' /tmp/server.log; do
    kill -0 "$PID" 2>/dev/null || { say "server exited:"; cat /tmp/server.log; exit 1; }
    [ $(( $(cut -d. -f1 /proc/uptime) - t0 )) -lt 120 ] || { say "server not ready in 120 s"; cat /tmp/server.log; exit 1; }
    sleep 0.1
done
qemu-io -f raw -c 'write -P 0x5a -f 1M 1M' -c 'flush' -c 'read -P 0x5a 1M 1M' "nbd+unix:///pmem0?socket=$SOCK" >/tmp/qio.out 2>&1
cat /tmp/qio.out
if grep -q "Pattern verification failed" /tmp/qio.out || ! grep -q "read 1048576/1048576" /tmp/qio.out; then
    say "pattern mismatch"; exit 1
fi
echo "RESULT pattern=ok"
kill -TERM "$PID"
rc=0; wait "$PID" || rc=$?
echo "RESULT serve_exit=$rc"
