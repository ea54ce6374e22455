package io.pmemblk.pmem.bitmap;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.zip.CRC32C;

/**
 * The first page of a bitmap file, pmemblk's own layout (no peer format is shared): what the bits are about, so a
 * file is never read against a device it was not made for. Little-endian, checked field by field at open.
 * <pre>
 *   0  u64 magic        "PMBLKBMP"
 *   8  u32 version      1
 *  12  u32 header size  4096 (the bits start there, page-aligned, so a bit's msync never rewrites the header)
 *  16  u64 device size  bytes of the device the bits cover
 *  24  u64 granularity  bytes per bit, a power of two
 *  32  u64 generation   1 for a new bitmap; its successor at a checkpoint has the next one
 *  40  u64 bits bytes   bytes of bits after the header (whole 8-byte words, one per 64 blocks)
 *  48  u32 checksum     CRC-32C of bytes 0..48
 * </pre>
 * Bit {@code j} of the word at {@code HEADER_BYTES + 8 * i} is block {@code 64 * i + j}, block {@code b} covering
 * bytes {@code [b * granularity, (b + 1) * granularity)} of the device.
 */
public record BitmapHeader(long deviceSize, long granularity, long generation) {
    static final long MAGIC = 0x504d424d424b4c50L; // "PMBLKBMP" read as a little-endian u64
    static final int VERSION = 1;
    public static final int HEADER_BYTES = 4096;
    private static final int CHECKED_BYTES = 48;
    private static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN);

    /** Smallest and largest granularity: a 512-byte sector; 1 GiB (a few bits even for a large device). */
    public static final long MIN_GRANULARITY = 512, MAX_GRANULARITY = 1L << 30;

    public BitmapHeader {
        checkGranularity(granularity);
        if (deviceSize <= 0 || generation < 1) {
            throw new IllegalArgumentException("device size " + deviceSize + ", generation " + generation
                    + "; allowed: both positive");
        }
    }

    /** Refuses a granularity that is not a power of two between {@link #MIN_GRANULARITY} and {@link #MAX_GRANULARITY}. */
    public static void checkGranularity(long granularity) {
        if (granularity < MIN_GRANULARITY || granularity > MAX_GRANULARITY || Long.bitCount(granularity) != 1) {
            throw new IllegalArgumentException("granularity " + granularity + "; allowed: a power of two from "
                    + MIN_GRANULARITY + " to " + MAX_GRANULARITY + " bytes (QEMU's default is 65536)");
        }
    }

    /** Blocks of {@link #granularity} covering the device, the last one possibly short. */
    public long blocks() {
        return (deviceSize + granularity - 1) / granularity;
    }

    /** Bytes of bits: one u64 word per 64 blocks. */
    public long bitsBytes() {
        return (blocks() + 63) / 64 * 8;
    }

    /** The file's size: header, then the bits rounded up to a page. */
    public long fileBytes() {
        return HEADER_BYTES + (bitsBytes() + 4095) / 4096 * 4096;
    }

    /** The successor at a checkpoint: same device and granularity, the next generation. */
    public BitmapHeader next() {
        return new BitmapHeader(deviceSize, granularity, generation + 1);
    }

    void write(MemorySegment page) {
        page.set(U64, 0, MAGIC);
        page.set(U32, 8, VERSION);
        page.set(U32, 12, HEADER_BYTES);
        page.set(U64, 16, deviceSize);
        page.set(U64, 24, granularity);
        page.set(U64, 32, generation);
        page.set(U64, 40, bitsBytes());
        page.set(U32, CHECKED_BYTES, checksum(page));
    }

    /**
     * The header in {@code page}, refused with what was found and what was expected: never reinterpreted.
     * @param what names the file in messages
     */
    static BitmapHeader read(MemorySegment page, String what) {
        long magic = page.get(U64, 0);
        if (magic != MAGIC) {
            throw new IllegalStateException(what + " is not a pmemblk bitmap (magic 0x" + Long.toHexString(magic)
                    + ", expected 0x" + Long.toHexString(MAGIC) + "); remove it, pmemblk does not reinterpret it");
        }
        int version = page.get(U32, 8);
        if (version != VERSION || page.get(U32, 12) != HEADER_BYTES) {
            throw new IllegalStateException(what + " has bitmap version " + version + " with a header of "
                    + page.get(U32, 12) + " bytes; this pmemblk reads version " + VERSION + " with " + HEADER_BYTES);
        }
        int sum = page.get(U32, CHECKED_BYTES);
        if (sum != checksum(page)) {
            throw new IllegalStateException(what + ": header checksum 0x" + Integer.toHexString(sum) + " does not"
                    + " match its fields (0x" + Integer.toHexString(checksum(page)) + "): the header is damaged; remove"
                    + " the bitmap and take a full backup");
        }
        BitmapHeader h;
        try {
            h = new BitmapHeader(page.get(U64, 16), page.get(U64, 24), page.get(U64, 32));
        } catch (IllegalArgumentException e) {
            throw new IllegalStateException(what + ": " + e.getMessage(), e);
        }
        if (page.get(U64, 40) != h.bitsBytes()) {
            throw new IllegalStateException(what + " holds " + page.get(U64, 40) + " bytes of bits where its device"
                    + " size and granularity need " + h.bitsBytes());
        }
        return h;
    }

    private static int checksum(MemorySegment page) {
        CRC32C crc = new CRC32C();
        crc.update(page.asSlice(0, CHECKED_BYTES).asByteBuffer());
        return (int) crc.getValue();
    }
}
