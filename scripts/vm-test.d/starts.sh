# shellcheck shell=bash
# JVM crashes at start: unpinned guest JVMs died of SIGSEGV a few seconds after `serve` started in 1 boot of 10 under
# TCG (the cause: xmodify). One guest starts it PMEMBLK_STARTS times (each: ready, a little I/O, SIGTERM) and counts the JVM crashes.
scenario_starts() {
    local t0 n=${PMEMBLK_STARTS:-100} mode=${PMEMBLK_STARTS_MODE:-nbd} opts=${PMEMBLK_STARTS_JAVA_OPTS-} out rc
    local crashes ok failures hangs label
    t0=$(now_ms)
    if [ "$SERVER" != pmemblk ]; then
        report SKIP starts "needs the pmemblk server (scripts/pmemblk)"; return
    fi
    out="$LOGS/starts.out" label="cpu=${PMEMBLK_VM_CPU:-max} opts='${opts:-launcher defaults}'"
    # Bound, for a wedged guest only: a start took 130-300 s under TCG on the 2-core host with a load of 25-30 (other
    # guests, builds); jvm-starts.sh bounds each step itself (ready 600 s, I/O 60 s, SIGTERM 60 s).
    run_vm --timeout $((300 + n * 720)) --log "$LOGS/starts.console.log" \
        -- "STARTS_CRASH_AT=${PMEMBLK_STARTS_CRASH_AT:-0} PMEMBLK_GUEST_JAVA_OPTS='$opts' sh $GUEST_DIR/jvm-starts.sh $n $mode \"$label\"" >"$out" 2>&1
    rc=$?
    crashes=$(result "$out" starts.crashes) ok=$(result "$out" starts.ok) failures=$(result "$out" starts.failures)
    hangs=$(result "$out" starts.hangs)
    if [ -z "$crashes" ]; then
        report FAIL starts "the guest ended (exit $rc) before the $n starts did; last: $(grep -E '^start [0-9]+:|^vm: ' "$out" | tail -n 1) ($(secs_since "$t0"); logs: $out)"; return
    fi
    # shellcheck disable=SC2153  # CRASHES: the harness's folder of crash reports (crashes: this run's count)
    if [ "$crashes" != 0 ] || [ "$failures" != 0 ] || [ "$rc" != 0 ]; then
        report FAIL starts "$n starts of serve ($mode, $label): $ok clean, $crashes JVM crashes, $failures other failures ($hangs of them never ready or stuck, diagnosed in the \
log); first crash: $(result "$out" starts.first_crash); $(grep -m1 'FAIL' "$out") ($(secs_since "$t0"); logs: $out, $CRASHES)"; return
    fi
    report PASS starts "$n starts of serve in one guest ($mode): 0 JVM crashes, each ready, 1 MiB FUA write read back, SIGTERM exit 0 ($(secs_since "$t0"))" \
        "$label"
}
