package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.PmemRegion;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;

/**
 * One bitmap's bits, in a file of its own mapped as a {@link PmemRegion} (so through the same persistence as the
 * device: pmem_flush + drain on pmem, msync otherwise), behind a {@link BitmapHeader}. Owns the region.
 *
 * <p>Marking is two steps with a persist between: {@link #set} stores bits into the mapping, {@link #persist}
 * makes a range of them durable and only then {@link #published} records them in a heap shadow, which is what
 * {@link #durablySet} reads. A bit some other writer has set but not yet persisted is therefore not "set" to a
 * second writer: it persists the bit itself before its own write may reach the image. The shadow costs the fast
 * path one plain load of a heap word per 64 blocks; a stale read only sends a writer down the slow path.
 */
public final class BitmapFile implements AutoCloseable {
    private static final ValueLayout.OfLong WORD = ValueLayout.JAVA_LONG.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle MAPPED_WORD = WORD.varHandle();
    private static final VarHandle SHADOW_WORD = MethodHandles.arrayElementVarHandle(long[].class);

    private final PmemRegion region;
    private final BitmapHeader header;
    private final MemorySegment bits;
    private final long[] shadow;
    private final Object persistLock = new Object();
    private final int shift;
    private final long blocks;

    private BitmapFile(PmemRegion region, BitmapHeader header) {
        this.region = region;
        this.header = header;
        this.bits = region.memory().asSlice(BitmapHeader.HEADER_BYTES, header.bitsBytes());
        this.shadow = new long[(int) (header.bitsBytes() / 8)];
        this.shift = Long.numberOfTrailingZeros(header.granularity());
        this.blocks = header.blocks();
        // what the file holds was persisted by whoever set it (or is made durable at open: PmemRegion syncs it)
        for (int i = 0; i < shadow.length; i++) {
            shadow[i] = bits.get(WORD, 8L * i);
        }
    }

    /**
     * Lays a header over {@code region}, which its open just created (all zero bits), and persists it before the
     * bitmap is used. The region must be {@link BitmapHeader#fileBytes()} long.
     */
    public static BitmapFile create(PmemRegion region, BitmapHeader header) throws IOException {
        if (region.size() != header.fileBytes()) {
            throw new IllegalArgumentException(region.path() + " has " + region.size() + " bytes; a bitmap with "
                    + header + " needs " + header.fileBytes());
        }
        header.write(region.memory().asSlice(0, BitmapHeader.HEADER_BYTES));
        region.writeBack().persistRange(0, BitmapHeader.HEADER_BYTES);
        return new BitmapFile(region, header);
    }

    /** The bitmap in an existing file: its header is checked and refused by {@code what} when it is not one. */
    public static BitmapFile open(PmemRegion region, String what) {
        if (region.size() < BitmapHeader.HEADER_BYTES) {
            throw new IllegalStateException(what + " has " + region.size() + " bytes, less than a bitmap's header");
        }
        BitmapHeader h = BitmapHeader.read(region.memory().asSlice(0, BitmapHeader.HEADER_BYTES), what);
        if (region.size() != h.fileBytes()) {
            throw new IllegalStateException(what + " has " + region.size() + " bytes where its header needs "
                    + h.fileBytes());
        }
        return new BitmapFile(region, h);
    }

    public BitmapHeader header() {
        return header;
    }

    public PmemRegion region() {
        return region;
    }

    /** Whether every block touching [offset, offset + length) is set durably: no store, one load per 64 blocks. */
    boolean durablySet(long offset, long length) {
        long first = offset >>> shift;
        long last = (offset + length - 1) >>> shift;
        for (long w = first >>> 6; w <= last >>> 6; w++) {
            long mask = mask(w, first, last);
            if ((shadow[(int) w] & mask) != mask) {
                return false;
            }
        }
        return true;
    }

    /** Sets the bits of every block touching [offset, offset + length) in the mapping (durable after {@link #persist}). */
    void set(long offset, long length) {
        long first = offset >>> shift;
        long last = (offset + length - 1) >>> shift;
        for (long w = first >>> 6; w <= last >>> 6; w++) {
            long mask = mask(w, first, last);
            long at = 8 * w;
            if (((long) MAPPED_WORD.getVolatile(bits, at) & mask) != mask) {
                MAPPED_WORD.getAndBitwiseOr(bits, at, mask);
            }
        }
    }

    /**
     * Makes the bits of the blocks touching [offset, end) durable: whatever was stored there before this call
     * (by any thread) is then on the persistence domain.
     */
    void persist(long offset, long end) throws IOException {
        long firstWord = (offset >>> shift) >>> 6;
        long lastWord = ((end - 1) >>> shift) >>> 6;
        // One persist at a time: Linux reports a failed write-back to one msync only and marks the pages clean. A
        // second msync running beside the one that gets the error could return 0 for bits in those lost pages,
        // before the first has recorded the failure; serialised, the region has recorded it (it does so before
        // throwing) when the next one starts, and refuses that one too. Only bits going 0 to 1 come here.
        synchronized (persistLock) {
            region.writeBack().persistRange(BitmapHeader.HEADER_BYTES + 8 * firstWord, 8 * (lastWord - firstWord + 1));
        }
    }

    /** Records the bits of [offset, offset + length), set and persisted, in the shadow that {@link #durablySet} reads. */
    void published(long offset, long length) {
        long first = offset >>> shift;
        long last = (offset + length - 1) >>> shift;
        for (long w = first >>> 6; w <= last >>> 6; w++) {
            SHADOW_WORD.getAndBitwiseOr(shadow, (int) w, mask(w, first, last));
        }
    }

    /** Bits of word {@code w} that lie in blocks [first, last]. */
    private static long mask(long w, long first, long last) {
        long lo = Math.max(first - (w << 6), 0);
        long hi = Math.min(last - (w << 6), 63);
        return (-1L >>> (63 - hi)) & (-1L << lo);
    }

    /** Whether block {@code block} is dirty. */
    public boolean dirty(long block) {
        return (bits.get(WORD, 8 * (block >>> 6)) & (1L << block)) != 0;
    }

    /**
     * The run of blocks from {@code block} (below {@code limit}) in {@code block}'s state: the first block after it,
     * or {@code limit}; negated when the run is dirty ({@link #isDirtyRun}, {@link #runEnd}). The state and the
     * run's start come from one read of a word: read apart, a write marking {@code block} between the two reads
     * made a clean answer run on over blocks that were dirty before the query, or gave a run of no length.
     */
    public long run(long block, long limit) {
        long w = bits.get(WORD, 8 * (block >>> 6));
        boolean dirty = (w & (1L << block)) != 0;
        long b = block;
        while (true) {
            long diff = (dirty ? ~w : w) >>> (b & 63); // ones where the state changes, from b on; bit 0 is never one
            if (diff != 0) {
                long end = Math.min(limit, b + Long.numberOfTrailingZeros(diff));
                return dirty ? -end : end;
            }
            b = (b | 63) + 1;
            if (b >= limit) {
                return dirty ? -limit : limit;
            }
            w = bits.get(WORD, 8 * (b >>> 6));
        }
    }

    /** Whether a {@link #run} or {@link #runAt} answer is a dirty run. */
    public static boolean isDirtyRun(long run) {
        return run < 0;
    }

    /** Where a {@link #run} or {@link #runAt} answer's run ends. */
    public static long runEnd(long run) {
        return Math.abs(run);
    }

    /**
     * {@link #run} in bytes: the run of blocks from the one holding byte {@code offset}, its end the first byte
     * after it (at most {@code limit}), negated when dirty.
     */
    public long runAt(long offset, long limit) {
        long run = run(offset >>> shift, ((limit - 1) >>> shift) + 1);
        long end = Math.min(limit, runEnd(run) << shift);
        return isDirtyRun(run) ? -end : end;
    }

    /** Blocks of the device, the last one possibly short. */
    public long blocks() {
        return blocks;
    }

    /** Dirty blocks now. */
    public long dirtyBlocks() {
        long n = 0;
        for (long at = 0; at < bits.byteSize(); at += 8) {
            n += Long.bitCount(bits.get(WORD, at));
        }
        return n;
    }

    /**
     * ORs every bit of {@code other} (same device and granularity) into this one and persists them all; markers
     * may be marking this one meanwhile, not {@code other}.
     */
    void absorb(BitmapFile other) throws IOException {
        for (long at = 0; at < bits.byteSize(); at += 8) {
            long w = other.bits.get(WORD, at);
            if (w != 0) {
                MAPPED_WORD.getAndBitwiseOr(bits, at, w);
            }
        }
        synchronized (persistLock) {
            region.writeBack().persistRange(BitmapHeader.HEADER_BYTES, bits.byteSize());
        }
        // only what was persisted here: a marker may be storing bits it has not persisted yet
        for (int i = 0; i < shadow.length; i++) {
            long w = other.bits.get(WORD, 8L * i);
            if (w != 0) {
                SHADOW_WORD.getAndBitwiseOr(shadow, i, w);
            }
        }
    }

    @Override
    public void close() throws IOException {
        region.close();
    }

    @Override
    public String toString() {
        return "bitmap " + region.path() + " (generation " + header.generation() + ", " + header.granularity()
                + "-byte blocks)";
    }
}
