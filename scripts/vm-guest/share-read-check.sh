#!/bin/sh
# Does the guest read the JDK's files off the 9p host share exactly? The JVM maps its CDS archive (classes.jsa:
# metadata and archived Java objects with pointers in them) and libjvm.so from there; a page read wrong would be a
# wild pointer in a running JVM. `share-read-check.sh ROUNDS FILE=SHA1...`: each round drops the page cache and
# hashes every FILE twice at once, by read(2) (sha1sum) and through a private mapping (python3 mmap), so page faults
# and readahead both fetch from the share, concurrently.
# Output: "BAD round R FILE via read|mmap: SHA1" for each difference, then RESULT share.{rounds,reads,bad}=N.
set -u
ROUNDS=${1:?usage: share-read-check.sh ROUNDS FILE=SHA1...}; shift
bad=0 reads=0 r=1
while [ "$r" -le "$ROUNDS" ]; do
    sync; echo 3 >/proc/sys/vm/drop_caches
    for spec in "$@"; do
        f=${spec%%=*} want=${spec#*=}
        sha1sum "$f" >/tmp/read.sum &
        /usr/bin/python3 -c 'import hashlib, mmap, sys
with open(sys.argv[1], "rb") as fh:
    m = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    h = hashlib.sha1()
    for off in range(0, len(m), 1 << 20):
        h.update(m[off:off + (1 << 20)])
    print(h.hexdigest())' "$f" >/tmp/mmap.sum
        wait
        got_read=$(cut -d' ' -f1 /tmp/read.sum) got_mmap=$(cat /tmp/mmap.sum)
        reads=$((reads + 2))
        [ "$got_read" = "$want" ] || { bad=$((bad + 1)); echo "BAD round $r $f via read: $got_read (want $want)"; }
        [ "$got_mmap" = "$want" ] || { bad=$((bad + 1)); echo "BAD round $r $f via mmap: $got_mmap (want $want)"; }
    done
    r=$((r + 1))
done
echo "RESULT share.rounds=$ROUNDS"
echo "RESULT share.reads=$reads"
echo "RESULT share.bad=$bad"
[ "$bad" = 0 ]
