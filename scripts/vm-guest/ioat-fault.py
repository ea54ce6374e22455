#!/usr/bin/python3
"""A misbehaving I/OAT driver in guest userspace, against the device at ADDR (argv[1]), with no kernel driver bound.

Run by ioat-raid5-check.sh (phase "fault") after ioatdma was removed. The guest kernel has no IOMMU here and vfio-pci
has no no-IOMMU mode (CONFIG_VFIO_NOIOMMU is not set in Debian's kernel), so this driver reaches the device the way
a root process can without one: BAR0 through /sys/bus/pci/devices/ADDR/resource0, bus mastering through the config
file, and DMA memory in 2 MiB huge pages whose guest-physical addresses come from /proc/self/pagemap (guest-physical
is the IOVA the device sees: QEMU maps guest RAM for it as it is). What a hostile driver sends, and what the hardware
answers (the device halts the channel with a CHANERR bit) is asserted for each case:
  good        a 64 KiB copy: done, the bytes match (the driver itself is right, so the faults below mean something)
  src-out     a source far outside guest RAM (1 TiB): halted, CHANERR set, the destination's canary untouched
  src-span    a source that starts in guest RAM and runs past its end: halted, nothing of it copied (canary)
  dst-out     a destination outside guest RAM: halted, CHANERR set
  ring-out    CHAINADDR outside guest RAM: halted, CHANERR set
  ring-mmio   CHAINADDR at the device's own BAR0 (an address that is not memory): halted, CHANERR set
  cmp-out     a completion address outside guest RAM: halted, CHANERR set
  reset       RESET once a chain of 256 x 1 MiB copies runs (a descriptor completed): CHANCMD reads back 0, the
              channel HALTED with no error at a descriptor before the last, and the next copy works
  good-again  a 64 KiB copy after all of the above: the device still serves this driver
Registers: drivers/dma/ioat/registers.h and hw.h (the project's io.pmemblk.dma.ioat.IoatSpec writes the same).
Output: one line per case, then "RESULT fault_NAME=..." lines and "RESULT fault=pass" or "RESULT fault_why=...".
"""
import ctypes
import mmap
import os
import struct
import sys
import time

ADDR = sys.argv[1]
DEV = f'/sys/bus/pci/devices/{ADDR}'
PAGE = 4096
HUGE = 2 << 20
MAP_HUGETLB = 0x40000

# BAR0: channel 0's registers at 0x80 (registers.h IOAT_CHAN*_OFFSET, channel base 0x80 * (n + 1)).
CH = 0x80
CHANCTRL, CHANCMD, DMACOUNT, CHANSTS, CHAINADDR, CHANCMP, CHANERR = (CH + 0x00, CH + 0x04, CH + 0x06, CH + 0x08,
                                                                     CH + 0x10, CH + 0x18, CH + 0x28)
CMD_RESET = 0x20
CTRL_ERR_COMPLETION_EN, CTRL_ANY_ERR_ABORT_EN = 0x04, 0x08
STATE = {0: 'ACTIVE', 1: 'IDLE', 2: 'SUSPENDED', 3: 'HALTED', 4: 'ARMED'}
IDLE, HALTED = 1, 3
# Descriptor (hw.h struct ioat_dma_descriptor, 64 bytes): size u32, ctl u32, src u64, dst u64, next u64, 4 x u64.
DESC = struct.Struct('<IIQQQ32x')
CTL_COMPL_WRITE = 1 << 3
ERR_NAMES = ['SRC_ADDR', 'DEST_ADDR', 'NEXT_ADDR', 'NEXT_DESC_ALIGN', 'CHAIN_ADDR_VALUE', 'CHANCMD', 'CHIPSET_UNCOR',
             'DMA_UNCOR', 'READ_DATA', 'WRITE_DATA', 'CONTROL', 'LENGTH', 'COMPLETION_ADDR', 'INT_CONFIG', 'SOFT',
             'UNAFFILIATED']
OUTSIDE = 1 << 40        # 1 TiB: no guest RAM and nothing QEMU maps for the device


def die(why):
    print(f'RESULT fault_why={why}')
    print(f'ioat-fault: FAIL: {why}')
    sys.exit(1)


def errnames(v):
    return '|'.join(n for i, n in enumerate(ERR_NAMES) if v >> i & 1) or '0'


# --- the device: bus mastering on, BAR0 mapped ------------------------------------------------------------------
cfg = os.open(f'{DEV}/config', os.O_RDWR)
cmd = struct.unpack('<H', os.pread(cfg, 2, 4))[0]
os.pwrite(cfg, struct.pack('<H', cmd | 0x6), 4)          # memory space + bus master
bar_phys = int(open(f'{DEV}/resource').readline().split()[0], 16)
fd = os.open(f'{DEV}/resource0', os.O_RDWR | os.O_SYNC)
bar = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def r8(o): return ctypes.c_uint8.from_buffer(bar, o).value
def r32(o): return ctypes.c_uint32.from_buffer(bar, o).value
def w8(o, v): ctypes.c_uint8.from_buffer(bar, o).value = v
def w16(o, v): ctypes.c_uint16.from_buffer(bar, o).value = v
def w32(o, v): ctypes.c_uint32.from_buffer(bar, o).value = v
# 64-bit registers as two 32-bit accesses, low half first, as ioatdma does (ioat_set_chainaddr, ioat_chansts_32).
def r64(o): lo = r32(o); return lo | r32(o + 4) << 32
def w64(o, v): w32(o, v & 0xffffffff); w32(o + 4, v >> 32)


# --- DMA memory: huge pages (physically contiguous), their guest-physical addresses from pagemap -----------------
libc = ctypes.CDLL(None, use_errno=True)


def dma_buffer():
    m = mmap.mmap(-1, HUGE, mmap.MAP_SHARED | MAP_HUGETLB, mmap.PROT_READ | mmap.PROT_WRITE)
    m[:] = b'\0' * HUGE
    va = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if libc.mlock(ctypes.c_void_p(va), ctypes.c_size_t(HUGE)) != 0:
        die(f'mlock of a huge page failed: {os.strerror(ctypes.get_errno())}')
    with open('/proc/self/pagemap', 'rb') as pm:
        pm.seek(va // PAGE * 8)
        ents = struct.unpack(f'<{HUGE // PAGE}Q', pm.read(HUGE // PAGE * 8))
    pfns = [e & ((1 << 55) - 1) for e in ents]
    if not all(e >> 63 for e in ents) or pfns != list(range(pfns[0], pfns[0] + len(pfns))) or pfns[0] == 0:
        die('a huge page is not present and contiguous in /proc/self/pagemap (root needed for the frame numbers)')
    return m, pfns[0] * PAGE


try:
    A, PA = dma_buffer()     # descriptors at 0, completion word at 0x1000, src at 0x10000, dst at 0x40000
    B, PB = dma_buffer()     # the reset case's 1 MiB destination
except OSError as e:
    die(f'no huge page for DMA memory ({e}): echo N > /proc/sys/vm/nr_hugepages first')
RING, CMPW, SRC, DST = 0, 0x1000, 0x10000, 0x40000
# The top of guest RAM as QEMU maps it for the device: the firmware's memory map (/sys/firmware/memmap, e820), from
# the highest "System RAM" range on through the ranges that follow it without a gap (QEMU reserves the last 128 KiB
# of RAM for ACPI: reserved, but RAM all the same).
def ram_end():
    ranges = []
    for d in os.listdir('/sys/firmware/memmap'):
        base = f'/sys/firmware/memmap/{d}'
        ranges.append((int(open(f'{base}/start').read(), 16), int(open(f'{base}/end').read(), 16) + 1,
                       open(f'{base}/type').read().strip()))
    end = max(e for s, e, t in ranges if t == 'System RAM' and s < 1 << 32)
    while any(s == end for s, e, t in ranges):
        end = next(e for s, e, t in ranges if s == end)
    return end


RAM_END = ram_end()


def put_desc(i, size, src, dst, nxt, ctl=CTL_COMPL_WRITE):
    A[RING + i * 64:RING + i * 64 + 64] = DESC.pack(size, ctl, src, dst, nxt)


def wait(pred, secs=5.0):
    end = time.monotonic() + secs
    while not pred():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def reset_channel():
    w8(CHANCMD, CMD_RESET)
    if not wait(lambda: r8(CHANCMD) & CMD_RESET == 0):
        die('CHANCMD still shows RESET after 5 s')
    err = r32(CHANERR)
    if err:
        w32(CHANERR, err)    # write-1-to-clear
    if r32(CHANERR):
        die(f'CHANERR {r32(CHANERR):#x} after writing its bits back')


def run(descs, chain=None, cmp=None, secs=5.0):
    """Start the channel on descriptor 0 (or CHAINADDR=chain) with `descs` made available; wait until it stops."""
    reset_channel()
    A[CMPW:CMPW + 8] = b'\0' * 8
    w16(CHANCTRL, CTRL_ERR_COMPLETION_EN | CTRL_ANY_ERR_ABORT_EN)
    w64(CHANCMP, PA + CMPW if cmp is None else cmp)
    w64(CHAINADDR, PA + RING if chain is None else chain)
    w16(DMACOUNT, descs)
    last = PA + RING + (descs - 1) * 64
    done = wait(lambda: (lambda s: s & 7 == HALTED or (s & 7 == IDLE and s & ~0x3f == last))(r64(CHANSTS)), secs)
    sts, err = r64(CHANSTS), r32(CHANERR)
    return done, sts, err


results = {}


def report(name, sts, err, note=''):
    line = f'CHANSTS={sts:#x} ({STATE.get(sts & 7, sts & 7)}) CHANERR={err:#x} ({errnames(err)}){note}'
    print(f'ioat-fault: {name}: {line}')
    results[name] = f'{err:#x}'
    print(f'RESULT fault_{name}={STATE.get(sts & 7, sts & 7)},chanerr={err:#x}')


def expect_halt(name, done, sts, err, note=''):
    report(name, sts, err, note)
    if not done or sts & 7 != HALTED or err == 0:
        die(f'{name}: the channel did not halt with a CHANERR bit (CHANSTS {sts:#x}, CHANERR {err:#x})')


def good(name):
    pat = os.urandom(0x10000)
    A[SRC:SRC + 0x10000] = pat
    A[DST:DST + 0x10000] = b'\0' * 0x10000
    put_desc(0, 0x10000, PA + SRC, PA + DST, PA + RING)
    done, sts, err = run(1)
    report(name, sts, err)
    if not done or sts & 7 != IDLE or err:
        die(f'{name}: a plain 64 KiB copy did not complete (CHANSTS {sts:#x}, CHANERR {err:#x})')
    if A[DST:DST + 0x10000] != pat:
        die(f'{name}: the 64 KiB copy completed but the destination differs from the source')
    if struct.unpack('<Q', A[CMPW:CMPW + 8])[0] & ~0x3f != PA + RING:
        die(f'{name}: the completion word does not name the descriptor')


def canary(off, n=0x10000):
    c = bytes([0xa5]) * n
    A[off:off + n] = c
    return lambda: A[off:off + n] == c


print(f'ioat-fault: device {ADDR}, BAR0 at {bar_phys:#x}, CHANCNT {r8(0)}, XFERCAP 2^{r8(1)}, CBVER {r8(8):#x}; '
      f'DMA memory at {PA:#x} and {PB:#x}; guest RAM ends at {RAM_END:#x}')
good('good')

intact = canary(DST)
put_desc(0, 0x1000, OUTSIDE, PA + DST, PA + RING)
done, sts, err = run(1)
expect_halt('src-out', done, sts, err)
if not intact():
    die('src-out: the destination was written although the source is outside guest RAM')

intact = canary(DST)
put_desc(0, 0x1000, RAM_END - 0x800, PA + DST, PA + RING)
done, sts, err = run(1)
expect_halt('src-span', done, sts, err, f' (source [{RAM_END - 0x800:#x}, {RAM_END + 0x800:#x}))')
if not intact():
    die('src-span: part of a source that runs past guest RAM was copied (canary overwritten)')

A[SRC:SRC + 0x1000] = os.urandom(0x1000)
put_desc(0, 0x1000, PA + SRC, OUTSIDE, PA + RING)
expect_halt('dst-out', *run(1))

expect_halt('ring-out', *run(1, chain=OUTSIDE))
expect_halt('ring-mmio', *run(1, chain=bar_phys))

put_desc(0, 0x1000, PA + SRC, PA + DST, PA + RING)
done, sts, err = run(1, cmp=OUTSIDE)
expect_halt('cmp-out', done, sts, err)

# RESET while a chain runs: 256 copies of 1 MiB (the largest XFERCAP a v3 part has is 2^20), ring of 256 descriptors.
xfer = min(1 << r8(1), 1 << 20)
for i in range(256):
    put_desc(i, xfer, PA + HUGE // 2, PB, PA + RING + ((i + 1) % 256) * 64, ctl=0)
reset_channel()
w16(CHANCTRL, CTRL_ERR_COMPLETION_EN | CTRL_ANY_ERR_ABORT_EN)
w64(CHANCMP, PA + CMPW)
w64(CHAINADDR, PA + RING)
w16(DMACOUNT, 256)
# RESET only once the chain runs (a descriptor completed), so it lands mid-chain, not before the first fetch.
if not wait(lambda: r64(CHANSTS) & ~0x3f != 0 or r64(CHANSTS) & 7 == HALTED):
    die(f'reset: the chain did not start within 5 s (CHANSTS {r64(CHANSTS):#x}, CHANERR {r32(CHANERR):#x})')
t0 = time.monotonic()
w8(CHANCMD, CMD_RESET)
if not wait(lambda: r8(CHANCMD) & CMD_RESET == 0):
    die('reset: CHANCMD still shows RESET 5 s after a RESET under load')
sts, err = r64(CHANSTS), r32(CHANERR)
at = (sts & ~0x3f) - (PA + RING)
report('reset', sts, err, f', {(time.monotonic() - t0) * 1000:.1f} ms after the RESET; last completed descriptor '
       + (f'#{at // 64 + 1} of 256' if 0 <= at < 256 * 64 else 'none'))
if sts & 7 != HALTED or err:
    die(f'reset: the channel is {STATE.get(sts & 7, sts & 7)} with CHANERR {err:#x} after RESET; the model says HALTED, no error')
if not 0 <= at < 255 * 64:
    die('reset: the chain of 256 had finished before the RESET arrived: nothing was interrupted')

good('good-again')
print('RESULT fault=pass')
