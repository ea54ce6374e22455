# shellcheck shell=bash
# The pmem scenarios (pmem, dma, btt) share ONE pair of boots on one NVDIMM (scripts/vm-guest/pmem-check.sh): each
# has its own server on its own pool file on the same ext4 -o dax, its own fio verify, its own FUA writes, and the
# same power cut (QEMU SIGKILLed once every server acknowledged its FUA writes, interleaved so that each one's last is
# as close to the cut as when it was alone: scripts/vm-guest/fua.py) ends them all; the second boot restarts
# each server and reads its FUA data back. Each boot costs a kernel boot, the namespace and the filesystem, and its
# first JVM start pays for the guest's cold caches: shared, the three cost what one did. The first of them in the
# list boots the pair for all that were asked for (and can run: dma and btt need pmemblk, btt pmempool and debugfs);
# each then reports from its own RESULT lines ("RESULT NAME.KEY=..."), and one that fails does not stop the others.
PMEM_SCENARIOS="pmem dma btt"
PMEM_BOOTED=0 PMEM_SECS='' PMEM_NAMES='' PMEM_WHY=''
declare -A PMEM_FAIL=()   # NAME -> why it failed
# pmem_args NAME: the settings of NAME's server; pmem_port NAME: its metrics port (0: none).
pmem_args() {
    case "$1" in
        dma) echo "--set dma.engine=soft --set route.dma.bounce=true --set route.dma.min-bytes=65536" ;;
        btt) echo "--set pmem.layout=btt" ;;   # serve creates the missing pool with a BTT
    esac
}
pmem_port() { if [ "$1" = dma ]; then echo 9464; else echo 0; fi; }
# pmem_skip NAME: why NAME cannot run here (nothing when it can).
pmem_skip() {
    case "$1" in
        dma) [ "$SERVER" = pmemblk ] || echo "needs the pmemblk server (scripts/pmemblk); the stand-in has no copy routes" ;;
        btt) if [ "$SERVER" != pmemblk ]; then echo "needs the pmemblk server (scripts/pmemblk); the stand-in has no BTT"
             elif ! command -v pmempool >/dev/null || ! command -v debugfs >/dev/null; then
                 echo "needs pmempool (pmdk-tools) and debugfs (e2fsprogs) on the host"
             fi ;;
    esac
}
presult() { keyresult "$LOGS/pmem-boot$1.out" "$2"; }

pmem_guest() {
    local s n t0 marker nv="$WORK/pmem.nvdimm" env rc want=() cut=() again=() why w v
    [ "$PMEM_BOOTED" = 1 ] && return 0
    PMEM_BOOTED=1
    t0=$(now_ms)
    for s in "${SCENARIOS[@]}"; do
        case " $PMEM_SCENARIOS " in *" $s "*) [ -n "$(pmem_skip "$s")" ] || want+=("$s") ;; esac
    done
    PMEM_NAMES="${want[*]}"
    [ ${#want[@]} -gt 0 ] || return 0
    env="SERVER=$SERVER PMEM_TOGETHER=${PMEMBLK_PMEM_TOGETHER:-1}"
    for n in "${want[@]}"; do env="$env ARGS_$n='$(pmem_args "$n")' PORT_$n=$(pmem_port "$n")"; done
    marker="POWER-CUT-$RANDOM$RANDOM"
    : >"$LOGS/pmem-boot1.out"; : >"$LOGS/pmem-boot2.out"
    # Bounds for a wedged guest only: a JVM took 100-165 s to start under TCG with other guests and builds on the 2
    # cores, and the servers share one vCPU. 1G: three pools of 256 MiB (fio's 64 MiB, the FUA writes at 200 MiB).
    run_vm --nvdimm "$nv" --nvdimm-size 1G --timeout $((300 + 300 * ${#want[@]})) --kill-after-marker "$marker" \
        --log "$LOGS/pmem-boot1.console.log" \
        -- "$env sh $GUEST_DIR/pmem-check.sh first $marker ${want[*]}" >"$LOGS/pmem-boot1.out" 2>&1
    rc=$?
    for n in "${want[@]}"; do
        why=$(presult 1 "$n.why")
        if [ -n "$why" ]; then PMEM_FAIL[$n]="first boot: $why"
        elif [ "$rc" != 0 ] || [ -z "$(presult 1 "$n.fua_written")" ]; then
            PMEM_FAIL[$n]="first boot (fsdax, server, fio, FUA writes) failed before the power cut: $(grep -m1 -E '^vm: |^pmem-check: ' "$LOGS/pmem-boot1.out" || echo "see $LOGS/pmem-boot1.out")"
        else cut+=("$n"); fi
    done
    # btt: a host-side look at the pool as the power cut left it, before the next open recovers it.
    for n in "${cut[@]}"; do
        if [ "$n" = btt ] && ! btt_crash_check "$nv"; then PMEM_FAIL[btt]=${PMEM_WHY:-"copying btt's pool out of the NVDIMM failed"}; else again+=("$n"); fi
    done
    if [ ${#again[@]} -gt 0 ]; then
        run_vm --nvdimm "$nv" --nvdimm-size 1G --timeout $((240 + 180 * ${#again[@]})) --log "$LOGS/pmem-boot2.console.log" \
            -- "$env sh $GUEST_DIR/pmem-check.sh second ${again[*]}" >"$LOGS/pmem-boot2.out" 2>&1
        rc=$?
        # A failure of the guest's own (the namespace, the mount) is every scenario's; one of a server is its own.
        why=''
        for n in "${again[@]}"; do why="$why$(presult 2 "$n.why")"; done
        if [ "$rc" != 0 ] && [ -z "$why" ]; then
            why="after the power cut: $(grep -m1 -E 'mismatch|lost|not ready|exited|^vm: |^pmem-check: ' "$LOGS/pmem-boot2.out" || echo 'second boot failed')"
            for n in "${again[@]}"; do PMEM_FAIL[$n]=$why; done
        fi
        for n in "${again[@]}"; do
            why=$(presult 2 "$n.why") w=$(presult 1 "$n.fua_written") v=$(presult 2 "$n.fua_verified")
            if [ -n "${PMEM_FAIL[$n]:-}" ]; then continue
            elif [ -n "$why" ]; then PMEM_FAIL[$n]="after the power cut: $why"
            elif [ "$w" != "$v" ]; then PMEM_FAIL[$n]="FUA writes acknowledged ${w:-none}, read back ${v:-none}"
            fi
        done
        case " ${again[*]} " in *" btt "*)
            if [ -z "${PMEM_FAIL[btt]:-}" ]; then
                PMEM_WHY=''
                if ! pool_from_nvdimm "$nv" /pool-btt "$WORK/btt-after.blk" || ! pmempool check -v "$WORK/btt-after.blk" >"$LOGS/btt-after-check.log" 2>&1; then
                    PMEM_FAIL[btt]="pmempool check -v after the second boot: ${PMEM_WHY:-$(grep -m1 -iE 'not consistent|error' "$LOGS/btt-after-check.log" || echo failed)}"
                fi
                rm -f "$WORK/btt-after.blk"
            fi ;;
        esac
    fi
    PMEM_SECS="$(secs_since "$t0") for the boots of $PMEM_NAMES"
}

# pmem_result NAME: SKIP or FAIL NAME and false when it did not pass (pmem_guest first).
pmem_result() {
    local skip
    skip=$(pmem_skip "$1")
    [ -z "$skip" ] || { report SKIP "$1" "$skip"; return 1; }
    pmem_guest
    [ -z "${PMEM_FAIL[$1]:-}" ] || { report FAIL "$1" "${PMEM_FAIL[$1]} ($PMEM_SECS; logs: $LOGS/pmem-*)"; return 1; }
}

scenario_pmem() {
    local is_pmem note
    pmem_result pmem || return
    if [ "$SERVER" = pmemblk ]; then
        is_pmem=$(presult 1 pmem.is_pmem)
        [ "$is_pmem" = true ] || { report FAIL pmem "serve reports is_pmem=${is_pmem:-none} on an fsdax mount ($PMEM_SECS; logs: $LOGS/pmem-*)"; return; }
        note="is_pmem=true on ext4 -o dax"
    else
        note="ext4 -o dax (stand-in nbdkit)"
    fi
    report PASS pmem "$note: fio verify clean, $(presult 2 pmem.fua_verified) FUA writes read back after QEMU was SIGKILLed ($PMEM_SECS)" \
        "fsdax NVDIMM; is_pmem from serve's region line; fio verify=crc32c over 64 MiB; FUA writes of 4 KiB and 1 MiB; the stand-in cannot show is_pmem"
}

scenario_dma() {
    local dma cpu
    pmem_result dma || return
    dma=$(presult 1 dma.dma_bytes) cpu=$(presult 1 dma.cpu_bytes)
    if ! [ "${dma:-0}" -gt 0 ] 2>/dev/null || ! [ "${cpu:-0}" -gt 0 ] 2>/dev/null; then
        report FAIL dma "copy routes not both used: pmemblk_copy_bytes_total dma=${dma:-none} cpu=${cpu:-none} ($PMEM_SECS; logs: $LOGS/pmem-*)"; return
    fi
    report PASS dma "both copy routes used (dma=$dma cpu=$cpu bytes), fio verify clean, FUA writes read back after QEMU was SIGKILLed ($PMEM_SECS)" \
        "dma.engine=soft, route.dma.bounce=true, route.dma.min-bytes=65536; fio verify=crc32c; $(presult 2 dma.fua_verified) FUA writes read back"
}

# pool_from_nvdimm NVDIMM POOL OUT: the guest's pool file (POOL, a path on its ext4 on the fsdax namespace) copied
# out of the NVDIMM file on the host, without mounting: the filesystem is found by its superblock (the namespace's own
# metadata comes first), copied, its journal replayed on the copy (e2fsck), and POOL dumped by debugfs. Sets PMEM_WHY.
pool_from_nvdimm() {
    local nv=$1 src=$2 out=$3 fs="$WORK/btt-fs.img" off
    off=$(/usr/bin/python3 - "$nv" <<'PY'
import sys
with open(sys.argv[1], "rb") as f:
    head = f.read(64 << 20)
for at in range(0, len(head) - 4096, 4096):
    # ext4: the superblock at 1024, magic 0xEF53 at +56, log2(block size) - 10 at +24 (4 KiB: 2)
    if head[at + 1080:at + 1082] == b"\x53\xef" and head[at + 1048] == 2:
        print(at)
        break
PY
) || return 1
    [ -n "$off" ] || { PMEM_WHY="no ext4 superblock in the first 64 MiB of $nv"; return 1; }
    dd if="$nv" of="$fs" bs=1M iflag=skip_bytes skip="$off" status=none || return 1
    e2fsck -fy "$fs" >"$LOGS/btt-e2fsck.log" 2>&1   # replays the journal; exit 1 (fixed) is fine
    [ $? -le 1 ] || { PMEM_WHY="e2fsck of the NVDIMM's filesystem failed (see $LOGS/btt-e2fsck.log)"; return 1; }
    if ! debugfs -R "dump $src $out" "$fs" >"$LOGS/btt-debugfs.log" 2>&1 || [ ! -s "$out" ]; then
        PMEM_WHY="debugfs could not dump $src (see $LOGS/btt-debugfs.log)"; return 1
    fi
    rm -f "$fs"
}

# btt_crash_check NVDIMM: pmempool check -v on btt's pool as the power cut left it (before the next open recovers).
btt_crash_check() {
    local pool="$WORK/btt-crash.blk"
    PMEM_WHY=''
    pool_from_nvdimm "$1" /pool-btt "$pool" || return 1
    pmempool check -v "$pool" >"$LOGS/btt-crash-check.log" 2>&1 \
        || { PMEM_WHY="pmempool check -v on the crash image: $(grep -m1 -iE 'not consistent|error' "$LOGS/btt-crash-check.log" || echo failed)"; return 1; }
    rm -f "$pool"
}

scenario_btt() {
    pmem_result btt || return
    report PASS btt "pmem.layout=btt: fio verify clean, $(presult 2 btt.fua_verified) FUA writes read back after QEMU was SIGKILLed, pmempool check -v clean on the crash image and \
after the restart ($PMEM_SECS)" \
        "fsdax NVDIMM; the BTT made by serve on a new pool; fio verify=crc32c over 64 MiB; FUA writes of 4 KiB and 1 MiB; pool copied out of the NVDIMM's ext4 with e2fsck + debugfs"
}
