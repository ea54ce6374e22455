# shellcheck shell=bash
# NVMe/TCP: the target and the kernel's host (nvme-tcp) in ONE guest over 127.0.0.1, nvme-cli 2.3 (Debian's
# nvme-cli, installed on the host when missing: the guest runs the host's root). scripts/vm-guest/nvme-tcp-check.sh has
# the steps; scripts/vm-guest/nvme-hostile.py the hostile peers. nvme-tcp runs pmemblk's target on a pool on the
# emulated NVDIMM (ext4 without DAX) and ends with a FUA'd, a flushed and a never-flushed write and a power cut: the
# host reads them back from the pool in the NVDIMM file. When powercut runs too, nvme-tcp's steps run in powercut's
# last boot after its read-back (nvme_share_boot): one boot fewer. Its server JVMs start from the AOT cache every guest
# JVM starts from (scripts/lib/guest-aot.sh, scripts/vm-guest/guest-java.sh). nvme-tcp-nvmet (not in the default list) runs the same steps against the kernel's
# nvmet-tcp over brd, the peer baseline: its hostile answers and fio figures are reported, not asserted.
NVME_PORT=4420
NVME_NQN=nqn.2026-12.io.pmemblk:test
# serve's settings for the NVMe/TCP frontend (the nvme.* keys of docs/configuration.md) and its ready line
NVME_ARGS=${PMEMBLK_NVME_ARGS:-"--set nvme.listen=127.0.0.1:$NVME_PORT --set nvme.subsystem-nqn=$NVME_NQN"}
NVME_READY=${PMEMBLK_NVME_READY:-"^ready: nvme-tcp 127.0.0.1:$NVME_PORT $NVME_NQN"}

# nvme_packages LOG: nvme-cli on the host (the guest's root), ensure_packages' way; false, naming it, when missing.
nvme_packages() {
    # shellcheck disable=SC2094  # the log is read only after the install wrote it and ended
    ( . "$REPO_ROOT/scripts/lib/common.sh" && ensure_packages nvme-cli fio ) >>"$1" 2>&1 \
        || { echo "nvme-cli missing and not installed (apt-get install nvme-cli): $(tail -n 1 "$1")"; return 1; }
}

# A boot shared with powercut: its last boot reads the last cut back and stops its server, then runs nvme-tcp's steps
# on an NVDIMM of their own, and nvme-tcp's power cut ends it (scripts/vm-test.d/powercut.sh). NVME_SHARED_RC is that
# boot's exit status once it ran them (their output split off into $LOGS/nvme-tcp.out), NVME_SHARED_NOTE what the
# report says of the boot; both empty when nvme-tcp boots alone.
NVME_SHARED_RC='' NVME_SHARED_NOTE='' NVME_RAN=0
# nvme_share_boot: true when powercut's last boot is to run nvme-tcp's steps: nvme-tcp is asked for in this run too,
# later, with pmemblk's server and nvme-cli on the host (else nvme-tcp reports why when its turn comes).
nvme_share_boot() {
    [ "$SERVER" = pmemblk ] && [ "$NVME_RAN" = 0 ] || return 1
    case " ${SCENARIOS[*]} " in *" nvme-tcp "*) ;; *) return 1 ;; esac
    nvme_packages "$LOGS/nvme-packages.log" >/dev/null
}
# nvme_guest_cmd MARKER: the guest's command for nvme-tcp's steps, ending with MARKER.
nvme_guest_cmd() {
    echo "TARGET=pmemblk PORT=$NVME_PORT NQN=$NVME_NQN NVME_ARGS='$NVME_ARGS' READY_RE='$NVME_READY' MARKER=$1 \
RATE_SECS=${PMEMBLK_NVME_RATE_SECS:-0} sh $GUEST_DIR/nvme-tcp-check.sh"
}

# nvme_took T0: how long nvme-tcp took, or where its steps ran and how long they took there.
nvme_took() { echo "${NVME_SHARED_NOTE:-$(secs_since "$1")}"; }

scenario_nvme_tcp() {
    local t0 out="$LOGS/nvme-tcp.out" nv="$WORK/nvme.nvdimm" marker rc why pool="$WORK/nvme-pool.bin" k off sum got
    t0=$(now_ms) NVME_RAN=1
    [ "$SERVER" = pmemblk ] || { report SKIP nvme-tcp "needs the pmemblk server (scripts/pmemblk)"; return; }
    if [ -n "$NVME_SHARED_RC" ]; then
        rc=$NVME_SHARED_RC   # the steps ran in powercut's last boot
    else
        why=$(nvme_packages "$LOGS/nvme-packages.log") || { report FAIL nvme-tcp "$why"; return; }
        marker="NVME-POWER-CUT-$RANDOM$RANDOM"
        run_vm --nvdimm "$nv" --nvdimm-size 256M --timeout 1200 --kill-after-marker "$marker" --log "$LOGS/nvme-tcp.console.log" \
            -- "$(nvme_guest_cmd "$marker")" >"$out" 2>&1
        rc=$?
    fi
    why=$(result "$out" why)
    if [ -n "$why" ] || [ "$rc" != 0 ] || [ "$(result "$out" status)" != pass ]; then
        report FAIL nvme-tcp "${why:-the guest run failed (exit $rc): $(grep -m1 -E '^vm: ' "$out" || tail -n 1 "$out")} ($(nvme_took "$t0"); logs: $LOGS/nvme-tcp*)"; return
    fi
    # The power cut: the FUA'd and the flushed write, read from the pool in the NVDIMM file as the cut left it.
    PMEM_WHY=''
    pool_from_nvdimm "$nv" /pool "$pool" || { report FAIL nvme-tcp "after the power cut: ${PMEM_WHY:-could not copy the pool out of the NVDIMM} ($(nvme_took "$t0"); logs: $LOGS/nvme-tcp*)"; return; }
    for k in fua flushed; do
        read -r off sum <<<"$(result "$out" "$k")"
        got=$(dd if="$pool" bs=64K iflag=skip_bytes skip="$off" count=1 status=none | sha256sum | cut -d' ' -f1)
        [ "$got" = "$sum" ] || { report FAIL nvme-tcp "the $k write (64 KiB at byte $off, sha256 $sum) read back after the power cut as $got ($(nvme_took "$t0"); logs: $out)"; rm \
            -f "$pool"; return; }
    done
    # The third write was never flushed: it sat only in the guest's page cache at the cut, so it may be lost; the
    # report says which, to show the cut could lose what was not made durable.
    read -r off sum <<<"$(result "$out" unflushed)"
    got=$(dd if="$pool" bs=64K iflag=skip_bytes skip="$off" count=1 status=none | sha256sum | cut -d' ' -f1)
    local unflushed=kept
    [ "$got" = "$sum" ] || unflushed=lost
    rm -f "$pool"
    report PASS nvme-tcp "pmemblk's NVMe/TCP target to the kernel's host: discover, connect -i 2 and -g -G, id-ctrl/id-ns/ns-descs/get-feature 6/flush/write-zeroes/dsm as \
specified, fio verify on /dev/nvmeXn1 and io_uring_cmd on /dev/ngXn1, ext4 + e2fsck clean, $(result "$out" hostile.status) against the hostile peers, \
fio over -g -G clean across kill -9 and a new server (same namespace IDs, reconnected after $(result "$out" reconnected_after)), a FUA'd and a flushed write read back after the power cut (a never-flushed one: $unflushed) ($(nvme_took "$t0"))" \
        "id-ctrl: $(result "$out" id_ctrl); id-ns: $(result "$out" id_ns); $(result "$out" ns_descs); vwc: $(result "$out" vwc); dsm: $(result "$out" dsm); hostile: \
$(grep '^RESULT hostile\.' "$out" | sed 's/^RESULT hostile\.//' | tr '\n' ';'); rate (IOPS MB/s err) libaio $(result "$out" rate_libaio), io_uring_cmd \
$(result "$out" rate_io_uring_cmd); $(result "$out" region); JVM starts: $GUEST_AOT_NOTE ($(result "$out" aot)), $(grep -o 'server ready after [0-9]* s' "$out" | tr '\n' ';'); \
steps (guest uptime): $(sed -n 's/^nvme-tcp-check: \[\([0-9.]*\)s\] == \(.*\)/\2 \1/p' "$out" | tr '\n' ';')"
}

scenario_nvme_tcp_nvmet() {
    local t0 out="$LOGS/nvme-tcp-nvmet.out" rc why
    t0=$(now_ms)
    why=$(nvme_packages "$LOGS/nvme-packages.log") || { report FAIL nvme-tcp-nvmet "$why"; return; }
    run_vm --timeout 900 --log "$LOGS/nvme-tcp-nvmet.console.log" \
        -- "TARGET=kernel PORT=$NVME_PORT NQN=$NVME_NQN RATE_SECS=${PMEMBLK_NVME_RATE_SECS:-5} HOSTILE_FATAL=0 sh $GUEST_DIR/nvme-tcp-check.sh" >"$out" 2>&1
    rc=$?
    why=$(result "$out" why)
    if [ -n "$why" ] || [ "$rc" != 0 ] || [ "$(result "$out" status)" != pass ]; then
        report FAIL nvme-tcp-nvmet "${why:-the guest run failed (exit $rc): $(grep -m1 -E '^vm: ' "$out" || tail -n 1 "$out")} ($(secs_since "$t0"); logs: $LOGS/nvme-tcp-nvmet*)"; return
    fi
    report PASS nvme-tcp-nvmet "the kernel's nvmet-tcp over brd, the same steps: discover, connect -i 2 and -g -G, identify, flush, write-zeroes, dsm, fio verify (libaio and \
io_uring_cmd), ext4; hostile peers $(result "$out" hostile.status) (not asserted); rate libaio $(result "$out" rate_libaio), io_uring_cmd \
$(result "$out" rate_io_uring_cmd) (IOPS MB/s err) ($(secs_since "$t0"))" \
        "id-ctrl: $(result "$out" id_ctrl); id-ns: $(result "$out" id_ns); vwc: $(result "$out" vwc); dsm: $(result "$out" dsm); hostile: \
$(grep '^RESULT hostile\.' "$out" | sed 's/^RESULT hostile\.//' | tr '\n' ';')"
}
