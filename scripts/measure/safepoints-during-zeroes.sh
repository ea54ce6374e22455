#!/usr/bin/env bash
# Measures how long 4k reads on one NBD connection can be held at a safepoint while another connection sends
# 4 GiB WRITE_ZEROES. Prints "Reaching safepoint" (-Xlog:safepoint) while zeroing and over the whole run.
# Needs fio (nbd engine), python3-libnbd, jcmd (to request safepoints). Env: WARM=1 faults the image in
# first; ZEROES=n zeroes; PMEM_IS_PMEM_FORCE=1 takes the pmem_memset path. See docs/durability.md.
# usage: safepoints-during-zeroes.sh REPO LABEL   -- REPO's scripts/pmemblk serves one 4G export on /dev/shm,
#        zeroes on one connection, 4k reads on another (REPO: this checkout, or a baseline's tree to compare)
set -uo pipefail
REPO=${1:?usage: safepoints-during-zeroes.sh REPO LABEL}; LABEL=${2:?usage: safepoints-during-zeroes.sh REPO LABEL}
WARM=${WARM:-}
D=${OUT:-/tmp/pmemblk-safepoints}/$LABEL; rm -rf "$D"; mkdir -p "$D"
IMG=/dev/shm/sp-$LABEL.img; SOCK=$D/s.sock
rm -f "$IMG"
PMEMBLK_JAVA_OPTS="-Xlog:safepoint:file=$D/safepoint.log:utctime,uptime -XX:+UnlockDiagnosticVMOptions -XX:+SafepointTimeout -XX:SafepointTimeoutDelay=4" \
  "$REPO/scripts/pmemblk" serve --set "pmem.path=$IMG" --set pmem.size=4G \
   --set "nbd.socket=$SOCK" --set nbd.port=0 > "$D/server.out" 2>&1 &
SPID=$!
# The server's socket, 20 s at most (a first start may build the jar: then scripts/pmemblk builds it before serving).
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.2; done
[ -S "$SOCK" ] || { echo "safepoints-during-zeroes: no server socket $SOCK after 20 s (see $D/server.out)" >&2; exit 1; }
URI="nbd+unix:///?socket=$SOCK"
if [ -n "$WARM" ]; then # fault every page of the mapping in once, before the measurement
  /usr/bin/python3 -c "import nbd,sys; h=nbd.NBD(); h.connect_uri(sys.argv[1]); h.zero(4294963200, 0); h.shutdown()" "$URI"
fi
fio --name=reads --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --size=1g --time_based --runtime=25 --iodepth=1 \
    --percentile_list=50:99:99.9:99.99:100 --output="$D/fio.txt" &
FPID=$!
sleep 3
( while kill -0 "$FPID" 2>/dev/null; do jcmd "$SPID" Thread.print > /dev/null 2>&1; sleep 0.05; done ) &
TPID=$!
/usr/bin/python3 - "$URI" > "$D/zero.txt" 2>&1 <<'PY'
import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
w0 = time.time()
for i in range(int(__import__("os").environ.get("ZEROES", "4"))):
    t = time.time(); h.zero(4294963200, 0); print("zero 4G-4k: %.3f s" % (time.time() - t), flush=True)
print("window %.3f %.3f" % (w0, time.time()))
h.shutdown()
PY
wait "$FPID"; kill "$TPID" 2>/dev/null; wait "$TPID" 2>/dev/null
kill "$SPID"; wait "$SPID"
rm -f "$IMG"
echo "== $LABEL"; cat "$D/zero.txt"
grep -E "clat|lat \(|99.99|100.00|IOPS" "$D/fio.txt" | head -12
python3 - "$D" <<'PY'
import re,sys,datetime
d=sys.argv[1]
w=[l.split() for l in open(d+'/zero.txt') if l.startswith('window')]
a,b=(float(w[0][1]),float(w[0][2])) if w else (0,0)
allr=[];inw=[]
for l in open(d+'/safepoint.log'):
    m=re.search(r'^\[([^\]]+)\].*Reaching safepoint: (\d+) ns.*Total: (\d+) ns',l)
    if not m: continue
    t=datetime.datetime.strptime(m.group(1),'%Y-%m-%dT%H:%M:%S.%f%z').timestamp()
    r=int(m.group(2)); allr.append(r)
    if a<=t<=b: inw.append(r)
allr.sort(); inw.sort()
f=lambda l:"n=%d median %.3f ms max %.3f ms" % (len(l), l[len(l)//2]/1e6, l[-1]/1e6) if l else "n=0"
print("reaching safepoint while zeroing: "+f(inw)+" | whole run: "+f(allr))
PY
