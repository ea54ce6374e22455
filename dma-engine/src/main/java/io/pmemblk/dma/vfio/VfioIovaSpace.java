package io.pmemblk.dma.vfio;

import io.pmemblk.dma.IovaSpace;
import java.lang.foreign.MemorySegment;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An {@link IovaSpace} whose regions are also mapped in a VFIO container's IOMMU domain: {@link #map} pins the
 * pages and issues VFIO_IOMMU_MAP_DMA (whole pages, so byte 0 keeps its offset in the page), {@link #unmap}
 * issues VFIO_IOMMU_UNMAP_DMA. IOVAs stay below the device's addressing limit and inside the IOMMU's ranges.
 * A mapping the kernel refuses (an fsdax or page-cache file) throws {@link IllegalStateException} whose cause is
 * the {@link VfioException} with the fix.
 */
public final class VfioIovaSpace extends IovaSpace {
    private final VfioContainer container;
    /** page IOVA -> span of what is mapped in the IOMMU now, for {@link #unmapAll}. */
    private final Map<Long, Long> live = new LinkedHashMap<>();

    /** IOVAs from {@code base} up to {@code limit} (exclusive), clamped to the container's first usable range. */
    public VfioIovaSpace(VfioContainer container, long base, long limit) {
        super(clampBase(container, base, limit), clampLimit(container, base, limit));
        this.container = container;
    }

    private static VfioContainer.IovaRange usable(VfioContainer c, long base, long limit) {
        for (VfioContainer.IovaRange r : c.iovaRanges()) {
            long lo = Math.max(r.start(), base);
            long hi = r.end() == -1L ? limit : Math.min(limit, r.end() + 1);
            if (hi - lo >= (1 << 20)) {
                return new VfioContainer.IovaRange(lo, hi);
            }
        }
        if (!c.iovaRanges().isEmpty()) {
            throw new IllegalArgumentException("the IOMMU offers no IOVA range of 1 MiB between 0x" + Long.toHexString(base)
                    + " and 0x" + Long.toHexString(limit) + "; its ranges: " + c.iovaRanges());
        }
        return new VfioContainer.IovaRange(base, limit);
    }

    private static long clampBase(VfioContainer c, long base, long limit) {
        return (usable(c, base, limit).start() + PAGE - 1) & -PAGE;
    }

    private static long clampLimit(VfioContainer c, long base, long limit) {
        return usable(c, base, limit).end();
    }

    @Override
    protected long pageOffset(MemorySegment seg) {
        return seg.address() & (PAGE - 1);
    }

    @Override
    protected void mapped(long iovaPage, long span, MemorySegment seg) {
        try {
            container.mapDma(seg.address() & -PAGE, iovaPage, span);
        } catch (VfioException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
        live.put(iovaPage, span);
    }

    @Override
    protected void unmapped(long iovaPage, long span) {
        if (live.remove(iovaPage) == null || container.isClosed()) {
            return; // unmapAll took it already, or the container's release dropped it
        }
        try {
            container.unmapDma(iovaPage, span);
        } catch (VfioException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /**
     * Withdraws every region from the IOMMU (the bookkeeping stays: later {@link #unmap} calls just forget them).
     * Called at shutdown before the container closes, after the device stopped. Returns how many were unmapped.
     */
    public synchronized int unmapAll() {
        int n = 0;
        IllegalStateException first = null;
        for (Map.Entry<Long, Long> e : live.entrySet()) {
            try {
                container.unmapDma(e.getKey(), e.getValue());
                n++;
            } catch (VfioException ex) {
                first = first == null ? new IllegalStateException(ex.getMessage(), ex) : first;
            }
        }
        live.clear();
        if (first != null) {
            throw first;
        }
        return n;
    }

    /** Regions mapped in the IOMMU now. */
    public synchronized int liveMappings() {
        return live.size();
    }
}
