package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

import java.lang.System.Logger.Level;
import java.util.Arrays;

/**
 * The DMA route, shared by both layouts: the region and each queue's buffer pool in the engine's IOVA space,
 * a request's copies placed as one unit, its reports counted down to its completion, the CPU's redo of what the
 * device failed, and the doorbell. Queue i uses channel i mod channels, so queues do not share a ring unless
 * there are fewer channels than queues. Without an engine there are no channels and nothing is mapped.
 */
final class DmaRoute {
    private static final System.Logger LOG = Completions.LOG;
    static final int MAX_QUEUES = 4096;

    /** {@link #place} outcomes; CPU: not offered to the channel at all. */
    static final int PLACED = 0, RING_FULL = 1, CPU = 2;

    /**
     * Driver-private failure status, beside the channel's CHANERR bits and its CLOSED/ABORTED: the channel threw
     * while this request's copies were being placed (closed, or broken by a halt it could not recover from).
     */
    static final int STATUS_NOT_PLACED = 0x2000_0000;

    private final DmaEngine engine;
    private final DmaChannel[] channels;
    private final long regionIova;
    private final long[] poolIova = new long[MAX_QUEUES];
    /** Whether the region is still in the engine's IOVA space ({@link #unmapAll} withdraws it once). */
    private boolean regionMapped;
    private final CopyStats stats;
    private final Completions completions;

    /** The route over {@code engine} (null: none, all by the CPU), the region mapped in its IOVA space now. */
    DmaRoute(DmaEngine engine, PmemRegion region, CopyStats stats, Completions completions) {
        this.engine = engine;
        this.stats = stats;
        this.completions = completions;
        Arrays.fill(poolIova, -1);
        if (engine != null) {
            this.channels = engine.channels().toArray(new DmaChannel[0]);
            this.regionIova = engine.iovaSpace().map(region.memory());
            this.regionMapped = true;
        } else {
            this.channels = new DmaChannel[0];
            this.regionIova = -1;
        }
    }

    /** Queue hwq's channel, or null without an engine. */
    DmaChannel channel(int hwq) {
        return channels.length == 0 ? null : channels[hwq % channels.length];
    }

    /**
     * Makes the calling thread a reaper of queue hwq's channel ({@link io.pmemblk.queueing.BlockDriver#startReaping}):
     * the channel's pollers are on, and its completion eventfd is returned (-1: no engine, or a channel whose
     * completions come only on its own thread).
     */
    int startReaping(int hwq) {
        DmaChannel channel = channel(hwq);
        int fd = channel == null ? -1 : channel.completionFd();
        if (fd >= 0) {
            channel.pollers(true);
        }
        return fd;
    }

    /** Reports queue hwq's channel's finished copies on the calling thread; how many. */
    int reapCompletions(int hwq) {
        DmaChannel channel = channel(hwq);
        return channel == null ? 0 : channel.poll();
    }

    /** The reaper of queue hwq's channel stops being one. */
    void stopReaping(int hwq) {
        DmaChannel channel = channel(hwq);
        if (channel != null) {
            channel.pollers(false);
        }
    }

    /** The region mapping's address in the engine's IOVA space (-1: no engine). */
    long regionIova() {
        return regionIova;
    }

    /** Queue hwq's buffer pool in the engine's IOVA space. */
    long poolIova(int hwq) {
        return poolIova[hwq];
    }

    /** Maps the queue's buffer pool into the engine's IOVA space: once, never per request. */
    void attachQueue(HardwareQueue queue) {
        if (engine != null) {
            if (queue.index() >= MAX_QUEUES) {
                throw new IllegalArgumentException("at most " + MAX_QUEUES + " hardware queues with DMA");
            }
            poolIova[queue.index()] = engine.iovaSpace().map(queue.pool().memory());
        }
    }

    /**
     * After the engine's close: the pools and the region leave its IOVA space, once. Each mapping is forgotten as
     * it is withdrawn, so a second close of the driver (or one after a close that threw half way) withdraws only
     * what is still mapped: the space refuses an IOVA it no longer holds.
     */
    synchronized void unmapAll(IovaSpace space) {
        for (int q = 0; q < poolIova.length; q++) {
            if (poolIova[q] >= 0) {
                space.unmap(poolIova[q]);
                poolIova[q] = -1;
            }
        }
        if (regionMapped) {
            space.unmap(regionIova);
            regionMapped = false;
        }
    }

    /**
     * Places every segment of r (its pool chunks, or its pieces of caller memory: one copy each, which the channel
     * splits at its transfer size) as one unit ({@link DmaChannel#placeAll}: all or none), each copy with r as its
     * context. RING_FULL: there was no room for all of them and nothing was placed. PLACED: the request's count
     * ({@link PerRequest#outstanding}) is one per segment plus one that the caller drops, with the share of the
     * segments not placed because the channel threw ({@link PerRequest#placeError}); whoever drops the count to
     * zero completes the request.
     */
    int place(DmaChannel channel, int hwq, Request r) {
        int chunks = r.segments();
        int n = chunks > 0 ? chunks : r.iovCount(); // wantsDma: no chunks here means caller memory
        PerRequest st = PerRequest.of(r);
        // Every segment's copy reports to the request, not just the last: the device may halt on any descriptor,
        // failing that copy and every one after it, so some segments may succeed and others fail. The request
        // completes when all have reported, and goes to the CPU if any failed.
        st.beginCopies(n);
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
            notPlaced(channel, r, st, t);
        }
        return PLACED;
    }

    /**
     * The channel threw placing r's copies (nothing placed: all or none): r is completed by the CPU once the
     * caller drops its share; an Error goes back to the caller with it. Logged once a second unless an Error.
     */
    void notPlaced(DmaChannel channel, Request r, PerRequest st, Throwable t) {
        st.failedStatus = STATUS_NOT_PLACED;
        st.placeError = t instanceof Error ? t : null;
        if (t instanceof Error || completions.faults().due()) {
            completions.faults().write(Level.ERROR, "DMA channel " + channel.index() + " threw placing " + r
                    + "; it is completed by the CPU: " + t, t);
        }
    }

    /**
     * {@code copies} segment copies of r have been reported (channel completion thread): true when they were the
     * last shares of its count, and the caller finishes r.
     */
    boolean reported(Request r, int segmentStatus, int copies) {
        PerRequest st = (PerRequest) r.driverData;
        if (segmentStatus != 0 && st.failedStatus == 0) {
            st.failedStatus = segmentStatus;
        }
        int left = st.drop(copies);
        if (left > 0) {
            return false;
        }
        if (left < 0) {
            // More reports than copies placed: completing again would complete someone else's request.
            LOG.log(System.Logger.Level.ERROR, "DMA channel reported a copy of " + r + " more often than it was placed;"
                    + " ignored");
            return false;
        }
        return true;
    }

    /**
     * After r's copies failed with {@code status}: whether the CPU may do them instead (counted and logged as a
     * fallback), or, false, r must answer EIO because its caller memory left the IOVA space under it (unregistered
     * before its requests were released): the owner is giving it back, so the CPU must not copy into or out of it
     * either. Logged once a second at most: a halt fails every copy behind it.
     */
    boolean cpuMayRedo(Request r, int status) {
        stats.dmaError();
        if (r.callerMemory() && !stillMapped(r)) {
            if (completions.faults().due()) {
                completions.faults().write(Level.ERROR, "DMA copy of " + r + " failed (CHANERR 0x"
                        + Integer.toHexString(status) + "): its caller memory is no longer registered for DMA"
                        + " (unregisterMemory comes after the region's requests are released); answered EIO", null);
            }
            return false;
        }
        stats.dmaFallback();
        if (status != STATUS_NOT_PLACED && completions.faults().due()) {
            completions.faults().write(Level.WARNING, "DMA copy of " + r + " failed (CHANERR 0x"
                    + Integer.toHexString(status) + "); it and the copies behind it are completed by the CPU ("
                    + stats.dmaFallbacks() + " so far)", null);
        }
        return true;
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

    /** Rings {@code channel}'s doorbell; what it throws is logged, and kept if an Error (the BTT's groups ring it too). */
    Throwable submit(DmaChannel channel, Throwable error) {
        try {
            channel.submit();
            return error;
        } catch (Throwable t) {
            // The placed copies stay reported by the channel: at the next doorbell, or as closed when it closes.
            LOG.log(System.Logger.Level.ERROR, "ringing DMA channel " + channel.index() + "'s doorbell threw: " + t, t);
            return Completions.firstError(error, t);
        }
    }
}
