#!/bin/sh
# Scenario "drbd" (scripts/vm-test), one node's part: `drbd-check.sh ROLE`, ROLE one of
#   a      node A's first boot: its pmemblk on a file on /dev/vda, DRBD up, promoted, ext4 on /dev/drbd0; fio verify
#          jobs run while node B kills its pmemblk (SIGKILL) and starts it again with ublk recovery; then files synced
#          with sha256 sums and a fio job acknowledged with fdatasync; a last load runs when it prints the kill marker
#          and the host SIGKILLs its QEMU (this boot never ends by itself)
#   b      node B, one boot: pmemblk, DRBD up; kills its pmemblk mid-load and serves again (ublk recovery), waits for
#          UpToDate/UpToDate; after A's kill: promoted, journal replay, every sum and fio's acknowledged blocks
#          verified, e2fsck -fn clean, a file written; waits for A to come back and resync, hashes the device, demotes
#   a-again  node A booted again on the same disk image: its pmemblk on the same file, DRBD up as secondary, resync
#          from B, the same device hash as B's, then promoted: every sum (A's and B's files) and fio's blocks verified,
#          e2fsck -fn clean
# The nodes' only link is QEMU's socket netdev (eth0, 10.99.0.1 = drbd-a, 10.99.0.2 = drbd-b). The host and the
# nodes coordinate through files in /mnt/coord (a share of the host's, read-write for both) and A's console
# marker; every wait is bounded and fails naming what did not happen. Output: RESULT lines the host reads.
# Recipe, timings and pitfalls: shared/notes/drbd.md.
set -u
ROLE=${1:?usage: drbd-check.sh a|b|a-again}
GUEST_NAME=drbd-$ROLE
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
COORD=/mnt/coord
CONF=/tmp/drbd.conf
DISK=/mnt/disk            # ext4 on /dev/vda: pmemblk's file, which outlives a killed guest
POOL=$DISK/pool
FS=/mnt/r0                # ext4 on /dev/drbd0
SLOG=/tmp/pmemblk.log
READY_SECS=${DRBD_READY_SECS:-400}   # a JVM start: 15 s under TCG on a quiet host, minutes with two guests on 2 cores
PEER_SECS=${DRBD_PEER_SECS:-900}     # the other node's steps (its boot, JVM start, a restart)
cd /tmp || exit 1

fail() { result why "$*"; say "FAIL: $*"; dmesg | grep -i drbd | tail -n 20 | sed 's/^/dmesg| /'; exit 1; }
drbd() { drbdadm -c "$CONF" "$@"; }
state() { echo "cstate=$(drbd cstate r0 2>&1) role=$(drbd role r0 2>&1) dstate=$(drbd dstate r0 2>&1)"; }
# coord_put NAME TEXT: a file the other node or the host waits for, appearing whole.
coord_put() { printf '%s\n' "$2" >"$COORD/.$1.tmp" && mv "$COORD/.$1.tmp" "$COORD/$1"; }
# wait_for WHAT SECONDS COMMAND...: COMMAND polled until it holds; fails the scenario naming WHAT after SECONDS.
wait_for() {
    _what=$1 _ws=$2 _wt=$(( $(now) + $2 )); shift 2
    until "$@"; do
        [ "$(now)" -lt "$_wt" ] || fail "no $_what within ${_ws}s ($(state))"
        sleep 0.2
    done
}
is() { [ "$(drbd "$1" r0 2>/dev/null)" = "$2" ]; }
not_connected() { ! is cstate Connected; }
# In sync: connected with no resync running (during the handshake before a resync both disks may still read
# UpToDate: cstate tells).
in_sync() { is cstate Connected && is dstate UpToDate/UpToDate; }
# The peer is there (connected, or resyncing with it); StandAlone is DRBD refusing it (split brain, unrelated data).
peer_there() {
    _cs=$(drbd cstate r0 2>/dev/null)
    case $_cs in
        Connected|Sync*|PausedSync*|WFBitMap*|WFSyncUUID) return 0 ;;
        StandAlone) fail "DRBD went StandAlone instead of connecting ($(state)); kernel: $(dmesg | grep drbd | tail -n 3 | tr '\n' ' ' | cut -c1-300)" ;;
    esac
    return 1
}
pings() { busybox ping -c1 -W1 "$1" >/dev/null 2>&1; }
# A DRBD split brain, or the backing device failing under DRBD, is the news this scenario looks for.
check_drbd_log() {
    _bad=$(dmesg | grep -E 'drbd' | grep -E 'Split-Brain|split-brain|IO ERROR|io-error|disk\( [A-Za-z]+ -> (Failed|Diskless)|Unrelated data' || true)
    [ -z "$_bad" ] || { echo "$_bad" | sed 's/^/dmesg| /'; fail "$1: $(echo "$_bad" | head -n 1 | cut -c1-200)"; }
}

# pmemblk serving /dev/ublkb0 on the file on /dev/vda; ublk recovery on, so a killed server leaves the device
# (and DRBD's I/O on it) waiting for the next one.
serve_pmemblk() {
    rm -f /tmp/nbd.sock
    serve_start "$SLOG" --set "pmem.path=$POOL" --set pmem.size=128M --set nbd.socket=/tmp/nbd.sock --set nbd.port=0 \
        --set nbd.export=pmem0 --set ublk.enabled=true --set ublk.id=0 --set ublk.recovery=true
    serve_ready "$SLOG" "$READY_SECS" '^ready: /dev/ublkb0' || fail "pmemblk did not serve /dev/ublkb0: $(server_lines "$SLOG" | tail -n 1)"
    [ -b /dev/ublkb0 ] || fail "pmemblk printed ready but /dev/ublkb0 is not a block device"
}

# The node: hostname (DRBD picks its `on` section by it), its address on the private link, the modules, the
# directories drbdadm needs on a read-only root (shared/notes/drbd.md, pitfalls), the configuration.
setup_node() {
    case $ROLE in a*) _me=drbd-a _ip=10.99.0.1 _peer=10.99.0.2 ;; *) _me=drbd-b _ip=10.99.0.2 _peer=10.99.0.1 ;; esac
    hostname "$_me"
    ip addr add "$_ip/24" dev eth0 || fail "no eth0 (scripts/vm --nic-socket)"
    ip link set eth0 up
    modprobe -a drbd ublk_drv || fail "modprobe drbd ublk_drv failed"
    mkdir -p /run/lock
    mount -t tmpfs tmpfs /var/lib/drbd
    # ping-int 2: the survivor notices a dead peer in about 5 s instead of 20. ko-count 0: while the secondary's
    # backing device waits for its restarted pmemblk (ublk recovery), the primary's writes wait for it (protocol C)
    # instead of DRBD dropping the peer after ko-count x timeout.
    cat >"$CONF" <<EOF
global { usage-count no; }
common { net { protocol C; ping-int 2; ko-count 0; } }
resource r0 {
  device /dev/drbd0; disk /dev/ublkb0; meta-disk internal;
  on drbd-a { address 10.99.0.1:7789; }
  on drbd-b { address 10.99.0.2:7789; }
}
EOF
    wait_for "answer from the peer $_peer on the private link" "$PEER_SECS" pings "$_peer"
    say "link up: $(ip -o -4 addr show eth0 | awk '{print $4}') -> $_peer answers"
}

drbd_up() {  # drbd_up [create]: metadata created (first boot) and the resource up, connected (bounded)
    if [ "${1:-}" = create ]; then
        drbd -- --force create-md r0 </dev/null >/tmp/create-md.out 2>&1 || { cat /tmp/create-md.out; fail "drbdadm create-md r0 failed"; }
    fi
    drbd up r0 >/tmp/up.out 2>&1 || { cat /tmp/up.out; fail "drbdadm up r0 failed"; }
    wait_for "DRBD connection to the peer" "$PEER_SECS" peer_there
    say "DRBD connected: $(state)"
}

# fio_job NAME FILE SIZE EXTRA...: 4k random writes on FILE in $FS (libaio, direct, iodepth 8) with crc32c verify
# headers; the seed is fixed, so the same arguments with --verify_only check what it wrote, on any node.
fio_job() {
    _fn=$1 _ff=$2 _fs=$3; shift 3
    timeout -k 10 "${FIO_SECS:-600}" fio --name="$_fn" --filename="$FS/$_ff" --size="$_fs" --ioengine=libaio --direct=1 \
        --rw=randwrite --bs=4k --iodepth=8 --verify=crc32c --verify_fatal=1 --randrepeat=1 --randseed=2602 \
        --verify_state_save=0 "$@" --output="/tmp/fio-$_fn.out" >/dev/null 2>&1
}
# What node A's fio wrote and fdatasync'ed before the kill: acknowledged, so it must read back on B and on A again.
ACKED="acked acked.dat 16M"
verify_acked() {
    # shellcheck disable=SC2086 # three words
    fio_job $ACKED --verify_only --do_verify=1 || { cat /tmp/fio-acked.out; fail "fio --verify_only of the acknowledged writes failed: $(grep -m1 -E 'verify|bad|err=' /tmp/fio-acked.out)"; }
    grep -q 'err= 0' /tmp/fio-acked.out || { cat /tmp/fio-acked.out; fail "fio --verify_only of the acknowledged writes reported an error"; }
}
verify_sums() {  # verify_sums FILE: sha256sum -c in $FS; RESULT NAME_verified
    (cd "$FS" && sha256sum -c --quiet "$COORD/$1") || fail "sha256 sums of $1 differ on $ROLE"
    result "${1%.sums}_verified" "$(wc -l <"$COORD/$1")"
}
fsck_clean() {
    timeout 300 e2fsck -fn /dev/drbd0 >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck -fn /dev/drbd0 not clean on $ROLE"; }
    result fsck clean
}
# The DRBD device's bytes (without the metadata at the end of the backing device), read around the page cache. Its
# size from sysfs: a secondary's /dev/drbd0 cannot be opened, even read-only.
device_hash() {
    dd if="$1" bs=1M count="$(( $(cat /sys/block/drbd0/size) * 512 ))" iflag=direct,count_bytes 2>/dev/null | sha256sum | cut -d' ' -f1
}

# ---------------------------------------------------------------------------------------------
node_a() {
    setup_node
    { mkfs.ext4 -q -F /dev/vda && mkdir -p "$DISK" && mount /dev/vda "$DISK"; } || fail "no ext4 on /dev/vda"
    serve_pmemblk
    drbd_up create
    # Both backing devices are new pmemblk files (zeros): already equal, so no initial sync (the final device hashes
    # compare every byte anyway).
    drbd -- --clear-bitmap new-current-uuid r0 || fail "drbdadm new-current-uuid --clear-bitmap failed"
    drbd primary r0 || fail "drbdadm primary r0 failed"
    wait_for "UpToDate/UpToDate after the promotion" 60 in_sync
    { mkfs.ext4 -q -F /dev/drbd0 && mkdir -p "$FS" && mount /dev/drbd0 "$FS"; } || fail "no ext4 on /dev/drbd0"
    say "primary, ext4 mounted: $(state)"

    # B's pmemblk is killed and started again while these jobs run; the last starts after B is back.
    _t0=$(now) _n=0 _span=0 _worst=0
    while :; do
        [ -e "$COORD/b-recovered" ] && _last=1 || _last=0
        [ -e "$COORD/b-killed" ] && _k0=1 || _k0=0
        [ "$_n" = 0 ] && coord_put a-io-running "fio job 1 starting"
        _j0=$(now)
        FIO_SECS=900 fio_job "during-$_n" "during.dat" 8M --do_verify=1 \
            || { cat "/tmp/fio-during-$_n.out"; fail "fio verify job $_n on A failed while B's pmemblk restarted"; }
        _d=$(( $(now) - _j0 )); [ "$_d" -le "$_worst" ] || _worst=$_d
        [ -e "$COORD/b-killed" ] && [ "$_k0" = 0 ] && _span=$((_span + 1))
        _n=$((_n + 1))
        say "fio verify job $_n: clean in ${_d}s"
        [ "$_last" = 0 ] || break
        [ $(( $(now) - _t0 )) -lt "$PEER_SECS" ] || fail "B did not report its pmemblk recovered within ${PEER_SECS}s"
    done
    rm -f "$FS/during.dat"
    [ "$_span" -ge 1 ] || fail "no fio job was running when B's pmemblk was killed (jobs: $_n)"
    result during_jobs "$_n"; result during_spanning "$_span"; result during_longest "${_worst}s"
    { is cstate Connected && is role Primary/Secondary && is dstate UpToDate/UpToDate; } \
        || fail "after B's recovery A shows $(state) (want Connected Primary/Secondary UpToDate/UpToDate)"
    check_drbd_log "A's kernel log during B's pmemblk restart"
    say "B's pmemblk restart: $_n fio verify jobs clean, $_span spanning the kill, longest ${_worst}s; $(state)"

    # Acknowledged data: files each fsync'ed, then their sums (on the share: the host keeps them); a fio job whose
    # writes fdatasync covers.
    for s in 4 60 512 1000 4096; do
        for k in 1 2; do head -c "${s}K" /dev/urandom >"$FS/a-$s-$k"; sync "$FS/a-$s-$k"; done
    done
    (cd "$FS" && sha256sum a-*) >"$COORD/.a.sums.tmp" && mv "$COORD/.a.sums.tmp" "$COORD/a.sums"
    # shellcheck disable=SC2086 # three words
    fio_job $ACKED --do_verify=0 --fdatasync=16 --end_fsync=1 || { cat /tmp/fio-acked.out; fail "fio acked job failed"; }
    result acked_fio "16M fdatasync'ed"
    # A file written after the sums and never synced: what a test that wrongly checks it (DRBD_BREAK=unsynced) trips on.
    if [ "${DRBD_BREAK:-}" = unsynced ]; then
        head -c 1M /dev/urandom >"$FS/a-unsynced"; (cd "$FS" && sha256sum a-unsynced) >>"$COORD/a.sums"
        head -c 1M /dev/urandom >"$FS/a-unsynced"
    fi
    # The load the kill lands in.
    timeout -k 5 900 fio --name=inflight --filename="$FS/inflight.dat" --size=32M --ioengine=libaio --direct=1 \
        --rw=randwrite --bs=4k --iodepth=8 --fsync=4 --time_based --runtime=900 --output=/tmp/fio-inflight.out >/dev/null 2>&1 &
    _fp=$!
    wait_for "write by the in-flight fio job" 120 test -s "$FS/inflight.dat"
    say "$(state); in-flight load running"
    echo "@@drbd-A-kill-me"
    # The host SIGKILLs this guest's QEMU now; getting past this wait means it did not.
    wait_gone "$_fp" 900 || true
    fail "A was not killed while its last load ran"
}

# ---------------------------------------------------------------------------------------------
node_b() {
    setup_node
    { mkfs.ext4 -q -F /dev/vda && mkdir -p "$DISK" && mount /dev/vda "$DISK"; } || fail "no ext4 on /dev/vda"
    serve_pmemblk
    drbd_up create
    wait_for "UpToDate/UpToDate (A's promotion)" "$PEER_SECS" in_sync

    # The secondary's pmemblk SIGKILLed while A writes, and served again on the same file and device id.
    wait_for "A's fio load (a-io-running)" "$PEER_SECS" test -e "$COORD/a-io-running"
    kill -9 "$SERVER_PID"
    wait_gone "$SERVER_PID" 30 || fail "pmemblk alive 30 s after kill -9"
    wait "$SERVER_PID" 2>/dev/null || true
    coord_put b-killed "$(state)"
    [ -b /dev/ublkb0 ] || fail "/dev/ublkb0 vanished after kill -9 with ublk.recovery=true"
    say "pmemblk killed (SIGKILL): $(state)"
    _k=$(now)
    mv "$SLOG" /tmp/pmemblk-1.log
    # DRBD_BREAK=fresh: the new server on another file, which ublk recovery must refuse (the scenario then FAILs).
    # The old file goes first: two 128 MiB files do not fit on the 256 MiB disk, and a break that fails for want
    # of room proves nothing about the refusal.
    if [ "${DRBD_BREAK:-}" = fresh ]; then rm -f "$POOL"; POOL=$DISK/pool-fresh; fi
    serve_pmemblk
    grep -q ', recovered)' "$SLOG" || fail "pmemblk on the same file did not resume /dev/ublkb0: $(server_lines "$SLOG" | tail -n 1)"
    wait_for "UpToDate/UpToDate after the recovery" 120 in_sync
    is role Secondary/Primary || fail "after its pmemblk's recovery B shows $(state)"
    check_drbd_log "B's kernel log across its pmemblk's SIGKILL and recovery"
    result b_recovered_after "$(( $(now) - _k ))s"
    coord_put b-recovered "$(state)"
    say "pmemblk recovered after $(( $(now) - _k ))s: $(state)"

    # A is lost (its QEMU SIGKILLed): B takes over.
    wait_for "host's a-killed" "$PEER_SECS" test -e "$COORD/a-killed"
    _k=$(now)
    wait_for "loss of the connection to A" 120 not_connected
    result b_noticed_after "$(( $(now) - _k ))s"
    say "peer lost: $(state)"
    drbd primary r0 || fail "drbdadm primary r0 on B failed: $(state)"
    { mkdir -p "$FS" && mount /dev/drbd0 "$FS"; } || fail "mount /dev/drbd0 on B failed"
    verify_sums a.sums
    verify_acked
    result acked_verified_b ok
    umount "$FS"
    fsck_clean
    # B's own writes as primary: A must get them by resync.
    mount /dev/drbd0 "$FS" || fail "remount on B failed"
    head -c 2M /dev/urandom >"$FS/b-after-failover"; sync "$FS/b-after-failover"
    (cd "$FS" && sha256sum b-after-failover) >"$COORD/.b.sums.tmp" && mv "$COORD/.b.sums.tmp" "$COORD/b.sums"
    rm -f "$FS/inflight.dat"   # what A wrote unacknowledged: gone from B's data, to be resynced away on A
    sync
    umount "$FS"
    coord_put b-promoted "$(state)"
    say "promoted, verified, written: $(state)"

    # A comes back: it must connect as secondary and sync from B.
    wait_for "A reconnecting" "$PEER_SECS" peer_there
    say "A back: $(state)"
    wait_for "resync to UpToDate/UpToDate" 300 in_sync
    is role Primary/Secondary || fail "after the resync B shows $(state) (want Primary/Secondary)"
    check_drbd_log "B's kernel log across A's loss and return"
    _h=$(device_hash /dev/drbd0)
    drbd secondary r0 || fail "drbdadm secondary r0 on B failed"
    coord_put b.hash "$_h"
    result b_hash "$_h"
    say "resynced; device hash $_h; demoted"
    wait_for "A's verification (a-done)" "$PEER_SECS" test -e "$COORD/a-done"
    check_drbd_log "B's kernel log at the end"
    result status pass
}

# ---------------------------------------------------------------------------------------------
node_a_again() {
    setup_node
    { mkdir -p "$DISK" && mount /dev/vda "$DISK"; } || fail "mount /dev/vda (the disk that outlived the kill) failed"
    [ -s "$POOL" ] || fail "pmemblk's file $POOL is not on /dev/vda after the kill"
    serve_pmemblk
    drbd_up
    say "rejoined: $(state)"
    wait_for "resync from B to UpToDate/UpToDate" 300 in_sync
    is role Secondary/Primary || fail "A rejoined as $(state) (want Secondary/Primary)"
    check_drbd_log "A's kernel log across its rejoin"
    # The kernel's account of the resync (how much, how long): the PASS line's details.
    _rs=$(dmesg | grep -E 'drbd.*(Began resync as SyncTarget|Resync done)' | sed 's/^\[[^]]*\] //' | tr '\n' ';')
    [ -n "$_rs" ] || fail "A rejoined without a resync (the kernel log has no 'Began resync as SyncTarget')"
    result resync "$_rs"
    wait_for "B's device hash (b.hash)" "$PEER_SECS" test -e "$COORD/b.hash"
    _h=$(device_hash /dev/ublkb0)
    result a_hash "$_h"
    [ "$_h" = "$(cat "$COORD/b.hash")" ] || fail "A's device after the resync differs from B's: $_h vs $(cat "$COORD/b.hash")"
    drbd primary r0 || fail "drbdadm primary r0 on A (B demoted) failed: $(state)"
    { mkdir -p "$FS" && mount /dev/drbd0 "$FS"; } || fail "mount /dev/drbd0 on A again failed"
    verify_sums a.sums
    verify_sums b.sums
    verify_acked
    result acked_verified_a ok
    [ ! -e "$FS/inflight.dat" ] || fail "A still has inflight.dat, which B deleted before the resync"
    umount "$FS"
    fsck_clean
    { drbd secondary r0 && drbd down r0; } || fail "drbdadm secondary/down on A failed"
    serve_stop 60 || fail "pmemblk ignored SIGTERM"
    [ "$SERVER_RC" = 0 ] || fail "pmemblk exited $SERVER_RC on SIGTERM (want 0)"
    coord_put a-done ok
    result status pass
}

case $ROLE in
    a) node_a ;;
    b) node_b ;;
    a-again) node_a_again ;;
    *) fail "unknown role '$ROLE' (a, b or a-again)" ;;
esac
