# shellcheck shell=bash
scenario_mount() {
    local d="$WORK/mount" t0 sock rc
    mkdir -p "$d"
    sock="$d/nbd.sock"
    t0=$(now_ms)
    fail() { report FAIL mount "$1 ($(secs_since "$t0"); logs: $LOGS/mount-*)"; }
    why() { grep -m1 -E '^vm: |error|failed|FAILED' "$1" 2>/dev/null || echo "see $1"; }

    # Boot $1 on a server over the same file: mount-check.sh $2 in the guest, its status in rc; $3 and $4 are
    # what a server that did not start, or did not stop on SIGTERM, is reported as. Fails (1) on either.
    mount_boot() {
        start_host_server "$d/disk.img" 256M "$sock" "$LOGS/mount-server-$1.log" \
            || { fail "$3: $(tail -n 1 "$LOGS/mount-server-$1.log")"; return 1; }
        run_vm --nbd-socket "$sock" --nbd-export pmem0 --timeout 120 --log "$LOGS/mount-boot$1.console.log" \
            -- "sh $GUEST_DIR/mount-check.sh $2" >"$LOGS/mount-boot$1.out" 2>&1
        rc=$?
        stop_host_server "$SERVER_PID" || { fail "$4"; return 1; }
    }

    mount_boot 1 write "server did not start" "server did not stop on SIGTERM" || return
    [ "$rc" = 0 ] || { fail "first boot (mkfs, write) failed: $(why "$LOGS/mount-boot1.out")"; return; }
    mount_boot 2 verify "server did not restart on the same file" \
        "server did not stop on SIGTERM after the second boot" || return
    case "$(result "$LOGS/mount-boot2.out" fsck)" in
        clean) ;;
        dirty) fail "e2fsck -fn not clean after the server restart"; return ;;
        *) fail "second boot failed before e2fsck: $(why "$LOGS/mount-boot2.out")"; return ;;
    esac
    [ "$rc" = 0 ] || { fail "checksum verification failed in the second boot: $(why "$LOGS/mount-boot2.out")"; return; }
    # The sums read back must be the ones computed when writing (not just self-consistent).
    if ! diff <(grep '^SUM ' "$LOGS/mount-boot1.out") <(grep '^SUM ' "$LOGS/mount-boot2.out") >/dev/null; then
        fail "sums read after restart differ from those written"; return
    fi
    report PASS mount "ext4 on the NBD export ($SERVER) survives a server restart: e2fsck clean, $(result "$LOGS/mount-boot2.out" verified) files sha256-verified ($(secs_since "$t0"))" \
        "restart by SIGTERM; e2fsck -fn; files of 4 KiB..32 MiB, sums compared with those computed when writing"
}
