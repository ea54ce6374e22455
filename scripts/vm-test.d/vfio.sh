# shellcheck shell=bash
# devdax and vfio share one boot when both are in the run: the vfio guest (QEMU's edu behind an emulated IOMMU, an
# NVDIMM of 128 MiB) runs devdax-check.sh first, then vfio-check.sh, one output with the keys of both (none shared).
# Each reports from its own RESULT lines; devdax-check.sh ends its server however it exits, so vfio still runs.
DAX_BOOTED=0 DAX_RC=0 DAX_SECS=''
dax_shared() {
    [ "$SERVER" = pmemblk ] || return 1
    case " ${SCENARIOS[*]} " in *" devdax "*) ;; *) return 1 ;; esac
    case " ${SCENARIOS[*]} " in *" vfio "*) return 0 ;; esac
    return 1
}
dax_guest() {
    local t0
    [ "$DAX_BOOTED" = 1 ] && return 0
    DAX_BOOTED=1
    t0=$(now_ms)
    # Bound for a wedged guest only: the two scenarios' bounds (480 s, 420 s) together.
    run_vm --nvdimm "$WORK/dax.nvdimm" --nvdimm-size 128M --vfio-edu --timeout 900 --log "$LOGS/dax.console.log" \
        -- "sh $GUEST_DIR/devdax-check.sh; echo \"RESULT devdax.rc=\$?\"; sh $GUEST_DIR/vfio-check.sh" >"$LOGS/dax.out" 2>&1
    DAX_RC=$?
    DAX_SECS="$(secs_since "$t0") for the boot of devdax and vfio"
}

scenario_devdax() {
    local t0 is_pmem size exit_code out="$LOGS/devdax.out" secs=''
    t0=$(now_ms)
    if [ "$SERVER" != pmemblk ]; then
        report SKIP devdax "needs the pmemblk server (scripts/pmemblk)"; return
    fi
    if dax_shared; then
        dax_guest
        out="$LOGS/dax.out" secs=$DAX_SECS
        case "$(result "$out" devdax.rc)" in
            0) ;;
            '') report FAIL devdax "the shared guest ended (exit $DAX_RC) before devdax-check.sh did: $(grep -m1 -E '^vm: ' "$out" || echo "see $out") ($secs; logs: $LOGS/dax*)"; return ;;
            *) report FAIL devdax "the guest run failed (devdax-check.sh exit $(result "$out" devdax.rc); $secs; logs: $LOGS/dax*)"; return ;;
        esac
    elif ! run_vm --nvdimm "$WORK/devdax.nvdimm" --nvdimm-size 512M --timeout 480 --log "$LOGS/devdax.console.log" \
        -- "sh $GUEST_DIR/devdax-check.sh" >"$out" 2>&1; then
        report FAIL devdax "the guest run failed ($(secs_since "$t0"); logs: $LOGS/devdax*)"; return
    fi
    secs=${secs:-$(secs_since "$t0")}
    is_pmem=$(result "$out" is_pmem) size=$(result "$out" size)
    exit_code=$(result "$out" serve_exit)
    if [ "$is_pmem" != true ] || [ "$(result "$out" pattern)" != ok ] || [ "$exit_code" != 0 ]; then
        report FAIL devdax "is_pmem=$is_pmem pattern=$(result "$out" pattern) serve exit=$exit_code ($secs; logs: $out)"; return
    fi
    report PASS devdax "serve on /dev/dax0.0: is_pmem=true, FUA pattern read back through the export, SIGTERM exit 0 ($secs)" \
        "device DAX, no filesystem; size $size bytes (serve's region line); qemu-io write -P 0x5a -f 1M, flush, read -P 0x5a"
}

# ---------------------------------------------------------------------------------------------
scenario_vfio() {
    local t0 out r bad='' dma transfers fault secs=''
    t0=$(now_ms)
    if [ "$SERVER" != pmemblk ]; then
        report SKIP vfio "needs the pmemblk server (scripts/pmemblk)"; return
    fi
    out="$LOGS/vfio.out"
    if dax_shared; then
        dax_guest
        out="$LOGS/dax.out" secs=$DAX_SECS
        if [ "$DAX_RC" != 0 ]; then
            report FAIL vfio "the guest run failed: $(grep -m1 -E '^vm: |vfio-check: |pmemblk: ' "$out" || echo "see $out") ($secs; logs: $LOGS/dax*)"; return
        fi
    elif ! run_vm --nvdimm "$WORK/vfio.nvdimm" --nvdimm-size 128M --vfio-edu --timeout 420 --log "$LOGS/vfio.console.log" \
        -- "sh $GUEST_DIR/vfio-check.sh" >"$out" 2>&1; then
        report FAIL vfio "the guest run failed: $(grep -m1 -E '^vm: |vfio-check: |pmemblk: ' "$out" || echo "see $out") ($(secs_since "$t0"); logs: $LOGS/vfio*)"; return
    fi
    secs=${secs:-$(secs_since "$t0")}
    for r in written=ok read=ok reread=ok serve_exit_1=0 serve_exit_2=0 unmapped_1=yes unmapped_2=yes check=ok \
             dma_errors=0 fsdax_exit=1 fsdax_message=ok; do
        [ "$(result "$out" "${r%%=*}")" = "${r#*=}" ] || bad="$bad ${r%%=*}=$(result "$out" "${r%%=*}")"
    done
    dma=$(result "$out" dma_bytes) transfers=$(result "$out" device_transfers) fault=$(result "$out" dmar_fault)
    # 16 writes and 16 reads of 8 KiB at least; edu moves 2 KiB per transfer, each direction: 1 KiB per transfer.
    [ "${dma:-0}" -ge $((32 * 8192)) ] 2>/dev/null || bad="$bad dma_bytes=${dma:-none}"
    [ "${transfers:-0}" -gt 0 ] 2>/dev/null && [ $((transfers * 1024)) = "${dma:-x}" ] || bad="$bad device_transfers=${transfers:-none}(x1024 != dma_bytes)"
    # The fault the kernel logged must be the check's write to the IOVA it had just unmapped.
    case "$fault" in *DMAR*"fault addr $(result "$out" unmapped_iova) "*) ;; *) bad="$bad dmar_fault=${fault:-none}" ;; esac
    if [ -n "$bad" ]; then
        report FAIL vfio "unexpected:$bad ($secs; logs: $out)"; return
    fi
    report PASS vfio "dma.engine=vfio on edu behind intel-iommu: $dma DMA bytes = device transfers x 1 KiB, unmapped IOVA faults, fsdax refused ($secs)" \
        "serve on /dev/dax0.0; 32 requests of 8 KiB, $transfers device transfers; pattern read back after restart; SIGTERM exit 0, mappings withdrawn; DMA to an unmapped IOVA moved \
0 bytes, kernel: '${fault#*] }'; fsdax refused with the devdax/tmpfs hint"
}
