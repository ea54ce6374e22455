# shellcheck shell=bash
# Power cuts that can lose data: the server runs in the guest on ext4 WITHOUT DAX over a virtio
# disk (a host file), so what it never msync'ed lives only in the guest's page cache and dies with QEMU.
# Each cut: a boot that loads one region of the device (numbered 4 KiB writes, half FUA, FLUSHes at random
# points, every acknowledgement on the console) and is SIGKILLed at a random write; the next boot reads that
# region back, and powercut-verify.py checks every acknowledged-durable block on the host. Cuts share boots
# (a boot reads back the previous cut and takes the next); PMEMBLK_POWERCUT_CUTS sets how many (default 2;
# scripts/test --long: 50). The last cut is the restart case instead of a random one: the FLUSH a client sends
# to a new server after the old one was killed must cover what the old one acknowledged (a new server whose dirty
# flag started false would cover nothing), and the cut comes right after that FLUSH, before anything else could
# write the pages back. The server keeps a dirty bitmap (docs/bitmaps.md) checkpointed at each load's start: after
# each cut, every block acknowledged durable and every block holding a write of the load must be dirty in it.
# When nvme-tcp is asked for too, its steps follow the last read-back in that boot (scripts/vm-test.d/nvme.sh,
# nvme_share_boot): the boot's output after POWERCUT_DONE is nvme-tcp's, and nvme-tcp's power cut ends the boot.
POWERCUT_DONE="powercut-check: read-back done"
scenario_powercut() {
    local d="$WORK/powercut" t0 cuts=${PMEMBLK_POWERCUT_CUTS:-2} k marker at out next
    local promised=0 submitted=0 flushes=0 lost=0 checked=0 bitmap=0 k_bitmap ats=""
    local last cmd limit=240 rc t1 up nvme_marker nvme_part shared=() note=""
    t0=$(now_ms)
    if [ "$SERVER" != pmemblk ]; then
        report SKIP powercut "needs the pmemblk server (scripts/pmemblk)"; return
    fi
    mkdir -p "$d"
    for ((k = 0; k < cuts; k++)); do
        marker="POWER-OFF-$RANDOM$RANDOM"
        if [ "$k" = $((cuts - 1)) ]; then
            # The last cut is the restart case: plain writes, kill -9 of the server, a new server,
            # one FLUSH acknowledged by it, then the power goes. Two JVM starts in this boot: a larger bound
            # (one start took 125 s under emulation on a 2-core host at load 25).
            ats="$ats${ats:+,}restart"
            run_vm --disk "$d/disk.img" --timeout 720 --kill-after-marker "$marker" --log "$LOGS/powercut-$k.console.log" \
                -- "sh $GUEST_DIR/powercut-check.sh restart $k $marker $RANDOM" >"$LOGS/powercut-$k.out" 2>&1 \
                || { report FAIL powercut "boot $((k + 1)) (read-back, plain writes, kill -9, restart, FLUSH, cut) failed: \
$(grep -m1 -E '^vm: |not ready|exited' "$LOGS/powercut-$k.out") ($(secs_since "$t0"); logs: $LOGS/powercut-*)"; return; }
            continue
        fi
        at=$((100 + RANDOM % 400))
        ats="$ats${ats:+,}$at"
        run_vm --disk "$d/disk.img" --timeout 300 --kill-after-marker "$marker" --log "$LOGS/powercut-$k.console.log" \
            -- "sh $GUEST_DIR/powercut-check.sh cut $k $at $marker $RANDOM" >"$LOGS/powercut-$k.out" 2>&1 \
            || { report FAIL powercut "boot $((k + 1)) (read-back, load, cut after write $at) failed: $(grep -m1 -E '^vm: |not ready|exited' "$LOGS/powercut-$k.out") \
($(secs_since "$t0"); logs: $LOGS/powercut-*)"; return; }
    done
    last="$LOGS/powercut-$cuts.out" cmd="sh $GUEST_DIR/powercut-check.sh dump $((cuts - 1))"
    if nvme_share_boot; then
        nvme_marker="NVME-POWER-CUT-$RANDOM$RANDOM"
        shared=(--nvdimm "$WORK/nvme.nvdimm" --nvdimm-size 256M --kill-after-marker "$nvme_marker")
        # the guest's uptime at the read-back's end: what the boot spent on nvme-tcp comes after it
        cmd="$cmd && echo \"$POWERCUT_DONE at \$(cut -d' ' -f1 /proc/uptime) s\" && $(nvme_guest_cmd "$nvme_marker")"
        limit=$((limit + 1200))
    fi
    t1=$(now_ms)
    run_vm --disk "$d/disk.img" "${shared[@]}" --timeout "$limit" --log "$LOGS/powercut-$cuts.console.log" -- "$cmd" >"$last" 2>&1
    rc=$?
    if [ ${#shared[@]} -gt 0 ]; then
        # The read-back's lines stay here, the rest is nvme-tcp's (judged by scenario_nvme_tcp).
        : >"$LOGS/nvme-tcp.out"
        awk -v d="$POWERCUT_DONE" -v n="$LOGS/nvme-tcp.out" 'x { print > n; next } { print } index($0, d) == 1 { x = 1 }' "$last" \
            >"$last.own" && mv "$last.own" "$last"
        up=$(sed -n "s/.*$POWERCUT_DONE at \([0-9]*\).*/\1/p" "$last" | tail -n 1)
        nvme_part=$(( ($(now_ms) - t1) / 1000 - ${up:-0} ))
        # shellcheck disable=SC2034 # both read by scenario_nvme_tcp (nvme.sh)
        NVME_SHARED_RC=$rc
        # shellcheck disable=SC2034
        NVME_SHARED_NOTE="in powercut's last boot after its read-back: ~$nvme_part s of that boot's $(secs_since "$t1"); console: $LOGS/powercut-$cuts.console.log"
        [ -n "$up" ] || { report FAIL powercut "the last read-back boot failed before its end ($(secs_since "$t0"); logs: $LOGS/powercut-*)"; return; }
        note=", of which ~$nvme_part s nvme-tcp's steps in its last boot"
    elif [ "$rc" != 0 ]; then
        report FAIL powercut "the last read-back boot failed ($(secs_since "$t0"); logs: $LOGS/powercut-*)"; return
    fi
    for ((k = 0; k < cuts; k++)); do
        out="$LOGS/powercut-verify-$k.out" next="$LOGS/powercut-$((k + 1)).out"
        # The whole console log of the cut boot: scripts/vm stops echoing at the marker, but the load goes on
        # until QEMU dies, and writes issued after the marker (acknowledged or not) may be what a block holds.
        python3 "$REPO_ROOT/scripts/vm-guest/powercut-verify.py" "$LOGS/powercut-$k.console.log" "$next" >"$out" 2>&1
        promised=$((promised + $(result "$out" promised))) submitted=$((submitted + $(result "$out" submitted)))
        flushes=$((flushes + $(result "$out" flushes))) checked=$((checked + $(result "$out" blocks_checked)))
        lost=$((lost + $(result "$out" lost)))
        k_bitmap=$(result "$out" bitmap_checked | tr -cd 0-9) bitmap=$((bitmap + ${k_bitmap:-0}))
        if [ "$(result "$out" lost)" != 0 ] || [ "$(result "$out" promised)" = 0 ]; then
            report FAIL powercut "cut $((k + 1)) of $cuts$([ "$k" = $((cuts - 1)) ] && echo ' (restart case: plain writes, kill -9, new server, FLUSH)'): $(result "$out" lost) \
acknowledged blocks lost of $(result "$out" promised) promised; $(grep -m1 '^lost' "$out") ($(secs_since "$t0"); logs: $LOGS/powercut-*)"
            return
        fi
    done
    [ "$bitmap" -gt 0 ] || { report FAIL powercut "no block was checked against the dirty bitmap (no 'BITMAP b' in the read-backs) ($(secs_since "$t0"); logs: $LOGS/powercut-*)"; return; }
    report PASS powercut "$cuts power cuts, the last after kill -9 and a new server's FLUSH: $promised durable writes acknowledged, 0 lost; $bitmap written blocks all dirty in the bitmap ($(secs_since "$t0")$note)" \
        "QEMU SIGKILLed after writes $ats; server on ext4 without DAX; $submitted writes, $promised acknowledged durable (FUA, or before one of $flushes FLUSHes), $checked blocks \
read back after the cuts"
}
