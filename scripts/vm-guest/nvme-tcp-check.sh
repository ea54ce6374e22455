#!/bin/sh
# Scenario "nvme-tcp" (and "nvme-tcp-nvmet", the same steps against the kernel's own target as the peer baseline),
# run inside ONE guest by scripts/vm-test: a target on 127.0.0.1 and the kernel's NVMe/TCP host (nvme-tcp) on it.
#   TARGET=pmemblk  `pmemblk serve` with its NVMe/TCP frontend (NVME_ARGS) on a pool on ext4 on the emulated NVDIMM
#                   (/dev/pmem0; a tmpfs file when there is none), mounted WITHOUT dax (PM_DAX=1: with): the NVDIMM
#                   is a host file that keeps every store, so on a dax mount a power cut can lose nothing and its
#                   step would prove nothing; without dax the pool's pages live in the guest's page cache, and only
#                   what Flush and FUA write back (msync) reaches the NVDIMM before the cut
#   TARGET=kernel   nvmet-tcp over brd through configfs (shared/notes/nvme-tcp.md's recipe), same size
# Steps, each asserted, in this order (a failure names what was expected and what was seen):
#   discover      `nvme discover`: a record of the subsystem (trtype tcp, our NQN, the port)
#   connect       `nvme connect -i 2`: the controller live over tcp, 2 I/O queues mapped (dmesg, queue_count)
#   identify      id-ctrl (subnqn, SGL support, IOCCSZ >= 4, ONCS DSM + Write Zeroes, NN >= 1), id-ns (NSZE = NCAP,
#                 NSZE x LBA size = the block device's size), ns-descs (an NGUID or UUID, not zero)
#   vwc           get-feature -f 6: bit 0 set when id-ctrl's VWC says a volatile cache is present (on by default);
#                 without one, an error or 0
#   flush         `nvme flush`: success
#   write-zeroes  4 blocks between written neighbours: zeros read back, neighbours intact
#   dsm           `nvme dsm -d` on 4 blocks: success; zeros read back when id-ns DLFEAT says deallocated blocks read
#                 0; neighbours intact
#   fio           verify=crc32c on /dev/nvmeXnY (libaio, direct, 4k..1m), on /dev/ngXnY (io_uring_cmd, raw NVMe)
#   ext4          mkfs.ext4, e2fsck -fn clean; disconnect (the controller gone)
#   digests       connect -g -G -i 2: the same ns-descs (stable IDs), e2fsck -fn clean, the file's sum; disconnect
#                 (TARGET=kernel: and a fio verify; pmemblk's fio over digests is the restart step's)
#   hostile       (HOSTILE=1) nvme-hostile.py against the target: every bad PDU answered or closed, others served,
#                 canaries intact (and the pool file, when it is a file)
#   restart       (pmemblk) connect -g -G with --ctrl-loss-tmo/--reconnect-delay, fio verify, kill -9 of the server
#                 after 4 MiB written, a new server on the same pool: the host reconnects, the same ns-descs, fio
#                 ends clean, no I/O error in the kernel log
#   rate          (RATE_SECS > 0) the same fio jobs as the peer's (4k randrw QD32 libaio; 4k randrw QD32 io_uring_cmd):
#                 IOPS reported, not asserted
#   powercut      (MARKER set) everything so far synced, the kernel's own write-back off; a FUA write (`nvme write
#                 --force-unit-access`), a plain write + `nvme flush`, and a plain write never flushed, their sha256
#                 and LBAs as RESULT lines (fua, flushed, unflushed), then MARKER without a sync: the host cuts the
#                 power (QEMU SIGKILL) and reads them back from the pool in the NVDIMM file; the first two must be
#                 there, the third may be gone (it shows the cut can lose what was not made durable)
# Output: RESULT lines for the host; "RESULT why=..." on a failure (and exit 1).
# Environment: TARGET, PORT (4420), NQN, NVME_ARGS (serve's settings for the frontend), READY_RE (its ready line),
# SIZE_MIB (64), HOSTILE (1), RATE_SECS (0), MARKER, FIO_MIB (8).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TARGET=${TARGET:-pmemblk}
PORT=${PORT:-4420}
NQN=${NQN:-nqn.2026-12.io.pmemblk:test}
NVME_ARGS=${NVME_ARGS:-}
READY_RE=${READY_RE:-^ready: nvme-tcp }
SIZE_MIB=${SIZE_MIB:-64}
HOSTILE=${HOSTILE:-1}
RATE_SECS=${RATE_SECS:-0}
MARKER=${MARKER:-}
FIO_MIB=${FIO_MIB:-8}
READY_SECS=${READY_SECS:-300}
PM=/mnt/pm
SLOG=/tmp/server.log
cd /tmp || exit 1

CTRL='' DEV='' NG='' STEP=setup
fail() { result why "$STEP: $*"; say "FAIL $STEP: $*"; [ -n "$SERVER_PID" ] && [ -s "$SLOG" ] && tail -n 20 "$SLOG" | sed 's/^/server| /'; dmesg | tail -n 15 | sed 's/^/dmesg| /'; exit 1; }
step() { STEP=$1; say "== $1"; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 missing ($2)"; }

need nvme "Debian's nvme-cli on the host: scripts/vm-test installs it (apt-get install nvme-cli)"
need fio "Debian's fio"
ip link set lo up || fail "ip link set lo up"
modprobe nvme-tcp || fail "modprobe nvme-tcp failed"
dmesg_mark

# --- the target ---------------------------------------------------------------------------------------------------
POOL=''
start_pmemblk() {
    # shellcheck disable=SC2086 # NVME_ARGS is a word list of --set options
    serve_start "$SLOG" --set "pmem.path=$POOL" --set "pmem.size=${SIZE_MIB}M" --set nbd.socket=/tmp/nbd.sock \
        --set nbd.port=0 $NVME_ARGS
    serve_ready "$SLOG" "$READY_SECS" "$READY_RE" || fail "pmemblk serve not ready (expected a line matching '$READY_RE')"
}
if [ "$TARGET" = pmemblk ]; then
    step target
    if [ -e /dev/pmem0 ]; then
        ndctl create-namespace -f -e namespace0.0 -m fsdax --map=mem >/tmp/ndctl.json 2>&1 || fail "ndctl create-namespace: $(tail -n 1 /tmp/ndctl.json)"
        mkdir -p "$PM"
        mkfs.ext4 -q -F -b 4096 /dev/pmem0 || fail "mkfs.ext4 /dev/pmem0"
        if [ "${PM_DAX:-0}" = 1 ]; then
            mount -o dax /dev/pmem0 "$PM" || fail "mount -o dax /dev/pmem0"
        else
            mount /dev/pmem0 "$PM" || fail "mount /dev/pmem0"
            ! grep " $PM " /proc/mounts | grep -q dax || fail "$PM mounted with dax though PM_DAX is not 1"
        fi
        POOL=$PM/pool
    else
        POOL=/tmp/pool
    fi
    start_pmemblk
    result region "$(grep -m1 -E 'is_pmem' "$SLOG" | cut -c1-200)"
    # The JVM says so when it cannot use the AOT cache (a changed jar, another JVM build): the start is slower
    result aot "$([ -n "$PMEMBLK_GUEST_AOT_OPTS" ] && echo 'AOT cache given; ')$(grep -m2 -i -E '\[(aot|cds)\]|AOT cache' "$SLOG" | tr '\n' ' ' | cut -c1-300)"
else
    step target
    modprobe configfs 2>/dev/null; mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || fail "mount configfs"
    modprobe brd rd_nr=1 rd_size=$((SIZE_MIB * 1024)) || fail "modprobe brd"
    { modprobe nvmet && modprobe nvmet-tcp; } || fail "modprobe nvmet nvmet-tcp"
    C=/sys/kernel/config/nvmet
    { mkdir "$C/subsystems/$NQN" && echo 1 >"$C/subsystems/$NQN/attr_allow_any_host" \
        && mkdir "$C/subsystems/$NQN/namespaces/1" && echo /dev/ram0 >"$C/subsystems/$NQN/namespaces/1/device_path" \
        && echo 1 >"$C/subsystems/$NQN/namespaces/1/enable" && mkdir "$C/ports/1" && echo tcp >"$C/ports/1/addr_trtype" \
        && echo ipv4 >"$C/ports/1/addr_adrfam" && echo 127.0.0.1 >"$C/ports/1/addr_traddr" \
        && echo "$PORT" >"$C/ports/1/addr_trsvcid" && ln -s "$C/subsystems/$NQN" "$C/ports/1/subsystems/"; } \
        || fail "nvmet configfs set-up"
    POOL=''
fi

# --- host side helpers ------------------------------------------------------------------------------------------
# find_ctrl: the controller of NQN over tcp (CTRL), its namespace's block device (DEV) and char device (NG).
find_ctrl() {
    CTRL='' DEV='' NG=''
    for _c in /sys/class/nvme/nvme*; do
        [ -e "$_c/subsysnqn" ] || continue
        if [ "$(cat "$_c/subsysnqn")" != "$NQN" ] || [ "$(cat "$_c/transport")" != tcp ] || [ "$(cat "$_c/state")" != live ]; then continue; fi
        CTRL=${_c##*/}
    done
    [ -n "$CTRL" ] || return 1
    for _s in /sys/class/nvme/"$CTRL"/nvme*n1 /sys/class/nvme-subsystem/*/nvme*n1; do
        [ -e "$_s" ] || continue
        case "${_s##*/}" in *c*) continue ;; esac
        [ "$(cat "/sys/block/${_s##*/}/device/subsysnqn" 2>/dev/null || cat "$_s/../subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
        DEV=${_s##*/}
    done
    [ -n "$DEV" ] && [ -b "/dev/$DEV" ] || return 1
    NG=ng${DEV#nvme}
    [ -c "/dev/$NG" ] || NG=''
    return 0
}
wait_ctrl() {   # wait_ctrl SECONDS
    _t=$(( $(now) + $1 ))
    until find_ctrl; do [ "$(now)" -lt "$_t" ] || return 1; sleep 0.2; done
}
gone_ctrl() {
    _t=$(( $(now) + $1 ))
    while find_ctrl; do [ "$(now)" -lt "$_t" ] || return 1; sleep 0.2; done
}
connect() {   # connect EXTRA-OPTIONS...
    _o=$(nvme connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$NQN" "$@" 2>&1) || fail "nvme connect $*: $(echo "$_o" | tail -n 1)"
    wait_ctrl 60 || fail "nvme connect $* returned but no live tcp controller of $NQN with a namespace within 60 s"
    say "connected ($*): $CTRL, /dev/$DEV, ${NG:+/dev/$NG}"
}
disconnect() {
    _o=$(nvme disconnect -n "$NQN" 2>&1) || fail "nvme disconnect -n $NQN: $_o"
    gone_ctrl 60 || fail "the controller $CTRL still there 60 s after nvme disconnect"
}
jq_() {   # jq_ FILE EXPR: a field of nvme-cli's JSON (python, since jq may be missing)
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$1" "$2"
}
BS=512
blocks_pattern() {   # blocks_pattern LBA COUNT TAG: writes COUNT blocks of a pattern at LBA (direct)
    python3 -c 'import hashlib,sys; n=int(sys.argv[1]); t=sys.argv[2].encode(); sys.stdout.buffer.write(b"".join(hashlib.sha256(t+b"%d"%i).digest() for i in range(n//32)))' \
        $(( $2 * BS )) "$3" >"/tmp/pat.$3"
    dd if=/tmp/pat."$3" of="/dev/$DEV" bs="$BS" seek="$1" count="$2" oflag=direct conv=notrunc status=none || fail "dd write at LBA $1"
}
read_blocks() { dd if="/dev/$DEV" bs="$BS" skip="$1" count="$2" iflag=direct status=none; }
nonzero() { read_blocks "$1" "$2" | tr -d '\000' | wc -c; }
same_as() { read_blocks "$1" "$2" | cmp -s - "$3"; }

# --- the steps ----------------------------------------------------------------------------------------------------
step discover
nvme discover -t tcp -a 127.0.0.1 -s "$PORT" >/tmp/discover.out 2>&1 || fail "nvme discover: $(tail -n 1 /tmp/discover.out)"
sed 's/^/discover| /' /tmp/discover.out
grep -q "subnqn: *$NQN\$" /tmp/discover.out || fail "no record with subnqn $NQN in the discovery log (saw: $(grep subnqn /tmp/discover.out | tr -s ' ' | tr '\n' ';'))"
awk -v n="$NQN" '/^=====Discovery Log Entry/ { t = s = p = "" } /^trtype:/ { t = $2 } /^trsvcid:/ { s = $2 } /^subnqn:/ { if ($2 == n) p = 1 }
    /^subnqn:/ && $2 == n && t == "tcp" && s != "" { ok = 1 } END { exit !ok }' /tmp/discover.out \
    || fail "the record of $NQN does not say trtype tcp with a trsvcid"
result discover_records "$(grep -c '^=====Discovery Log Entry' /tmp/discover.out)"

step connect
connect -i 2
queues=$(dmesg | grep "$CTRL: mapped" | tail -n 1 | sed -n 's/.*mapped \([0-9]*\)\/.*/\1/p')
[ "$queues" = 2 ] || fail "nvme connect -i 2: expected 'mapped 2/0/0 default/read/poll queues' in dmesg, saw '$(dmesg | grep "$CTRL: mapped" | tail -n 1)'"
if [ -e "/sys/class/nvme/$CTRL/queue_count" ]; then
    [ "$(cat "/sys/class/nvme/$CTRL/queue_count")" = 3 ] || fail "queue_count $(cat "/sys/class/nvme/$CTRL/queue_count"), expected 3 (admin + 2 I/O)"
fi
BS=$(blockdev --getss "/dev/$DEV") SIZE=$(blockdev --getsize64 "/dev/$DEV")
result io_queues "$queues"

step identify
nvme id-ctrl "/dev/$CTRL" -o json >/tmp/idctrl.json 2>&1 || fail "nvme id-ctrl: $(tail -n 1 /tmp/idctrl.json)"
nvme id-ctrl "/dev/$CTRL" -H >/tmp/idctrl.txt 2>&1 || true
# one python start for all fields (each costs seconds under TCG): ID_subnqn=... lines, evaluated
eval "$(python3 -c 'import json,sys,shlex; d=json.load(open(sys.argv[1])); print("\n".join("ID_%s=%s" % (k, shlex.quote(str(d.get(k, "")).strip())) for k in sys.argv[2:]))' \
    /tmp/idctrl.json subnqn cntlid sgls ioccsz iorcsz vwc oncs nn mdts kas)" || fail "id-ctrl's JSON: $(head -c 200 /tmp/idctrl.json)"
# shellcheck disable=SC2154 # the ID_ variables come from the eval above
{
    say "id-ctrl: subnqn=$ID_subnqn cntlid=$ID_cntlid sgls=$ID_sgls ioccsz=$ID_ioccsz iorcsz=$ID_iorcsz vwc=$ID_vwc oncs=$ID_oncs nn=$ID_nn mdts=$ID_mdts kas=$ID_kas"
    result id_ctrl "subnqn=$ID_subnqn sgls=$(printf 0x%x "$ID_sgls") ioccsz=$ID_ioccsz iorcsz=$ID_iorcsz vwc=$ID_vwc oncs=$(printf 0x%x "$ID_oncs") nn=$ID_nn mdts=$ID_mdts kas=$ID_kas"
    [ "$ID_subnqn" = "$NQN" ] || fail "id-ctrl subnqn '$ID_subnqn', expected $NQN"
    [ $((ID_sgls & 3)) != 0 ] || fail "id-ctrl SGLS $ID_sgls: bits 1:0 must say SGLs are supported (NVMe over Fabrics uses SGLs only)"
    [ "$ID_ioccsz" -ge 4 ] || fail "id-ctrl IOCCSZ $ID_ioccsz, expected >= 4 (a 64-byte command) for a fabrics controller"
    [ "$ID_iorcsz" -ge 1 ] || fail "id-ctrl IORCSZ $ID_iorcsz, expected >= 1"
    [ $((ID_oncs & 4)) != 0 ] || fail "id-ctrl ONCS $ID_oncs: bit 2 (Dataset Management) not set"
    [ $((ID_oncs & 8)) != 0 ] || fail "id-ctrl ONCS $ID_oncs: bit 3 (Write Zeroes) not set"
    [ "$ID_nn" -ge 1 ] || fail "id-ctrl NN $ID_nn, expected >= 1"
    VWC=$((ID_vwc & 1))
}
nvme id-ns "/dev/$DEV" -o json >/tmp/idns.json 2>&1 || fail "nvme id-ns: $(tail -n 1 /tmp/idns.json)"
read -r NSZE NCAP LBADS DLFEAT <<EOF
$(jq_ /tmp/idns.json '"%d %d %d %d" % (d["nsze"], d["ncap"], d["lbafs"][d["flbas"] & 15]["ds"], d["dlfeat"])')
EOF
result id_ns "nsze=$NSZE ncap=$NCAP lbads=$LBADS dlfeat=$DLFEAT"
[ "$NSZE" = "$NCAP" ] || fail "id-ns NSZE $NSZE != NCAP $NCAP (no thin provisioning is advertised)"
[ $((1 << LBADS)) = "$BS" ] || fail "id-ns LBA data size 2^$LBADS, the block device's logical block $BS"
[ $((NSZE << LBADS)) = "$SIZE" ] || fail "id-ns NSZE $NSZE x 2^$LBADS = $((NSZE << LBADS)) bytes, the block device $SIZE"
nvme ns-descs "/dev/$DEV" >/tmp/nsdescs.txt 2>&1 || fail "nvme ns-descs: $(tail -n 1 /tmp/nsdescs.txt)"
sed 's/^/ns-descs| /' /tmp/nsdescs.txt
IDS=$(grep -E '^(nguid|uuid|eui64) *:' /tmp/nsdescs.txt | tr -s ' ' | sort | tr '\n' ' ')
echo "$IDS" | grep -qE '(nguid|uuid) : *[0-9a-f-]*[1-9a-f]' || fail "ns-descs: no non-zero NGUID or UUID (saw '$IDS')"
result ns_descs "$IDS"

step vwc
if gf=$(nvme get-feature "/dev/$CTRL" -f 6 2>&1); then
    # printf's %#x: "0x00000001", but "00000000" for 0 (no prefix): hex either way
    val=$(echo "$gf" | sed -n 's/.*Current value: *\(0x\)\{0,1\}\([0-9a-fA-F][0-9a-fA-F]*\).*/0x\2/p')
    [ -n "$val" ] || fail "get-feature -f 6 printed no current value: $gf"
    result vwc "id-ctrl vwc=$ID_vwc get-feature=$val"
    if [ "$VWC" = 1 ]; then
        [ $((val & 1)) = 1 ] || fail "id-ctrl says a volatile write cache is present, get-feature -f 6 says $val (expected WCE=1, the default)"
    else
        [ $((val & 1)) = 0 ] || fail "id-ctrl says no volatile write cache, get-feature -f 6 says it is enabled ($val)"
    fi
else
    [ "$VWC" = 0 ] || fail "id-ctrl says a volatile write cache is present but get-feature -f 6 failed: $gf"
    result vwc "id-ctrl vwc=0, get-feature -f 6 refused: $(echo "$gf" | tail -n 1)"
fi
case "$(cat "/sys/block/$DEV/queue/write_cache" 2>/dev/null)" in
    "write back") [ "$VWC" = 1 ] || fail "the kernel uses a write-back cache though id-ctrl VWC=0" ;;
    "write through") [ "$VWC" = 0 ] || fail "the kernel uses write-through though id-ctrl VWC=1" ;;
esac

step flush
out=$(nvme flush "/dev/$DEV" -n 1 2>&1) || fail "nvme flush: $out"
echo "$out" | grep -qi success || fail "nvme flush printed '$out', expected success"

step write-zeroes
L=1000
blocks_pattern "$L" 8 wz
out=$(nvme write-zeroes "/dev/$DEV" -n 1 -s $((L + 2)) -c 3 2>&1) || fail "nvme write-zeroes -s $((L + 2)) -c 3: $out"
[ "$(nonzero $((L + 2)) 4)" = 0 ] || fail "write-zeroes of LBAs $((L + 2))..$((L + 5)): $(nonzero $((L + 2)) 4) non-zero bytes read back"
read_blocks "$L" 8 >/tmp/wz.after
cmp -s -n $((2 * BS)) /tmp/wz.after /tmp/pat.wz || fail "write-zeroes changed the 2 blocks before its range"
cmp -s -i $((6 * BS)) -n $((2 * BS)) /tmp/wz.after /tmp/pat.wz || fail "write-zeroes changed the 2 blocks after its range"

step dsm
L=1100
blocks_pattern "$L" 8 dsm
out=$(nvme dsm "/dev/$DEV" -n 1 -d -s $((L + 2)) -b 4 2>&1) || fail "nvme dsm -d -s $((L + 2)) -b 4: $out"
echo "$out" | grep -qi success || fail "nvme dsm -d printed '$out', expected success"
read_blocks "$L" 8 >/tmp/dsm.after
cmp -s -n $((2 * BS)) /tmp/dsm.after /tmp/pat.dsm || fail "dsm -d changed the 2 blocks before its range"
cmp -s -i $((6 * BS)) -n $((2 * BS)) /tmp/dsm.after /tmp/pat.dsm || fail "dsm -d changed the 2 blocks after its range"
nz=$(nonzero $((L + 2)) 4)
if [ $((DLFEAT & 7)) = 1 ]; then
    [ "$nz" = 0 ] || fail "id-ns DLFEAT $DLFEAT says deallocated blocks read zeros; $nz non-zero bytes read back"
fi
result dsm "deallocated 4 blocks, $nz non-zero bytes read back (DLFEAT $DLFEAT)"

step fio
FIO_VERIFY_SECS=300 fio_verify nvme-blk --filename="/dev/$DEV" --size="${FIO_MIB}M"
say "fio libaio on /dev/$DEV clean"
if [ -n "$NG" ]; then
    # raw NVMe Read/Write from userspace through the char device: the target's parser without the block layer's help
    rc=0
    timeout -k 10 300 fio --name=nvme-ng --filename="/dev/$NG" --ioengine=io_uring_cmd --cmd_type=nvme --rw=randwrite \
        --bssplit=4k/40:16k/30:64k/30 --iodepth=16 --size="${FIO_MIB}M" --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --verify_state_save=0 --output=/tmp/fio-nvme-ng.out >/dev/null 2>&1 || rc=$?
    fio_verify_check nvme-ng "$rc"
    say "fio io_uring_cmd on /dev/$NG clean"
    result ng "/dev/$NG io_uring_cmd verify clean"
else
    fail "no /dev/ng char device for /dev/$DEV (fio's io_uring_cmd needs it)"
fi

step ext4
mkfs.ext4 -q -F "/dev/$DEV" || fail "mkfs.ext4 /dev/$DEV"
mkdir -p /mnt/nvfs
mount "/dev/$DEV" /mnt/nvfs || fail "mount /dev/$DEV"
head -c 3M /dev/urandom >/mnt/nvfs/f && sync && sha=$(sha256sum /mnt/nvfs/f | cut -d' ' -f1)
umount /mnt/nvfs || fail "umount"
e2fsck -fn "/dev/$DEV" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; fail "e2fsck -fn not clean after mkfs and a file"; }
disconnect

step digests
connect -g -G -i 2
nvme ns-descs "/dev/$DEV" >/tmp/nsdescs2.txt 2>&1 || fail "nvme ns-descs after reconnecting: $(tail -n 1 /tmp/nsdescs2.txt)"
IDS2=$(grep -E '^(nguid|uuid|eui64) *:' /tmp/nsdescs2.txt | tr -s ' ' | sort | tr '\n' ' ')
[ "$IDS2" = "$IDS" ] || fail "namespace IDs changed across a reconnect: '$IDS' then '$IDS2'"
e2fsck -fn "/dev/$DEV" >/tmp/fsck2.out 2>&1 || { cat /tmp/fsck2.out; fail "e2fsck -fn not clean over -g -G"; }
mount -o ro "/dev/$DEV" /mnt/nvfs || fail "mount over -g -G"
[ "$(sha256sum /mnt/nvfs/f | cut -d' ' -f1)" = "$sha" ] || fail "a file's sha256 differs read over -g -G"
umount /mnt/nvfs
if [ "$TARGET" = pmemblk ]; then
    result digests "connect -g -G -i 2: IDs stable, e2fsck clean, file sum equal (fio over digests: the restart step)"
else
    # the peer has no restart step: its digests' data path gets a fio of its own
    FIO_VERIFY_SECS=300 fio_verify nvme-digest --filename="/dev/$DEV" --size=8M --offset=32M
    result digests "connect -g -G -i 2: IDs stable, e2fsck clean, file sum equal, fio verify clean"
fi
disconnect

if [ "$HOSTILE" = 1 ]; then
    step hostile
    # the pool file is checked only where its bytes are the namespace's (a file, not a device)
    timeout -k 5 600 python3 "$HERE/nvme-hostile.py" --addr 127.0.0.1 --port "$PORT" --nqn "$NQN" ${POOL:+--pool "$POOL"} \
        ${HOSTILE_ARGS:+$HOSTILE_ARGS} >/tmp/hostile.out 2>&1
    rc=$?
    cat /tmp/hostile.out
    if [ "$rc" != 0 ]; then
        # the peer baseline (HOSTILE_FATAL=0) reports what the kernel's target did; ours must pass
        [ "${HOSTILE_FATAL:-1}" = 0 ] || fail "nvme-hostile.py (exit $rc): $(sed -n 's/^RESULT hostile.why=//p' /tmp/hostile.out | cut -c1-400)"
        grep -q '^RESULT hostile.status=' /tmp/hostile.out || result hostile.status "fail (exit $rc)"
    fi
    if [ "$TARGET" = pmemblk ]; then alive "$SERVER_PID" || fail "the server died under the hostile peers"; fi
fi

if [ "$TARGET" = pmemblk ]; then
    step restart
    # with header and data digests: this fio is also the digests' data path, R2T/H2CData and C2HData under load
    connect -g -G -i 2 --ctrl-loss-tmo=600 --reconnect-delay=1
    dmesg_mark
    before=$(awk -v d="$DEV" '$3 == d { print $10 }' /proc/diskstats)
    # 4 MiB/s: the kill lands mid-run and fio's I/O is held across the JVM's restart, then finishes
    ( FIO_VERIFY_SECS=900 fio_verify_run nvme-restart --filename="/dev/$DEV" --size=12M --rate=4m; echo $? >/tmp/fio-restart.rc ) &
    t=$(( $(now) + 120 ))
    until [ $(( $(awk -v d="$DEV" '$3 == d { print $10 }' /proc/diskstats) - before )) -ge 8192 ]; do
        [ "$(now)" -lt "$t" ] || fail "fio wrote less than 4 MiB to /dev/$DEV in 120 s"
        [ ! -e /tmp/fio-restart.rc ] || fail "fio ended before 4 MiB were written: $(tail -n 3 /tmp/fio-nvme-restart.out 2>/dev/null)"
        sleep 0.1
    done
    kill -KILL "$SERVER_PID"
    wait_gone "$SERVER_PID" 10 || fail "server still alive 10 s after SIGKILL"
    t_kill=$(now)
    say "server SIGKILLed under fio; starting a new one"
    start_pmemblk
    t=$(( $(now) + 120 ))
    until [ "$(cat "/sys/class/nvme/$CTRL/state" 2>/dev/null)" = live ]; do
        [ "$(now)" -lt "$t" ] || fail "$CTRL not live 120 s after the new server was ready (state $(cat "/sys/class/nvme/$CTRL/state" 2>/dev/null))"
        sleep 0.2
    done
    result reconnected_after "$(( $(now) - t_kill )) s"
    # a new server on the same pool is the same namespace to the host (one whose IDs changed, the kernel removes)
    nvme ns-descs "/dev/$DEV" >/tmp/nsdescs3.txt 2>&1 \
        || fail "nvme ns-descs /dev/$DEV after the new server failed; the kernel's last word on $CTRL: $(dmesg | grep "$CTRL" | tail -n 1 | cut -c1-160)"
    IDS3=$(grep -E '^(nguid|uuid|eui64) *:' /tmp/nsdescs3.txt | tr -s ' ' | sort | tr '\n' ' ')
    [ "$IDS3" = "$IDS" ] || fail "namespace IDs changed across the server's restart: '$IDS' then '$IDS3'"
    say "$CTRL live again, $(( $(now) - t_kill )) s after the kill"
    t=$(( $(now) + 900 ))
    while [ ! -e /tmp/fio-restart.rc ]; do [ "$(now)" -lt "$t" ] || fail "fio did not end within 900 s of the restart"; sleep 0.5; done
    fio_verify_check nvme-restart "$(cat /tmp/fio-restart.rc)"
    say "fio across the restart clean"
    dmesg | tail -n +$((DMESG_MARK + 1)) | grep -E "$CTRL" | sed 's/^/dmesg| /' | tail -n 12
    check_dmesg
    result restart "fio verify clean across kill -9 and a new server; $CTRL reconnected"
fi

if [ "$RATE_SECS" -gt 0 ]; then
    step rate
    find_ctrl || connect -i 2
    for eng in libaio io_uring_cmd; do
        if [ "$eng" = libaio ]; then f="--filename=/dev/$DEV --ioengine=libaio --direct=1"
        else f="--filename=/dev/$NG --ioengine=io_uring_cmd --cmd_type=nvme"; fi
        # shellcheck disable=SC2086 # f is a word list
        fio --name="rate-$eng" $f --rw=randrw --bs=4k --iodepth=32 --size=32M --runtime="$RATE_SECS" --time_based \
            --output-format=json --output="/tmp/rate-$eng.json" >/dev/null 2>&1 || fail "fio rate job $eng failed"
        result "rate_$eng" "$(python3 "$HERE/fio-rate.py" "/tmp/rate-$eng.json")"
    done
fi

if [ -n "$MARKER" ]; then
    step powercut
    find_ctrl || connect -i 2
    # What the steps before wrote, and the pool file's own metadata, go to the NVDIMM now; from here on only the
    # target's Flush and FUA may write the pool's pages back: not the kernel's flusher (it writes what has been
    # dirty for 30 s), not a sync before the cut
    sync
    { echo 0 >/proc/sys/vm/dirty_writeback_centisecs && echo 360000 >/proc/sys/vm/dirty_expire_centisecs; } \
        || fail "turning the kernel's write-back off"
    # A FUA write of 64 KiB at byte 8 MiB, a plain write at 9 MiB followed by a Flush, a plain write at 10 MiB
    # never flushed.
    FUA_LBA=$(( (8 << 20) / BS )) FL_LBA=$(( (9 << 20) / BS )) UN_LBA=$(( (10 << 20) / BS )) N=$(( 65536 / BS ))
    head -c 65536 /dev/urandom >/tmp/fua.bin
    head -c 65536 /dev/urandom >/tmp/flushed.bin
    head -c 65536 /dev/urandom >/tmp/unflushed.bin
    out=$(nvme write "/dev/$DEV" -s "$FUA_LBA" -c $((N - 1)) -z 65536 -d /tmp/fua.bin --force-unit-access 2>&1) \
        || fail "nvme write --force-unit-access: $out"
    dd if=/tmp/flushed.bin of="/dev/$DEV" bs=65536 seek=$((FL_LBA * BS / 65536)) count=1 oflag=direct status=none || fail "dd write"
    out=$(nvme flush "/dev/$DEV" -n 1 2>&1) || fail "nvme flush: $out"
    result fua "$((FUA_LBA * BS)) $(sha256sum /tmp/fua.bin | cut -d' ' -f1)"
    result flushed "$((FL_LBA * BS)) $(sha256sum /tmp/flushed.bin | cut -d' ' -f1)"
    # after the Flush: nothing makes this one durable (the host's block layer sends no flush of its own for O_DIRECT)
    dd if=/tmp/unflushed.bin of="/dev/$DEV" bs=65536 seek=$((UN_LBA * BS / 65536)) count=1 oflag=direct status=none \
        || fail "dd write (unflushed)"
    result unflushed "$((UN_LBA * BS)) $(sha256sum /tmp/unflushed.bin | cut -d' ' -f1)"
    result dirty_before_cut "$(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
    result status pass
    say "the writes done: the power goes"
    echo "$MARKER"
    sleep 120
    fail "still running 120 s after the marker: the host did not cut the power"
fi
if [ "$TARGET" = pmemblk ]; then
    nvme disconnect -n "$NQN" >/dev/null 2>&1
    serve_stop 60 || fail "the server ignored SIGTERM"
    [ "$SERVER_RC" = 0 ] || fail "the server exited $SERVER_RC after SIGTERM"
fi
result status pass
