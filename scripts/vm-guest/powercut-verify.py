#!/usr/bin/python3
"""Host side of the power-cut scenario: judges a read-back against what the cut boot acknowledged.

  powercut-verify.py WRITE_LOG DUMP_LOG
      WRITE_LOG: the whole console log of the boot that was cut (W/A/F lines of powercut.py write), including
                 what the guest printed after the marker until QEMU died: a block may hold a write issued then.
                 (A line cut short by the kill parses as nothing, or as a lower number than the real one, which
                 only makes the check stricter.)
      DUMP_LOG:  the console of the next boot (B/T lines of powercut.py dump).
Every block must hold its last promised write (a FUA write acknowledged, or a write acknowledged before a
FLUSH that returned) or a write submitted after it; with no promise, zeros or any write submitted to it. When the
read-back has the server's dirty bitmap ("BITMAP b", "D block" lines), every block with a promised write, and every
block holding one of the load's writes (it reached the image), must be dirty in it.
Prints RESULT lines and one "lost ..." line per violation; exits 1 on any.
"""
import re
import sys


def main(write_log, dump_log):
    writes = {}      # seq -> (block, fua)
    acked = set()
    flushed_upto = 0  # every write acknowledged with seq <= this is promised (flushes are sequential)
    flushes = 0
    line_re = re.compile(r"(?:^|\s)([WAF]) (\d+)(?: (\d+) ([01]))?\s*$")
    with open(write_log, errors="replace") as f:
        for line in f:
            m = line_re.search(line.rstrip("\r\n"))
            if not m:
                continue
            kind, seq = m.group(1), int(m.group(2))
            if kind == "W" and m.group(3) is not None:
                writes[seq] = (int(m.group(3)), m.group(4) == "1")
            elif kind == "A":
                acked.add(seq)
            elif kind == "F":
                flushed_upto = max(flushed_upto, seq)
                flushes += 1
    promised = {s for s in acked if writes.get(s, (0, False))[1] or s <= flushed_upto}
    by_block = {}
    for seq in sorted(writes):
        by_block.setdefault(writes[seq][0], []).append(seq)
    got = {}
    torn = []
    bitmap = False
    dirty = set()
    with open(dump_log, errors="replace") as f:
        for line in f:
            if re.search(r"(?:^|\s)BITMAP b\s*$", line):
                bitmap = True
                continue
            m = re.search(r"(?:^|\s)D (\d+)\s*$", line)
            if m:
                dirty.add(int(m.group(1)))
                continue
            m = re.search(r"(?:^|\s)B (\d+) (-?\d+)\s*$", line)
            if m:
                got[int(m.group(1))] = int(m.group(2))
                continue
            m = re.search(r"(?:^|\s)T (\d+)\s*$", line)
            if m:
                torn.append(int(m.group(1)))
    bad = []
    for block in torn:
        bad.append(f"lost: block {block} is torn or holds foreign data")
    checked = 0
    for block, seqs in by_block.items():
        if block in torn:
            continue
        if block not in got:
            bad.append(f"lost: block {block} missing from the read-back")
            continue
        prom = [s for s in seqs if s in promised]
        last = max(prom) if prom else None
        allowed = {s for s in seqs if last is None or s >= last} | ({-1} if last is None else set())
        checked += 1
        if got[block] not in allowed:
            bad.append(f"lost: block {block} reads write {got[block]}, but write {last} to it was acknowledged as"
                       f" durable ({'FUA' if writes[last][1] else 'flushed'}); allowed {sorted(allowed)}")
    bitmap_checked = 0
    if bitmap:
        for block, seqs in sorted(by_block.items()):
            prom = [s for s in seqs if s in promised]
            landed = got.get(block, -1) != -1 or block in torn
            if not prom and not landed:
                continue
            bitmap_checked += 1
            if block not in dirty:
                why = (f"write {max(prom)} to it was acknowledged as durable" if prom
                       else f"it holds {'torn data' if block in torn else 'write ' + str(got[block])}")
                bad.append(f"lost: block {block} is clean in dirty bitmap b, but {why}")
        untouched = [b for b, s in got.items() if b not in by_block and s != -1]
    for b in untouched:
        bad.append(f"lost: block {b} was never written but reads write {got[b]}")
    print(f"RESULT submitted={len(writes)}")
    print(f"RESULT acknowledged={len(acked)}")
    print(f"RESULT promised={len(promised)}")
    print(f"RESULT flushes={flushes}")
    print(f"RESULT blocks_checked={checked}")
    print(f"RESULT bitmap_checked={bitmap_checked if bitmap else 'no-bitmap'}")
    print(f"RESULT lost={len(bad)}")
    for b in bad[:20]:
        print(b)
    return 1 if bad or not promised else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
