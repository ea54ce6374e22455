# shellcheck shell=bash
# DRBD: two guests, each serving /dev/ublkb0 with pmemblk on a file on its own --disk, one DRBD resource
# (protocol C, internal metadata) over the two, linked only by QEMU's socket netdev on 127.0.0.1 (B's QEMU listens,
# A's connects: a listener takes the next connection, so A booted again rejoins). The guest side and the steps:
# scripts/vm-guest/drbd-check.sh; the host boots, kills A's QEMU (SIGKILL, from its pidfile) on A's console marker,
# tells B through the coord share, and boots A again on the same disk image. Recipe: shared/notes/drbd.md.
# PMEMBLK_DRBD_BREAK=unsynced|fresh breaks it on purpose (a sum of a file never synced; B's pmemblk restarted on a
# fresh file): the scenario must then FAIL.

# drbd_wait SECONDS "PID..." WHAT COMMAND...: true once COMMAND holds; false, with DRBD_WHY set, when one of the
# guests (their scripts/vm) ended first or the bound passed.
drbd_wait() {
    local deadline=$(( $(date +%s) + $1 )) pids=$2 what=$3 pid
    shift 3
    until "$@"; do
        for pid in $pids; do
            kill -0 "$pid" 2>/dev/null || { DRBD_WHY="a guest ended before $what"; return 1; }
        done
        [ "$(date +%s)" -lt "$deadline" ] || { DRBD_WHY="no $what within $1 s"; return 1; }
        sleep 0.2
    done
}
# drbd_end SECONDS OUT:PID...: waits until every guest has ended (bounded); false, with DRBD_WHY set, as soon as one
# ended without its RESULT status=pass, or when the bound passed.
drbd_end() {
    local deadline=$(( $(date +%s) + $1 )) g left
    shift
    while :; do
        left=0
        for g in "$@"; do
            if kill -0 "${g#*:}" 2>/dev/null; then left=1
            elif [ "$(result "${g%%:*}" status)" != pass ]; then DRBD_WHY="${g%%:*} ended without passing"; return 1; fi
        done
        [ "$left" = 1 ] || break
        [ "$(date +%s)" -lt "$deadline" ] || { DRBD_WHY="the guests still running after $1 s"; return 1; }
        sleep 0.2
    done
    for g in "$@"; do wait "${g#*:}" 2>/dev/null || { DRBD_WHY="${g%%:*}: scripts/vm exited $?"; return 1; }; done
}
listening() { ss -ltnH "sport = :$1" 2>/dev/null | grep -q "127.0.0.1:$1"; }
# drbd_boot NAME ROLE ARGS...: scripts/vm in the background for one node (1 vCPU, 1 GiB: two TCG guests share 2
# host cores), console in $LOGS/drbd-NAME.out; sets DRBD_PID.
drbd_boot() {
    local name=$1 role=$2
    shift 2
    "$VM" --crash-dir "$CRASHES" --smp 1 --mem 1G --disk-size 256M --share "$WORK/drbd/coord:coord:/mnt/coord" \
        --log "$LOGS/drbd-$name.console.log" "$@" \
        -- "DRBD_BREAK=${PMEMBLK_DRBD_BREAK:-} sh $GUEST_DIR/drbd-check.sh $role" >"$LOGS/drbd-$name.out" 2>&1 &
    DRBD_PID=$!
    PIDS+=("$DRBD_PID")
}

scenario_drbd() {
    local d="$WORK/drbd" t0 port pa pb pa2 qpid why out
    t0=$(now_ms)
    [ "$SERVER" = pmemblk ] || { report SKIP drbd "needs the pmemblk server (scripts/pmemblk)"; return; }
    # drbdadm, run in the guests from the shared root; without Recommends (exim4, bsd-mailx), ensure_packages' way.
    ( . "$REPO_ROOT/scripts/lib/common.sh"; ensure_packages drbd-utils ) >>"$LOGS/drbd-install.log" 2>&1 \
        || { report FAIL drbd "drbd-utils missing and not installed: $(tail -n 1 "$LOGS/drbd-install.log")"; return; }
    mkdir -p "$d/coord"
    port=$(free_port)
    DRBD_WHY=''
    drbd_fail() {
        local p
        for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
        for p in "$@"; do wait_gone "$p" 30 || kill -KILL "$p" 2>/dev/null; done
        why=''
        for out in "$LOGS"/drbd-b.out "$LOGS"/drbd-a.out "$LOGS"/drbd-a2.out; do
            [ -e "$out" ] && [ -n "$(result "$out" why)" ] && why="$why; ${out##*/drbd-}: $(result "$out" why)"
        done
        report FAIL drbd "$DRBD_WHY$why ($(secs_since "$t0"); logs: $LOGS/drbd-*)"
    }

    drbd_boot b b --disk "$d/b.img" --nic-socket "listen=127.0.0.1:$port" --mac 52:54:00:00:99:02 --timeout 2400
    pb=$DRBD_PID
    # A's QEMU connects at its start: B's listener first.
    drbd_wait 120 "$pb" "B's QEMU listening on 127.0.0.1:$port" listening "$port" || { drbd_fail "$pb"; return; }
    drbd_boot a a --disk "$d/a.img" --nic-socket "connect=127.0.0.1:$port" --mac 52:54:00:00:99:01 \
        --pidfile "$d/a.pid" --timeout 1800
    pa=$DRBD_PID
    drbd_wait 1800 "$pa $pb" "kill marker from A" grep -q '@@drbd-A-kill-me' "$LOGS/drbd-a.out" || { drbd_fail "$pa" "$pb"; return; }
    # A whole machine lost mid-load: its QEMU SIGKILLed (after checking the pid is QEMU's).
    qpid=$(cat "$d/a.pid" 2>/dev/null)
    [ "$(cat "/proc/$qpid/comm" 2>/dev/null)" = qemu-system-x86 ] \
        || { DRBD_WHY="A's pidfile names '$qpid', not a running qemu-system-x86"; drbd_fail "$pa" "$pb"; return; }
    kill -KILL "$qpid"
    wait_gone "$pa" 60 || { DRBD_WHY="A's scripts/vm still running 60 s after its QEMU was killed"; drbd_fail "$pa" "$pb"; return; }
    date +%s >"$d/coord/.a-killed" && mv "$d/coord/.a-killed" "$d/coord/a-killed"
    drbd_wait 900 "$pb" "promotion on B (b-promoted)" test -e "$d/coord/b-promoted" || { drbd_fail "$pb"; return; }
    drbd_boot a2 a-again --disk "$d/a.img" --nic-socket "connect=127.0.0.1:$port" --mac 52:54:00:00:99:01 \
        --pidfile "$d/a.pid" --timeout 1800
    pa2=$DRBD_PID
    drbd_end 1800 "$LOGS/drbd-a2.out:$pa2" "$LOGS/drbd-b.out:$pb" || { drbd_fail "$pa2" "$pb"; return; }
    if [ "$(result "$LOGS/drbd-a2.out" a_hash)" != "$(result "$LOGS/drbd-b.out" b_hash)" ] \
        || [ -z "$(result "$LOGS/drbd-b.out" b_hash)" ]; then
        DRBD_WHY="device hashes differ after the resync"; drbd_fail; return
    fi
    report PASS drbd "DRBD (protocol C) over /dev/ublkb0 on two guests: B's pmemblk SIGKILLed and recovered under load ($(result "$LOGS/drbd-a.out" during_jobs) fio verify jobs on \
A clean), A's QEMU SIGKILLed mid-load, B promoted: e2fsck clean, $(result "$LOGS/drbd-b.out" a_verified) synced files and 16 MiB of fdatasync'ed fio \
writes verified; A rebooted, resynced as secondary, same device hash, all verified on A ($(secs_since "$t0"))" \
        "B's pmemblk back after $(result "$LOGS/drbd-b.out" b_recovered_after) (longest fio job on A $(result "$LOGS/drbd-a.out" during_longest), \
$(result "$LOGS/drbd-a.out" during_spanning) spanning the kill); B noticed A's loss after $(result "$LOGS/drbd-b.out" b_noticed_after); device sha256 \
$(result "$LOGS/drbd-b.out" b_hash); A's resync: $(result "$LOGS/drbd-a2.out" resync)"
}
