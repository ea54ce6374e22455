package io.pmemblk.ublk;

import java.lang.foreign.MemorySegment;

import static io.pmemblk.ublk.UblkAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * What the ublk device tells the kernel's block layer about itself ({@code struct ublk_params}: basic + discard).
 * It advertises the truth: a volatile write cache with FUA, because stores into a page-cache file (and, on real
 * pmem, in the CPU caches) are not durable until flushed, so the kernel must send FLUSH and FUA; discard and
 * write-zeroes, which the driver executes by zeroing the range.
 *
 * @param sizeBytes      device size (a multiple of {@code logicalBlock})
 * @param logicalBlock   512 or 4096
 * @param maxIoBytes     largest READ/WRITE the kernel sends (it splits bigger ones)
 * @param maxDiscardBytes largest DISCARD/WRITE_ZEROES the kernel sends
 */
public record DeviceParams(long sizeBytes, int logicalBlock, int maxIoBytes, int maxDiscardBytes) {
    /** Physical block and minimum I/O: a page, the unit the pmem driver persists and the kernel caches. */
    static final int PHYSICAL_BLOCK = 4096;

    public DeviceParams {
        if (logicalBlock != 512 && logicalBlock != 4096) {
            throw new IllegalArgumentException("logical block size " + logicalBlock + ": 512 or 4096");
        }
        if (sizeBytes <= 0 || sizeBytes % PHYSICAL_BLOCK != 0) {
            throw new IllegalArgumentException("device size " + sizeBytes + " is not a positive multiple of " + PHYSICAL_BLOCK);
        }
        if (maxIoBytes < PHYSICAL_BLOCK || maxIoBytes % PHYSICAL_BLOCK != 0 || maxIoBytes > USER_COPY_MAX_BYTES) {
            throw new IllegalArgumentException("max I/O " + maxIoBytes + " bytes: a multiple of 4096 up to "
                    + USER_COPY_MAX_BYTES + " (the user-copy offset has 25 bits)");
        }
    }

    void write(MemorySegment p) {
        p.fill((byte) 0);
        p.set(JAVA_INT, PARAMS_LEN, PARAMS_SIZE);
        p.set(JAVA_INT, PARAMS_TYPES, UBLK_PARAM_TYPE_BASIC | UBLK_PARAM_TYPE_DISCARD);
        p.set(JAVA_INT, BASIC_ATTRS, UBLK_ATTR_VOLATILE_CACHE | UBLK_ATTR_FUA);
        p.set(JAVA_BYTE, BASIC_LOGICAL_BS_SHIFT, (byte) Integer.numberOfTrailingZeros(logicalBlock));
        p.set(JAVA_BYTE, BASIC_PHYSICAL_BS_SHIFT, (byte) Integer.numberOfTrailingZeros(PHYSICAL_BLOCK));
        p.set(JAVA_BYTE, BASIC_IO_MIN_SHIFT, (byte) Integer.numberOfTrailingZeros(PHYSICAL_BLOCK));
        p.set(JAVA_BYTE, BASIC_IO_OPT_SHIFT, (byte) Integer.numberOfTrailingZeros(PHYSICAL_BLOCK));
        p.set(JAVA_INT, BASIC_MAX_SECTORS, maxIoBytes >>> 9);
        p.set(JAVA_LONG, BASIC_DEV_SECTORS, sizeBytes >>> 9);
        p.set(JAVA_INT, DISCARD_GRANULARITY, PHYSICAL_BLOCK);
        p.set(JAVA_INT, DISCARD_MAX_SECTORS, maxDiscardBytes >>> 9);
        p.set(JAVA_INT, DISCARD_MAX_WRITE_ZEROES_SECTORS, maxDiscardBytes >>> 9);
        p.set(JAVA_SHORT, DISCARD_MAX_SEGMENTS, (short) 1);
    }

    static DeviceParams read(MemorySegment p) {
        return new DeviceParams(p.get(JAVA_LONG, BASIC_DEV_SECTORS) << 9, 1 << p.get(JAVA_BYTE, BASIC_LOGICAL_BS_SHIFT),
                p.get(JAVA_INT, BASIC_MAX_SECTORS) << 9, p.get(JAVA_INT, DISCARD_MAX_SECTORS) << 9);
    }
}
