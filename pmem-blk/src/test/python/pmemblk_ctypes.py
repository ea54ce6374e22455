# libpmemblk (PMDK 1.12, Debian's libpmemblk1) through ctypes, for the BTT tests: the independent implementation
# that reads what pmemblk's BTT wrote and writes what it must serve.
#   pmemblk_ctypes.py write FILE BSIZE lba:version...  writes pattern(lba, version), or zeroes the block
#                                                      (pmemblk_set_zero) for version 0
#   pmemblk_ctypes.py read FILE BSIZE lba:version...   compares each block with it, prints "block N ok"
#   pmemblk_ctypes.py dump FILE BSIZE OUT              every block in order (pmemblk_read) into OUT
# The first line is "nblock N" (pmemblk_nblock). Exit 2: the pool does not open; 3: an operation failed;
# 4: a block differs.
import ctypes, sys
lib = ctypes.CDLL("libpmemblk.so.1")
lib.pmemblk_open.restype = ctypes.c_void_p
lib.pmemblk_open.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.pmemblk_nblock.restype = ctypes.c_size_t
lib.pmemblk_nblock.argtypes = [ctypes.c_void_p]
lib.pmemblk_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
lib.pmemblk_write.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
lib.pmemblk_set_zero.argtypes = [ctypes.c_void_p, ctypes.c_longlong]
lib.pmemblk_close.argtypes = [ctypes.c_void_p]
lib.pmemblk_errormsg.restype = ctypes.c_char_p
mode, path, bsize = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
def pat(lba, v):
    return bytes(((lba * 131 + v * 7 + i * 3) ^ (i >> 8)) & 0xFF for i in range(bsize))
p = lib.pmemblk_open(path, bsize)
if not p:
    print("pmemblk_open failed:", lib.pmemblk_errormsg().decode())
    sys.exit(2)
n = lib.pmemblk_nblock(p)
print("nblock", n)
buf = ctypes.create_string_buffer(bsize)
rc = 0
if mode == "dump":
    with open(sys.argv[4], "wb") as f:
        for lba in range(n):
            if lib.pmemblk_read(p, buf, lba) != 0:
                print("pmemblk_read of block", lba, "failed:", lib.pmemblk_errormsg().decode())
                rc = 3
                break
            f.write(buf.raw)
for spec in sys.argv[4:] if mode != "dump" else []:
    lba, v = map(int, spec.split(":"))
    if mode == "write":
        if v == 0:
            r = lib.pmemblk_set_zero(p, lba)
        else:
            r = lib.pmemblk_write(p, ctypes.create_string_buffer(pat(lba, v), bsize), lba)
        if r != 0:
            print("pmemblk write of block", lba, "failed:", lib.pmemblk_errormsg().decode())
            rc = 3
    else:
        if lib.pmemblk_read(p, buf, lba) != 0:
            print("pmemblk_read of block", lba, "failed:", lib.pmemblk_errormsg().decode())
            rc = 3
            continue
        want = bytes(bsize) if v == 0 else pat(lba, v)
        ok = buf.raw == want
        print("block", lba, "ok" if ok else "MISMATCH")
        if not ok:
            rc = 4
lib.pmemblk_close(p)
sys.exit(rc)
