# shellcheck shell=bash
# The host's end of a guest's requests (scripts/vm-guest/lib.sh host_request): a guest script that needs the host
# to act while it runs (restart or kill the server its disk is on, read that server's CPU time or metrics) writes
# its words into req.N in a directory the host shares with it (scripts/vm --share DIR:ctl:/mnt/ctl) and waits for
# ack.N: "ok" or "fail" on the first line, then what the host had to say. Sourced by scripts/vm-test and
# scripts/bench-vhost.

# vm_requests_serve DIR PID HANDLER: answers the requests in DIR, in order, until PID (a scripts/vm in the
# background) exits: each by `HANDLER WORD...` in this shell (so it may start and stop servers and set variables),
# its output the answer, ok when it returned 0. Then waits for PID and returns its status. The handler bounds its
# own waits; the guest gives up on an answer after its own bound.
vm_requests_serve() {
    local dir=$1 pid=$2 handler=$3 n=1 words status
    while :; do
        if [ -e "$dir/req.$n" ]; then
            read -r -a words <"$dir/req.$n"
            if "$handler" "${words[@]}" >"$dir/.out.$n" 2>&1; then status=ok; else status=fail; fi
            { echo "$status"; cat "$dir/.out.$n"; } >"$dir/.ack.$n"
            rm -f "$dir/.out.$n"
            mv "$dir/.ack.$n" "$dir/ack.$n"
            n=$((n + 1))
            continue
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$pid"
}

# proc_ticks PID[/task/TID]: user+system clock ticks of a process (or one of its threads) so far, 0 once it is gone.
# The fields are counted after the command name, which may hold spaces and parentheses (proc(5): utime and stime
# are fields 14 and 15, the 12th and 13th after "(comm)").
proc_ticks() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    stat=${stat##*) }
    awk '{ print $12 + $13 }' <<<"$stat"
}
