#!/bin/sh
# The guest's side of scripts/bench-vhost: runs the plan the host wrote, $HOST_REQUESTS/plan, one measurement a line,
# "JOB TARGET DISK" (JOB such as randread-4k-qd32-2j: RW-BS-qdQD-Nj; DISK a name in /mnt/vm/disks), in order. Every
# disk of the plan is first written end to end (the servers allocate and fault their pages in on first write, which
# would otherwise land in the first write job). Each fio run is bracketed by host requests, "begin JOB TARGET" and
# "end JOB TARGET ok|failed" (the host reads the server's CPU time around it: scripts/bench-vhost), and leaves fio's
# JSON in $HOST_REQUESTS/out/JOB.TARGET.json and the disk's interrupts during the run in JOB.TARGET.irqs. A failed
# run is reported to the host and the plan goes on.
# Environment: RUNTIME (seconds per run), WARMUP (seconds of the same job, unmeasured, before a job's first run on a
# disk; 0: none), JOBFILE (bench/fio/vhost/job.fio as the guest sees it).
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
fail() { result why "$*"; say "FAIL: $*"; exit 1; }
PLAN=$HOST_REQUESTS/plan
[ -s "$PLAN" ] || fail "no plan in $PLAN"
mkdir -p "$HOST_REQUESTS/out"

awk '{ print $3 }' "$PLAN" | sort -u >/tmp/disks
while read -r disk; do
    dev=$(vm_disk "$disk") || fail "$(vm_disk "$disk" 2>&1)"
    say "prefill $disk ($dev, $(blockdev --getsize64 "$dev") bytes)"
    timeout 600 fio --name=prefill --filename="$dev" --ioengine=libaio --direct=1 --rw=write --bs=2m --iodepth=8 \
        --output=/tmp/prefill.out </dev/null >/dev/null 2>&1 || { cat /tmp/prefill.out; fail "prefilling $disk ($dev) failed"; }
done </tmp/disks

# disk_irqs DEV: the interrupts the guest took so far from DEV's virtio device (every vector of it: the request
# queues and config), from /proc/interrupts, whose lines end with the vector's name, such as virtio2-req.0.
disk_irqs() {
    virtio=$(basename "$(readlink -f "/sys/block/${1#/dev/}/device")")
    awk -v v="$virtio-" 'NR == 1 { cpus = NF; next }
        index($NF, v) == 1 { for (i = 2; i <= cpus + 1; i++) s += $i } END { print s + 0 }' /proc/interrupts
}

n=0
while read -r job target disk; do
    n=$((n + 1))
    dev=$(vm_disk "$disk") || fail "$(vm_disk "$disk" 2>&1)"
    # randread-4k-qd32-2j -> RW=randread BS=4k QD=32 NUMJOBS=2
    rw=${job%%-*} rest=${job#*-}
    bs=${rest%%-*} rest=${rest#*-}
    qd=${rest%%-*} nj=${rest#*-}
    qd=${qd#qd} nj=${nj%j}
    case "$rw:$bs:$qd:$nj" in
        *[!a-z0-9:]*|*::*|:*|*:) fail "job name '$job' is not RW-BS-qdQD-Nj" ;;
    esac
    span=$((100 / nj))%
    # Warm-up: the first run of a job on a disk is preceded by the same job, unmeasured, for WARMUP seconds, on
    # every disk alike, so that the measured run finds the server's code compiled (a JVM's JIT threads would
    # otherwise be a good part of a short run's CPU) and the server in the state the job leaves it in.
    if [ "${WARMUP:-0}" -gt 0 ] && ! grep -qx "$job $disk" /tmp/warm 2>/dev/null; then
        echo "$job $disk" >>/tmp/warm
        DISK=$dev RW=$rw BS=$bs QD=$qd NUMJOBS=$nj SPAN=$span RUNTIME=$WARMUP timeout -k 10 $((WARMUP + 120)) \
            fio --output=/tmp/warmup.out "$JOBFILE" </dev/null >/dev/null 2>&1 || say "warm-up of $job on $disk failed (the measured run reports it)"
    fi
    host_request 60 begin "$job" "$target" >/dev/null || fail "the host did not take 'begin $job $target'"
    status=ok
    irq0=$(disk_irqs "$dev")
    DISK=$dev RW=$rw BS=$bs QD=$qd NUMJOBS=$nj SPAN=$span RUNTIME=$RUNTIME timeout -k 10 $((RUNTIME + 120)) \
        fio --output-format=json --output="$HOST_REQUESTS/out/$job.$target.json" "$JOBFILE" </dev/null \
        >"/tmp/fio-$n.err" 2>&1 || { status=failed; sed "s/^/fio $job $target| /" "/tmp/fio-$n.err"; }
    echo $(($(disk_irqs "$dev") - irq0)) >"$HOST_REQUESTS/out/$job.$target.irqs"
    ans=$(host_request 120 end "$job" "$target" "$status") || fail "the host did not take 'end $job $target': $ans"
    say "[$n/$(wc -l <"$PLAN")] $job on $target ($dev): $ans"
done <"$PLAN"
result runs "$n"
