#!/usr/bin/python3
"""FUA writes and their read-back, for the power-loss part of the pmem scenarios.

  fua.py write URI [MARKER]
                     writes a fixed pattern with NBD_CMD_FLAG_FUA (small and large writes, so both
                     copy routes of pmemblk see FUA); every write has been acknowledged when it prints
                     "RESULT fua_written=N". With MARKER it then prints MARKER and waits with the
                     connection still open (no flush, no disconnect) for the power to be cut.
  fua.py verify URI  reads the same ranges back: "RESULT fua_verified=N" when all match

The pattern is a pure function of the index: nothing has to survive the power cut but the data.
"""
import sys
import time

import nbd

MIB = 1 << 20
BASE = 200 * MIB  # above the region fio uses


def writes():
    # (offset, length, fill byte): 4 KiB writes, then 1 MiB writes (above route.dma.min-bytes)
    for i in range(16):
        yield BASE + i * 8192, 4096, 0xA0 + i
    for i in range(8):
        yield BASE + 4 * MIB + i * MIB, MIB, 0xC0 + i


def main():
    mode, uri = sys.argv[1], sys.argv[2]
    h = nbd.NBD()
    h.connect_uri(uri)
    if mode == "write":
        if not h.can_fua():
            print("server does not advertise FUA")
            sys.exit(1)
        n = 0
        for off, length, fill in writes():
            h.pwrite(bytes([fill]) * length, off, nbd.CMD_FLAG_FUA)
            n += 1
        print(f"RESULT fua_written={n}", flush=True)
        if len(sys.argv) > 3:
            print(sys.argv[3], flush=True)
            time.sleep(600)
    elif mode == "verify":
        n = bad = 0
        for off, length, fill in writes():
            got = h.pread(length, off)
            if got != bytes([fill]) * length:
                first = next(i for i in range(length) if got[i] != fill)
                print(f"mismatch at offset {off + first}: 0x{got[first]:02x}, want 0x{fill:02x}")
                bad += 1
            else:
                n += 1
        print(f"RESULT fua_verified={n}")
        print(f"RESULT fua_bad={bad}")
        h.shutdown()
        sys.exit(1 if bad else 0)
    else:
        sys.exit("usage: fua.py write|verify URI")


if __name__ == "__main__":
    main()
