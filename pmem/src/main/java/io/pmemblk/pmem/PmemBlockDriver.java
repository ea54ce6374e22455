package io.pmemblk.pmem;

import io.pmemblk.block.BlockDriver;
import io.pmemblk.block.BufferPool;
import io.pmemblk.block.HardwareQueue;
import io.pmemblk.block.Op;
import io.pmemblk.block.Request;
import io.pmemblk.block.Route;
import io.pmemblk.block.Status;
import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.Arrays;

/**
 * The pmem block driver: executes block requests against a {@link PmemRegion}, copying each request's data
 * by CPU or by a DMA channel ({@link Routing}). Every request is bounds-checked here (frontends' checks are
 * not trusted) and completed exactly once.
 *
 * <p>Batches: all DMA copies of a batch are placed in the channel's ring and the doorbell is rung once at the
 * end (seed 004). Queue i uses channel i mod channels, so queues do not share a ring unless there are fewer
 * channels than queues. The CPU requests of a batch complete inline; DMA requests complete on the channel's
 * completion thread.
 *
 * <p>Durability: a WRITE/TRIM/WRITE_ZEROES with FUA is persistent before it completes; a FLUSH makes every
 * write completed before it, on any queue and by either route, persistent. A DMA write is made persistent
 * by the CPU after the device reports it ({@link PmemRegion#deviceWrote}): with DDIO the device's writes sit
 * in the CPU cache until flushed.
 *
 * <p>Faults: a copy the channel reports failed (a halt: its descriptor and every one placed after it) is
 * done again by the CPU before the request completes, so nothing is lost; the same bytes are copied again,
 * which a reader cannot tell from one copy.
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
    private volatile Routing routing;
    /** Forced route for benchmarks and the tuner; null = by {@link #routing}. */
    private volatile Route forced;
    private volatile long lastFaultLog = System.nanoTime() - 2_000_000_000L;

    /** A CPU-only driver. */
    public PmemBlockDriver(PmemRegion region, CopyStats stats) {
        this(region, stats, null, Routing.CPU_ONLY);
    }

    /**
     * A driver that may offload copies to {@code engine} (null: CPU only). The region is registered in the
     * engine's IOVA space now, each queue's buffer pool when the queue attaches: once, never per request
     * (seed 003). The driver owns the engine from here on and closes it before the region.
     */
    public PmemBlockDriver(PmemRegion region, CopyStats stats, DmaEngine engine, Routing routing) {
        this.region = region;
        this.size = region.size();
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
    }

    public PmemRegion region() {
        return region;
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
        if (offset < 0 || length <= 0 || offset > size || length > size - offset || length > Integer.MAX_VALUE) {
            return false; // the normal path answers it with the right error
        }
        if (engine == null) {
            return true;
        }
        Route f = forced;
        if (f != null) {
            return f == Route.CPU;
        }
        Routing rt = routing;
        return length < rt.minBytes() && BufferPool.chunksFor(length) < rt.minSegments();
    }

    @Override
    public void receiveInPlace(Request r) {
        region.views(r, state(r).windows(region), r.offset, (int) r.length);
        r.dataInPlace = true;
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
    public void queueRequests(int hwq, Request[] batch, int count) {
        DmaChannel channel = channels.length == 0 ? null : channels[hwq % channels.length];
        boolean placed = false;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (channel != null && r.op.carriesData() && !r.dataInPlace && inBounds(r) && wantsDma(r)) {
                int rc = place(channel, hwq, r);
                if (rc == PLACED) {
                    placed = true;
                    continue;
                }
                if (rc == RING_FULL && placed) {
                    // Ring the doorbell for what is already placed, and let the CPU take this one rather than
                    // stall the whole batch behind the device.
                    channel.submit();
                    placed = false;
                }
            }
            r.complete(executeByCpu(r));
        }
        if (placed) {
            channel.submit();
        }
    }

    private boolean wantsDma(Request r) {
        Route f = forced;
        return f != null ? f == Route.DMA : routing.toDma(r);
    }

    private static final int PLACED = 0, RING_FULL = 1;

    /** Places every segment of r as one unit (all or none), the request itself as the last copy's context. */
    private int place(DmaChannel channel, int hwq, Request r) {
        int n = r.segments();
        long pool = poolIova[hwq];
        boolean write = r.op == Op.WRITE;
        synchronized (channel) {
            int need = 0;
            for (int s = 0; s < n; s++) {
                need += channel.slotsFor(r.segmentLength(s));
            }
            if (need > channel.freeSlots()) {
                return RING_FULL;
            }
            long dev = regionIova + r.offset;
            // Every segment's copy reports to the request, not just the last: a halt can fall between two
            // place() calls (the channel recovers and re-arms there), failing the first segments while the
            // later ones, placed after the re-arm, succeed. The request completes when all have reported,
            // and goes to the CPU if any failed.
            PerRequest st = state(r);
            st.outstanding = n;
            st.failedStatus = 0;
            for (int s = 0; s < n; s++) {
                int len = r.segmentLength(s);
                long buf = pool + r.segmentPoolOffset(s);
                boolean ok = write ? channel.place(buf, dev, len, r) : channel.place(dev, buf, len, r);
                if (!ok) {
                    // freeSlots() said there was room and only this monitor's holders place on this channel
                    throw new IllegalStateException("DMA ring refused a copy after reporting room for it");
                }
                dev += len;
            }
        }
        return PLACED;
    }

    /** The driver's per-request area ({@link Request#driverData}): made once per tag, reused. */
    static final class PerRequest {
        /** Segment copies not yet reported by the channel; the first failure's status. */
        int outstanding;
        int failedStatus;
        private ByteBuffer[] windows;

        ByteBuffer[] windows(PmemRegion region) {
            if (windows == null) {
                windows = region.newWindowCache();
            }
            return windows;
        }
    }

    private static PerRequest state(Request r) {
        Object d = r.driverData;
        if (d == null) {
            PerRequest p = new PerRequest();
            r.driverData = p;
            return p;
        }
        return (PerRequest) d;
    }

    /**
     * A segment copy of a request has been reported (channel completion thread; the reports of one request are
     * serialised by its channel). The request completes with the last one.
     */
    private void dmaCompleted(Object ctx, int segmentStatus) {
        Request r = (Request) ctx;
        PerRequest st = state(r);
        if (segmentStatus != 0 && st.failedStatus == 0) {
            st.failedStatus = segmentStatus;
        }
        if (--st.outstanding > 0) {
            return;
        }
        int status = st.failedStatus;
        if (status == 0) {
            int result = Status.OK;
            boolean write = r.op == Op.WRITE;
            if (write) {
                try {
                    region.deviceWrote(r.offset, r.length, r.fua);
                } catch (IOException | RuntimeException e) {
                    LOG.log(System.Logger.Level.ERROR, "persisting DMA write " + r + " failed: " + e.getMessage(), e);
                    result = Status.EIO;
                }
            }
            stats.count(Route.DMA, write, r.length);
            r.route = Route.DMA;
            r.complete(result);
            return;
        }
        stats.dmaError();
        stats.dmaFallback();
        // A halt fails every copy behind it: one line per second, not one per request.
        long now = System.nanoTime();
        if (now - lastFaultLog > 1_000_000_000L) {
            lastFaultLog = now;
            LOG.log(System.Logger.Level.WARNING, "DMA copy of " + r + " failed (CHANERR 0x" + Integer.toHexString(status)
                    + "); it and the copies behind it are completed by the CPU (" + stats.dmaFallbacks() + " so far)");
        }
        r.complete(executeByCpu(r));
    }

    private boolean inBounds(Request r) {
        long off = r.offset;
        long len = r.length;
        return off >= 0 && len >= 0 && off <= size && len <= size - off;
    }

    private int executeByCpu(Request r) {
        try {
            return execute(r);
        } catch (IOException | RuntimeException e) {
            LOG.log(System.Logger.Level.ERROR, "request " + r + " failed: " + e.getMessage(), e);
            return Status.EIO;
        }
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
        switch (op) {
            case READ -> {
                if (r.sinkReadsDevice) {
                    // The frontend's gathering write copies straight out of the mapping: the CPU route's copy
                    // is the kernel's copy into the socket, and no second copy through the buffers is made.
                    region.views(r, state(r).windows(region), off, (int) len);
                } else {
                    copyOut(r);
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
                    copyIn(r);
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

    private void copyIn(Request r) {
        MemorySegment pool = r.queue().pool().memory();
        long dst = r.offset;
        for (int s = 0, n = r.segments(); s < n; s++) {
            int len = r.segmentLength(s);
            region.write(pool, r.segmentPoolOffset(s), dst, len);
            dst += len;
        }
    }

    private void copyOut(Request r) {
        MemorySegment pool = r.queue().pool().memory();
        long src = r.offset;
        for (int s = 0, n = r.segments(); s < n; s++) {
            int len = r.segmentLength(s);
            region.read(src, pool, r.segmentPoolOffset(s), len);
            src += len;
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

    /** Closes the DMA engine (its copies drain or fall back to the CPU), then persists and unmaps the region. */
    @Override
    public void close() throws IOException {
        try {
            if (engine != null) {
                engine.close();
                IovaSpace space = engine.iovaSpace();
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
