# shellcheck shell=bash
# What the host-side scripts that drive a guest's disks share (scripts/vm-test, scripts/bench-vhost): the host's end
# of a guest's requests, the CPU time of a server, and the vhost-user-blk servers.
#
# A guest script that needs the host to act while it runs (restart or kill the server its disk is on, read that
# server's CPU time or metrics: scripts/vm-guest/lib.sh host_request) writes its words into req.N in a directory the
# host shares with it (scripts/vm --share DIR:ctl:/mnt/ctl) and waits for ack.N: "ok" or "fail" on the first line,
# then what the host had to say.

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

# free_port: a TCP port on 127.0.0.1 that nothing listens on now (a server's metrics: other runs share this host).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The vhost-user-blk servers, each exec'ed, so that `NAME ARGS &` leaves $! the server's own pid (to signal, and to
# read the CPU time of). Each is ready when vhost_ready BACKEND LOG SOCK holds.
# pmemblk_vhost FILE SIZE SOCK [--set ...]: `pmemblk serve` exporting FILE over vhost-user-blk on SOCK, 2 queues; its
# NBD listener, which cannot be left out, beside SOCK with TCP off (PMEMBLK_JAVA_OPTS as the launcher takes it).
pmemblk_vhost() {
    local file=$1 size=$2 sock=$3
    shift 3
    exec "$PMEMBLK_VM_REPO/scripts/pmemblk" serve --set "pmem.path=$file" --set "pmem.size=$size" \
        --set "vhost.socket=$sock" --set vhost.queues=2 --set "nbd.socket=$sock.nbd" --set nbd.port=0 "$@"
}
# qsd_vhost FILE SOCK [BLOCKDEV-OPTIONS [IOTHREAD]]: qemu-storage-daemon exporting FILE (raw) over vhost-user-blk on
# SOCK, writable, 2 queues: the reference back-end (shared/notes/vhost-user.md section 7). With IOTHREAD (an id) the
# export runs in an iothread of that name (--object iothread) instead of the main loop.
qsd_vhost() {
    exec qemu-storage-daemon ${4:+--object "iothread,id=$4"} \
        --blockdev "driver=file,node-name=disk,filename=$1,cache.direct=off${3:+,$3}" \
        --export "type=vhost-user-blk,id=vhost0,node-name=disk,addr.type=unix,addr.path=$2,writable=on,num-queues=2${4:+,iothread=$4}"
}
# vhost_ready pmemblk|qsd LOG SOCK: pmemblk printed its ready line for vhost-user-blk; qemu-storage-daemon (which
# prints nothing) created its socket.
vhost_ready() {
    if [ "$1" = qsd ]; then test -S "$3"; else grep -qs '^ready: vhost-user-blk ' "$2"; fi
}
PMEMBLK_VM_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# guest_deb PACKAGE: a Debian package's files for a guest, not installed on this host: `apt-get download` and
# `dpkg -x` once into the guest cache (PMEMBLK_VM_CACHE, as scripts/vm's kernel), then reused; prints the folder
# (share it: scripts/vm --share DIR:TAG:/mnt/TAG:ro). The guest's root is this host's, so the package's libraries
# must be here: each Depends that names a library package (lib*) is checked installed. Fails saying what is missing.
guest_deb() {
    local pkg=$1 cache=${PMEMBLK_VM_CACHE:-$HOME/.cache/pmemblk-vm}/debs ver dir tmp deb dep
    ver=$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')
    if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
        apt-get update -q >/dev/null 2>&1 || true
        ver=$(apt-cache policy "$pkg" 2>/dev/null | sed -n 's/^ *Candidate: //p')
    fi
    if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
        # Offline: the newest one extracted before.
        dir=$(find "$cache" -maxdepth 1 -name "$pkg-*" -type d 2>/dev/null | sort -V | tail -n 1)
        [ -n "$dir" ] && [ -e "$dir/.complete" ] && { echo "$dir"; return 0; }
        echo "guest_deb: apt-cache knows no package $pkg (is Debian in sources.list? apt-get update?)" >&2
        return 1
    fi
    dir="$cache/$pkg-$ver"
    if [ ! -e "$dir/.complete" ]; then
        mkdir -p "$cache"
        tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
        # apt's _apt user cannot write into root's cache: download as root without the sandbox warning.
        if ! (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$ver" >"$tmp/download.log" 2>&1); then
            echo "guest_deb: apt-get download $pkg=$ver failed: $(tail -n 1 "$tmp/download.log")" >&2
            rm -rf "$tmp"; return 1
        fi
        deb=$(find "$tmp" -maxdepth 1 -name '*.deb' | head -n 1)
        mkdir -p "$tmp/root"
        dpkg -x "$deb" "$tmp/root" || { echo "guest_deb: dpkg -x $deb failed" >&2; rm -rf "$tmp"; return 1; }
        dpkg-deb -f "$deb" Depends >"$tmp/root/.depends"
        rm -rf "$dir"
        mv "$tmp/root" "$dir"
        rm -rf "$tmp"
        touch "$dir/.complete"
    fi
    # Each Depends entry's first alternative, without its version.
    for dep in $(tr ',' '\n' <"$dir/.depends" | sed 's/|.*//; s/(.*//; s/ //g' | grep '^lib' | sort -u); do
        dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'install ok installed' \
            || { echo "guest_deb: $pkg needs $dep on this host (the guest runs on this root): apt-get install $dep" >&2; return 1; }
    done
    echo "$dir"
}

# The waits and the NBD server on the host of scripts/vm-test's scenarios. They use the sourcing script's SERVER
# (pmemblk, or nbdkit as a stand-in), CRASHES (the folder JVM crash reports go to) and PIDS (the processes it ends
# at exit; each server started here is added).

# wait_gone PID SECONDS: true once PID has exited (reaped if it is our child: its exit status in GONE_STATUS).
GONE_STATUS=''
wait_gone() {
    local pid=$1 deadline=$(( $(date +%s) + $2 ))
    while kill -0 "$pid" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
    wait "$pid" 2>/dev/null
    # shellcheck disable=SC2034  # the callers read it
    GONE_STATUS=$?
    return 0
}

# wait_server PID SECONDS LOG COMMAND...: true once COMMAND succeeds; false, with a line in LOG saying which,
# when the server PID exited or the bound passed first.
wait_server() {
    local pid=$1 deadline=$(( $(date +%s) + $2 )) log=$3
    shift 3
    until "$@"; do
        kill -0 "$pid" 2>/dev/null || { echo "server exited before it was ready" >>"$log"; return 1; }
        [ "$(date +%s)" -lt "$deadline" ] || { echo "server not ready within $2 s" >>"$log"; return 1; }
        sleep 0.1
    done
}

# wait_ready LOG SOCKET PID SECONDS: the server printed "ready:" (pmemblk) or created its socket
# (nbdkit); false when the server died or the bound passed.
wait_ready() {
    if [ "$SERVER" = pmemblk ]; then wait_server "$3" "$4" "$1" grep -qs '^ready:' "$1"
    else wait_server "$3" "$4" "$1" test -S "$2"; fi
}

# start_host_server FILE SIZE SOCKET LOG: sets SERVER_PID.
start_host_server() {
    local file=$1 size=$2 sock=$3 log=$4
    rm -f "$sock"
    if [ "$SERVER" = pmemblk ]; then
        PMEMBLK_JAVA_OPTS="-XX:ErrorFile=$CRASHES/hs_err_pid%p.log ${PMEMBLK_JAVA_OPTS:-}" "$PMEMBLK_VM_REPO/scripts/pmemblk" serve \
            --set "pmem.path=$file" --set "pmem.size=$size" \
            --set "nbd.socket=$sock" --set nbd.port=0 --set nbd.export=pmem0 >>"$log" 2>&1 &
    else
        [ -e "$file" ] || truncate -s "$size" "$file"
        nbdkit -f -U "$sock" -e pmem0 file "$file" >>"$log" 2>&1 &
    fi
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    # The first pmemblk start may build the jar: allow for it.
    wait_ready "$log" "$sock" "$SERVER_PID" 240
}

stop_host_server() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null
    wait_gone "$pid" 20 || { kill -KILL "$pid" 2>/dev/null; echo "server ignored SIGTERM for 20 s" >&2; return 1; }
}
