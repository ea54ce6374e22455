# How pmemblk is launched: find a Java >= 25, and the JVM's arguments. Sourced by scripts/lib/common.sh (a
# clone) and by the installed /usr/bin/pmemblk (the Debian package ships this file as /usr/share/pmemblk/launch.sh),
# so both find the JDK and grant native access the same way.
# shellcheck shell=bash

# Every module on the module path, native access granted by name to the two modules that bind native libraries
# (libc, libpmem) and refused to every other caller.
PMEMBLK_NATIVE_MODULES="io.pmemblk.posix,io.pmemblk.pmem"
# PMEMBLK_JAVA_ARGS for the jar $1 (default $PMEMBLK_JAR) and the folder of modules $2 (default $PMEMBLK_MODULES).
pmemblk_java_args() {
  local jar=${1:-$PMEMBLK_JAR} modules=${2:-$PMEMBLK_MODULES}
  # shellcheck disable=SC2034  # for the script that sourced this file
  # --add-exports: the NBD reader busy-polls its socket (FIONREAD) through the fd the JDK keeps in sun.nio.ch
  # (io.pmemblk.nbd.ChannelFd, BusyPoll); without it the server still works, reading without polling.
  PMEMBLK_JAVA_ARGS=(--enable-native-access="$PMEMBLK_NATIVE_MODULES" --illegal-native-access=deny
    --add-exports=java.base/sun.nio.ch=io.pmemblk.nbd
    --module-path "$jar:$modules" --module io.pmemblk.cli/io.pmemblk.cli.Main)
}

# The feature release of a JDK home ("25"), from its release file or by asking its java.
jdk_feature() {
  local home=$1 v=""
  if [ -f "$home/release" ]; then
    v=$(sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$home/release")
  fi
  if [ -z "$v" ] && [ -x "$home/bin/java" ]; then
    v=$("$home/bin/java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
  fi
  echo "${v:-0}"
}

# Sets JAVA_HOME and JAVA to a Java >= 25: $JAVA_HOME if it qualifies, then Temurin 25, then any JDK or JRE
# under /usr/lib/jvm, then java on PATH. "find_jdk runtime" (the installed command) needs only java; without it
# (building) javac too. Stops with instructions otherwise.
find_jdk() {
  local mode=${1:-build} c candidates=()
  [ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME")
  candidates+=(/usr/lib/jvm/temurin-25-jdk-amd64 /usr/lib/jvm/temurin-25-jre-amd64)
  for c in /usr/lib/jvm/*; do candidates+=("$c"); done
  if command -v java >/dev/null 2>&1; then
    candidates+=("$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")")
  fi
  for c in "${candidates[@]}"; do
    if [ -x "$c/bin/java" ] && { [ "$mode" = runtime ] || [ -x "$c/bin/javac" ]; } && [ "$(jdk_feature "$c")" -ge 25 ]; then
      export JAVA_HOME=$c
      # shellcheck disable=SC2034  # for the script that sourced this file
      JAVA="$c/bin/java"
      return 0
    fi
  done
  if [ "$mode" = runtime ]; then
    cat >&2 <<'MSG'
pmemblk: no Java 25 or newer found (pmemblk uses the FFM API and is built for Java 25).
  Checked $JAVA_HOME, /usr/lib/jvm/* and java on PATH.
  Install one, e.g. with the Adoptium apt repository: apt-get install temurin-25-jre (or temurin-25-jdk),
  or point JAVA_HOME at a Java 25 (e.g. in a systemd drop-in: Environment=JAVA_HOME=/opt/jdk-25).
MSG
  else
    cat >&2 <<'MSG'
pmemblk: no JDK 25 or newer found (the FFM API it uses is final since Java 22; the build targets 25).
  Checked $JAVA_HOME, /usr/lib/jvm/* and java on PATH.
  Install one, e.g. Temurin 25 (https://adoptium.net/), or on Debian/Ubuntu with the Adoptium apt repository:
    apt-get install temurin-25-jdk
  then run again (or point JAVA_HOME at it).
MSG
  fi
  exit 1
}
