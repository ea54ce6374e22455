# shellcheck shell=bash
# ioat-raid5: pmemblk's software I/OAT device as a PCI function of its own, held to Linux's ioatdma. The
# device (`pmemblk dma-device`) runs on the host and serves it over vfio-user on a unix socket; the guest is booted by
# the peers' QEMU 10.2 with it attached (scripts/vm --vfio-user: vfio-user-pci, guest RAM a shared memfd). In the
# guest (scripts/vm-guest/ioat-raid5-check.sh) ioatdma binds it and md RAID5 hands it its copies under fio verify,
# then the same run on the CPU with no channel; the guest asks the host for the device process's CPU time (device-cpu).
# The peers come from ../shared/peers beside the checkout (PMEMBLK_PEERS): QEMU >= 10.1 with vfio-user-pci, and
# libvfio-user built by its script (the device binds it). Missing, the scenario FAILs naming what and where.
PEERS=${PMEMBLK_PEERS:-$REPO_ROOT/../shared/peers}
IOAT_CHANNELS=${PMEMBLK_IOAT_CHANNELS:-2}
# The library the device binds (its own lookup: PMEMBLK_LIBVFIO_USER, a libvfio-user.so.0): the peers' build script's
# output unless given.
LIBVFIO_USER=${PMEMBLK_LIBVFIO_USER:-$HOME/.cache/libvfio-user-efd091b/lib/libvfio-user.so.0}

# vfio_user_peers LOG: QEMU with vfio-user-pci found (VFIO_USER_QEMU) and libvfio-user built; prints what is missing
# and returns 1 otherwise. vfio_user_library LOG: only libvfio-user, for scenarios whose vfio-user link is on the host.
VFIO_USER_QEMU=''
vfio_user_peers() {
    VFIO_USER_QEMU=${PMEMBLK_QEMU_VFIO_USER:-$PEERS/qemu/bin/qemu-system-x86_64}
    if [ ! -x "$VFIO_USER_QEMU" ]; then
        echo "QEMU >= 10.1 with vfio-user-pci missing: no $VFIO_USER_QEMU (../shared/peers/qemu beside the checkout, built by ../shared/peers/build-qemu.sh; or PMEMBLK_PEERS, \
PMEMBLK_QEMU_VFIO_USER)"; return 1
    fi
    grep -q '"vfio-user-pci"' <<<"$("$VFIO_USER_QEMU" -device help 2>/dev/null)" \
        || { echo "$VFIO_USER_QEMU has no vfio-user-pci (-device help): QEMU >= 10.1 needed (../shared/peers/build-qemu.sh)"; return 1; }
    vfio_user_library "$1"
}
vfio_user_library() {
    if [ ! -f "$LIBVFIO_USER" ]; then
        [ -z "${PMEMBLK_LIBVFIO_USER:-}" ] || { echo "libvfio-user missing: no $LIBVFIO_USER (PMEMBLK_LIBVFIO_USER)"; return 1; }
        PMEMBLK_PEERS=$PEERS LIBVFIO_USER_DIR=${LIBVFIO_USER%/lib/libvfio-user.so.0} \
            "$REPO_ROOT/scripts/lib/libvfio-user" >>"$1" 2>&1 \
            || { echo "libvfio-user missing: $(tail -n 1 "$1") (scripts/lib/libvfio-user; log $1)"; return 1; }
    fi
}

# The device process: ioat_device_start SOCK LOG sets IOAT_PID, ready when its socket is there.
IOAT_PID='' IOAT_LOG=''
ioat_device_start() {
    rm -f "$1"
    IOAT_LOG=$2
    PMEMBLK_LIBVFIO_USER=$LIBVFIO_USER PMEMBLK_JAVA_OPTS="-XX:ErrorFile=$CRASHES/hs_err_pid%p.log ${PMEMBLK_JAVA_OPTS:-}" \
        "$REPO_ROOT/scripts/pmemblk" dma-device --socket "$1" --channels "$IOAT_CHANNELS" >>"$2" 2>&1 &
    IOAT_PID=$!
    PIDS+=("$IOAT_PID")
    wait_server "$IOAT_PID" 120 "$2" test -S "$1"
}
# The guest's requests: device-cpu, the CPU time the device process used so far ("ticks=N", clock ticks).
ioat_request() {
    case "$1" in
        device-cpu)
            kill -0 "$IOAT_PID" 2>/dev/null || { echo "the device process is gone: $(tail -n 2 "$IOAT_LOG" | tr '\n' ' ')"; return 1; }
            echo "ticks=$(proc_ticks "$IOAT_PID")" ;;
        *) echo "unknown request '$*' (known: device-cpu)"; return 1 ;;
    esac
}

scenario_ioat_raid5() {
    local d="$WORK/ioat" t0 why mdadm pid rc out="$LOGS/ioat-raid5.out" r absent=''
    t0=$(now_ms)
    [ "$SERVER" = pmemblk ] || { report SKIP ioat-raid5 "needs the pmemblk device (scripts/pmemblk dma-device)"; return; }
    mkdir -p "$d/ctl"
    why=$(vfio_user_peers "$LOGS/ioat-peers.log") || { report FAIL ioat-raid5 "$why"; return; }
    mdadm=$(guest_deb mdadm 2>"$LOGS/ioat-mdadm.log") || { report FAIL ioat-raid5 "mdadm for the guest: $(tail -n 1 "$LOGS/ioat-mdadm.log")"; return; }
    ioat_device_start "$d/ioat.sock" "$LOGS/ioat-device.log" \
        || { report FAIL ioat-raid5 "pmemblk dma-device did not start: $(tail -n 2 "$LOGS/ioat-device.log" | tr '\n' ' ') ($(secs_since "$t0"); logs: $LOGS/ioat-*)"; return; }
    PMEMBLK_QEMU_VFIO_USER=$VFIO_USER_QEMU "$VM" --crash-dir "$CRASHES" --vfio-user "$d/ioat.sock" \
        --share "$mdadm:mdadm:/mnt/mdadm:ro" --share "$d/ctl:ctl:/mnt/ctl" --timeout 900 --log "$LOGS/ioat-raid5.console.log" \
        -- "IOAT_CHANNELS=$IOAT_CHANNELS MDADM=/mnt/mdadm/sbin/mdadm sh $GUEST_DIR/ioat-raid5-check.sh" >"$out" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    vm_requests_serve "$d/ctl" "$pid" ioat_request
    rc=$?
    if ! stop_host_server "$IOAT_PID" 2>>"$LOGS/ioat-device.log"; then
        report FAIL ioat-raid5 "pmemblk dma-device ignored SIGTERM ($(secs_since "$t0"); logs: $LOGS/ioat-*)"; return
    fi
    [ "$GONE_STATUS" = 0 ] || { report FAIL ioat-raid5 "pmemblk dma-device exited $GONE_STATUS after SIGTERM ($(secs_since "$t0"); logs: $LOGS/ioat-*)"; return; }
    if [ "$rc" != 0 ]; then
        why=$(result "$out" why)
        report FAIL ioat-raid5 "${why:-the guest run failed (exit $rc): $(grep -m1 -E '^vm: ' "$out" || tail -n 1 "$out")} ($(secs_since "$t0"); logs: $LOGS/ioat-*)"; return
    fi
    for r in status=pass fault=pass ioat_driver=ioatdma selftest=passed "channels=$IOAT_CHANNELS" ioat_mismatch_cnt=0 \
        ioat_fsck=clean cpu_mismatch_cnt=0; do
        [ "$(result "$out" "${r%%=*}")" = "${r#*=}" ] || absent="$absent ${r%%=*}=$(result "$out" "${r%%=*}") (want ${r#*=})"
    done
    [ -z "$absent" ] || { report FAIL ioat-raid5 "the guest ended 0 without these results:$absent ($(secs_since "$t0"); logs: $out)"; return; }
    local faults k
    faults=$(for k in src-out src-span dst-out ring-out ring-mmio cmp-out order reset; do printf '%s %s; ' "$k" "$(result "$out" "fault_$k")"; done)
    report PASS ioat-raid5 "a hostile userspace driver's bad addresses, rings and a RESET under load each halted the channel with CHANERR, nothing copied past a canary, then \
Linux's ioatdma bound pmemblk dma-device over vfio-user (self-test passed, $IOAT_CHANNELS channels); md RAID5 under fio verify handed it \
$(result "$out" ioat_dma_bytes) bytes of copies for fio's $(result "$out" ioat_fio_written), md check mismatch_cnt 0, e2fsck clean; fio and check on the CPU as the baseline ($(secs_since "$t0"))" \
        "faults (state, CHANERR): $faults ioatdma: fio $(result "$out" ioat_fio_bw), $(result "$out" ioat_dma_copies) descriptors ($(result "$out" ioat_prep_failed) preps refused) \
of md's $(result "$out" ioat_md_copy_bytes) copied bytes, $(result "$out" ioat_interrupts) interrupts, device process \
$(result "$out" ioat_device_ticks) ticks; CPU: fio $(result "$out" cpu_fio_bw), md's $(result "$out" cpu_md_copy_bytes) bytes, device process \
$(result "$out" cpu_device_ticks) ticks; /sys/class/dma before: $(result "$out" sysfs_before); after: $(result "$out" sysfs_after)"
}
