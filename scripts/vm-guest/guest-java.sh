# shellcheck shell=sh
# How the guest scripts run pmemblk: java from the host's JDK, the modules of the read-only checkout at
# /mnt/pmemblk, and the JVM arguments scripts/lib/launch.sh gives the launcher (that file is bash; these scripts
# are sh, so its native-access list is read from it rather than sourced, and the guest cannot drift from it). Sourced by the *-check.sh scripts.
# Environment: PMEMBLK_GUEST_CMD replaces the whole command; PMEMBLK_GUEST_JAVA_OPTS the JVM options in front
# (unset: C1 only and the serial collector: under TCG emulation the C2 compiler and GC threads cost more
# start-up time than they return; measured: info 10 s -> 4.5 s on a busy host; set and empty: none, the
# launcher's defaults); PMEMBLK_NATIVE_MODULES the modules granted native access.
PMEMBLK_GUEST_JAVA_OPTS=${PMEMBLK_GUEST_JAVA_OPTS-"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
# A JVM that crashes writes its hs_err file into the run's share (scripts/vm: /mnt/vm is the host's run folder),
# so the report outlives the guest and the host prints it; the JVM's default, its working directory, is a tmpfs
# that dies with the guest.
PMEMBLK_GUEST_CRASH_DIR=${PMEMBLK_GUEST_CRASH_DIR:-/mnt/vm/crash}
CRASH_OPTS=''
[ -d "$PMEMBLK_GUEST_CRASH_DIR" ] && CRASH_OPTS="-XX:ErrorFile=$PMEMBLK_GUEST_CRASH_DIR/hs_err_pid%p.log"
NATIVE=${PMEMBLK_NATIVE_MODULES:-$(sed -n 's/^PMEMBLK_NATIVE_MODULES="\(.*\)"$/\1/p' "$(dirname "$0")/../lib/launch.sh")}
# --add-exports as the launcher's: the NBD reader busy-polls its socket through the fd the JDK keeps in sun.nio.ch.
PMEMBLK_GUEST_CMD=${PMEMBLK_GUEST_CMD:-"$JAVA_HOME/bin/java $CRASH_OPTS $PMEMBLK_GUEST_JAVA_OPTS --enable-native-access=${NATIVE:-io.pmemblk.posix,io.pmemblk.pmem} --illegal-native-access=deny --add-exports=java.base/sun.nio.ch=io.pmemblk.nbd -p /mnt/pmemblk/cli/target/pmemblk.jar:/mnt/pmemblk/cli/target/modules -m io.pmemblk.cli/io.pmemblk.cli.Main"}
