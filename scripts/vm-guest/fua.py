#!/usr/bin/python3
"""FUA writes and their read-back, for the power-loss part of the pmem scenarios.

  fua.py write [--marker MARKER] [NAME=]URI...
                     through every URI's server, interleaved: a fixed pattern written with NBD_CMD_FLAG_FUA (small
                     and large writes, so both copy routes of pmemblk see FUA); every write to a server has been
                     acknowledged when it prints "RESULT [NAME.]fua_written=N". A server that fails gets
                     "RESULT [NAME.]why=..." and the others go on. With MARKER, when at least one took all its
                     writes, it prints MARKER right after the last and waits with every connection still open (no
                     flush, no disconnect) for the power to be cut.
  fua.py verify [NAME=]URI
                     reads the same ranges back: "RESULT [NAME.]fua_verified=N" when all match
Exit status: 0 when every server took (or read back) every write.

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


def target(arg):
    """NAME=URI -> ("NAME.", URI); URI -> ("", URI) (an NBD URI has no '=' before its '://')."""
    name, sep, uri = arg.partition("=")
    if sep and "://" not in name:
        return name + ".", uri
    return "", arg


def write_all(args):
    marker = None
    if args[:1] == ["--marker"]:
        marker, args = args[1], args[2:]
    if not args:
        sys.exit("fua.py write: no URI")
    # Every server's writes interleaved, write i to each in turn: each server's last acknowledged write is then
    # as close to the power cut as when a guest wrote to only one (a server that acknowledged before its data
    # reached the mapping has no time to catch up), and every connection stays open until the cut.
    live = {}  # prefix -> handle, in the order given
    for prefix, uri in map(target, args):
        try:
            h = nbd.NBD()
            h.connect_uri(uri)
            if not h.can_fua():
                print(f"RESULT {prefix}why=server does not advertise FUA", flush=True)
                continue
            live[prefix] = h
        except nbd.Error as e:
            print(f"RESULT {prefix}why=cannot connect to {uri}: {e}", flush=True)
    for off, length, fill in writes():
        for prefix, h in list(live.items()):
            try:
                h.pwrite(bytes([fill]) * length, off, nbd.CMD_FLAG_FUA)
            except nbd.Error as e:
                print(f"RESULT {prefix}why=FUA write of {length} bytes at {off} failed: {e}", flush=True)
                del live[prefix]
    n = sum(1 for _ in writes())
    for prefix in live:
        print(f"RESULT {prefix}fua_written={n}", flush=True)
    if marker is not None and live:
        print(marker, flush=True)
        time.sleep(600)
    sys.exit(0 if len(live) == len(args) else 1)


def verify(arg):
    prefix, uri = target(arg)
    h = nbd.NBD()
    h.connect_uri(uri)
    n = bad = 0
    for off, length, fill in writes():
        got = h.pread(length, off)
        if got != bytes([fill]) * length:
            first = next(i for i in range(length) if got[i] != fill)
            print(f"mismatch at offset {off + first}: 0x{got[first]:02x}, want 0x{fill:02x}")
            bad += 1
        else:
            n += 1
    print(f"RESULT {prefix}fua_verified={n}")
    print(f"RESULT {prefix}fua_bad={bad}")
    h.shutdown()
    sys.exit(1 if bad else 0)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "write":
        write_all(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "verify":
        verify(sys.argv[2])
    else:
        sys.exit("usage: fua.py write [--marker MARKER] [NAME=]URI... | verify [NAME=]URI")


if __name__ == "__main__":
    main()
