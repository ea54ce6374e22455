# shellcheck shell=bash
# vhost-user-blk: a server on the host exports a file over vhost-user-blk and the guest's /dev/vda is QEMU's
# vhost-user-blk-pci on it, 2 virtqueues, reconnect=1 (the server may go away and come back under the running guest).
# The guest script (scripts/vm-guest/vhost-check.sh) asks the host to restart or kill the server, or for its metrics,
# through a shared request directory (scripts/lib/vm-host.sh). One boot per scenario; no JVM in the guest.
# PMEMBLK_VHOST_BACKEND=qsd runs the same steps against qemu-storage-daemon's vhost-user-blk export: the reference
# that shows the scenario itself sound (it has no copy routes: the route check is left out).
VHOST_BACKEND=${PMEMBLK_VHOST_BACKEND:-pmemblk}
VHOST_SIZE=512M VHOST_BYTES=$((512 << 20))
VHOST_PID='' VHOST_FILE='' VHOST_SOCK='' VHOST_LOG='' VHOST_LOGS='' VHOST_STARTS=0 VHOST_PORT=0
VHOST_SETS=()

# vhost_start: the server (VHOST_BACKEND) on VHOST_FILE, listening on VHOST_SOCK, 2 queues; waits (bounded) until it
# serves. Sets VHOST_PID and VHOST_LOG (one log per start).
vhost_start() {
    VHOST_STARTS=$((VHOST_STARTS + 1))
    VHOST_LOG="$VHOST_LOGS-server-$VHOST_STARTS.log"
    rm -f "$VHOST_SOCK"
    if [ "$VHOST_BACKEND" = qsd ]; then
        [ -e "$VHOST_FILE" ] || truncate -s "$VHOST_SIZE" "$VHOST_FILE"
        qsd_vhost "$VHOST_FILE" "$VHOST_SOCK" discard=unmap >"$VHOST_LOG" 2>&1 &
    else
        PMEMBLK_JAVA_OPTS="-XX:ErrorFile=$CRASHES/hs_err_pid%p.log ${PMEMBLK_JAVA_OPTS:-}" \
            pmemblk_vhost "$VHOST_FILE" "$VHOST_SIZE" "$VHOST_SOCK" "${VHOST_SETS[@]}" >"$VHOST_LOG" 2>&1 &
    fi
    VHOST_PID=$!
    PIDS+=("$VHOST_PID")
    # A JVM start (and a first build of the jar) takes longer than qemu-storage-daemon's.
    wait_server "$VHOST_PID" 240 "$VHOST_LOG" vhost_ready "$VHOST_BACKEND" "$VHOST_LOG" "$VHOST_SOCK"
}

# vhost_stop SIGNAL: the server ended by SIGNAL (TERM: pmemblk must exit 0), waited for (bounded). Says what went wrong.
vhost_stop() {
    # bash reports a child killed by a signal ("Killed ...") on its stderr when it reaps it: not in the answer.
    exec 5>&2 2>/dev/null
    kill -"$1" "$VHOST_PID"
    if ! wait_gone "$VHOST_PID" 60; then
        kill -KILL "$VHOST_PID"
        exec 2>&5 5>&-
        echo "the server ignored SIG$1 for 60 s"; return 1
    fi
    exec 2>&5 5>&-
    if [ "$1" = TERM ] && [ "$VHOST_BACKEND" = pmemblk ] && [ "$GONE_STATUS" != 0 ]; then
        echo "the server exited $GONE_STATUS on SIGTERM (want 0): $(tail -n 1 "$VHOST_LOG")"; return 1
    fi
}

# vhost_dirty: KiB of the disk file the server's mappings hold dirty (Shared_Dirty + Private_Dirty in its smaps: pages
# written and not yet written back, by msync or the kernel's flusher, which leaves a page up to 30 s). A power cut of
# the host now would lose them: the power cut of the server's view, measured without cutting anything.
vhost_dirty() {
    local file
    file=$(readlink -f "$VHOST_FILE")
    [ -r "/proc/$VHOST_PID/smaps" ] || { echo "no /proc/$VHOST_PID/smaps"; return 1; }
    awk -v f="$file" '/^[0-9a-f]+-[0-9a-f]+ / { on = ($NF == f) } on && /^(Shared|Private)_Dirty:/ { s += $2 }
        END { print s + 0 }' "/proc/$VHOST_PID/smaps"
}

# The host's answers to vhost-check.sh (vm_requests_serve): restart (SIGTERM, a new server on the same file), kill
# (SIGKILL, the same), metrics (the server's Prometheus text), dirty (vhost_dirty).
vhost_request() {
    local t0
    t0=$(now_ms)
    case "$1" in
        restart|kill)
            vhost_stop "$([ "$1" = kill ] && echo KILL || echo TERM)" || return 1
            vhost_start || { echo "no new server after the $1: $(tail -n 2 "$VHOST_LOG" | tr '\n' ' ')"; return 1; }
            echo "server $([ "$1" = kill ] && echo 'killed (SIGKILL)' || echo "stopped (SIGTERM, exit $GONE_STATUS)") and serving again after $(secs_since "$t0")" ;;
        metrics)
            curl -fsS --max-time 10 "http://127.0.0.1:$VHOST_PORT/metrics" || { echo "no metrics on port $VHOST_PORT"; return 1; } ;;
        dirty)
            vhost_dirty ;;
        dma-cycle)
            vhost_dma_request "$@" ;;
        backup)
            vhost_backup "$2" ;;
        *)
            echo "unknown request '$*' (known: restart, kill, metrics, dirty, dma-cycle BYTES, backup full|increment)"; return 1 ;;
    esac
}

# vhost_backup full|increment: an incremental backup of the disk from the host, over the server's NBD socket and its
# dirty bitmap b (docs/bitmaps.md), while the guest waits: full: the full copy's boundary (a checkpoint, its frozen
# half dropped) and the full copy (nbdcopy); increment: a checkpoint, the dirty blocks copied onto the full copy
# (scripts/pmemblk-backup), and the copy's sha256 must equal the disk's as the server serves it.
vhost_backup() {
    local uri="nbd+unix:///pmem0?socket=$VHOST_SOCK.nbd" ctl="$VHOST_FILE.bitmaps/control.sock" copy="${VHOST_FILE%.img}-backup.img"
    local f n a b
    f=$(/usr/bin/python3 "$REPO_ROOT/scripts/vm-guest/bitmapctl.py" "$ctl" checkpoint b 2>&1) || { echo "$f"; return 1; }
    case "$1" in
        full)
            n=$(/usr/bin/python3 "$REPO_ROOT/scripts/vm-guest/bitmapctl.py" "$ctl" remove "$f" 2>&1) || { echo "$n"; return 1; }
            timeout 300 nbdcopy "$uri" "$copy" 2>&1 || { echo "nbdcopy $uri $copy failed"; return 1; }
            echo "full copy of $(stat -c %s "$copy") bytes after the checkpoint that froze $f" ;;
        increment)
            n=$(timeout 300 /usr/bin/python3 "$REPO_ROOT/scripts/pmemblk-backup" "$uri" "$f" "$copy" 2>&1) \
                || { echo "pmemblk-backup $f: $n"; return 1; }
            a=$(sha256sum <"$copy") b=$(timeout 300 nbdcopy "$uri" - | sha256sum)
            rm -f "$copy"
            [ "$a" = "$b" ] || { echo "after $n bytes copied from $f: sha256 of the copy ${a%% *}, of the disk ${b%% *}"; return 1; }
            if [ "$n" -le 0 ] || [ "$n" -ge "$VHOST_BYTES" ]; then
                echo "the increment from $f is $n bytes: not a part of the disk"; return 1
            fi
            echo "equal: $n bytes copied from $f onto the full copy, sha256 ${a:0:16} as the disk's" ;;
        *)
            echo "backup $1: allowed full, increment"; return 1 ;;
    esac
}

# vhost_boot NAME "MODE...": one guest on the server's disk running `vhost-check.sh MODE...`, its requests answered;
# the server stopped after. Sets VHOST_OUT and VHOST_WHY (empty when the guest and the server's stop went well; the
# wcache mode's results are its scenario's to judge).
vhost_boot() {
    local name=$1 mode=$2 d="$WORK/$1" pid rc
    VHOST_WHY='' VHOST_OUT="$LOGS/$name.out"
    mkdir -p "$d/ctl"
    VHOST_FILE="$d/disk.img" VHOST_SOCK="$d/vhost.sock" VHOST_LOGS="$LOGS/$name" VHOST_STARTS=0
    if [ "${mode%% *}" = functional ] && [ "$VHOST_BACKEND" = pmemblk ]; then
        VHOST_PORT=$(free_port)
        VHOST_SETS=(--set dma.engine=soft --set route.dma.min-bytes=65536 --set "metrics.port=$VHOST_PORT"
            --set bitmap.dir=auto --set bitmap.names=b)
    elif [ "$mode" = dmakill ]; then
        # the device process (started by the scenario) does the copies of requests of 64 KiB and more
        VHOST_PORT=$(free_port)
        VHOST_SETS=(--set dma.engine=vfio-user --set "dma.vfio-user.socket=$VHOST_DMA_SOCK" --set route.dma.min-bytes=65536
            --set "metrics.port=$VHOST_PORT")
    else
        VHOST_SETS=()
    fi
    if ! vhost_start; then VHOST_WHY="the server did not start: $(tail -n 2 "$VHOST_LOG" | tr '\n' ' ')"; return; fi
    "$VM" --crash-dir "$CRASHES" --vhost-user-blk "$VHOST_SOCK" --vhost-queues 2 --vhost-reconnect \
        --share "$d/ctl:ctl:/mnt/ctl" --timeout 900 --log "$LOGS/$name.console.log" \
        -- "BACKEND=$VHOST_BACKEND DISK_BYTES=$VHOST_BYTES sh $GUEST_DIR/vhost-check.sh $mode" >"$VHOST_OUT" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    vm_requests_serve "$d/ctl" "$pid" vhost_request
    rc=$?
    vhost_stop TERM >"$LOGS/$name-stop.txt" || VHOST_WHY="after the guest: $(cat "$LOGS/$name-stop.txt")"
    if [ "$rc" != 0 ]; then
        VHOST_WHY="$(result "$VHOST_OUT" why)"
        [ -n "$VHOST_WHY" ] || VHOST_WHY="the guest run failed (exit $rc): $(grep -m1 -E '^vm: ' "$VHOST_OUT" || tail -n 1 "$VHOST_OUT")"
        return
    fi
    # A clean exit is not enough: every check must have said what it saw.
    local r absent='' want=()
    case " $mode " in *" functional "*|*" restart "*|*" dmakill "*) want+=(fio=verified dmesg=clean) ;; esac
    case " $mode " in *" functional "*) want+=(discard=ok fsck=clean verified=5) ;; esac
    case " $mode " in *" backup "*) want+=(backup=equal) ;; esac
    for r in "${want[@]}"; do
        [ "$(result "$VHOST_OUT" "${r%%=*}")" = "${r#*=}" ] || absent="$absent ${r%%=*}=$(result "$VHOST_OUT" "${r%%=*}") (want ${r#*=})"
    done
    [ -z "$absent" ] || VHOST_WHY="the guest ended 0 without these results:$absent${VHOST_WHY:+; $VHOST_WHY}"
}

# vhost-vfio-user: the vhost disk's server copies through `pmemblk dma-device` on the host
# (dma.engine=vfio-user; vfio-user is only between the two processes, so Debian's QEMU boots the guest). The guest
# (vhost-check.sh dmakill) runs fio verify in 2 MiB requests and asks for the device to be SIGKILLed once the DMA route
# carried 16 MiB, then started again; the host checks the server's log at each step.
VHOST_DMA_SOCK=''
# vhost_dma_bytes: the bytes the server's DMA route has carried (its metrics).
vhost_dma_bytes() {
    curl -fsS --max-time 10 "http://127.0.0.1:$VHOST_PORT/metrics" \
        | awk '/^pmemblk_copy_bytes_total\{/ && /route="dma"/ { s += $NF } END { printf "%.0f", s }'
}
# vhost_log_wait TEXT N WHAT: the server's Nth log line with TEXT, waited for (bounded, 60 s after WHAT).
vhost_log_wait() {
    local deadline=$(( $(date +%s) + 60 ))
    until [ "$(grep -c "$1" "$VHOST_LOG")" -ge "$2" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "the server did not log '$1' (time $2) within 60 s of $3: $(tail -n 2 "$VHOST_LOG" | tr '\n' ' ')"; return 1; }
        sleep 0.1   # polling the server's log
    done
    grep "$1" "$VHOST_LOG" | sed -n "$2p"
}
# vhost_dma_request dma-cycle BYTES (the guest's fio running): once the DMA route carried BYTES more and is moving (it
# grew since the last look 0.1 s before; polled here, fast, bounded 120 s), the device is stopped (SIGSTOP) until the
# route stalls, so that copies are in its hands, then SIGKILLed, and the server's log must say it is gone
# and the copies it held are redone by the CPU; the device is started again on the same socket, and the server's
# log must say it is back. A kill that found the device holding no copy proves no redo: once more then (2 at most,
# fio's run is ~30 s). Sets VHOST_DMA_CYCLES, VHOST_DMA_HELD (copies held at the last kill), VHOST_DMA_AT_KILL,
# VHOST_DMA_AT_LOSS and VHOST_DMA_AT_BACK (the DMA route's bytes then); the answer quotes the server's lines.
VHOST_DMA_CYCLES=0 VHOST_DMA_HELD=0 VHOST_DMA_AT_KILL='' VHOST_DMA_AT_LOSS='' VHOST_DMA_AT_BACK=0
vhost_dma_request() {
    local t0 deadline line back now prev want
    while :; do
        want=$(( VHOST_DMA_AT_BACK + $2 )) prev=$VHOST_DMA_AT_BACK deadline=$(( $(date +%s) + 120 ))
        until now=$(vhost_dma_bytes) && [ "${now:-0}" -ge "$want" ] && [ "$now" -gt "$prev" ]; do
            [ "$(date +%s)" -lt "$deadline" ] || { echo "the DMA route carried ${now:-?} bytes (want $want, moving) within 120 s: the guest's requests did not take it"; return 1; }
            prev=${now:-$prev}
            sleep 0.1   # polling the server's counters
        done
        # The device stopped first, until the DMA route stalls (unchanged over two looks 0.1 s apart; 2 s at most,
        # within the client's 5 s reply timeout): fio's next 2 MiB requests are then in its ring, held at the kill.
        kill -STOP "$IOAT_PID"
        deadline=$(( $(now_ms) + 2000 )) prev=-1
        while [ "$(now_ms)" -lt "$deadline" ]; do
            now=$(vhost_dma_bytes)
            [ "$now" != "$prev" ] || break
            prev=$now
            sleep 0.1   # polling the server's counters
        done
        VHOST_DMA_AT_KILL=$now VHOST_DMA_CYCLES=$((VHOST_DMA_CYCLES + 1)) t0=$(now_ms)
        exec 5>&2 2>/dev/null   # bash's "Killed" notice when it reaps the device: not in the answer
        kill -KILL "$IOAT_PID"
        wait_gone "$IOAT_PID" 30 || { exec 2>&5 5>&-; echo "the device process $IOAT_PID outlived SIGKILL by 30 s"; return 1; }
        exec 2>&5 5>&-
        line=$(vhost_log_wait 'is gone (' "$VHOST_DMA_CYCLES" "the device's SIGKILL") || { echo "$line"; return 1; }
        VHOST_DMA_AT_LOSS=$(vhost_dma_bytes)
        case "$line" in *" copies it held are redone by the CPU"*) ;;
            *) echo "the server's loss line does not say the held copies are redone by the CPU: $line"; return 1 ;; esac
        VHOST_DMA_HELD=$(sed -n 's/.*; \([0-9]*\) copies it held are redone by the CPU.*/\1/p' <<<"$line")
        printf '%s' "kill $VHOST_DMA_CYCLES (after a SIGSTOP) at $VHOST_DMA_AT_KILL DMA route bytes, noticed after $(secs_since "$t0") ($VHOST_DMA_AT_LOSS bytes then): ${line#*vfio-user: }; "
        t0=$(now_ms)
        ioat_device_start "$VHOST_DMA_SOCK" "$IOAT_LOG" || { echo "the device did not start again: $(tail -n 2 "$IOAT_LOG" | tr '\n' ' ')"; return 1; }
        back=$(vhost_log_wait 'is back after' "$VHOST_DMA_CYCLES" "the device's restart") || { echo "$back"; return 1; }
        VHOST_DMA_AT_BACK=$(vhost_dma_bytes)
        printf '%s' "started again, back after $(secs_since "$t0") ($VHOST_DMA_AT_BACK bytes then): ${back#*vfio-user: }; "
        if [ "${VHOST_DMA_HELD:-0}" != 0 ] || [ "$VHOST_DMA_CYCLES" -ge 2 ]; then break; fi
    done
    echo
    [ "${VHOST_DMA_HELD:-0}" -gt 0 ] || { echo "in $VHOST_DMA_CYCLES kills the device never held a copy: nothing was redone by the CPU"; return 1; }
}

scenario_vhost_vfio_user() {
    local t0 why d="$WORK/vhost-vfio-user" r
    t0=$(now_ms)
    why=$(vhost_missing)
    [ -z "$why" ] || { report SKIP vhost-vfio-user "$why"; return; }
    [ "$VHOST_BACKEND" = pmemblk ] || { report SKIP vhost-vfio-user "qemu-storage-daemon has no DMA route"; return; }
    why=$(vfio_user_library "$LOGS/vhost-vfio-user-peers.log") || { report FAIL vhost-vfio-user "$why"; return; }
    mkdir -p "$d"
    VHOST_DMA_SOCK="$d/ioat.sock"
    ioat_device_start "$VHOST_DMA_SOCK" "$LOGS/vhost-vfio-user-device.log" \
        || { report FAIL vhost-vfio-user "pmemblk dma-device did not start: $(tail -n 2 "$LOGS/vhost-vfio-user-device.log" | tr '\n' ' ') ($(secs_since "$t0"); logs: \
$LOGS/vhost-vfio-user*)"; return; }
    vhost_boot vhost-vfio-user dmakill
    if ! stop_host_server "$IOAT_PID" 2>>"$IOAT_LOG"; then
        why="${VHOST_WHY:+$VHOST_WHY; }pmemblk dma-device ignored SIGTERM"
    elif [ "$GONE_STATUS" != 0 ]; then
        why="${VHOST_WHY:+$VHOST_WHY; }pmemblk dma-device exited $GONE_STATUS after SIGTERM"
    else
        why=$VHOST_WHY
    fi
    [ -z "$why" ] || { report FAIL vhost-vfio-user "$why ($(secs_since "$t0"); logs: $LOGS/vhost-vfio-user*)"; return; }
    r=$(grep -c 'is gone (' "$LOGS/vhost-vfio-user-server-1.log")
    [ "$r" = "$VHOST_DMA_CYCLES" ] || { report FAIL vhost-vfio-user "the server logged the device's loss $r times (want $VHOST_DMA_CYCLES) ($(secs_since "$t0"); logs: \
$LOGS/vhost-vfio-user*)"; return; }
    local o=$VHOST_OUT
    [ "$(result "$o" dma_after)" -gt "${VHOST_DMA_AT_BACK:-0}" ] 2>/dev/null \
        || { report FAIL vhost-vfio-user "the DMA route did not grow after the device came back: ${VHOST_DMA_AT_BACK:-?} bytes then, $(result "$o" dma_after) at the end \
($(secs_since "$t0"); logs: $LOGS/vhost-vfio-user*)"; return; }
    report PASS vhost-vfio-user "fio verify (2 MiB requests) on /dev/vda served with dma.engine=vfio-user clean across a SIGKILL of pmemblk dma-device mid-run (its $VHOST_DMA_HELD \
held copies redone by the CPU) and its restart ($VHOST_DMA_CYCLES kill(s)); DMA route bytes $VHOST_DMA_AT_KILL at the kill, $VHOST_DMA_AT_LOSS at the \
loss, $VHOST_DMA_AT_BACK at the return, $(result "$o" dma_after) at the end ($(secs_since "$t0"))" \
        "$(result "$o" dma_cycle)CPU route bytes $(result "$o" cpu_at_return) after the return, $(result "$o" cpu_after) at the end; fio: \
$(grep -h -E '^fio (dmakill|again)\| *(WRITE|READ):' "$o" | tr '\n' ' ')"
}

vhost_label() {
    if [ "$VHOST_BACKEND" = qsd ]; then echo "qemu-storage-daemon"; else echo "pmemblk"; fi
}

# Both skip when the server they need is missing: pmemblk's launcher, or qemu-storage-daemon (qemu-system-common).
vhost_missing() {
    if [ "$VHOST_BACKEND" = qsd ]; then command -v qemu-storage-daemon >/dev/null || echo "qemu-storage-daemon not installed (package qemu-system-common)"
    elif [ "$SERVER" != pmemblk ]; then echo "needs the pmemblk server (scripts/pmemblk)"; fi
}

scenario_vhost() {
    local t0 why routes
    t0=$(now_ms)
    why=$(vhost_missing)
    [ -z "$why" ] || { report SKIP vhost "$why"; return; }
    # pmemblk also keeps a dirty bitmap: after the functional steps, an incremental backup of the guest's writes
    if [ "$VHOST_BACKEND" = pmemblk ]; then vhost_boot vhost "functional backup"; else vhost_boot vhost functional; fi
    [ -z "$VHOST_WHY" ] || { report FAIL vhost "$VHOST_WHY ($(secs_since "$t0"); logs: $LOGS/vhost*)"; return; }
    if [ "$VHOST_BACKEND" = pmemblk ]; then
        routes="both copy routes used (dma=$(result "$VHOST_OUT" dma_bytes) cpu=$(result "$VHOST_OUT" cpu_bytes) bytes), incremental backup of the guest's \
writes from dirty bitmap b ($(result "$VHOST_OUT" backup_detail))"
    else
        routes="copy routes not checked (qemu-storage-daemon has none)"
    fi
    report PASS vhost "ext4 on /dev/vda over vhost-user-blk ($(vhost_label)): blkdiscard and -z, fio verify on both queues, $routes, $(result "$VHOST_OUT" verified) files verified \
across a server restart, e2fsck clean ($(secs_since "$t0"))" \
        "2 virtqueues, interrupts per queue during fio verify (crc32c, 4k..1m, iodepth 32, 2 jobs): $(result "$VHOST_OUT" queue_interrupts); discard_max \
$(result "$VHOST_OUT" discard_max), write_zeroes_max $(result "$VHOST_OUT" write_zeroes_max); $(result "$VHOST_OUT" restart); server: ${VHOST_SETS[*]:-defaults}"
}

# vhost-restart and vhost-wcache share one boot (a guest boot and a server start each cost more than their steps):
# the first of them in the run boots it for both, wcache's steps first (they need a disk no earlier server left
# dirty pages in). Sets VHOST_SHARED_OUT, VHOST_SHARED_WHY and VHOST_SHARED_SECS.
VHOST_SHARED_DONE=0 VHOST_SHARED_OUT='' VHOST_SHARED_WHY='' VHOST_SHARED_SECS=''
vhost_shared_boot() {
    local modes=() t0
    [ "$VHOST_SHARED_DONE" = 0 ] || return 0
    VHOST_SHARED_DONE=1 t0=$(now_ms)
    case " ${SCENARIOS[*]} " in *" vhost-wcache "*) [ "$VHOST_BACKEND" = qsd ] || modes+=(wcache) ;; esac
    case " ${SCENARIOS[*]} " in *" vhost-restart "*) modes+=(restart) ;; esac
    vhost_boot vhost-restart "${modes[*]}"
    VHOST_SHARED_OUT=$VHOST_OUT VHOST_SHARED_WHY=$VHOST_WHY VHOST_SHARED_SECS=$(secs_since "$t0")
}

scenario_vhost_wcache() {
    local why lost
    why=$(vhost_missing)
    [ -z "$why" ] || { report SKIP vhost-wcache "$why"; return; }
    # qemu-storage-daemon writes through the page cache (no mapping to read dirty pages of): not measurable here.
    [ "$VHOST_BACKEND" != qsd ] || { report SKIP vhost-wcache "qemu-storage-daemon maps no file: its dirty pages are not the server's mapping's"; return; }
    vhost_shared_boot
    lost=$(result "$VHOST_SHARED_OUT" wcache_lost_kib)
    why=$(result "$VHOST_SHARED_OUT" wcache_why)
    if [ "$(result "$VHOST_SHARED_OUT" wcache)" != durable ]; then
        [ -n "$why" ] || why=${VHOST_SHARED_WHY:-no wcache result from the guest: $(grep -m1 -E '^vm: ' "$VHOST_SHARED_OUT" || tail -n 1 "$VHOST_SHARED_OUT")}
        report FAIL vhost-wcache "$why ($VHOST_SHARED_SECS shared boot; logs: $LOGS/vhost-restart*)"; return
    fi
    report PASS vhost-wcache "write through set in the guest kept across a SIGKILL of the server and a new one (QEMU reconnect=1): the 4 writes after it durable when they \
completed, a power cut of the server's view loses ${lost} KiB ($VHOST_SHARED_SECS shared boot)" \
        "cache_type at boot: $(result "$VHOST_SHARED_OUT" wcache_initial); the record: $(grep -h -m1 'write cache' "$LOGS"/vhost-restart-server-2.log 2>/dev/null)"
}

scenario_vhost_restart() {
    local t0 why
    t0=$(now_ms)
    why=$(vhost_missing)
    [ -z "$why" ] || { report SKIP vhost-restart "$why"; return; }
    vhost_shared_boot
    VHOST_OUT=$VHOST_SHARED_OUT VHOST_WHY=$VHOST_SHARED_WHY
    [ -z "$VHOST_WHY" ] || { report FAIL vhost-restart "$VHOST_WHY ($(secs_since "$t0"); logs: $LOGS/vhost-restart*)"; return; }
    report PASS vhost-restart "fio verify on /dev/vda ($(vhost_label)) clean across a SIGKILL of the server under load and a new server (QEMU reconnect=1), no I/O error in the \
guest ($VHOST_SHARED_SECS boot)" \
        "killed after $(result "$VHOST_OUT" killed_after_sectors) sectors written of 2 x 192 MiB; $(result "$VHOST_OUT" kill)"
}
