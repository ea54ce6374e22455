# shellcheck shell=bash
# scripts/vm boots QEMU's multi-threaded TCG, under which code patched on one vCPU while another runs it can be
# translated torn; guest JVMs are pinned to one vCPU for that (guest-java.sh's PMEMBLK_GUEST_PIN). This checks the
# pinning as the JVMs get it: HotSpot's patch sequence against a caller, three runs of PMEMBLK_XMODIFY_SECS (default 2;
# unpinned, every run of 20 s faulted within 46k-120k patches, and a pinned second does about 250k), each a fresh process.
scenario_xmodify() {
    local t0 out bin faults pin=''
    t0=$(now_ms)
    bin="$WORK/xmodify"
    # PMEMBLK_GUEST_PIN from here replaces the guest's (set and empty: unpinned, which faults)
    [ -z "${PMEMBLK_GUEST_PIN+set}" ] || pin="PMEMBLK_GUEST_PIN='$PMEMBLK_GUEST_PIN' "
    if ! ( . "$REPO_ROOT/scripts/lib/common.sh" && ensure_packages gcc ) >"$LOGS/xmodify-packages.log" 2>&1 \
        || ! gcc -O2 -pthread -o "$bin" "$REPO_ROOT/scripts/vm-guest/xmodify-check.c" >"$LOGS/xmodify-build.log" 2>&1; then
        report FAIL xmodify "could not build scripts/vm-guest/xmodify-check.c ($(secs_since "$t0"); logs: $LOGS/xmodify-*.log)"; return
    fi
    out="$LOGS/xmodify.out"
    # $WORK is under the host's /tmp, which the guest does not see: shared in
    if ! run_vm --timeout 600 --share "$WORK:xmodify:/mnt/xmodify:ro" --log "$LOGS/xmodify.console.log" \
        -- "$pin. $GUEST_DIR/guest-java.sh; echo \"RESULT xmodify.pin=\$PMEMBLK_GUEST_PIN\"; for i in 1 2 3; do \$PMEMBLK_GUEST_PIN /mnt/xmodify/xmodify ${PMEMBLK_XMODIFY_SECS:-2}; \
done" >"$out" 2>&1; then
        faults=$(grep -m1 'xmodify.fault=SIG' "$out")
        report FAIL xmodify "patched code faulted in the guest (-accel ${PMEMBLK_VM_ACCEL:-tcg}, pinned by '$(result "$out" xmodify.pin)'): ${faults:-the guest run failed} \
($(secs_since "$t0"); logs: $out)"; return
    fi
    if [ "$(grep -c 'bad=0 .*fault=none' "$out")" != 3 ]; then
        report FAIL xmodify "not 3 clean runs: $(grep RESULT "$out" | tr '\n' ' ') ($(secs_since "$t0"); logs: $out)"; return
    fi
    report PASS xmodify "HotSpot's entry patch against a running caller, pinned as guest JVMs are: 3 x ${PMEMBLK_XMODIFY_SECS:-2} s, no fault, no wrong result ($(secs_since "$t0"))" \
        "$(grep RESULT "$out" | tr '\n' ' ')"
}
