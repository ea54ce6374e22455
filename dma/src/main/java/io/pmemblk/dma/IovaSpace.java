package io.pmemblk.dma;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * The device's view of memory: registered segments at I/O virtual addresses, the way an IOMMU maps them.
 *
 * <p>Regions are handed out page-aligned, never at 0, with an unmapped guard page between neighbours so that a
 * copy running off the end of one buffer faults instead of landing in the next. IOVAs are never reused.
 *
 * <p>{@link #translate} runs on DMA engine threads for every descriptor, so it takes no lock and allocates only
 * the slice it returns: map/unmap build new sorted arrays and publish them through one volatile field
 * (copy-on-write); readers binary-search whatever snapshot they see. A later VFIO backend will also issue
 * {@code VFIO_IOMMU_MAP_DMA} in {@link #map}; this class is the bookkeeping both backends share.
 */
public class IovaSpace {
    /** First IOVA handed out; 0 stays unmapped so that a zeroed pointer faults. */
    public static final long DEFAULT_BASE = 0x1000_0000L;
    public static final long PAGE = 4096;
    /** Unmapped gap left after every region. */
    public static final long GUARD = PAGE;

    /** Immutable snapshot; starts ascending. */
    private record Table(long[] starts, long[] lengths, MemorySegment[] segments) {
        static final Table EMPTY = new Table(new long[0], new long[0], new MemorySegment[0]);
    }

    private volatile Table table = Table.EMPTY;
    private long nextIova;

    public IovaSpace() {
        this(DEFAULT_BASE);
    }

    public IovaSpace(long base) {
        if (base <= 0 || (base & (PAGE - 1)) != 0) {
            throw new IllegalArgumentException("IOVA base 0x" + Long.toHexString(base) + " must be positive and page aligned");
        }
        this.nextIova = base;
    }

    /** Registers {@code seg} (native, non-empty) and returns the IOVA of its byte 0. */
    public synchronized long map(MemorySegment seg) {
        if (!seg.isNative()) {
            throw new IllegalArgumentException("only native segments can be mapped for DMA, got a heap segment of " + seg.byteSize() + " bytes");
        }
        long size = seg.byteSize();
        if (size <= 0) {
            throw new IllegalArgumentException("cannot map an empty segment");
        }
        long iova = nextIova;
        long span = (size + PAGE - 1) & -PAGE;
        long next = iova + span + GUARD;
        if (next < iova) {
            throw new IllegalStateException("IOVA space exhausted at 0x" + Long.toHexString(iova));
        }
        nextIova = next;
        Table t = table;
        int n = t.starts.length;
        // New IOVAs only grow, so the new region sorts last.
        long[] starts = Arrays.copyOf(t.starts, n + 1);
        long[] lengths = Arrays.copyOf(t.lengths, n + 1);
        MemorySegment[] segs = Arrays.copyOf(t.segments, n + 1);
        starts[n] = iova;
        lengths[n] = size;
        segs[n] = seg;
        table = new Table(starts, lengths, segs);
        return iova;
    }

    /** Removes the region that starts at {@code iova}; later translations of it fault. */
    public synchronized void unmap(long iova) {
        Table t = table;
        int i = Arrays.binarySearch(t.starts, iova);
        if (i < 0) {
            throw new IllegalArgumentException("no region mapped at IOVA 0x" + Long.toHexString(iova)
                    + " (unmap takes the IOVA that map returned)");
        }
        int n = t.starts.length;
        long[] starts = new long[n - 1];
        long[] lengths = new long[n - 1];
        MemorySegment[] segs = new MemorySegment[n - 1];
        System.arraycopy(t.starts, 0, starts, 0, i);
        System.arraycopy(t.lengths, 0, lengths, 0, i);
        System.arraycopy(t.segments, 0, segs, 0, i);
        System.arraycopy(t.starts, i + 1, starts, i, n - i - 1);
        System.arraycopy(t.lengths, i + 1, lengths, i, n - i - 1);
        System.arraycopy(t.segments, i + 1, segs, i, n - i - 1);
        table = new Table(starts, lengths, segs);
    }

    /**
     * Returns the slice of the registered segment backing {@code [iova, iova+length)}.
     *
     * @throws IovaFault when the range is not fully inside one registered region (or length is negative)
     */
    public MemorySegment translate(long iova, long length) {
        Table t = table;
        long[] starts = t.starts;
        int lo = 0;
        int hi = starts.length - 1;
        int found = -1;
        while (lo <= hi) { // last region whose start <= iova (unsigned IOVAs never reach the sign bit here)
            int mid = (lo + hi) >>> 1;
            if (starts[mid] <= iova) {
                found = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (found < 0 || length < 0) {
            throw new IovaFault(iova, length, "is not mapped");
        }
        long offset = iova - starts[found];
        if (offset > t.lengths[found] - length) {
            throw new IovaFault(iova, length, "is not inside one mapped region (nearest starts at 0x"
                    + Long.toHexString(starts[found]) + ", " + t.lengths[found] + " bytes)");
        }
        return t.segments[found].asSlice(offset, length);
    }

    /** Number of regions mapped now. */
    public int regions() {
        return table.starts.length;
    }
}
