# shellcheck shell=bash
# An AOT cache of `pmemblk serve` for the guest JVMs (JDK 25: JEP 483's ahead-of-time class loading and linking,
# made in one training run by JEP 514's -XX:AOTCacheOutput): the classes a server start loads, parsed, verified and
# linked once on the host from the same jars, so that a guest start under TCG emulation maps them instead of doing
# that work in emulated code. Sourced by scripts/vm-test, made once before the first boot; every guest JVM started
# through scripts/vm-guest/guest-java.sh uses it.
#
# The guest's JVMs run the launcher's argument file without its --illegal-native-access=deny line
# (ROOT/cli/target/pmemblk-guest.args, written here): that property alone turns the archived module graph off, and a
# cache of AOT-linked classes is refused without it (-Xlog:aot: "optimized module handling: disabled due to
# incompatible property: jdk.module.illegal.native.access=deny"). The grants stay (--enable-native-access names the
# same three modules); what goes is the refusal of every other module, which no guest scenario tests (the host's
# NativeAccessIT and the package test do). Measured in one quiet guest boot: `pmemblk info` 18.2-20.5 s with the
# line and no cache, 16.6 s without the line, 11.3-11.8 s without it and with the cache (the module system's
# initialisation 2.8 s -> 0.05 s of it).
#
# The JVM takes a cache only where the module path is the one it was made with (same paths, same jar sizes and
# times; AOTClassLocationConfig::check_module_paths in HotSpot), and the guest sees the checkout at /mnt/pmemblk.
# So the training run sees it there too: a private mount namespace (unshare -m, root only) binds the checkout at
# /mnt/pmemblk for that one process tree, nothing else on the host sees it. The training is a server start as the
# guest's (same JVM options, an NVMe/TCP listener), a few cases of scripts/vm-guest/nvme-hostile.py against it (its
# well-behaved host too: the connection and I/O paths are then in the cache), then SIGTERM: the JVM writes the cache
# as it exits. Made once per build, beside the jars; made again when a jar or the argument file is newer.
#
# guest_aot_cache ROOT JAVA_OPTS LOG: prints the cache's path (ROOT/cli/target/pmemblk-guest.aot) when it is there
# or was made, and nothing when it cannot be made (not root, no unshare, no JDK 25, a failed training: the reason
# in LOG); a guest then starts without it, only slower. JAVA_OPTS: the guest JVM's options (guest-java.sh), which
# the cache is made under.
# guest_aot_drop ROOT: no cache for the guests (the cache and its argument file gone), as PMEMBLK_GUEST_AOT=0 asks.
guest_aot_drop() { rm -f "$1/cli/target/pmemblk-guest.aot" "$1/cli/target/pmemblk-guest.args" "$1/cli/target/pmemblk-guest.opts"; }

guest_aot_cache() {
    local root=$1 opts=$2 log=$3 target cache tmp port rc jdk
    target=$root/cli/target cache=$target/pmemblk-guest.aot
    # The guest's JDK (scripts/vm-guest/init names it): a cache is valid for that JVM build only
    jdk=$(sed -n 's/^JDK=//p' "$root/scripts/vm-guest/init")
    # ...and for the JVM options it was made under (pmemblk-guest.opts: the guests' defaults change now and then)
    if [ -s "$cache" ] && [ -s "$target/pmemblk-guest.args" ] && [ "$(cat "$target/pmemblk-guest.opts" 2>/dev/null)" = "$opts" ] \
            && [ -z "$(find "$target/pmemblk.jar" "$target/pmemblk.args" \
            "$target/modules" "$jdk/lib/modules" -newer "$cache" 2>/dev/null | head -n 1)" ]; then
        echo "$cache"; return 0
    fi
    guest_aot_drop "$root"
    { [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; } \
        || { echo "guest-aot: no cache: making one needs root and unshare (a private mount namespace)" >>"$log"; return 0; }
    case "$root" in /mnt|/mnt/*) echo "guest-aot: no cache: the checkout is under /mnt, which the training run hides" >>"$log"; return 0 ;; esac
    (. "$root/scripts/lib/launch.sh" && [ -x "$jdk/bin/java" ] && [ "$(jdk_feature "$jdk")" -ge 25 ]) >>"$log" 2>&1 \
        || { echo "guest-aot: no cache: no JDK 25 at '$jdk' (the guest's; -XX:AOTCacheOutput is JDK 25's)" >>"$log"; return 0; }
    { echo "# pmemblk.args for the guest's JVMs, without --illegal-native-access=deny: written by scripts/lib/guest-aot.sh"
      echo "# (why: there) beside the AOT cache made with it; the guest uses both or neither."
      grep -v -e '^--illegal-native-access=' "$target/pmemblk.args"; } >"$target/pmemblk-guest.args"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/pmemblk-aot.XXXXXX")
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "guest-aot: training in $tmp (nvme.listen 127.0.0.1:$port)" >>"$log"
    # shellcheck disable=SC2016 # expanded by the inner shell
    unshare --mount --propagation private bash -c '
        root=$1 tmp=$2 port=$3 opts=$4 jdk=$5
        mount -t tmpfs -o mode=755 tmpfs /mnt && mkdir /mnt/pmemblk && mount --bind "$root" /mnt/pmemblk || exit 3
        home=/mnt/pmemblk/cli/target
        # shellcheck disable=SC2086 # opts is a word list
        "$jdk/bin/java" $opts -XX:AOTCacheOutput="$tmp/pmemblk-guest.aot" --module-path "$home/pmemblk.jar:$home/modules" \
            "@$home/pmemblk-guest.args" serve --set "pmem.path=$tmp/pool" --set pmem.size=64M --set "nbd.socket=$tmp/nbd.sock" \
            --set nbd.port=0 --set "nvme.listen=127.0.0.1:$port" --set nvme.subsystem-nqn=nqn.2026-12.io.pmemblk:aot \
            >"$tmp/serve.log" 2>&1 &
        pid=$!
        t=$((SECONDS + 120))
        until grep -q "^ready: nvme-tcp " "$tmp/serve.log" 2>/dev/null; do
            kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$t" ] || { echo "serve not ready in 120 s"; kill -KILL "$pid"; exit 5; }
            sleep 0.2
        done
        # A few cases: the well-behaved host (in-capsule and R2T writes, reads, digests) runs after each
        timeout -k 5 120 python3 /mnt/pmemblk/scripts/vm-guest/nvme-hostile.py --addr 127.0.0.1 --port "$port" \
            --nqn nqn.2026-12.io.pmemblk:aot --pool "$tmp/pool" \
            --only bytewise,lba_out_of_range,unknown_opcode,h2cdata_past_r2t >"$tmp/hostile.log" 2>&1
        echo "training host: exit $? ($(grep -c . "$tmp/hostile.log") lines)"
        kill -TERM "$pid"
        t=$((SECONDS + 300))
        while kill -0 "$pid" 2>/dev/null; do
            [ "$SECONDS" -lt "$t" ] || { echo "serve still writing the cache after 300 s"; kill -KILL "$pid"; exit 6; }
            sleep 0.2
        done
        wait "$pid"
    ' guest-aot "$root" "$tmp" "$port" "$opts" "$jdk" >>"$log" 2>&1
    rc=$?
    tail -n 5 "$tmp/serve.log" >>"$log" 2>/dev/null
    if [ -s "$tmp/pmemblk-guest.aot" ]; then
        mv "$tmp/pmemblk-guest.aot" "$cache"
        printf '%s\n' "$opts" >"$target/pmemblk-guest.opts"
        echo "guest-aot: made $cache ($(du -h "$cache" | cut -f1); training exit $rc)" >>"$log"
        echo "$cache"
    else
        echo "guest-aot: no cache: the training run made none (exit $rc; see above)" >>"$log"
        rm -f "$target/pmemblk-guest.args"
    fi
    rm -rf "$tmp"
    return 0
}
