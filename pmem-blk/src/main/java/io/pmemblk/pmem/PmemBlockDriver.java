package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.btt.Btt;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.HashMap;
import java.util.Map;

/**
 * The pmem block driver: executes block requests against a {@link PmemRegion}, copying each request's data
 * by CPU or by a DMA channel ({@link Routing}). Every request is bounds-checked here (frontends' checks are
 * not trusted) and completed exactly once.
 *
 * <p>The driver picks its executor once, by layout: {@link RawExecutor}, or {@link BttExecutor} over a BTT. Both
 * route by {@link Router}, place copies through the {@link DmaRoute} and complete through {@link Completions};
 * none of them calls back into the driver.
 *
 * <p>Batches: all DMA copies of a batch are placed in the channel's ring and the doorbell is rung once at the
 * end: an MMIO doorbell write costs more than a small copy, so one per batch, not per request ({@link DmaRoute}).
 * The CPU requests of a batch complete inline; DMA requests complete on the channel's completion thread.
 *
 * <p>Caller memory ({@link Request#callerMemory}, a vhost-user guest's RAM): the data is copied between its
 * pieces and the mapping, on the CPU route one {@code MemorySegment.copy} per piece, on the DMA route one copy per
 * piece straight between the piece's iova ({@link #registerMemory}) and the mapping's. Only these requests and
 * forced routes reach the engine by default: a pool-buffer request's data already cost the kernel's CPU copy, so
 * it goes to DMA only with {@link Routing#bounce} ({@link Routing}).
 *
 * <p>Durability: a WRITE/TRIM/WRITE_ZEROES with FUA is persistent before it completes; a FLUSH makes every
 * write completed before it, on any queue and by either route, persistent. A DMA write is made persistent
 * by the CPU after the device reports it ({@link WriteBack#deviceWrote}): with DDIO the device's writes sit
 * in the CPU cache until flushed. Once the region's write-back has failed ({@link WriteBack#writeBackFailed})
 * every FLUSH, FUA and plain write answers EIO without touching the mapping, reads are served as before; the
 * region logs the failure once, so these refusals log nothing.
 *
 * <p>Faults: a copy the channel reports failed (a halt: its descriptor and every one placed after it) is
 * done again by the CPU before the request completes, so nothing is lost; the same bytes are copied again,
 * which a reader cannot tell from one copy. A channel that throws instead (closed, or broken by a halt it could
 * not recover from) loses nothing either: its request goes to the CPU, and the rest of the batch runs.
 *
 * <p>The BTT layout ({@code pmem.layout=btt}, {@link #onBtt}): the device is the BTT's external blocks, and its
 * requests are executed sector by sector by {@link BttExecutor} (sector-atomic writes, nothing received or sent
 * in place: the mapping's bytes are the BTT's, not the device's). The WRITEs of a batch, and the sectors of one
 * WRITE, are written in groups whose durability round trips are shared ({@link BttCpuRequests#writes}). On the
 * DMA route a group's data copies are the channel's, and its flog and map steps run on the completion thread once
 * the device-written blocks are written back and drained; a READ's copies are the channel's, its blocks held in
 * the BTT's device-read table until they are reported.
 */
public final class PmemBlockDriver implements BlockDriver {
    private static final System.Logger LOG = System.getLogger(PmemBlockDriver.class.getName());

    private final PmemRegion region;
    private final long size;
    private final DmaEngine engine;
    /** The BTT this driver serves, or null on the raw layout: for its accessor and sector size only. */
    private final Btt btt;
    private final DeviceViews views;
    private final Router router;
    private final DmaRoute dma;
    private final Executor executor;
    /** Caller memory in the engine's IOVA space ({@link #registerMemory}), by address; guarded by itself. */
    private final Map<Long, Registered> registered = new HashMap<>();

    /** A CPU-only driver. */
    public PmemBlockDriver(PmemRegion region, CopyStats stats) {
        this(region, stats, null, Routing.CPU_ONLY);
    }

    /**
     * A driver that may offload copies to {@code engine} (null: CPU only). The region is registered in the
     * engine's IOVA space now, each queue's buffer pool when the queue attaches: once, never per request
     * (mapping a buffer for a device per request costs more than the copy it serves). The driver owns the engine
     * from here on and closes it before the region.
     */
    public PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing) {
        this(region, stats, engine, routing, null, DeviceViews.WINDOW_SHIFT);
    }

    /**
     * As {@link #PmemBlockDriver(PmemRegion, CopyStats, DmaEngine, Routing)}, the views a frontend receives or
     * sends in place made in windows of {@code 1 << windowShift} bytes ({@link DeviceViews}).
     */
    PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing, int windowShift) {
        this(region, stats, engine, routing, null, windowShift);
    }

    /** A driver on the BTT of {@code region} ({@link BttRegion#open}), CPU copies only. */
    public static PmemBlockDriver onBtt(PmemRegion region, CopyStats stats, Btt btt) {
        return onBtt(region, stats, btt, null, Routing.CPU_ONLY);
    }

    /**
     * A driver on the BTT of {@code region} that may offload the data copies of WRITEs ({@link BttDmaWrites}) and
     * READs ({@link BttDmaReads}) to {@code engine} (null: CPU only), routed by {@code routing} as on the raw
     * layout. The BTT must be over this region's mapping; the driver owns the engine, as
     * {@link #PmemBlockDriver(PmemRegion, CopyStats, DmaEngine, Routing)} does.
     */
    public static PmemBlockDriver onBtt(PmemRegion region, CopyStats stats, Btt btt, DmaEngine engine, Routing routing) {
        return new PmemBlockDriver(region, stats, engine, routing, btt, DeviceViews.WINDOW_SHIFT);
    }

    private PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing, Btt btt,
                            int windowShift) {
        this.region = region;
        this.btt = btt;
        this.size = btt != null ? btt.blocks() * btt.blockSize() : region.size();
        this.engine = engine;
        this.views = new DeviceViews(region.memory(), windowShift);
        Completions completions = new Completions(region, stats);
        this.router = new Router(region, size, engine != null, btt == null, routing);
        this.dma = new DmaRoute(engine, region, stats, completions);
        this.executor = btt == null ? new RawExecutor(region, views, stats, router, dma, completions)
                : new BttExecutor(btt, region, stats, router, dma, completions);
        if (engine != null) {
            engine.onCompletion(new DmaCompletionListener() {
                @Override
                public void completed(Object ctx, int status) {
                    executor.dmaCompleted(ctx, status, 1);
                }

                @Override
                public void completed(Object ctx, int status, int copies) {
                    executor.dmaCompleted(ctx, status, copies); // a run's copies counted down in one step
                }
            });
        }
    }

    public PmemRegion region() {
        return region;
    }

    /** The BTT this driver serves (pmem.layout=btt), or null on the raw layout. */
    public Btt btt() {
        return btt;
    }

    /** The DMA engine, or null for a CPU-only driver. */
    public DmaEngine engine() {
        return engine;
    }

    @Override
    public long size() {
        return size;
    }

    @Override
    public boolean isPmem() {
        return region.isPmem();
    }

    // Capabilities: the region is one writable mapping shared by every queue, so what one connection wrote is
    // what all read, and FLUSH/FUA persist it whichever queue it came in on.

    /** Never: the region is always mapped writable. */
    @Override
    public boolean isReadOnly() {
        return false;
    }

    @Override
    public boolean canFlush() {
        return true;
    }

    @Override
    public boolean canFua() {
        return true;
    }

    /** TRIM zeroes the range, like WRITE_ZEROES: pmem has no thin provisioning to give it back to. */
    @Override
    public boolean canTrim() {
        return true;
    }

    /** The BTT's sector on the BTT layout (a partial sector cannot be written atomically), else 1. */
    @Override
    public int minimumBlockSize() {
        return btt == null ? 1 : btt.blockSize();
    }

    @Override
    public boolean canZero() {
        return true;
    }

    /** Zeroing is a store loop over the mapping, the same cost as writing zeros, never slower. */
    @Override
    public boolean canFastZero() {
        return true;
    }

    /** CACHE succeeds at once: the mapping is already memory. */
    @Override
    public boolean canCache() {
        return true;
    }

    @Override
    public boolean canMultiConn() {
        return true;
    }

    public Routing routing() {
        return router.routing();
    }

    public void routing(Routing routing) {
        router.routing(routing);
    }

    /**
     * Sends every data request to one route (null: back to the thresholds).
     * @return false when {@code route} is DMA and there is no engine
     */
    public boolean force(Route route) {
        return router.force(route);
    }

    /** Not on a BTT, nor after a failed write-back, nor where a page of the range cannot be loaded ({@link Router}). */
    @Override
    public boolean receivesInPlace(long offset, long length) {
        return router.receivesInPlace(offset, length);
    }

    /** Not on a BTT: the device's bytes are scattered over its data blocks ({@link Router}). */
    @Override
    public boolean sendsInPlace(long offset, long length) {
        return router.sendsInPlace(offset, length);
    }

    @Override
    public void receiveInPlace(Request r) {
        views.point(r, PerRequest.of(r).windows(views), r.offset, (int) r.length);
        r.dataInPlace = true;
    }

    /** A region of caller memory mapped in the engine's IOVA space. */
    private record Registered(long size, long iova) {}

    /**
     * Maps {@code memory} into the engine's IOVA space (VFIO: VFIO_IOMMU_MAP_DMA, pinning it), once per region.
     * A region the engine cannot map (its IOVA space full, the IOMMU refusing the pages) is logged and answered
     * {@link Request#NO_IOVA}: its requests go by the CPU, and the guest is served all the same.
     * @throws IllegalStateException when a region at the same address is registered already
     */
    @Override
    public long registerMemory(MemorySegment memory) {
        if (engine == null) {
            return Request.NO_IOVA;
        }
        synchronized (registered) {
            if (registered.containsKey(memory.address())) {
                throw new IllegalStateException("memory at 0x" + Long.toHexString(memory.address()) + " ("
                        + memory.byteSize() + " bytes) is registered for DMA already; allowed: once, until"
                        + " unregisterMemory");
            }
            long iova;
            try {
                iova = engine.iovaSpace().map(memory);
            } catch (IllegalStateException e) {
                LOG.log(System.Logger.Level.WARNING, "caller memory at 0x" + Long.toHexString(memory.address()) + " ("
                        + memory.byteSize() + " bytes) cannot be mapped for DMA: " + e.getMessage()
                        + "; its requests are copied by the CPU");
                return Request.NO_IOVA;
            }
            registered.put(memory.address(), new Registered(memory.byteSize(), iova));
            return iova;
        }
    }

    /**
     * Withdraws {@code memory} from the engine's IOVA space (VFIO: VFIO_IOMMU_UNMAP_DMA); a copy still aimed at
     * it faults in the engine. Memory never registered (no engine, or its mapping was refused) is left alone.
     * @throws IllegalArgumentException when the region registered at that address has another size
     */
    @Override
    public void unregisterMemory(MemorySegment memory) {
        if (engine == null) {
            return;
        }
        Registered r;
        synchronized (registered) {
            r = registered.get(memory.address());
            if (r == null) {
                return;
            }
            if (r.size() != memory.byteSize()) {
                throw new IllegalArgumentException("unregistering " + memory.byteSize() + " bytes at 0x"
                        + Long.toHexString(memory.address()) + ", but " + r.size() + " bytes were registered there;"
                        + " allowed: the segment given to registerMemory");
            }
            registered.remove(memory.address());
        }
        engine.iovaSpace().unmap(r.iova());
    }

    /** The engine's kind of memory ({@code IovaSpace.allocate}): a vfio-user device is given it by descriptor. */
    @Override
    public MemorySegment allocateBuffers(long bytes, Arena owner) {
        return engine == null ? owner.allocate(bytes, 4096) : engine.iovaSpace().allocate(bytes, 4096, owner);
    }

    @Override
    public void attachQueue(HardwareQueue queue) {
        dma.attachQueue(queue);
    }

    /** The queue's DMA channel's completions, reaped on the calling queue thread ({@link DmaRoute#startReaping}). */
    @Override
    public int startReaping(int hwq) {
        return dma.startReaping(hwq);
    }

    @Override
    public int reapCompletions(int hwq) {
        return dma.reapCompletions(hwq);
    }

    @Override
    public void stopReaping(int hwq) {
        dma.stopReaping(hwq);
    }

    /**
     * Every request of the batch is completed exactly once, whatever throws, by the layout's executor
     * ({@link RawExecutor#queueRequests}, {@link BttExecutor#queueRequests}).
     */
    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        executor.queueRequests(hwq, batch, count);
    }

    /** CPU time of the DMA engine's own threads so far (the software device's engines), 0 without one. */
    public long engineCpuNanos() {
        return engine == null ? 0 : engine.softDevice().map(d -> d.engineCpuTimeNanos()).orElse(0L);
    }

    @Override
    public void persistAll() throws IOException {
        region.writeBack().persistAll();
    }

    /**
     * Closes the DMA engine (its copies drain or fall back to the CPU; on the BTT every group in flight commits),
     * then persists and unmaps the region. Idempotent: each of those is released once, so a second close (a
     * caller's, after a layer over this driver closed it already) finds nothing left to release.
     */
    @Override
    public void close() throws IOException {
        try {
            if (engine != null) {
                engine.close();
                executor.engineClosed();
                IovaSpace space = engine.iovaSpace();
                synchronized (registered) {
                    for (Registered r : registered.values()) { // a frontend that never withdrew its memory
                        space.unmap(r.iova());
                    }
                    registered.clear();
                }
                dma.unmapAll(space);
            }
        } finally {
            region.close();
        }
    }
}
