#!/bin/sh
# How long a server takes to be ready in the guest, without and with the AOT cache the guest JVMs start from
# (scripts/lib/guest-aot.sh, scripts/vm-guest/guest-java.sh), in ONE boot, alternately, ROUNDS times each: the A/B
# behind the cache, under the same load. "plain" is the launcher's own argument file and no cache; "aot" is what every
# guest JVM runs when the cache is there. The server is started as nvme-tcp-check.sh starts it (a pool in /tmp, the
# NVMe/TCP listener), stopped with SIGTERM once ready.
# Run (the cache made first, e.g. by any scripts/vm-test run of this build):
#   scripts/vm -- "sh /mnt/pmemblk/scripts/vm-guest/aot-starts.sh 2"
# Output: the two commands ("plain: ...", "aot: ..."), "start plain|aot N: ready after S s" lines, then RESULT starts.plain=
# and starts.aot= (the seconds, each start's); a JVM that cannot use the cache says so on stderr, into its log, and those
# lines are printed.
set -u
ROUNDS=${1:-1}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # PMEMBLK_GUEST_CMD (guest-java.sh), serve_start, serve_ready, serve_stop, now
[ -n "$PMEMBLK_GUEST_AOT_OPTS" ] || { echo "no AOT cache in $PMEMBLK_GUEST_HOME (any scripts/vm-test run makes one)"; exit 1; }
cd /tmp || exit 1
ip link set lo up
AOT_CMD=$PMEMBLK_GUEST_CMD
# guest-java.sh's command with the cache off, in a subshell: its settings here stay the cache's
# shellcheck source=guest-java.sh
PLAIN_CMD=$(unset PMEMBLK_GUEST_CMD; PMEMBLK_GUEST_AOT=0 && . "$(dirname "$0")/guest-java.sh" && echo "$PMEMBLK_GUEST_CMD")
echo "plain: $PLAIN_CMD"; echo "aot: $AOT_CMD"
plain='' aot='' r=1
one() {   # one plain|aot ROUND
    if [ "$1" = aot ]; then PMEMBLK_GUEST_CMD=$AOT_CMD; else PMEMBLK_GUEST_CMD=$PLAIN_CMD; fi
    rm -f /tmp/starts.pool /tmp/starts.log
    _t0=$(cut -d' ' -f1 /proc/uptime)
    serve_start /tmp/starts.log --set pmem.path=/tmp/starts.pool --set pmem.size=64M --set nbd.socket=/tmp/starts.sock \
        --set nbd.port=0 --set nvme.listen=127.0.0.1:4420 --set nvme.subsystem-nqn=nqn.2026-12.io.pmemblk:starts
    serve_ready /tmp/starts.log 600 '^ready: nvme-tcp ' || exit 1
    _s=$(echo "$(cut -d' ' -f1 /proc/uptime) $_t0" | awk '{ printf "%.1f", $1 - $2 }')
    echo "start $1 $2: ready after $_s s"
    grep -i -E '\[(aot|cds)\]|AOT cache' /tmp/starts.log | head -n 4 | sed "s/^/$1 jvm| /"
    serve_stop 120 || exit 1
    if [ "$1" = aot ]; then aot="$aot $_s"; else plain="$plain $_s"; fi
}
while [ "$r" -le "$ROUNDS" ]; do
    one plain "$r"
    one aot "$r"
    r=$((r + 1))
done
echo "RESULT starts.plain=${plain# }"
echo "RESULT starts.aot=${aot# }"
