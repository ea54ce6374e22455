#!/bin/sh
# Where a guest `serve` start spends its time, with the launcher's JVM defaults: when the module system boots, when
# C1 first compiles StringBuilder.append (the frame of the guest JVMs' crash at start: scripts/vm-test starts), when pmemblk's first class loads,
# when it is ready. A crash before the first io.pmemblk class ran in JDK code only: no native call of pmemblk's had
# been made in that process. Run: scripts/vm -- sh /mnt/pmemblk/scripts/vm-guest/startup-phases.sh
# Output: RESULT phases.{module_bootstrap,first_sb_append_c1,first_pmemblk_class,ready}=SECONDS (JVM uptime; ready
# by the shell's clock from the launch).
set -u
# shellcheck disable=SC2034 # read by guest-java.sh
PMEMBLK_GUEST_JAVA_OPTS="-Xlog:class+load:file=/tmp/phases-classes.log:uptime -XX:+PrintCompilation"
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
LOG=/tmp/phases-serve.log
uptime_s() { cut -d' ' -f1 /proc/uptime; }
t0=$(uptime_s)
serve_start "$LOG" --set pmem.path=/tmp/phases.pool --set pmem.size=64M --set nbd.socket=/tmp/phases.sock \
    --set nbd.port=0 --set nbd.export=pmem0
rc=0; wait_until "$SERVER_PID" 900 grep -s -q '^ready:' "$LOG" || rc=$?
if [ "$rc" != 0 ]; then
    # The log is mostly PrintCompilation's lines: the server's own are the others.
    if [ "$rc" = 1 ]; then say "serve exited:"; else say "not ready in 900 s"; kill -KILL "$SERVER_PID"; fi
    grep -v -E '^ +[0-9]+ +[0-9]+ ' "$LOG" | tail; exit 1
fi
t1=$(uptime_s)
secs() { sed -n 's/^\[\([0-9.]*\)s\].*/\1/p' | head -n 1; }
echo "RESULT phases.module_bootstrap=$(grep -m1 'jdk.internal.module.ModuleBootstrap ' /tmp/phases-classes.log | secs)"
echo "RESULT phases.first_sb_append_c1=$(awk '$3 == 3 && $4 == "java.lang.StringBuilder::append" { printf "%.1f\n", $1 / 1000; exit }' "$LOG")"
echo "RESULT phases.first_pmemblk_class=$(grep -m1 ' io\.pmemblk\.' /tmp/phases-classes.log | secs)"
echo "RESULT phases.ready=$(echo "$t1 $t0" | awk '{ printf "%.1f\n", $1 - $2 }')"
serve_stop 60 && [ "$SERVER_RC" = 0 ]
