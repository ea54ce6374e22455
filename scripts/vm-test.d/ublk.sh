# shellcheck shell=bash
# The ublk scenarios share one guest: each boot costs a JVM-heavy set-up under emulation, and the
# scenarios need the same things (ublk_drv, the NVDIMM). The first of them in the list boots it for all
# that were asked for; the guest runs them in a fixed order (ublk-nbd measures /dev/pmem0 before the
# filesystem goes on it; ublk-recovery, the likeliest to wedge the kernel, last) and each reports from
# its RESULT lines.
UBLK_SCENARIOS="ublk-nbd ublk-pmem ublk ublk-recovery"
UBLK_BOOTED=0 UBLK_RC=0 UBLK_NOTE='' UBLK_TIMEOUT=0
# Upper bounds (s) for one scenario in the guest: about 2.5 times what each took under emulation on a
# 2-core host busy with other builds (ublk-nbd 77, ublk-pmem 125, ublk 94, ublk-recovery 170; the JVM
# starts dominate; with four guests on the 2 cores: each serve 100-165 s to ready, ublk-recovery
# 822 s with its two extra serves). Every wait inside the guest has its own bound; these only catch a wedged kernel.
ublk_budget() { case "$1" in ublk-nbd) echo 240 ;; ublk-pmem) echo 900 ;; ublk) echo 400 ;; ublk-recovery) echo 1500 ;; esac; }

# uresult NAME.KEY: the value of "RESULT NAME.KEY=" in the shared guest's output (fixed string, last one).
uresult() { keyresult "$LOGS/ublk.out" "$1"; }

ublk_guest() {
    local s want=() timeout=60
    [ "$UBLK_BOOTED" = 1 ] && return 0
    UBLK_BOOTED=1
    for s in "${SCENARIOS[@]}"; do
        case " $UBLK_SCENARIOS " in *" $s "*) want+=("$s"); timeout=$((timeout + $(ublk_budget "$s"))) ;; esac
    done
    case " ${want[*]} " in *" ublk-nbd "*)
        # The guest runs the host's nbd-client (the root is shared): install it when missing.
        if ! command -v nbd-client >/dev/null 2>&1 && [ ! -x /usr/sbin/nbd-client ]; then
            # shellcheck source=../lib/common.sh
            ( . "$REPO_ROOT/scripts/lib/common.sh" && ensure_packages nbd-client ) >"$LOGS/ublk-packages.log" 2>&1 \
                || UBLK_NOTE="nbd-client missing and not installable (Debian package nbd-client; $LOGS/ublk-packages.log)"
        fi ;;
    esac
    : >"$LOGS/ublk.out"
    run_vm --nvdimm "$WORK/ublk.nvdimm" --nvdimm-size 512M --timeout "$timeout" --log "$LOGS/ublk.console.log" \
        -- "sh $GUEST_DIR/ublk-check.sh ${want[*]}" >"$LOGS/ublk.out" 2>&1
    UBLK_RC=$?
    UBLK_TIMEOUT=$timeout
}

# The PASS line of each ublk scenario, from its RESULT lines, and the figures behind it (the run's log).
ublk_pass_text() {
    case "$1" in
        ublk) echo "ext4 on /dev/ublkbN: discard, fio verify, fstrim, e2fsck clean; $(uresult ublk.verified) files verified across a SIGTERM restart; \
incremental backup of the guest's writes from dirty bitmap b: $(uresult ublk.backup) bytes, sha256 equal; deleted by another process: $(uresult ublk.external_delete)" ;;
        ublk-recovery) echo "fio verify clean across kill -9 and recovery (ublk.id=7); another file refused, its own resumed; recovery=false removes the device" ;;
        ublk-pmem) echo "ublk on ext4 -o dax (is_pmem=$(uresult ublk-pmem.is_pmem)): fio verify clean; with dma.engine=soft both copy routes used" ;;
        ublk-nbd) echo "4k randrw QD32: ublk/nbd $(uresult ublk-nbd.ublk_vs_nbd), ublk/pmem0 $(uresult ublk-nbd.ublk_vs_pmem0) (TCG: compare ratios, not figures)" ;;
    esac
}
ublk_details() {
    case "$1" in
        ublk) echo "server on a tmpfs file, block size $(uresult ublk.block_size); blkdiscard and blkdiscard -z (zeros read back); restart by SIGTERM: exit 0, /dev/ublkbN and \
/dev/ublkcN gone; fio verify=crc32c 4k..1m iodepth 32; fstrim $(uresult ublk.fstrim) bytes; e2fsck -fn before and after; without /dev/ublk-control: $(uresult ublk.no_control)" ;;
        ublk-recovery) echo "killed after $(uresult ublk-recovery.killed_after) requests (device kept, I/O held); new serve ready $(uresult ublk-recovery.recovered_after) later; no \
I/O error in the kernel log; killed again: a serve on another file $(uresult ublk-recovery.other_file), on the device's own file \
$(uresult ublk-recovery.same_file); before, with recovery=false: kill -9 removed the device, the next serve on id 7 made a new one ($(uresult ublk-recovery.norecovery))" ;;
        ublk-pmem) echo "$(uresult ublk-pmem.ublk_requests) ublk requests; dma.engine=soft, route.dma.bounce=true, route.dma.min-bytes=65536: copy bytes \
dma=$(uresult ublk-pmem.dma_bytes) cpu=$(uresult ublk-pmem.cpu_bytes)" ;;
        ublk-nbd) echo "libaio direct, 50/50: ublk $(uresult ublk-nbd.ublk_iops) IOPS ($(uresult ublk-nbd.ublk_mbps) MB/s, $(uresult ublk-nbd.queues) queues), nbd \
$(uresult ublk-nbd.nbd_iops) IOPS ($(uresult ublk-nbd.nbd_mbps) MB/s, $(uresult ublk-nbd.nbd_connections) connections), pmem0 \
$(uresult ublk-nbd.pmem0_iops) IOPS ($(uresult ublk-nbd.pmem0_mbps) MB/s)" ;;
    esac
}

scenario_ublk_any() {
    local name=$1 st why secs last
    if [ "$SERVER" != pmemblk ]; then
        report SKIP "$name" "needs the pmemblk server (scripts/pmemblk); the stand-in has no ublk frontend"; return
    fi
    ublk_guest
    st=$(uresult "$name.status") why=$(uresult "$name.why") secs=$(uresult "$name.secs")
    case "$st" in
        pass)
            report PASS "$name" "$(ublk_pass_text "$name") (${secs}s)" "$(ublk_details "$name")" ;;
        fail)
            [ "$name" = ublk-nbd ] && [ -n "$UBLK_NOTE" ] && why="$UBLK_NOTE; $why"
            report FAIL "$name" "$why (${secs}s; logs: $LOGS/ublk.out, $LOGS/ublk.console.log)" ;;
        *)
            last=$(grep -E '^ublk-check: |^vm: ' "$LOGS/ublk.out" | tail -n 1)
            if [ "$UBLK_RC" = 124 ]; then why="the shared guest hit its ${UBLK_TIMEOUT}s bound before this scenario ended"
            elif [ -n "$(uresult setup.why)" ]; then why="guest set-up: $(uresult setup.why)"
            else why="no result: the shared guest ended (exit $UBLK_RC) before this scenario ended"; fi
            report FAIL "$name" "$why; last: ${last:-nothing} (logs: $LOGS/ublk.out, $LOGS/ublk.console.log)" ;;
    esac
}
