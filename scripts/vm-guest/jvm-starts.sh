#!/bin/sh
# Scenario "starts" (JVM crashes at start in a TCG guest): `serve` started N times in ONE guest, each start waited for ("ready:"),
# given a little I/O and stopped with SIGTERM; every start that dies of a JVM crash (an hs_err file, or the
# JVM's abort status 134) is counted. `jvm-starts.sh N MODE [VARIANT-LABEL]`, MODE nbd or ublk:
#   nbd   qemu-io writes a 1 MiB pattern through the NBD socket (FUA), reads it back and compares it
#   ublk  serve also exports /dev/ublkbN (ublk.enabled=true): dd writes 1 MiB with O_DIRECT, cmp reads it back;
#         the NBD round trip as well
# The JVM options are PMEMBLK_GUEST_JAVA_OPTS (guest-java.sh); set and empty means none, the launcher's own
# defaults (tiered C1+C2, the collector the JVM picks), which is what `pmemblk serve` runs with.
# Output: a line per start ("start K: ok 9.1s" / "start K: CRASH ..." / "start K: FAIL ..."), then
#   RESULT starts.{variant,mode,runs,ok,crashes,failures,secs,first_crash}=...
# STARTS_CRASH_AT=K sends start K's JVM a SIGSEGV once it is ready: the check that a crash is seen, counted and its
# hs_err file reaches the host.
# Exit: 0 when every start was clean, 1 otherwise. Every wait is bounded.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh" # PMEMBLK_GUEST_CMD, PMEMBLK_GUEST_CRASH_DIR (guest-java.sh), now, alive, serve_start
N=${1:?usage: jvm-starts.sh N nbd|ublk [LABEL]}
MODE=${2:?usage: jvm-starts.sh N nbd|ublk [LABEL]}
LABEL=${3:-default}
case "$MODE" in nbd|ublk) ;; *) echo "jvm-starts: MODE must be nbd or ublk, got '$MODE'"; exit 2 ;; esac
READY_SECS=600   # one start took 130-300 s under TCG on the 2-core host with a load of 25-30
STOP_SECS=60
SOCK=/tmp/starts.sock
POOL=/tmp/starts.pool
PATTERN=/tmp/starts.pattern
cd /tmp || exit 1

now_ds() { awk '{ printf "%d\n", $1 * 10 }' /proc/uptime; }
# diagnose PID LOG: a JVM that does not get on. Which threads burn CPU (utime, in ticks, twice 5 s apart), the
# Java stacks (SIGQUIT: into LOG), and for the busiest thread its registers and the instructions at its pc (gdb),
# twice: a thread that spins in place shows the same pc and the same code bytes. (Under TCG on a loaded host the
# guest's tick accounting overstates CPU time, 39 s in 5 s was seen: the ticks rank threads, the pcs tell a spin.)
diagnose() {
    _p=$1 _l=$2
    for _t in /proc/"$_p"/task/*; do echo "${_t##*/} $(cut -d')' -f2 "$_t/stat" | awk '{print $12}') $(cat "$_t/comm")"; done >/tmp/ticks.1
    sleep 5
    for _t in /proc/"$_p"/task/*; do echo "${_t##*/} $(cut -d')' -f2 "$_t/stat" | awk '{print $12}') $(cat "$_t/comm")"; done >/tmp/ticks.2
    echo "  busy threads (tid, CPU ticks in 5 s, name):"
    join /tmp/ticks.1 /tmp/ticks.2 | awk '{ d = $4 - $2; if (d > 0) print "  busy| " $1, d, $3 }' | sort -k3 -n -r | head -n 8
    _busy=$(join /tmp/ticks.1 /tmp/ticks.2 | awk '{ print $4 - $2, $1 }' | sort -n -r | head -n 1 | cut -d' ' -f2)
    kill -QUIT "$_p"
    _t1=$(now)
    until grep -q '^JNI global refs' "$_l" || [ $(( $(now) - _t1 )) -ge 30 ]; do sleep 0.2; done
    sed -n '/^Full thread dump/,/^JNI global refs/p' "$_l" | grep -E '^"|^[[:space:]]+at ' | head -n 80 | sed 's/^/  threads| /'
    if [ -n "$_busy" ] && command -v gdb >/dev/null; then
        for _i in 1 2; do
            echo "  gdb, thread $_busy, look $_i:"
            timeout 120 gdb -q -batch -nx -p "$_p" \
                -ex "python [t.switch() for t in gdb.selected_inferior().threads() if t.ptid[1] == $_busy]" \
                -ex 'info registers rip rsp rax rbx rcx rdx rsi rdi r8 r9 r10 r11 r12 r13 r14 r15' \
                -ex "x/12i \$pc-16" -ex "x/32xb \$pc" </dev/null 2>&1 | grep -v -E '^\[|^warning|^Using|libthread|^$' | head -n 40 | sed 's/^/  gdb| /'
        done
    fi
}
crash_files() {
    # shellcheck disable=SC2046 # a glob, split into its matches on purpose
    set -- "$PMEMBLK_GUEST_CRASH_DIR"/hs_err_pid*.log
    if [ -e "$1" ]; then echo $#; else echo 0; fi
}

if [ "$MODE" = ublk ]; then
    modprobe ublk_drv || { echo "jvm-starts: modprobe ublk_drv failed"; exit 1; }
fi
[ -d "$PMEMBLK_GUEST_CRASH_DIR" ] || echo "jvm-starts: warning: no crash folder $PMEMBLK_GUEST_CRASH_DIR: hs_err files stay in /tmp"
head -c 1048576 /dev/urandom >"$PATTERN"
echo "jvm-starts: $N starts, mode $MODE, variant $LABEL, JVM options '${PMEMBLK_GUEST_JAVA_OPTS}', cpu: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|bmi2|sse4_2' | tr '\n' ' ')"

ok=0 crashes=0 failures=0 hangs=0 first_crash='' t_all=$(now)
k=1
while [ "$k" -le "$N" ]; do
    log=/tmp/starts-$k.log
    rm -f "$SOCK" "$POOL"
    before=$(crash_files)
    t0=$(now_ds)
    extra=''
    [ "$MODE" = ublk ] && extra="--set ublk.enabled=true"
    # shellcheck disable=SC2086 # extra is a word list
    serve_start "$log" --set "pmem.path=$POOL" --set pmem.size=64M --set "nbd.socket=$SOCK" --set nbd.port=0 \
        --set nbd.export=pmem0 $extra
    pid=$SERVER_PID
    verdict='' why=''
    until grep -q '^ready:' "$log"; do
        alive "$pid" || { verdict=died; break; }
        [ $(( $(now_ds) - t0 )) -lt $((READY_SECS * 10)) ] || { verdict=fail; why="not ready in ${READY_SECS}s"; break; }
        sleep 0.1
    done
    ready_ds=$(( $(now_ds) - t0 ))
    if [ -z "$verdict" ] && [ "$k" = "${STARTS_CRASH_AT:-0}" ]; then
        kill -SEGV "$pid"
        t1=$(now)
        while alive "$pid" && [ $(( $(now) - t1 )) -lt 60 ]; do sleep 0.1; done
    fi
    if [ -z "$verdict" ]; then
        # A little I/O on each frontend: the request paths, not only start-up, run.
        if ! timeout 60 qemu-io -f raw -c "write -P $((k % 255 + 1)) -f 0 1M" -c "read -P $((k % 255 + 1)) 0 1M" \
                "nbd+unix:///pmem0?socket=$SOCK" >/tmp/starts-io.out 2>&1 \
           || grep -q -i -E 'error|fail|mismatch|pattern verification' /tmp/starts-io.out; then
            alive "$pid" && { verdict=fail; why="NBD write/read: $(grep -m1 -i -E 'error|fail|mismatch|pattern' /tmp/starts-io.out)"; }
        fi
        if [ -z "$verdict" ] && [ "$MODE" = ublk ] && alive "$pid"; then
            dev=$(sed -n 's/^ready: \(\/dev\/ublkb[0-9][0-9]*\).*/\1/p' "$log" | tail -n 1)
            if [ ! -b "$dev" ]; then verdict=fail; why="no ublk device in '$(grep -m1 '^ready:' "$log")'"
            elif ! timeout 60 dd if="$PATTERN" of="$dev" bs=1M count=1 oflag=direct conv=fsync status=none \
                 || ! timeout 60 dd if="$dev" bs=1M count=1 iflag=direct status=none | cmp -s - "$PATTERN"; then
                alive "$pid" && { verdict=fail; why="1 MiB through $dev not read back as written"; }
            fi
        fi
        if [ -z "$verdict" ] && alive "$pid"; then
            kill -TERM "$pid"
            t1=$(now)
            while alive "$pid"; do
                [ $(( $(now) - t1 )) -lt $STOP_SECS ] || { verdict=fail; why="still running ${STOP_SECS}s after SIGTERM"; kill -KILL "$pid"; break; }
                sleep 0.1
            done
        fi
        [ -n "$verdict" ] || alive "$pid" || verdict=exited
    fi
    # A start that failed but still runs (not ready, I/O wrong): what it is doing, then it is ended, so the next
    # start gets the machine.
    if [ "$verdict" = fail ] && alive "$pid"; then
        hangs=$((hangs + 1))
        diagnose "$pid" "$log"
        kill -KILL "$pid"
    fi
    rc=0; wait "$pid" || rc=$?
    if [ "$(crash_files)" -gt "$before" ] || [ "$rc" = 134 ] || [ "$rc" = 139 ]; then
        crashes=$((crashes + 1))
        # The newest report: their names carry the pid, so only their times order them.
        f=$(find "$PMEMBLK_GUEST_CRASH_DIR" -maxdepth 1 -name 'hs_err_pid*.log' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2-)
        what="exit $rc, $(grep -m1 -E '^# +SIG' "$f" 2>/dev/null | sed 's/^# *//'); $(grep -A1 -m1 '^# Problematic frame' "$f" 2>/dev/null | tail -n 1 | sed 's/^# *//')"
        [ -n "$first_crash" ] || first_crash="start $k: $what"
        echo "start $k: CRASH after $((ready_ds / 10)).$((ready_ds % 10))s ($what; ${f:-no hs_err file})"
        grep -E '^(Exception|Error|pmemblk|[A-Z][a-z]+Exception)' "$log" | head -n 5 | sed 's/^/  server| /'
    elif [ "$verdict" = fail ]; then
        failures=$((failures + 1))
        echo "start $k: FAIL $why (exit $rc)"; tail -n 5 "$log" | sed 's/^/  server| /'
    elif [ "$rc" != 0 ]; then
        failures=$((failures + 1))
        echo "start $k: FAIL exit $rc ($verdict; want 0 on SIGTERM)"; tail -n 5 "$log" | sed 's/^/  server| /'
    else
        ok=$((ok + 1))
        echo "start $k: ok, ready after $((ready_ds / 10)).$((ready_ds % 10))s"
    fi
    k=$((k + 1))
done
rm -f "$POOL" "$PATTERN"
RESULT_PREFIX=starts.
result variant "$LABEL"
result mode "$MODE"
result runs "$N"
result ok "$ok"
result crashes "$crashes"
result failures "$failures"
result hangs "$hangs"
result secs "$(( $(now) - t_all ))"
result first_crash "${first_crash:-none}"
[ "$crashes" = 0 ] && [ "$failures" = 0 ]
