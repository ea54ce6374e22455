package io.pmemblk.dma.vfiouser.client;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.MappedFiles;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * An {@link IovaSpace} whose regions are also given to a vfio-user device with VFIO_USER_DMA_MAP, each with a
 * descriptor of the file behind it and the offset in that file, so that the device process maps our memory
 * itself and copies without a message per access. The descriptor comes from {@link MappedFiles}: the pmem file,
 * guest RAM memfds and the memfds {@link #allocate} makes are recorded there when mapped. Memory with no file
 * behind it (plain {@code Arena.allocate}) is refused at map time, naming it: the device could reach it only
 * through DMA_READ/DMA_WRITE messages, a round trip per access, which this client answers
 * ({@link VfioUserConnection}) but never invites.
 *
 * <p>The space outlives connections: it keeps every region's descriptor and offset, and {@link #attach} gives
 * them all to a new connection (a device process that restarted knows nothing of the old one's mappings).
 * While no device is attached, map and unmap only keep the books.
 */
public final class VfioUserIovaSpace extends IovaSpace {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfiouser");

    /** One DMA mapping: its pages, and our own descriptor of the file behind them. */
    private record Region(long iovaPage, long span, int fd, long offset) {}

    /** page IOVA -> region, every region mapped now (attached or not). */
    private final Map<Long, Region> regions = new LinkedHashMap<>();
    private VfioUserConnection device;

    public VfioUserIovaSpace(long base, long limit) {
        super(base, limit);
    }

    /** Whole pages are given to the device, so byte 0 keeps its offset in its page, as under an IOMMU. */
    @Override
    protected long pageOffset(MemorySegment seg) {
        return seg.address() & (PAGE - 1);
    }

    /** A memfd's pages: memory the device process can map by descriptor. */
    @Override
    public MemorySegment allocate(long bytes, long alignment, Arena owner) {
        if (alignment > PAGE) {
            throw new IllegalArgumentException("alignment " + alignment + " above a page is not offered");
        }
        try {
            return SharedMemory.allocate("pmemblk-dma", bytes, owner);
        } catch (NativeException e) {
            throw new IllegalStateException("cannot allocate " + bytes + " bytes of DMA memory: " + e.getMessage(), e);
        }
    }

    @Override
    protected void mapped(long iovaPage, long span, MemorySegment seg) {
        long page = seg.address() & -PAGE;
        MappedFiles.Backing b;
        try {
            b = MappedFiles.backing(page, span);
        } catch (NativeException e) {
            throw new IllegalStateException("cannot give the device a descriptor of memory at 0x" + Long.toHexString(page)
                    + ": " + e.getMessage(), e);
        }
        if (b == null) {
            throw new IllegalStateException(seg.byteSize() + " bytes at 0x" + Long.toHexString(seg.address())
                    + " have no file behind them, so a vfio-user device cannot map them; allowed: memory mapped from a"
                    + " file or memfd (the pmem file, guest RAM, IovaSpace.allocate)");
        }
        Region r = new Region(iovaPage, span, b.fd(), b.offset());
        VfioUserConnection d = device;
        if (d != null) {
            try {
                d.dmaMap(iovaPage, span, r.fd(), r.offset());
            } catch (VfioUserException e) {
                if (!e.connectionLost()) {
                    Libc.closeQuietly(r.fd());
                    throw new IllegalStateException(e.getMessage(), e);
                }
                // the device just went: the region is given to the next one at attach
            }
        }
        regions.put(iovaPage, r);
    }

    @Override
    protected void unmapped(long iovaPage, long span) {
        Region r = regions.remove(iovaPage);
        if (r == null) {
            return;
        }
        Libc.closeQuietly(r.fd());
        VfioUserConnection d = device;
        if (d != null) {
            try {
                d.dmaUnmap(iovaPage, r.span());
            } catch (VfioUserException e) {
                if (!e.connectionLost()) {
                    LOG.log(System.Logger.Level.WARNING, "vfio-user: DMA_UNMAP of 0x" + Long.toHexString(iovaPage) + "+0x"
                            + Long.toHexString(r.span()) + " refused: " + e.getMessage());
                }
            }
        }
    }

    /** Sends maps and unmaps to no device any more (books only), until the next {@link #attach}. */
    public synchronized void detach() {
        device = null;
    }

    /**
     * Gives every region to {@code connection} (DMA_MAP each) and sends later maps and unmaps to it. Returns how
     * many regions were mapped.
     * @throws VfioUserException when the device refuses one or goes away meanwhile (nothing stays attached)
     */
    public synchronized int attach(VfioUserConnection connection) throws VfioUserException {
        device = null;
        for (Region r : regions.values()) {
            connection.dmaMap(r.iovaPage(), r.span(), r.fd(), r.offset());
        }
        device = connection;
        return regions.size();
    }

    /**
     * Detaches and closes every region's descriptor (engine shutdown, after the channels stopped); later unmaps
     * of regions still in the books only forget them.
     */
    public synchronized void release() {
        device = null;
        for (Region r : regions.values()) {
            Libc.closeQuietly(r.fd());
        }
        regions.clear();
    }

    /** Regions given to the device now (or to be given at the next attach). */
    public synchronized int mappedRegions() {
        return regions.size();
    }
}
