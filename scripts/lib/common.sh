# Shared by the scripts: find a JDK >= 25, install Debian packages when missing, build the jar.
# shellcheck shell=bash

PMEMBLK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# What the build leaves in cli/target: the jar, the modules it runs with, the JVM's argument file.
PMEMBLK_HOME="$PMEMBLK_ROOT/cli/target"
PMEMBLK_JAR="$PMEMBLK_HOME/pmemblk.jar"
PMEMBLK_MODULES="$PMEMBLK_HOME/modules"
PMEMBLK_ARGS="$PMEMBLK_HOME/pmemblk.args"
# find_jdk, jdk_feature, pmemblk_java_args: shared with the installed /usr/bin/pmemblk.
# shellcheck source=scripts/lib/launch.sh
. "$PMEMBLK_ROOT/scripts/lib/launch.sh"
# Installs the Debian packages named when any is missing (needs root, or sudo without a password).
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
      echo "pmemblk: missing Debian packages: ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
      return 1
    fi
  fi
  echo "pmemblk: installing ${missing[*]} ..." >&2
  # One install at a time: two scripts started together (a bench and a test, vm-test's scenarios installing their
  # tools when first needed) would otherwise fail at once on the dpkg lock the other holds.
  (
    flock 9
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  ) 9>"${TMPDIR:-/tmp}/pmemblk-apt.lock"
}

# The JVM argument file is stale when missing or older than its template (a pom edit, which may change a
# grant, is newer than the jar, so ensure_jar rebuilds both through its own check).
args_stale() {
  [ ! -f "$PMEMBLK_ARGS" ] || [ -n "$(find "$PMEMBLK_ROOT/cli/src/launch" -newer "$PMEMBLK_ARGS" -print -quit)" ]
}

# Builds cli/target/pmemblk.jar when it is missing or older than any source or pom. Serialised with flock
# so two launchers started together do not build over each other.
ensure_jar() {
  stale() {
    [ ! -f "$PMEMBLK_JAR" ] || [ ! -d "$PMEMBLK_MODULES" ] && return 0
    [ -n "$(find "$PMEMBLK_ROOT" -path "$PMEMBLK_ROOT/bench/jmh" -prune -o -path "$PMEMBLK_ROOT/bench/ring" -prune -o -path "$PMEMBLK_ROOT/bench/vhost-load" -prune -o -path '*/target' -prune -o -path '*/.git' -prune \
        -o \( -name '*.java' -o -name 'pom.xml' -o -path '*/src/main/resources/*' \) -newer "$PMEMBLK_JAR" -print -quit)" ]
  }
  stale || args_stale || return 0
  mkdir -p "$PMEMBLK_ROOT/cli/target"
  (
    flock 9
    if stale || args_stale; then
      echo "pmemblk: building $PMEMBLK_JAR (mvn package) ..." >&2
      (cd "$PMEMBLK_ROOT" && mvn -q -B -DskipTests -pl cli -am package) >&2 \
        || { echo "pmemblk: build failed (run: cd $PMEMBLK_ROOT && mvn -pl cli -am package)" >&2; exit 1; }
    fi
  ) 9>"$PMEMBLK_ROOT/cli/target/.build.lock"
}

# A/B baselines. Builds git revision $1 of this repository once, caches the built tree by commit sha and sets
# BASELINE_SHA, BASELINE_SHORT and BASELINE_ROOT (that revision's tree with its modules built). Run the baseline
# only through "$BASELINE_ROOT/scripts/pmemblk": the launch line (jar or module path) is the revision's own.
# The build happens in a temporary detached git worktree under /tmp that is removed on every exit path of the
# build (success, failure, Ctrl-C); the built tree (without .git, timestamps kept so its launcher does not see
# it as stale) is then copied into the cache, ${PMEMBLK_BASELINE_CACHE:-~/.cache/pmemblk-baseline}/<sha>/tree,
# and reused by later runs. Serialised per sha with flock, so concurrent runs build a revision once.
baseline_build() {
  local rev=$1 sha cache dir
  sha=$(git -C "$PMEMBLK_ROOT" rev-parse --verify --quiet "$rev^{commit}") \
    || { echo "pmemblk: --baseline '$rev' is not a commit of $PMEMBLK_ROOT" >&2; return 1; }
  BASELINE_SHA=$sha
  BASELINE_SHORT=$(git -C "$PMEMBLK_ROOT" rev-parse --short "$sha")
  cache=${PMEMBLK_BASELINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmemblk-baseline}
  dir="$cache/$sha"
  BASELINE_ROOT="$dir/tree"
  mkdir -p "$cache"
  if [ ! -f "$dir/.built" ]; then
    (
      flock 9
      [ -f "$dir/.built" ] && exit 0
      wt=$(mktemp -d /tmp/pmemblk-baseline-wt.XXXXXX)
      # shellcheck disable=SC2317 # run by the EXIT trap
      remove_wt() {
        git -C "$PMEMBLK_ROOT" worktree remove --force "$wt" >/dev/null 2>&1 || true
        rm -rf "$wt" "$dir.partial"
        git -C "$PMEMBLK_ROOT" worktree prune 2>/dev/null || true
      }
      trap remove_wt EXIT
      trap 'exit 130' INT TERM
      echo "pmemblk: building baseline $BASELINE_SHORT ($rev) in $wt ..." >&2
      git -C "$PMEMBLK_ROOT" worktree add --quiet --detach "$wt" "$sha" >&2 || exit 1
      (cd "$wt" && mvn -q -B -ntp -DskipTests -pl cli -am package) >&2 \
        || { echo "pmemblk: baseline build of $BASELINE_SHORT failed (cd $PMEMBLK_ROOT && git worktree add /tmp/b $sha && cd /tmp/b && mvn -pl cli -am package)" >&2; exit 1; }
      rm -rf "$dir.partial" "$dir"
      mkdir -p "$dir.partial/tree"
      tar -C "$wt" --exclude=./.git -cf - . | tar -C "$dir.partial/tree" -xpf -
      git -C "$PMEMBLK_ROOT" log -1 --format='%H %cI %s' "$sha" >"$dir.partial/commit"
      touch "$dir.partial/.built"
      mv "$dir.partial" "$dir"
    ) 9>"$cache/$sha.lock" || return 1
  else
    echo "pmemblk: baseline $BASELINE_SHORT ($rev) already built in $dir" >&2
  fi
  [ -x "$BASELINE_ROOT/scripts/pmemblk" ] \
    || { echo "pmemblk: baseline $BASELINE_SHORT has no scripts/pmemblk to launch it with" >&2; return 1; }
}

# bench_options PROG SPEC ARGS...: the bench scripts' command line. SPEC lists, space-separated, OPTION=VAR (the option
# takes a value, stored in VAR), OPTION=VAR:VALUE (a flag: VAR set to VALUE) and OPTION+=ARRAY (each value appended
# to ARRAY as `--set VALUE`, the form pmemblk takes); -h and --help call the script's usage 0. An unknown option, or
# one without its value, is refused naming it, with usage 2 on stderr.
bench_options() {
  local prog=$1 spec=$2 entry opt var hit
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in -h|--help) usage 0 ;; esac
    hit=''
    for entry in $spec; do
      if [[ $entry == *+=* ]]; then opt=${entry%%+=*}; else opt=${entry%%=*}; fi
      [ "$opt" = "$1" ] || continue
      hit=1 var=${entry#*=}
      if [[ $entry == *=*:* ]]; then
        printf -v "${var%%:*}" '%s' "${var#*:}"; shift
      elif [ $# -lt 2 ]; then
        echo "$prog: $1 wants a value" >&2; usage 2 >&2
      elif [[ $entry == *+=* ]]; then
        local -n bench_array=$var
        bench_array+=(--set "$2"); unset -n bench_array; shift 2
      else
        printf -v "$var" '%s' "$2"; shift 2
      fi
      break
    done
    [ -n "$hit" ] || { echo "$prog: unknown option '$1'" >&2; usage 2 >&2; }
  done
}
# bench_check PROG OPTION VALUE REGEX WHAT: VALUE must match REGEX, or the script exits 2 saying OPTION wants WHAT.
bench_check() {
  [[ $3 =~ $4 ]] || { echo "$1: $2 wants $5, got '$3'" >&2; exit 2; }
}
# Whole numbers >= 1, as bench_check's REGEX.
# shellcheck disable=SC2034  # the bench scripts' to use
BENCH_WHOLE='^0*[1-9][0-9]*$'

# The bench scripts' reports and A/B tables (the package scripts/lib/benchreport; standard library only, so Debian's
# /usr/bin/python3 runs it with nothing installed).
benchreport() {
  local py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  PYTHONPATH="$PMEMBLK_ROOT/scripts/lib${PYTHONPATH:+:$PYTHONPATH}" "$py" -m benchreport "$@"
}

# round_order ROUND NAME...: sets ORDER to the names in the order they run in that round. In an A/B run (a name is
# "baseline") even rounds run in reverse, so neither ours nor the baseline always goes first.
round_order() {
  local r=$1 i
  shift
  ORDER=("$@")
  if [[ " $* " == *" baseline "* ]] && ((r % 2 == 0)); then
    ORDER=()
    for ((i = $#; i >= 1; i--)); do ORDER+=("${!i}"); done
  fi
}

# ab_describe REV: sets BASE_DESC and OURS_DESC, the two sides of an A/B run as its report names them (after
# baseline_build REV).
# shellcheck disable=SC2034 # BASE_DESC is for the script that calls this
ab_describe() {
  BASE_DESC="$BASELINE_SHORT ($1: $(git -C "$PMEMBLK_ROOT" log -1 --format=%s "$BASELINE_SHA" | cut -c1-80))"
  OURS_DESC="this tree, $(git -C "$PMEMBLK_ROOT" rev-parse --abbrev-ref HEAD) at $(git -C "$PMEMBLK_ROOT" rev-parse --short HEAD)"
  [ -z "$(git -C "$PMEMBLK_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || OURS_DESC+=" + uncommitted changes"
}
