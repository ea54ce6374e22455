package io.pmemblk.dma;

import java.lang.foreign.Arena;
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
 * (copy-on-write); readers binary-search whatever snapshot they see. The VFIO backend
 * ({@code io.pmemblk.dma.vfio.VfioIovaSpace}) also issues {@code VFIO_IOMMU_MAP_DMA} through {@link #mapped} and
 * {@link #unmapped}; this class is the bookkeeping both backends share.
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
    /** First IOVA the device cannot reach (exclusive). */
    private final long limit;
    /** IOVAs are chosen by whoever maps ({@link #mapAt}), as a vfio-user client chooses them in DMA_MAP; map() is refused. */
    private final boolean placedByCaller;

    private IovaSpace(boolean placedByCaller) {
        this.placedByCaller = placedByCaller;
        this.nextIova = 0;
        this.limit = Long.MAX_VALUE;
    }

    /**
     * A space whose regions are placed at IOVAs the other side chooses ({@link #mapAt}): a device's view of a
     * vfio-user client's DMA_MAP regions (guest-physical addresses under QEMU). There is no guard page between
     * neighbours (the client's layout is the client's), 0 may be mapped (guest RAM starts there), and
     * {@link #map} is refused.
     */
    public static IovaSpace placedByCaller() {
        return new IovaSpace(true);
    }

    public IovaSpace() {
        this(DEFAULT_BASE);
    }

    public IovaSpace(long base) {
        this(base, Long.MAX_VALUE);
    }

    /** IOVAs in [base, limit): a device that masks bus addresses (QEMU's edu: 28 bits) cannot reach past limit. */
    public IovaSpace(long base, long limit) {
        if (base <= 0 || (base & (PAGE - 1)) != 0) {
            throw new IllegalArgumentException("IOVA base 0x" + Long.toHexString(base) + " must be positive and page aligned");
        }
        if (limit <= base) {
            throw new IllegalArgumentException("IOVA limit 0x" + Long.toHexString(limit) + " must be above the base 0x"
                    + Long.toHexString(base));
        }
        this.nextIova = base;
        this.limit = limit;
        this.placedByCaller = false;
    }

    /**
     * Bytes between the page start and byte 0 of {@code seg} as the device must see them: 0 here (the translation
     * is in software); an IOMMU maps whole pages, so there byte 0 sits at the same offset in its IOVA page.
     */
    protected long pageOffset(MemorySegment seg) {
        return 0;
    }

    /**
     * Called under this space's lock before a region is published: the pages of {@code span} bytes from
     * {@code iovaPage} are to show {@code seg}'s memory from its page start. Throwing leaves nothing mapped.
     */
    protected void mapped(long iovaPage, long span, MemorySegment seg) {
    }

    /** Called under this space's lock after a region was withdrawn (its pages: {@code span} bytes from iovaPage). */
    protected void unmapped(long iovaPage, long span) {
    }

    /**
     * Memory the device will be given (descriptor rings, completion words, buffer pools), as Linux's
     * dma_alloc_coherent asks the device's DMA backend: plain native memory here; a device in another process
     * (vfio-user) can reach only memory it maps by descriptor, and its space overrides this. Owned by
     * {@code owner}; not mapped yet: the caller maps it.
     */
    public MemorySegment allocate(long bytes, long alignment, Arena owner) {
        return owner.allocate(bytes, alignment);
    }

    /** The first IOVA past the space (exclusive). */
    public long limit() {
        return limit;
    }

    /** Registers {@code seg} (native, non-empty) and returns the IOVA of its byte 0. */
    public synchronized long map(MemorySegment seg) {
        if (placedByCaller) {
            throw new IllegalStateException("this IOVA space's addresses are chosen by the client (mapAt), not handed out");
        }
        if (!seg.isNative()) {
            throw new IllegalArgumentException("only native segments can be mapped for DMA, got a heap segment of " + seg.byteSize() + " bytes");
        }
        long size = seg.byteSize();
        if (size <= 0) {
            throw new IllegalArgumentException("cannot map an empty segment");
        }
        long page = nextIova;
        long skew = pageOffset(seg);
        long span = (skew + size + PAGE - 1) & -PAGE;
        long next = page + span + GUARD;
        if (next < page || page + span > limit) {
            throw new IllegalStateException("IOVA space exhausted: " + size + " bytes do not fit between 0x"
                    + Long.toHexString(page) + " and the device's limit 0x" + Long.toHexString(limit)
                    + " (map less: a smaller pmem.size, queue.buffer-bytes or queues)");
        }
        mapped(page, span, seg);
        nextIova = next;
        long iova = page + skew;
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

    /**
     * Registers {@code seg} (native, non-empty) at {@code iova}, chosen by the caller, in a space made by
     * {@link #placedByCaller}. Copy-on-write like {@link #map}: a translation running meanwhile sees the table before
     * or after, never a torn one.
     *
     * @throws IllegalArgumentException when the range wraps, or overlaps a region already mapped (as VFIO refuses
     *         an overlapping DMA_MAP)
     */
    public synchronized void mapAt(long iova, MemorySegment seg) {
        if (!placedByCaller) {
            throw new IllegalStateException("this IOVA space hands out its own addresses (map), mapAt is for a space"
                    + " placedByCaller()");
        }
        if (!seg.isNative()) {
            throw new IllegalArgumentException("only native segments can be mapped for DMA, got a heap segment of " + seg.byteSize() + " bytes");
        }
        long size = seg.byteSize();
        if (size <= 0 || iova < 0 || iova + size < iova) {
            throw new IllegalArgumentException("cannot map " + size + " bytes at IOVA 0x" + Long.toHexString(iova)
                    + " (allowed: a non-empty range in [0, 2^63))");
        }
        Table t = table;
        int n = t.starts.length;
        int at = Arrays.binarySearch(t.starts, iova);
        if (at >= 0) {
            throw new IllegalArgumentException(overlap(iova, size, t.starts[at], t.lengths[at]));
        }
        at = -at - 1; // insertion point: starts[at-1] < iova < starts[at]
        if (at > 0 && t.starts[at - 1] + t.lengths[at - 1] > iova) {
            throw new IllegalArgumentException(overlap(iova, size, t.starts[at - 1], t.lengths[at - 1]));
        }
        if (at < n && iova + size > t.starts[at]) {
            throw new IllegalArgumentException(overlap(iova, size, t.starts[at], t.lengths[at]));
        }
        long[] starts = new long[n + 1];
        long[] lengths = new long[n + 1];
        MemorySegment[] segs = new MemorySegment[n + 1];
        System.arraycopy(t.starts, 0, starts, 0, at);
        System.arraycopy(t.lengths, 0, lengths, 0, at);
        System.arraycopy(t.segments, 0, segs, 0, at);
        starts[at] = iova;
        lengths[at] = size;
        segs[at] = seg;
        System.arraycopy(t.starts, at, starts, at + 1, n - at);
        System.arraycopy(t.lengths, at, lengths, at + 1, n - at);
        System.arraycopy(t.segments, at, segs, at + 1, n - at);
        table = new Table(starts, lengths, segs);
    }

    private static String overlap(long iova, long size, long otherStart, long otherLength) {
        return "IOVA range [0x" + Long.toHexString(iova) + ", 0x" + Long.toHexString(iova + size)
                + ") overlaps the mapped region [0x" + Long.toHexString(otherStart) + ", 0x"
                + Long.toHexString(otherStart + otherLength) + ")";
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
        long page = iova & -PAGE;
        unmapped(page, (iova - page + t.lengths[i] + PAGE - 1) & -PAGE);
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
