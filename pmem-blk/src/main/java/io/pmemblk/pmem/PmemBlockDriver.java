package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;
import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.btt.Btt;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * The pmem block driver: executes block requests against a {@link PmemRegion}, copying each request's data
 * by CPU or by a DMA channel ({@link Routing}). Every request is bounds-checked here (frontends' checks are
 * not trusted) and completed exactly once.
 *
 * <p>Batches: all DMA copies of a batch are placed in the channel's ring and the doorbell is rung once at the
 * end: an MMIO doorbell write costs more than a small copy, so one per batch, not per request. Queue i uses
 * channel i mod channels, so queues do not share a ring unless there are fewer channels than queues. The CPU requests of a batch complete inline; DMA requests complete on the channel's
 * completion thread.
 *
 * <p>Caller memory ({@link Request#callerMemory}, a vhost-user guest's RAM): the data is copied between its
 * pieces and the mapping, on the CPU route one {@code MemorySegment.copy} per piece, on the DMA route one copy per
 * piece straight between the piece's iova ({@link #registerMemory}) and the mapping's. Only these requests and
 * forced routes reach the engine by default: a pool-buffer request's data already cost the kernel's CPU copy, so
 * it goes to DMA only with {@link Routing#bounce} ({@link Routing}).
 *
 * <p>Durability: a WRITE/TRIM/WRITE_ZEROES with FUA is persistent before it completes; a FLUSH makes every
 * write completed before it, on any queue and by either route, persistent. A DMA write is made persistent
 * by the CPU after the device reports it ({@link PmemRegion#deviceWrote}): with DDIO the device's writes sit
 * in the CPU cache until flushed. Once the region's write-back has failed ({@link PmemRegion#writeBackFailed})
 * every FLUSH, FUA and plain write answers EIO without touching the mapping, reads are served as before; the
 * region logs the failure once, so these refusals log nothing.
 *
 * <p>Faults: a copy the channel reports failed (a halt: its descriptor and every one placed after it) is
 * done again by the CPU before the request completes, so nothing is lost; the same bytes are copied again,
 * which a reader cannot tell from one copy. A channel that throws instead (closed, or broken by a halt it could
 * not recover from) loses nothing either: its request goes to the CPU, and the rest of the batch runs.
 *
 * <p>The BTT layout ({@code pmem.layout=btt}, {@link #onBtt}): the device is the BTT's external blocks, and its
 * requests are executed sector by sector by {@link BttRequests} (sector-atomic writes, nothing received or sent
 * in place: the mapping's bytes are the BTT's, not the device's). The WRITEs of a batch, and the sectors of one
 * WRITE, are written in groups whose durability round trips are shared ({@link #queueOnBtt}). On the DMA route a
 * group's data copies are the channel's, and its flog and map steps run on the completion thread once the
 * device-written blocks are written back and drained; a READ's copies are the channel's, its blocks held in the
 * BTT's device-read table until they are reported.
 */
public final class PmemBlockDriver implements BlockDriver {
    private static final System.Logger LOG = System.getLogger(PmemBlockDriver.class.getName());
    private static final int MAX_QUEUES = 4096;

    private final PmemRegion region;
    private final long size;
    private final CopyStats stats;
    private final DmaEngine engine;
    private final DmaChannel[] channels;
    private final long regionIova;
    private final long[] poolIova = new long[MAX_QUEUES];
    /** Caller memory in the engine's IOVA space ({@link #registerMemory}), by address; guarded by itself. */
    private final Map<Long, Registered> registered = new HashMap<>();
    private volatile Routing routing;
    /** Forced route for benchmarks and the tuner; null = by {@link #routing}. */
    private volatile Route forced;
    private volatile long lastFaultLog = System.nanoTime() - 2_000_000_000L;
    /** The BTT layout's executor, or null on the raw layout. */
    private final BttRequests btt;

    /** A CPU-only driver. */
    public PmemBlockDriver(PmemRegion region, CopyStats stats) {
        this(region, stats, null, Routing.CPU_ONLY);
    }

    /**
     * A driver that may offload copies to {@code engine} (null: CPU only). The region is registered in the
     * engine's IOVA space now, each queue's buffer pool when the queue attaches: once, never per request
     * (mapping a buffer for a device per request costs more than the copy it serves). The driver owns the engine from here on and closes it before the region.
     */
    public PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing) {
        this(region, stats, engine, routing, null);
    }

    /** A driver on the BTT of {@code region} ({@link BttRegion#open}), CPU copies only. */
    public static PmemBlockDriver onBtt(PmemRegion region, CopyStats stats, Btt btt) {
        return onBtt(region, stats, btt, null, Routing.CPU_ONLY);
    }

    /**
     * A driver on the BTT of {@code region} that may offload the data copies of WRITEs ({@link
     * BttRequests#dmaWrites}) and READs ({@link BttRequests#prepareDmaRead}) to {@code engine} (null: CPU only),
     * routed by {@code routing} as on the raw layout. The BTT must be over
     * this region's mapping; the driver owns the engine, as {@link #PmemBlockDriver(PmemRegion, CopyStats,
     * DmaEngine, Routing)} does.
     */
    public static PmemBlockDriver onBtt(PmemRegion region, CopyStats stats, Btt btt, DmaEngine engine, Routing routing) {
        return new PmemBlockDriver(region, stats, engine, routing, new BttRequests(btt, stats));
    }

    private PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing, BttRequests btt) {
        this.region = region;
        this.btt = btt;
        this.size = btt != null ? btt.size() : region.size();
        this.stats = stats;
        this.engine = engine;
        this.routing = routing;
        Arrays.fill(poolIova, -1);
        if (engine != null) {
            this.channels = engine.channels().toArray(new DmaChannel[0]);
            this.regionIova = engine.iovaSpace().map(region.memory());
            engine.onCompletion(this::dmaCompleted);
        } else {
            this.channels = new DmaChannel[0];
            this.regionIova = -1;
        }
        if (btt != null) {
            btt.attach(this, regionIova);
        }
    }

    public PmemRegion region() {
        return region;
    }

    /** The BTT this driver serves (pmem.layout=btt), or null on the raw layout. */
    public Btt btt() {
        return btt == null ? null : btt.btt();
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
        return btt == null ? 1 : btt.btt().blockSize();
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
        return routing;
    }

    public void routing(Routing routing) {
        this.routing = routing;
    }

    /**
     * Sends every data request to one route (null: back to the thresholds).
     * @return false when {@code route} is DMA and there is no engine
     */
    public boolean force(Route route) {
        if (route == Route.DMA && engine == null) {
            return false;
        }
        forced = route;
        return true;
    }

    @Override
    public boolean receivesInPlace(long offset, long length) {
        // After a failed write-back the normal path answers it, with EIO. Never on a BTT: a sector's place in the
        // mapping is known only once its write has taken a free block.
        return btt == null && !region.writeBackFailed() && byCpu(offset, length) && loadable(offset, length);
    }

    /**
     * Whether the kernel may copy into the range: a page it cannot load (truncated file, bad block) would fail
     * the frontend's socket read with EFAULT mid-request and lose the connection. Not loadable: the request takes
     * the buffers' path instead, where the copy fails alone, with EIO.
     */
    private boolean loadable(long offset, long length) {
        try {
            region.probe(offset, length);
            return true;
        } catch (MappingFault f) {
            return false;
        }
    }

    @Override
    public boolean sendsInPlace(long offset, long length) {
        // No probe here: a READ sent from the mapping is probed where it runs (execute), and fails alone with EIO.
        // Never on a BTT: the device's bytes are scattered over its data blocks (sinkReadsDevice is ignored there too).
        return btt == null && byCpu(offset, length);
    }

    /**
     * Whether a READ or WRITE of the range takes the CPU route, which copies straight between the mapping and
     * the frontend's socket or ublk: {@link #routesToDma}, the rule {@link #wantsDma} applies at dispatch, asked
     * before the request is acquired, so it takes buffers only for DMA. False out of bounds: the normal path
     * answers it with the right error.
     */
    private boolean byCpu(long offset, long length) {
        if (offset < 0 || length <= 0 || offset > size || length > size - offset || length > Integer.MAX_VALUE) {
            return false;
        }
        return !routesToDma(length, BufferPool.chunksFor(length), false);
    }

    /**
     * The route of a data request in bounds: forced, or by the thresholds, where a pool-buffer request (not
     * {@code callerMemory}) needs route.dma.bounce as well: the kernel's CPU copy into its buffers is already made.
     */
    private boolean routesToDma(long length, int segments, boolean callerMemory) {
        if (engine == null) {
            return false;
        }
        Route f = forced;
        if (f != null) {
            return f == Route.DMA;
        }
        Routing rule = routing;
        return (callerMemory || rule.bounce()) && rule.toDma(length, segments);
    }

    @Override
    public void receiveInPlace(Request r) {
        region.views(r, state(r).windows(region), r.offset, (int) r.length);
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
    public MemorySegment allocateBuffers(long bytes, java.lang.foreign.Arena owner) {
        return engine == null ? owner.allocate(bytes, 4096) : engine.iovaSpace().allocate(bytes, 4096, owner);
    }

    @Override
    public void attachQueue(HardwareQueue queue) {
        if (engine != null) {
            if (queue.index() >= MAX_QUEUES) {
                throw new IllegalArgumentException("at most " + MAX_QUEUES + " hardware queues with DMA");
            }
            poolIova[queue.index()] = engine.iovaSpace().map(queue.pool().memory());
        }
    }

    @Override
    public int startReaping(int hwq) {
        DmaChannel channel = channels.length == 0 ? null : channels[hwq % channels.length];
        int fd = channel == null ? -1 : channel.completionFd();
        if (fd >= 0) {
            channel.pollers(true);
        }
        return fd;
    }

    @Override
    public int reapCompletions(int hwq) {
        return channels.length == 0 ? 0 : channels[hwq % channels.length].poll();
    }

    @Override
    public void stopReaping(int hwq) {
        if (channels.length > 0) {
            channels[hwq % channels.length].pollers(false);
        }
    }

    /**
     * Every request of the batch is completed exactly once, whatever throws (the contract of
     * {@link BlockDriver#queueRequests}; a request left uncompleted keeps its tag, and shutdown waits for it):
     * a copy the channel cannot take goes to the CPU, a CPU copy that throws answers EIO, and the requests
     * after it still run. An {@link Error} (out of memory, a failed assertion) is logged, its request answered
     * EIO, and it is rethrown once the whole batch is completed and the doorbell rung: the caller learns that
     * something is badly wrong, and no tag is lost on the way.
     */
    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        if (btt != null) {
            queueOnBtt(hwq, batch, count);
            return;
        }
        DmaChannel channel = channels.length == 0 ? null : channels[hwq % channels.length];
        boolean unsubmitted = false; // copies placed since the last doorbell
        Throwable error = null;      // the first Error of the batch
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            int rc = CPU;
            if (channel != null) {
                try {
                    rc = wantsDma(r) ? place(channel, hwq, r) : CPU;
                } catch (Throwable t) { // place() catches what the channel throws: this is the routing itself
                    error = failed(r, "routing", t, error);
                }
            }
            if (rc == PLACED) {
                // The request's count still holds the placer's share, so the request is ours until it is dropped:
                // nothing of it may be read after that.
                PerRequest st = (PerRequest) r.driverData;
                unsubmitted |= st.placed > 0;
                error = firstError(error, st.placeError);
                st.placeError = null;
                if (st.drop(1 + st.count - st.placed) == 0) {
                    error = finishDma(r, st, error); // every placed copy reported already, or none was placed
                }
                continue;
            }
            if (rc == RING_FULL && unsubmitted) {
                // Ring the doorbell for what is already placed, and let the CPU take this one rather than
                // stall the whole batch behind the device.
                error = submit(channel, error);
                unsubmitted = false;
            }
            error = completeByCpu(r, error);
        }
        if (unsubmitted) {
            error = submit(channel, error);
        }
        if (error != null) {
            throw (Error) error;
        }
    }

    /**
     * A batch on the BTT layout: each run of consecutive WRITEs that together cover more than one sector is
     * written in groups ({@link BttRequests#writes}: the BTT's durability round trips paid once per group of
     * sectors, not once per sector); everything else, and a lone one-sector WRITE, is executed alone as before.
     * A run ends at any other request (a READ, TRIM, FLUSH ...), so what the batch orders around it stays
     * ordered. Completion and errors as in {@link #queueRequests}.
     *
     * <p>With an engine, a run of WRITEs the routing rule sends to DMA ({@link #wantsDmaOnBtt}, the raw layout's
     * rule) is written in groups whose data copies are the channel's ({@link BttRequests#dmaWrites}); they
     * complete on its completion thread. A run is of one route: where the route changes, the next run starts.
     */
    private void queueOnBtt(int hwq, Request[] batch, int count) {
        DmaChannel channel = channels.length == 0 ? null : channels[hwq % channels.length];
        Throwable error = null;
        boolean unsubmitted = false; // DMA READs placed since the last doorbell
        int i = 0;
        while (i < count) {
            Request r = batch[i];
            if (channel != null && r.op == Op.READ && wantsDma(r)) {
                int rc = CPU;
                try {
                    rc = placeBttRead(channel, hwq, r);
                } catch (Throwable t) { // not expected (it catches what the BTT and the channel throw): the CPU's
                    error = failed(r, "routing", t, error);
                }
                if (rc == PLACED) {
                    PerRequest st = (PerRequest) r.driverData; // ours until its count is dropped, as in queueRequests
                    unsubmitted |= st.placed > 0;
                    error = firstError(error, st.placeError);
                    st.placeError = null;
                    if (st.drop(1 + st.count - st.placed) == 0) {
                        error = finishDma(r, st, error);
                    }
                    i++;
                    continue;
                }
                if (rc == ZEROS) {
                    stats.count(Route.CPU, false, r.length);
                    r.route = Route.CPU;
                    error = complete(r, Status.OK, error);
                    i++;
                    continue;
                }
            }
            if (unsubmitted) {
                // Whatever comes next may wait: for a lane (held by a writer that waits for a block one of these
                // READs holds), or in a write's read tracking. Their copies must be on their way first.
                error = submit(channel, error);
                unsubmitted = false;
            }
            if (cpuReadOnBtt(channel, r)) {
                // A run of CPU READs on one lane, their map entries loaded ahead together.
                int j = i + 1;
                while (j < count && cpuReadOnBtt(channel, batch[j])) {
                    j++;
                }
                if (j - i > 1) {
                    error = btt.reads(this, batch, i, j, error);
                    i = j;
                    continue;
                }
            }
            if (!groupable(r)) {
                error = completeByCpu(r, error);
                i++;
                continue;
            }
            boolean dma = channel != null && wantsDmaOnBtt(batch[i]);
            int j = i + 1; // the run holds batch[i] whatever the route of the next ones says
            long sectors = batch[i].length / btt.btt().blockSize();
            while (j < count && groupable(batch[j]) && (channel != null && wantsDmaOnBtt(batch[j])) == dma) {
                sectors += batch[j].length / btt.btt().blockSize();
                j++;
            }
            if (dma) {
                error = btt.dmaWrites(batch, i, j, error, channel, poolIova[hwq]);
                i = j;
            } else if (sectors > 1) {
                error = btt.writes(this, batch, i, j, error);
                i = j;
            } else {
                error = completeByCpu(batch[i], error);
                i++;
            }
        }
        if (unsubmitted) {
            error = submit(channel, error);
        }
        if (error != null) {
            throw (Error) error;
        }
    }

    /** {@link #placeBttRead}: every sector the READ touches reads as zeros, and its memory is zeroed already. */
    private static final int ZEROS = 3;

    /**
     * Places a READ on the BTT as {@link #place} places one on raw, its copies those of
     * {@link BttRequests#prepareDmaRead} (each sector's block, held in the BTT's device-read table until the
     * request's copies have all been reported: {@link #finishDma} ends them). CPU: it takes the CPU route, nothing
     * held; RING_FULL: nothing placed, nothing held.
     */
    private int placeBttRead(DmaChannel channel, int hwq, Request r) {
        PerRequest st = state(r);
        int n = btt.prepareDmaRead(r, st, poolIova[hwq], region);
        if (n < 0) {
            return CPU;
        }
        if (n == 0) {
            return ZEROS;
        }
        st.failedStatus = 0;
        st.placed = 0;
        st.placeError = null;
        st.outstanding = n + 1;
        st.count = n;
        try {
            if (!channel.placeAll(st.bttReads(), r)) {
                btt.endDmaRead(st);
                return RING_FULL;
            }
            st.placed = n;
        } catch (Throwable t) {
            st.failedStatus = STATUS_NOT_PLACED; // finishDma ends its device reads and completes it by the CPU
            st.placeError = t instanceof Error ? t : null;
            if (t instanceof Error || faultLogDue()) {
                LOG.log(System.Logger.Level.ERROR, "DMA channel " + channel.index() + " threw placing " + r
                        + "; it is completed by the CPU: " + t, t);
            }
        }
        return PLACED;
    }

    /** Whether a WRITE on the BTT goes to DMA: the raw layout's rule, and sectors whole in its pieces. */
    private boolean wantsDmaOnBtt(Request r) {
        return wantsDma(r) && btt.dmaWritable(r);
    }

    /** The channel threw placing a BTT group (nothing placed; the CPU takes it): logged, once a second unless an Error. */
    Throwable placeFailed(DmaChannel channel, Throwable t, Throwable error) {
        if (t instanceof Error || faultLogDue()) {
            LOG.log(System.Logger.Level.ERROR, "DMA channel " + channel.index() + " threw placing a BTT group's copies;"
                    + " the group is written by the CPU: " + t, t);
        }
        return firstError(error, t);
    }

    /**
     * A copy of a BTT group of {@code sectors} failed with {@code status}: the group's data is stored by the CPU
     * instead. Logged once a second at most (a halt fails every copy behind it), the line built only then.
     */
    void groupCopyFailed(int sectors, int status) {
        if (faultLogDue()) {
            LOG.log(System.Logger.Level.WARNING, "DMA copy of a BTT group of " + sectors + " sectors failed (CHANERR 0x"
                    + Integer.toHexString(status) + "); the group and the copies behind it are stored by the CPU ("
                    + stats.dmaFallbacks() + " so far)");
        }
    }

    /** Whether r is a READ that {@link #execute} would hand to the BTT on the CPU route (no DMA wanted for it). */
    private boolean cpuReadOnBtt(DmaChannel channel, Request r) {
        return r.op == Op.READ && inBounds(r) && (channel == null || !wantsDma(r));
    }

    /**
     * Whether r is a WRITE that {@link #execute} would hand to the BTT whole: in bounds, not empty, of whole
     * sectors, write-back not failed. Anything else takes {@link #completeByCpu}, which answers it as before.
     */
    private boolean groupable(Request r) {
        return r.op == Op.WRITE && r.length > 0 && inBounds(r)
                && ((r.offset | r.length) & (btt.btt().blockSize() - 1)) == 0 && !region.writeBackFailed();
    }

    private boolean wantsDma(Request r) {
        // A request acquired without buffers (in place) stays on the CPU even if the route changed since.
        if (!r.op.carriesData() || r.dataInPlace || !inBounds(r) || (r.op == Op.WRITE && region.writeBackFailed())) {
            return false; // refused writes are answered by execute, before any copy
        }
        int n = r.segments();
        if (n > 0) {
            return routesToDma(r.length, n, false);
        }
        // No pool chunks: caller memory, or a READ sent from the mapping. A zero-length request has no copy that
        // would ever report it; pieces without an iova, or not covering the length, are execute's to answer.
        int pieces = r.iovCount();
        return pieces > 0 && r.iovsReachable() && r.iovBytes() == r.length && routesToDma(r.length, pieces, true);
    }

    /** {@link #place} outcomes; CPU: not offered to the channel at all. */
    private static final int PLACED = 0, RING_FULL = 1, CPU = 2;

    /**
     * Driver-private failure status, beside the channel's CHANERR bits and its CLOSED/ABORTED: the channel threw
     * while this request's copies were being placed (closed, or broken by a halt it could not recover from).
     */
    static final int STATUS_NOT_PLACED = 0x2000_0000;

    /**
     * Places every segment of r (its pool chunks, or its pieces of caller memory: one copy each, which the channel
     * splits at its transfer size) as one unit ({@link DmaChannel#placeAll}: all or none), each copy with r as its
     * context. RING_FULL: there was no room for all of them and nothing was placed. PLACED: the request's count
     * ({@link PerRequest#outstanding}) is one per segment plus one that the caller drops, with the share of the
     * segments not placed because the channel threw ({@link PerRequest#placeError}); whoever drops the count to
     * zero completes the request.
     */
    private int place(DmaChannel channel, int hwq, Request r) {
        int chunks = r.segments();
        int n = chunks > 0 ? chunks : r.iovCount(); // wantsDma: no chunks here means caller memory
        PerRequest st = state(r);
        // Set before the copies are placed: a report (on the completion thread) may come before placeAll returns.
        // Every segment's copy reports to the request, not just the last: the device may halt on any descriptor,
        // failing that copy and every one after it, so some segments may succeed and others fail. The request
        // completes when all have reported, and goes to the CPU if any failed.
        st.failedStatus = 0;
        st.placed = 0;
        st.placeError = null;
        st.outstanding = n + 1;
        st.count = n;
        boolean write = r.op == Op.WRITE;
        DmaChannel.Copies copies = chunks > 0 ? st.copies(r, poolIova[hwq], regionIova + r.offset, write)
                : st.iovCopies(r, regionIova + r.offset, write);
        try {
            if (!channel.placeAll(copies, r)) {
                return RING_FULL;
            }
            st.placed = n;
        } catch (Throwable t) {
            // Nothing was placed (all or none); the request goes to the CPU with the caller's drop.
            st.failedStatus = STATUS_NOT_PLACED;
            st.placeError = t instanceof Error ? t : null;
            if (t instanceof Error || faultLogDue()) {
                LOG.log(System.Logger.Level.ERROR, "DMA channel " + channel.index() + " threw placing " + r
                        + "; it is completed by the CPU: " + t, t);
            }
        }
        return PLACED;
    }

    /**
     * The driver's per-request area ({@link Request#driverData}): made once per tag, reused. It is also the
     * request's list of copies for {@link DmaChannel#placeAll}, so placing allocates nothing.
     */
    static final class PerRequest implements DmaChannel.Copies {
        private static final VarHandle OUTSTANDING;

        static {
            try {
                OUTSTANDING = MethodHandles.lookup().findVarHandle(PerRequest.class, "outstanding", int.class);
            } catch (ReflectiveOperationException e) {
                throw new ExceptionInInitializerError(e);
            }
        }

        /**
         * Segment copies not yet reported by the channel, plus the placer's share while it is still placing;
         * the channel's completion thread and the placer drop it concurrently, so only atomically
         * ({@link #drop}). The first failure's status is written before the writer's drop.
         */
        volatile int outstanding;
        int failedStatus;
        /** The placer's own: the request's copies, those it put in the ring (0 or all: placeAll), and an Error the channel threw at it. */
        int count;
        int placed;
        Throwable placeError;
        private ByteBuffer[] windows;
        /** The copy list of a caller-memory request; made on the tag's first one. */
        private IovCopies iovCopies;

        /**
         * The BTT's grouped writes ({@link BttRequests#writes}, on the dispatching thread; {@link
         * BttRequests#dmaWrites}, also on the completion thread, before its drop of {@link #outstanding}): the
         * first failure of one of the request's sectors, and pieces not covering its length (EINVAL).
         */
        Throwable bttFailure;
        boolean bttInvalid;
        /** The status of a READ run on one lane ({@link BttRequests#reads}), until its completion. */
        int bttStatus;
        /**
         * The BTT's DMA route ({@link BttRequests#dmaWrites}): some sector's group was stored by the CPU after the
         * device failed; sectors placed in groups (each holds a share of {@link #outstanding}); the next request
         * to complete once a group's lanes are given back. Written by the dispatcher and the completion thread,
         * each before its drop of the count, read by whoever drops it to zero.
         */
        boolean bttRedone;
        int bttAdded;
        Request bttNext;
        /** A DMA READ's copies on the BTT; made on the tag's first one. */
        private BttRequests.ReadCopies bttReads;

        BttRequests.ReadCopies bttReads() {
            BttRequests.ReadCopies c = bttReads;
            if (c == null) {
                c = bttReads = new BttRequests.ReadCopies();
            }
            return c;
        }

        private Request request;
        private long poolIova;
        private long deviceIova;
        private boolean write;

        /** Points the copy list at r: its segments in the pool at poolIova, its range at deviceIova. */
        DmaChannel.Copies copies(Request r, long poolIova, long deviceIova, boolean write) {
            this.request = r;
            this.poolIova = poolIova;
            this.deviceIova = deviceIova;
            this.write = write;
            return this;
        }

        /** The copy list of r's pieces of caller memory, its range at deviceIova. */
        DmaChannel.Copies iovCopies(Request r, long deviceIova, boolean write) {
            IovCopies c = iovCopies;
            if (c == null) {
                c = iovCopies = new IovCopies();
            }
            c.request = r;
            c.deviceIova = deviceIova;
            c.write = write;
            return c;
        }

        @Override
        public int count() {
            return request.segments();
        }

        @Override
        public long srcIova(int i) {
            return write ? poolIova + request.segmentPoolOffset(i) : deviceIova + (long) i * BufferPool.CHUNK;
        }

        @Override
        public long dstIova(int i) {
            return write ? deviceIova + (long) i * BufferPool.CHUNK : poolIova + request.segmentPoolOffset(i);
        }

        @Override
        public long length(int i) {
            return request.segmentLength(i);
        }

        /** Drops n shares; returns what is left (0: the caller completes the request). */
        int drop(int n) {
            return (int) OUTSTANDING.getAndAdd(this, -n) - n;
        }

        ByteBuffer[] windows(PmemRegion region) {
            if (windows == null) {
                windows = region.newWindowCache();
            }
            return windows;
        }
    }

    /** One copy per piece of caller memory, straight between the piece's iova and its place in the mapping. */
    static final class IovCopies implements DmaChannel.Copies {
        private Request request;
        private long deviceIova;
        private boolean write;

        @Override
        public int count() {
            return request.iovCount();
        }

        @Override
        public long srcIova(int i) {
            return write ? request.iovIova(i) : deviceIova + request.iovOffset(i);
        }

        @Override
        public long dstIova(int i) {
            return write ? deviceIova + request.iovOffset(i) : request.iovIova(i);
        }

        @Override
        public long length(int i) {
            return request.iovLength(i);
        }
    }

    /** r's {@link PerRequest}, made on its tag's first use and reused after. */
    static PerRequest state(Request r) {
        Object d = r.driverData;
        if (d == null) {
            PerRequest p = new PerRequest();
            r.driverData = p;
            return p;
        }
        return (PerRequest) d;
    }

    /**
     * A segment copy of a request has been reported (channel completion thread). The request completes with the
     * last share of its count. Nothing escapes but an Error, and that only after the request is completed: the
     * channel's thread logs it and goes on.
     */
    private void dmaCompleted(Object ctx, int segmentStatus) {
        if (ctx instanceof BttRequests.Flight f) { // a BTT group's data copy
            Throwable error = f.owner().copied(f, segmentStatus);
            if (error != null) {
                throw (Error) error;
            }
            return;
        }
        Request r = (Request) ctx;
        PerRequest st = (PerRequest) r.driverData;
        if (segmentStatus != 0 && st.failedStatus == 0) {
            st.failedStatus = segmentStatus;
        }
        int left = st.drop(1);
        if (left > 0) {
            return;
        }
        if (left < 0) {
            // More reports than copies placed: completing again would complete someone else's request.
            LOG.log(System.Logger.Level.ERROR, "DMA channel reported a copy of " + r + " more often than it was placed;"
                    + " ignored");
            return;
        }
        Throwable error = finishDma(r, st, null);
        if (error != null) {
            throw (Error) error;
        }
    }

    /** Completes a request whose copies have all been reported: by DMA if they all succeeded, else by the CPU. */
    private Throwable finishDma(Request r, PerRequest st, Throwable error) {
        if (btt != null) {
            return finishBttRead(r, st, error); // a READ (the BTT's writes finish in BttRequests)
        }
        int status = st.failedStatus;
        if (status == 0) {
            int result = Status.OK;
            boolean write = r.op == Op.WRITE;
            try {
                if (write) {
                    if (region.writeBackFailed()) {
                        // placed before the failure, landed after it: refused like those the CPU refuses
                        region.countRefused();
                        return complete(r, Status.EIO, error);
                    }
                    region.deviceWrote(r.offset, r.length, r.fua);
                }
                stats.count(Route.DMA, write, r.length);
                r.route = Route.DMA;
            } catch (WriteBackFailedException e) {
                region.countRefused();
                result = Status.EIO; // the region has said why, once
            } catch (Throwable t) {
                error = failed(r, "persisting its DMA write", t, error);
                result = Status.EIO;
            }
            return complete(r, result, error);
        }
        if (!cpuMayRedo(r, status)) {
            return complete(r, Status.EIO, error);
        }
        return completeByCpu(r, error);
    }

    /**
     * After r's copies failed with {@code status}: whether the CPU may do them instead (counted and logged as a
     * fallback), or, false, r must answer EIO because its caller memory left the IOVA space under it (unregistered
     * before its requests were released): the owner is giving it back, so the CPU must not copy into or out of it
     * either. Logged once a second at most: a halt fails every copy behind it.
     */
    private boolean cpuMayRedo(Request r, int status) {
        stats.dmaError();
        if (r.callerMemory() && !stillMapped(r)) {
            if (faultLogDue()) {
                LOG.log(System.Logger.Level.ERROR, "DMA copy of " + r + " failed (CHANERR 0x" + Integer.toHexString(status)
                        + "): its caller memory is no longer registered for DMA (unregisterMemory comes after the"
                        + " region's requests are released); answered EIO");
            }
            return false;
        }
        stats.dmaFallback();
        if (status != STATUS_NOT_PLACED && faultLogDue()) {
            LOG.log(System.Logger.Level.WARNING, "DMA copy of " + r + " failed (CHANERR 0x" + Integer.toHexString(status)
                    + "); it and the copies behind it are completed by the CPU (" + stats.dmaFallbacks() + " so far)");
        }
        return true;
    }

    /**
     * Completes a READ on the BTT whose copies have all been reported: by DMA if they all succeeded, else by the CPU
     * from the same blocks, still held ({@link BttRequests#readHeldByCpu}: not {@link #completeByCpu}, whose
     * execution claims a lane, which this thread, the channel's completion thread, must never wait for). Then the
     * blocks are let go.
     */
    private Throwable finishBttRead(Request r, PerRequest st, Throwable error) {
        int status = st.failedStatus;
        if (status == 0) {
            btt.endDmaRead(st); // before the completion: the tag's state may serve its next request right after
            stats.count(Route.DMA, false, r.length);
            r.route = Route.DMA;
            return complete(r, Status.OK, error);
        }
        if (!cpuMayRedo(r, status)) {
            btt.endDmaRead(st);
            return complete(r, Status.EIO, error);
        }
        Throwable failed = null;
        try {
            btt.readHeldByCpu(st, region);
        } catch (Throwable t) {
            failed = t;
        } finally {
            btt.endDmaRead(st);
        }
        if (failed != null) {
            return completeFailed(r, failed, error);
        }
        stats.count(Route.CPU, false, r.length);
        r.route = Route.CPU;
        return complete(r, Status.OK, error);
    }

    /**
     * The mapping could not be accessed for r (truncated file, bad block, machine check): r answers EIO and the
     * driver goes on. One line per second at most, with the offset; the count is a metric.
     */
    private void mappingFault(Request r, MappingFault f) {
        stats.mappingFault();
        long now = System.nanoTime();
        long last = lastMappingFaultLog;
        if (now - last > 1_000_000_000L) {
            lastMappingFaultLog = now;
            long total = stats.mappingFaults();
            LOG.log(System.Logger.Level.ERROR, r.op + " at offset " + r.offset + " answered EIO: " + f.getMessage()
                    + " (" + total + " mapping faults so far, " + (total - faultsAtLastLog - 1) + " not logged since the"
                    + " last line); if the backing file was truncated, stop the server and restore it; if the pmem has"
                    + " bad blocks, `ndctl list --media-errors` shows them");
            faultsAtLastLog = total;
        }
    }

    private volatile long lastMappingFaultLog = System.nanoTime() - 2_000_000_000L;

    /**
     * r's own memory faulted under its copy (a frontend's buffer taken away: a vhost-user front end truncated its
     * guest RAM): r answers EIO, the pmem file is not at fault and the driver goes on. One line per second at most.
     */
    private void callerMemoryFault(Request r, CallerMemoryFault f) {
        long now = System.nanoTime();
        if (now - lastCallerFaultLog > 1_000_000_000L) {
            lastCallerFaultLog = now;
            LOG.log(System.Logger.Level.ERROR, r + " answered EIO: " + f.getMessage() + "; the pmem file is intact;"
                    + " the frontend that owns this memory took it away while the request used it");
        }
    }

    private volatile long lastCallerFaultLog = System.nanoTime() - 2_000_000_000L;
    private volatile long faultsAtLastLog;

    private boolean faultLogDue() {
        long now = System.nanoTime();
        if (now - lastFaultLog > 1_000_000_000L) {
            lastFaultLog = now;
            return true;
        }
        return false;
    }

    /** Whether every piece of r's caller memory still translates in the engine's IOVA space (a failure path only). */
    private boolean stillMapped(Request r) {
        IovaSpace space = engine.iovaSpace();
        for (int i = 0, n = r.iovCount(); i < n; i++) {
            try {
                space.translate(r.iovIova(i), r.iovLength(i));
            } catch (IovaFault f) {
                return false;
            }
        }
        return true;
    }

    private boolean inBounds(Request r) {
        long off = r.offset;
        long len = r.length;
        return off >= 0 && len >= 0 && off <= size && len <= size - off;
    }

    /** Executes r by the CPU and completes it: EIO when that throws. */
    private Throwable completeByCpu(Request r, Throwable error) {
        int status;
        try {
            status = execute(r);
        } catch (Throwable t) {
            return completeFailed(r, t, error);
        }
        return complete(r, status, error);
    }

    /**
     * Completes r with EIO for {@code t}, what executing it threw: logged as its kind asks (the BTT's grouped
     * writes answer their failures here too, as they would have been answered executed alone).
     */
    Throwable completeFailed(Request r, Throwable t, Throwable error) {
        if (t instanceof WriteBackFailedException) {
            region.countRefused(); // the region has said why, once: one line, not one per request
        } else if (t instanceof MappingFault f) {
            mappingFault(r, f);
        } else if (t instanceof CallerMemoryFault f) {
            callerMemoryFault(r, f);
        } else {
            error = failed(r, "failed", t, error);
        }
        return complete(r, Status.EIO, error);
    }

    /**
     * Completes r once. What the completion throws (the frontend's callback, or a second completion the request
     * refuses) is logged and never retried: the request's state has moved on, and calling again would run the
     * frontend's completion twice.
     */
    static Throwable complete(Request r, int status, Throwable error) {
        try {
            r.complete(status);
            return error;
        } catch (Throwable t) {
            LOG.log(System.Logger.Level.ERROR, "completing " + r + " threw: " + t, t);
            return firstError(error, t);
        }
    }

    /** Rings {@code channel}'s doorbell; what it throws is logged, and kept if an Error (the BTT's groups ring it too). */
    Throwable submit(DmaChannel channel, Throwable error) {
        try {
            channel.submit();
            return error;
        } catch (Throwable t) {
            // The placed copies stay reported by the channel: at the next doorbell, or as closed when it closes.
            LOG.log(System.Logger.Level.ERROR, "ringing DMA channel " + channel.index() + "'s doorbell threw: " + t, t);
            return firstError(error, t);
        }
    }

    /** Logs what r's execution threw; keeps the first Error (the rest answer EIO and are done with). */
    private static Throwable failed(Request r, String what, Throwable t, Throwable error) {
        LOG.log(System.Logger.Level.ERROR, "request " + r + " " + what + ": " + t, t);
        return firstError(error, t);
    }

    private static Throwable firstError(Throwable first, Throwable t) {
        return first != null || !(t instanceof Error) ? first : t;
    }

    private int execute(Request r) throws IOException {
        Op op = r.op;
        if (op == Op.FLUSH) {
            region.persistAll();
            return Status.OK;
        }
        if (!inBounds(r)) {
            return op == Op.WRITE || op == Op.WRITE_ZEROES ? Status.ENOSPC : Status.EINVAL;
        }
        long off = r.offset;
        long len = r.length;
        if (op != Op.READ && op != Op.CACHE && region.writeBackFailed()) {
            // Stored now, the bytes could never be made durable (the failed pages are clean to the kernel):
            // refused before they reach the mapping. A payload the kernel received in place has landed already,
            // as a write answered with an error may have.
            region.countRefused();
            return Status.EIO;
        }
        if (btt != null) {
            // CACHE: nothing to prefetch there either; the rest sector by sector, each write durable on return (FUA)
            return op == Op.CACHE ? Status.OK : btt.execute(r);
        }
        switch (op) {
            case READ -> {
                if (r.sinkReadsDevice) {
                    // The frontend's gathering write copies straight out of the mapping: the CPU route's copy
                    // is the kernel's copy into the socket, and no second copy through the buffers is made.
                    // Probed first: the kernel would answer a missing page with EFAULT, mid-reply.
                    region.probe(off, len);
                    region.views(r, state(r).windows(region), off, (int) len);
                } else if (!copyOut(r)) {
                    return Status.EINVAL;
                }
                stats.count(Route.CPU, false, len);
                r.route = Route.CPU;
            }
            case WRITE -> {
                if (r.dataInPlace) {
                    // received straight into the mapping by the kernel: cache lines to write back on real
                    // pmem (as for a device's writes), dirty pages elsewhere
                    region.deviceWrote(off, len, r.fua);
                } else {
                    if (!copyIn(r)) {
                        return Status.EINVAL;
                    }
                    if (r.fua) {
                        region.persistWritten(off, len);
                    }
                }
                stats.count(Route.CPU, true, len);
                r.route = Route.CPU;
            }
            case TRIM, WRITE_ZEROES -> {
                // TRIM leaves the range reading as zeroes: deterministic for every client, and what
                // nbdkit's memory plugin does too.
                region.zero(off, len);
                if (r.fua) {
                    region.persistWritten(off, len);
                }
            }
            case CACHE -> { } // the mapping is already memory: nothing to prefetch
            default -> {
                return Status.EINVAL;
            }
        }
        return Status.OK;
    }

    /**
     * Stores a WRITE's data from its pool chunks, or from its pieces of caller memory, into the mapping; false
     * (nothing stored) when its pieces do not cover its length.
     */
    private boolean copyIn(Request r) {
        int n = r.segments();
        if (n == 0) {
            return copyPieces(r, true); // caller memory, or no data at all
        }
        MemorySegment pool = r.queue().pool().memory();
        long dst = r.offset;
        for (int s = 0; s < n; s++) {
            int len = r.segmentLength(s);
            region.write(pool, r.segmentPoolOffset(s), dst, len);
            dst += len;
        }
        return true;
    }

    /** Loads a READ's data into its pool chunks or its pieces of caller memory; false as {@link #copyIn}. */
    private boolean copyOut(Request r) {
        int n = r.segments();
        if (n == 0) {
            return copyPieces(r, false);
        }
        MemorySegment pool = r.queue().pool().memory();
        long src = r.offset;
        for (int s = 0; s < n; s++) {
            int len = r.segmentLength(s);
            region.read(src, pool, r.segmentPoolOffset(s), len);
            src += len;
        }
        return true;
    }

    /**
     * Copies between r's pieces of caller memory and the mapping (into the mapping for a WRITE), the pieces
     * together ({@link PmemRegion#writePieces}); false, copying nothing, when they do not cover the request's length.
     */
    private boolean copyPieces(Request r, boolean write) {
        if (r.iovBytes() != r.length) {
            return false;
        }
        if (write) {
            region.writePieces(r);
        } else {
            region.readPieces(r);
        }
        return true;
    }

    /**
     * After the engine's close: every copy is reported, but the last group's flog and map steps may still run on a
     * completion thread the channel's close stopped waiting for. The mapping must outlive them.
     */
    private void awaitBttGroups() throws IOException {
        try {
            if (!btt.awaitGroups(30_000)) {
                LOG.log(System.Logger.Level.ERROR, "BTT groups written by DMA were still committing 30 s after the"
                        + " engine closed; unmapping anyway (the next open finishes a swap whose flog entry is"
                        + " durable)");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while BTT groups written by DMA were committing", e);
        }
    }

    /** CPU time of the DMA engine's own threads so far (the software device's engines), 0 without one. */
    public long engineCpuNanos() {
        return engine == null ? 0 : engine.softDevice().map(d -> d.engineCpuTimeNanos()).orElse(0L);
    }

    @Override
    public void persistAll() throws IOException {
        region.persistAll();
    }

    /**
     * Closes the DMA engine (its copies drain or fall back to the CPU; on the BTT every group in flight commits),
     * then persists and unmaps the region.
     */
    @Override
    public void close() throws IOException {
        try {
            if (engine != null) {
                engine.close();
                if (btt != null) {
                    awaitBttGroups();
                }
                IovaSpace space = engine.iovaSpace();
                synchronized (registered) {
                    for (Registered r : registered.values()) { // a frontend that never withdrew its memory
                        space.unmap(r.iova());
                    }
                    registered.clear();
                }
                for (long iova : poolIova) {
                    if (iova >= 0) {
                        space.unmap(iova);
                    }
                }
                space.unmap(regionIova);
            }
        } finally {
            region.close();
        }
    }
}
