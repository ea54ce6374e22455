#!/usr/bin/python3
"""Numbered, patterned block writes for the power-cut scenario, and their read-back.

  powercut.py write URI FIRST BLOCKS MARKER_AT MAX MARKER SEED
      Zeroes the region durably, then writes up to MAX blocks of 4 KiB at random block numbers in
      [FIRST, FIRST+BLOCKS): about half with FUA, the
      others followed by a FLUSH at random points. Before each write it prints "W seq block fua"; after the
      server acknowledges it, "A seq"; after a FLUSH returns, "F seq" (every write acknowledged before the
      FLUSH was sent, i.e. up to seq, is promised). After MARKER_AT writes it prints MARKER (the host kills
      QEMU when it sees it) and goes on writing until the power goes.
  powercut.py plain URI FIRST BLOCKS COUNT SEED
      The restart case's first half: zeroes the region durably, then COUNT plain writes (no FUA, no FLUSH) at
      random blocks, printed as above ("W seq block 0", "A seq"); exits 0 with them acknowledged and promised
      nothing yet. The server is then killed (kill -9) and started again.
  powercut.py flush URI SEQ MARKER
      The second half, on the new server: one FLUSH, then "F SEQ" (it promises every write up to SEQ, which the
      killed server acknowledged) and MARKER, and waits for the power to go (nothing else may write back).
  powercut.py dump URI FIRST BLOCKS
      Reads every block of [FIRST, FIRST+BLOCKS) and prints "B block seq" (seq -1: never written, all zeros) or "T block" when the
      block is neither zeros nor one whole write (torn, or foreign data). When the server offers the dirty bitmap
      "b" (qemu:dirty-bitmap:b, 4 KiB granularity), also "BITMAP b" and "D block" for each block of the region it
      marks dirty.

With PMEMBLK_BITMAP_CTL set (the server's bitmap control socket), write and plain checkpoint bitmap "b" once the
region is zeroed and drop the frozen half: b then holds this load's writes alone.

A block's content is a pure function of (block, seq): a 16-byte header (magic, block, seq) and a body of
8-byte words derived from both, so a block read back names the write it came from.
"""
import os
import random
import struct
import sys
import time

import nbd

import bitmapctl

BS = 4096
MAGIC = 0x70636B54  # "pckT"
BITMAP = "qemu:dirty-bitmap:b"


def content(block, seq):
    head = struct.pack("<IIQ", MAGIC, block, seq)
    word = (seq * 0x9E3779B97F4A7C15 + block * 0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF
    return head + struct.pack("<Q", word) * ((BS - len(head)) // 8)


def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    if not (h.can_fua() and h.can_flush()):
        print("server does not advertise FUA and FLUSH", flush=True)
        sys.exit(1)
    return h


def zero_region(h, first, blocks):
    """The region may hold an earlier cut's blocks (long runs reuse regions): it is zeroed durably first, so that
    every block read back after this cut is zeros or one of this load's writes."""
    if h.can_zero():
        h.zero(blocks * BS, first * BS)
    else:
        for b in range(first, first + blocks):
            h.pwrite(bytes(BS), b * BS)
    h.flush()
    checkpoint()


def checkpoint():
    """The load's boundary in bitmap b: its writes until now (the zeroing) go to the frozen half, dropped."""
    ctl = os.environ.get("PMEMBLK_BITMAP_CTL")
    if ctl:
        frozen = bitmapctl.request(ctl, "checkpoint b").strip()
        bitmapctl.request(ctl, "remove " + frozen)
        print(f"bitmap b checkpointed ({frozen} dropped)", flush=True)


def dirty_blocks(h, first, blocks):
    """The blocks of [first, first+blocks) that bitmap b marks dirty (its granularity is one block)."""
    dirty = []
    pos, end = first * BS, (first + blocks) * BS
    while pos < end:
        seen = []

        def extents(context, offset, entries, err):
            if context == BITMAP:
                for i in range(0, len(entries), 2):
                    seen.append((offset, entries[i], entries[i + 1]))
                    offset += entries[i]
            return 0

        h.block_status(end - pos, pos, extents)
        if not seen:
            raise SystemExit(f"powercut: block status of {BITMAP} described nothing at {pos}")
        for offset, length, flags in seen:
            if flags & 1:
                dirty.extend(range(offset // BS, min(offset + length, end) // BS))
        pos = seen[-1][0] + seen[-1][1]
    return dirty


def write(uri, first, blocks, marker_at, maximum, marker, seed):
    rnd = random.Random(seed)
    h = connect(uri)
    zero_region(h, first, blocks)
    seq = 0
    while seq < maximum:
        seq += 1
        block = first + rnd.randrange(blocks)
        fua = rnd.random() < 0.5
        print(f"W {seq} {block} {int(fua)}", flush=True)
        h.pwrite(content(block, seq), block * BS, nbd.CMD_FLAG_FUA if fua else 0)
        print(f"A {seq}", flush=True)
        if rnd.random() < 0.15:
            h.flush()
            print(f"F {seq}", flush=True)
        if seq == marker_at:
            print(marker, flush=True)
    print("powercut: wrote every block and the power is still on", flush=True)
    sys.exit(1)


def plain(uri, first, blocks, count, seed):
    rnd = random.Random(seed)
    h = connect(uri)
    zero_region(h, first, blocks)
    for seq in range(1, count + 1):
        block = first + rnd.randrange(blocks)
        print(f"W {seq} {block} 0", flush=True)
        h.pwrite(content(block, seq), block * BS)
        print(f"A {seq}", flush=True)
    h.shutdown()


def flush(uri, seq, marker):
    h = connect(uri)
    h.flush()
    print(f"F {seq}", flush=True)
    print(marker, flush=True)
    time.sleep(600)
    print("powercut: the power is still on 600 s after the FLUSH", flush=True)
    sys.exit(1)


def dump(uri, first, blocks):
    h = nbd.NBD()
    h.add_meta_context(BITMAP)
    h.connect_uri(uri)
    zeros = bytes(BS)
    for block in range(first, first + blocks):
        got = h.pread(BS, block * BS)
        if got == zeros:
            print(f"B {block} -1")
            continue
        magic, b, seq = struct.unpack_from("<IIQ", got)
        if magic == MAGIC and b == block and got == content(block, seq):
            print(f"B {block} {seq}")
        else:
            print(f"T {block}")
    if h.can_meta_context(BITMAP):
        print("BITMAP b")
        for block in dirty_blocks(h, first, blocks):
            print(f"D {block}")
    h.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7],
              int(sys.argv[8]))
    elif sys.argv[1] == "plain":
        plain(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "flush":
        flush(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "dump":
        dump(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        print(__doc__)
        sys.exit(2)
