#!/usr/bin/python3
# ublk-ctl.py stop|del ID: what another process (ublksrv's `ublk del -n ID`) does to a device pmemblk serves, through
# /dev/ublk-control on a hand-driven io_uring (no liburing, no ublksrv in the guest). `stop` sends STOP_DEV; `del`
# sends STOP_DEV then DEL_DEV in its waiting form, which returns only once the server has closed /dev/ublkcID.
# Prints each command's result; exits 0 when every command answered 0 (or -ENODEV for STOP_DEV of a device already
# stopped). Run as root in the guest; bound it with `timeout`: a DEL_DEV whose server never lets go waits for ever.
# Opcodes and the SQE layout: ublk/src/main/java/io/pmemblk/ublk/UblkAbi.java (from include/uapi/linux/ublk_cmd.h).
import ctypes, errno, mmap, os, struct, sys

UBLK_U_CMD_STOP_DEV, UBLK_U_CMD_DEL_DEV = 0xC0207507, 0xC0207505
IORING_OP_URING_CMD, IORING_SETUP_SQE128 = 46, 1 << 10
NR_SETUP, NR_ENTER = 425, 426

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def syscall(n, *args):
    r = libc.syscall(ctypes.c_long(n), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("stop", "del"):
        sys.exit("usage: ublk-ctl.py stop|del ID")
    dev_id = int(sys.argv[2])
    p = ctypes.create_string_buffer(120)
    struct.pack_into('I', p, 8, IORING_SETUP_SQE128)
    fd = syscall(NR_SETUP, 4, p)
    sq_entries, cq_entries = struct.unpack_from('2I', p, 0)
    sq = struct.unpack_from('7I', p, 40)   # head tail ring_mask ring_entries flags dropped array
    cq = struct.unpack_from('6I', p, 80)   # head tail ring_mask ring_entries overflow cqes
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | mmap.MAP_POPULATE
    sqr = mmap.mmap(fd, sq[6] + sq_entries * 4, flags, prot, offset=0)
    cqr = mmap.mmap(fd, cq[5] + cq_entries * 16, flags, prot, offset=0x8000000)
    sqes = mmap.mmap(fd, sq_entries * 128, flags, prot, offset=0x10000000)
    ctrl = os.open('/dev/ublk-control', os.O_RDWR)

    def u32(m, o):
        return struct.unpack_from('I', m, o)[0]

    def cmd(op):
        tail = u32(sqr, sq[1])
        idx = tail & u32(sqr, sq[2])
        e = bytearray(128)
        struct.pack_into('BBHi', e, 0, IORING_OP_URING_CMD, 0, 0, ctrl)
        struct.pack_into('I', e, 8, op)                   # cmd_op
        struct.pack_into('Q', e, 32, 1)                   # user_data
        struct.pack_into('IHHQQHHI', e, 48, dev_id, 0xFFFF, 0, 0, 0, 0, 0, 0)  # ublksrv_ctrl_cmd
        sqes[idx * 128:(idx + 1) * 128] = bytes(e)
        struct.pack_into('I', sqr, sq[6] + 4 * idx, idx)
        struct.pack_into('I', sqr, sq[1], tail + 1)       # x86: stores are not reordered with stores
        syscall(NR_ENTER, fd, 1, 1, 1, 0, 0)              # submit 1, wait for 1
        head = u32(cqr, cq[0])
        _, res, _ = struct.unpack_from('QiI', cqr, cq[5] + 16 * (head & u32(cqr, cq[2])))
        struct.pack_into('I', cqr, cq[0], head + 1)
        return res

    ok = True
    res = cmd(UBLK_U_CMD_STOP_DEV)
    print(f"STOP_DEV {dev_id}: {res}", flush=True)
    ok &= res == 0 or res == -errno.ENODEV
    if sys.argv[1] == "del":
        res = cmd(UBLK_U_CMD_DEL_DEV)
        print(f"DEL_DEV {dev_id}: {res}", flush=True)
        ok &= res == 0
    sys.exit(0 if ok else 1)


main()
