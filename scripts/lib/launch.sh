# How pmemblk is launched: find a Java >= 25, and the JVM's arguments. Sourced by scripts/lib/common.sh (a
# clone) and by the installed /usr/bin/pmemblk (the Debian package ships this file as /usr/share/pmemblk/launch.sh),
# so both find the JDK the same way and run java with the same generated argument file.
# Signals: serve takes SIGHUP back itself when it was started with it ignored (nohup; cli ServeSignals). A
# `trap - HUP` here could not: a non-interactive bash keeps a signal ignored at its entry ignored, and exec passes
# that on to java.
# shellcheck shell=bash

# PMEMBLK_JAVA_ARGS: the JVM arguments that run the pmemblk built or installed in folder $1 (cli/target in a
# clone, /usr/share/pmemblk installed): its pmemblk.jar and modules/ as the module path, then its pmemblk.args,
# the argument file the build generates with every grant and the main module (cli/src/launch/pmemblk.args says
# what it holds and why the module path is not in it). JVM options go before these, pmemblk's arguments after.
pmemblk_java_args() {
  local home=$1
  if [ ! -f "$home/pmemblk.args" ]; then
    echo "pmemblk: $home/pmemblk.args is missing; it is built with the jar (cd <clone> && mvn -pl cli -am package)," \
      "or installed with it by the Debian package" >&2
    exit 1
  fi
  # shellcheck disable=SC2034  # for the script that sourced this file
  PMEMBLK_JAVA_ARGS=(--module-path "$home/pmemblk.jar:$home/modules" "@$home/pmemblk.args")
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
