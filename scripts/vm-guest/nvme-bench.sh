#!/bin/sh
# The guest's side of scripts/bench-nvme: every server and every host in this ONE guest, over 127.0.0.1, and the same
# fio job (bench/fio/vhost/job.fio: libaio, direct) on each target's disk in turn, the order rotated per job and round.
# Targets (TARGETS, a comma list):
#   pmemblk        `pmemblk serve` with nvme.listen on a pool on a tmpfs (RAM, as brd) (the kernel's nvme-tcp host, 2 I/O queues)
#   nvmet-brd      the kernel's nvmet-tcp over brd (/dev/ram0), configfs, its own port
#   nvmet-pmem     the kernel's nvmet-tcp over /dev/pmem0 (the emulated NVDIMM, raw: no filesystem)
#   nbd            the same pmemblk server's NBD export on TCP 127.0.0.1, through the kernel's nbd client (2 connections)
# The disks are written end to end first (first-touch page faults stay out of the write jobs). Around each run the
# guest's busy CPU ticks (/proc/stat: user+nice+system+irq+softirq+steal, the same measure for every target: it holds
# the server, the host driver and fio) and, for the pmemblk targets, the server process's ticks (/proc/PID/stat
# utime+stime) are read; fio's JSON goes to $HOST_REQUESTS/out/JOB.TARGET.json and a line "JOB TARGET SERVER_TICKS
# GUEST_TICKS ok|failed" to $HOST_REQUESTS/out/ticks.tsv, which the host turns into the report.
# Environment: TARGETS, JOBS (comma list of RW-BS-qdQD-Nj), RUNTIME (s), REPEAT, SIZE_MIB, JOBFILE.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
fail() { result why "$*"; say "FAIL: $*"; [ -s /tmp/server.log ] && tail -n 20 /tmp/server.log | sed 's/^/server| /'; exit 1; }
OUT=$HOST_REQUESTS/out
{ mkdir -p "$OUT" && : >"$OUT/ticks.tsv"; } || fail "cannot write to $OUT"
TARGETS=${TARGETS:-pmemblk,nvmet-brd,nvmet-pmem,nbd}
SIZE_MIB=${SIZE_MIB:-256}
REPEAT=${REPEAT:-1}
NQN_P=nqn.2026-12.io.pmemblk:bench NQN_K=nqn.2026-12.io.pmemblk:nvmet PORT_P=4420 PORT_K=4421 NBD_PORT=10809
cd /tmp || exit 1
want() { case ",$TARGETS," in *",$1,"*) return 0 ;; esac; return 1; }

ip link set lo up || fail "ip link set lo up"
modprobe nvme-tcp || fail "modprobe nvme-tcp"

# The namespaces' block devices; not the hidden per-path ones of native multipath (nvmeXcYnZ: no /dev node)
nvme_blocks() {
    for _b in /sys/block/nvme*; do
        case "${_b##*/}" in nvme\*|nvme*c*) continue ;; esac
        echo "${_b##*/}"
    done | sort
}
# new_nvme_dev NQN PORT: connects the kernel's host to NQN at PORT; NEWDEV: the namespace's block device
new_nvme_dev() {
    nvme_blocks >/tmp/before
    _o=$(nvme connect -t tcp -a 127.0.0.1 -s "$2" -n "$1" -i 2 2>&1) || fail "nvme connect $1 port $2: $_o"
    _t=$(( $(now) + 60 ))
    while :; do
        _d=$(nvme_blocks | comm -13 /tmp/before - | head -n 1)
        [ -n "$_d" ] && [ -b "/dev/$_d" ] && { NEWDEV=/dev/$_d; return 0; }
        [ "$(now)" -lt "$_t" ] || fail "no new nvme block device 60 s after nvme connect $1"
        sleep 0.2
    done
}

SERVER_PID=''
if want pmemblk || want nbd; then
    say "pmemblk serve: NVMe/TCP on $PORT_P, NBD on $NBD_PORT, pool of $SIZE_MIB MiB on a tmpfs"
    { mkdir -p /mnt/bench-pool && mount -t tmpfs -o size=$((SIZE_MIB + 16))m tmpfs /mnt/bench-pool; } || fail "tmpfs for the pool"
    # shellcheck disable=SC2086 # PMEMBLK_SETS is a word list of --set options
    serve_start /tmp/server.log --set pmem.path=/mnt/bench-pool/pool --set "pmem.size=${SIZE_MIB}M" --set nbd.socket= \
        --set "nbd.port=$NBD_PORT" --set nbd.export=pmem0 --set "nvme.listen=127.0.0.1:$PORT_P" \
        --set "nvme.subsystem-nqn=$NQN_P" ${PMEMBLK_SETS:-}
    serve_ready /tmp/server.log 300 "^ready: nvme-tcp " || fail "pmemblk serve not ready"
fi
if want nvmet-brd || want nvmet-pmem; then
    modprobe configfs 2>/dev/null; mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || fail "mount configfs"
    { modprobe nvmet && modprobe nvmet-tcp; } || fail "modprobe nvmet nvmet-tcp"
    C=/sys/kernel/config/nvmet
    { mkdir "$C/ports/1" && echo tcp >"$C/ports/1/addr_trtype" && echo ipv4 >"$C/ports/1/addr_adrfam" \
        && echo 127.0.0.1 >"$C/ports/1/addr_traddr" && echo "$PORT_K" >"$C/ports/1/addr_trsvcid"; } || fail "nvmet port"
    # subsystem NAME DEVICE: one subsystem per backing device, on the one port
    subsystem() {
        _s="$C/subsystems/$NQN_K-$1"
        { mkdir "$_s" && echo 1 >"$_s/attr_allow_any_host" && mkdir "$_s/namespaces/1" \
            && echo "$2" >"$_s/namespaces/1/device_path" && echo 1 >"$_s/namespaces/1/enable" \
            && ln -s "$_s" "$C/ports/1/subsystems/"; } || fail "nvmet subsystem $1 on $2"
    }
    if want nvmet-brd; then
        modprobe brd rd_nr=1 rd_size=$((SIZE_MIB * 1024)) || fail "modprobe brd"
        subsystem brd /dev/ram0
    fi
    if want nvmet-pmem; then
        [ -b /dev/pmem0 ] || fail "no /dev/pmem0 (bench-nvme boots the guest with an NVDIMM)"
        subsystem pmem /dev/pmem0
    fi
fi

# DEV_<target>: each target's block device
for t in $(echo "$TARGETS" | tr , ' '); do
    case "$t" in
        pmemblk) new_nvme_dev "$NQN_P" "$PORT_P"; d=$NEWDEV ;;
        nvmet-brd) new_nvme_dev "$NQN_K-brd" "$PORT_K"; d=$NEWDEV ;;
        nvmet-pmem) new_nvme_dev "$NQN_K-pmem" "$PORT_K"; d=$NEWDEV ;;
        nbd)
            modprobe nbd nbds_max=2 || fail "modprobe nbd"
            timeout 60 nbd-client 127.0.0.1 "$NBD_PORT" -N pmem0 -b 4096 -connections 2 /dev/nbd0 >/tmp/nbd-client.out 2>&1 \
                || fail "nbd-client: $(tail -n 1 /tmp/nbd-client.out)"
            d=/dev/nbd0 ;;
        *) fail "unknown target '$t'" ;;
    esac
    eval "DEV_$(echo "$t" | tr - _)=$d"
    say "$t: $d ($(blockdev --getsize64 "$d") bytes)"
    timeout 600 fio --name=prefill --filename="$d" --ioengine=libaio --direct=1 --rw=write --bs=1m --iodepth=8 \
        --size="${SIZE_MIB}M" --output=/tmp/prefill.out </dev/null >/dev/null 2>&1 || { cat /tmp/prefill.out; fail "prefilling $t ($d)"; }
done

guest_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
server_ticks() {
    if [ -n "$SERVER_PID" ]; then awk '{ print $14 + $15 }' "/proc/$SERVER_PID/stat"; else echo 0; fi
}
n=0 total=$(( $(echo "$JOBS" | tr , '\n' | wc -l) * $(echo "$TARGETS" | tr , '\n' | wc -l) * REPEAT ))
round=0
while [ "$round" -lt "$REPEAT" ]; do
    i=0
    for job in $(echo "$JOBS" | tr , ' '); do
        # randread-4k-qd32-2j -> RW=randread BS=4k QD=32 NUMJOBS=2
        rw=${job%%-*} rest=${job#*-}
        bs=${rest%%-*} rest=${rest#*-}
        qd=${rest%%-*} nj=${rest#*-}
        qd=${qd#qd} nj=${nj%j}
        # the targets rotated by job and round: none always runs first
        # shellcheck disable=SC2046 # the target names are words
        set -- $(echo "$TARGETS" | tr , ' ')
        k=$(( (i + round) % $# ))
        while [ "$k" -gt 0 ]; do _f=$1; shift; set -- "$@" "$_f"; k=$((k - 1)); done
        for t in "$@"; do
            n=$((n + 1))
            dev=''
            eval "dev=\$DEV_$(echo "$t" | tr - _)"
            s0=$(server_ticks) g0=$(guest_ticks)
            status=ok
            DISK=$dev RW=$rw BS=$bs QD=$qd NUMJOBS=$nj SPAN=$((100 / nj))% RUNTIME=$RUNTIME timeout -k 10 $((RUNTIME + 120)) \
                fio --output-format=json --output="$OUT/$job.$t.r$round.json" "$JOBFILE" </dev/null >"/tmp/fio-$n.err" 2>&1 \
                || { status=failed; sed "s/^/fio $job $t| /" "/tmp/fio-$n.err"; }
            s1=$(server_ticks) g1=$(guest_ticks)
            case "$t" in pmemblk|nbd) st=$((s1 - s0)) ;; *) st=- ;; esac
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$job" "$t" "$round" "$st" $((g1 - g0)) "$status" >>"$OUT/ticks.tsv"
            say "[$n/$total] $job on $t ($dev): $status"
        done
        i=$((i + 1))
    done
    round=$((round + 1))
done
result runs "$n"
result status pass
