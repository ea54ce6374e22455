#!/usr/bin/env bash
# Removes one persistence step at a time from PmemRegion.java (remove-persistence.py NAME), runs
# DurabilityRecordTest in both surefire executions, records which tests failed and how, and restores the file.
# Usage: scripts/measure/remove-persistence.sh M1_... M2_... (names in remove-persistence.py). Commit first: it
# checks PmemRegion.java out after each run.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
find_jdk build || exit 1
cd "$PMEMBLK_ROOT" || exit 1
mkdir -p /tmp/remove-persistence; out=/tmp/remove-persistence/results.txt
for m in "$@"; do
  git checkout -q pmem-blk/src/main/java/io/pmemblk/pmem/PmemRegion.java
  python3 scripts/measure/remove-persistence.py "$m" || { echo "$m: patch failed" >> "$out"; continue; }
  rm -rf pmem-blk/target/surefire-reports pmem-blk/target/surefire-reports-forced-pmem
  mvn -q -B -ntp -pl pmem-blk -am test -Dtest='DurabilityRecordTest' -Dsurefire.failIfNoSpecifiedTests=false > "/tmp/remove-persistence/$m.log" 2>&1
  echo "=== $m (mvn exit $?)" >> "$out"
  python3 - "$m" >> "$out" <<'PY'
import glob,re,sys,html
for d in ['surefire-reports','surefire-reports-forced-pmem']:
    for f in glob.glob('pmem-blk/target/%s/TEST-*.xml'%d):
        x=open(f).read()
        for m in re.finditer(r'<testcase name="([^"]+)"[^>]*>\s*<(failure|error) message="([^"]*)"',x):
            msg=html.unescape(m.group(3)).replace('\n',' ')[:400]
            print(' [%s] %s: %s: %s'%('forced' if 'forced' in d else 'plain', m.group(1), m.group(2), msg))
PY
done
git checkout -q pmem-blk/src/main/java/io/pmemblk/pmem/PmemRegion.java
echo DONE >> "$out"
