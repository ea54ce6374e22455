package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * The raw layout: the device's bytes are the mapping's, each request one range of it. A request goes by the CPU
 * (copied, or received and sent in place by the frontend) or by the DMA route, as {@link Router} says.
 */
final class RawExecutor implements Executor {
    private final PmemRegion region;
    private final DeviceViews views;
    private final CopyStats stats;
    private final Router router;
    private final DmaRoute dma;
    private final Completions completions;

    RawExecutor(PmemRegion region, DeviceViews views, CopyStats stats, Router router, DmaRoute dma,
                Completions completions) {
        this.region = region;
        this.views = views;
        this.stats = stats;
        this.router = router;
        this.dma = dma;
        this.completions = completions;
    }

    /**
     * Every request of the batch is completed exactly once, whatever throws (the contract of
     * {@link io.pmemblk.queueing.BlockDriver#queueRequests}; a request left uncompleted keeps its tag, and shutdown
     * waits for it): a copy the channel cannot take goes to the CPU, a CPU copy that throws answers EIO, and the
     * requests after it still run. An {@link Error} (out of memory, a failed assertion) is logged, its request
     * answered EIO, and it is rethrown once the whole batch is completed and the doorbell rung: the caller learns
     * that something is badly wrong, and no tag is lost on the way.
     */
    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        DmaChannel channel = dma.channel(hwq);
        boolean unsubmitted = false; // copies placed since the last doorbell
        Throwable error = null;      // the first Error of the batch
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            int rc = DmaRoute.CPU;
            if (channel != null) {
                try {
                    rc = router.wantsDma(r) ? dma.place(channel, hwq, r) : DmaRoute.CPU;
                } catch (Throwable t) { // place() catches what the channel throws: this is the routing itself
                    error = Completions.failed(r, "routing", t, error);
                }
            }
            if (rc == DmaRoute.PLACED) {
                // The request's count still holds the placer's share, so the request is ours until it is dropped:
                // nothing of it may be read after that.
                PerRequest st = (PerRequest) r.driverData;
                unsubmitted |= st.placed > 0;
                error = Completions.firstError(error, st.placeError);
                st.placeError = null;
                if (st.drop(1 + st.count - st.placed) == 0) {
                    error = finishDma(r, st, error); // every placed copy reported already, or none was placed
                }
                continue;
            }
            if (rc == DmaRoute.RING_FULL && unsubmitted) {
                // Ring the doorbell for what is already placed, and let the CPU take this one rather than
                // stall the whole batch behind the device.
                error = dma.submit(channel, error);
                unsubmitted = false;
            }
            error = completions.completeByCpu(r, this, error);
        }
        if (unsubmitted) {
            error = dma.submit(channel, error);
        }
        if (error != null) {
            throw (Error) error;
        }
    }

    @Override
    public void dmaCompleted(Object ctx, int segmentStatus, int copies) {
        Request r = (Request) ctx;
        if (!dma.reported(r, segmentStatus, copies)) {
            return;
        }
        Throwable error = finishDma(r, (PerRequest) r.driverData, null);
        if (error != null) {
            throw (Error) error;
        }
    }

    /** Nothing: a request's completion is its last report's, which the engine's close has made. */
    @Override
    public void engineClosed() {
    }

    /** Completes a request whose copies have all been reported: by DMA if they all succeeded, else by the CPU. */
    private Throwable finishDma(Request r, PerRequest st, Throwable error) {
        int status = st.failedStatus;
        if (status == 0) {
            int result = Status.OK;
            boolean write = r.op == Op.WRITE;
            try {
                if (write) {
                    if (region.writeBack().writeBackFailed()) {
                        // placed before the failure, landed after it: refused like those the CPU refuses
                        region.writeBack().countRefused();
                        return Completions.complete(r, Status.EIO, error);
                    }
                    region.writeBack().deviceWrote(r.offset, r.length, r.fua);
                }
                stats.count(Route.DMA, write, r.length);
                r.route = Route.DMA;
            } catch (WriteBackFailedException e) {
                region.writeBack().countRefused();
                result = Status.EIO; // the region has said why, once
            } catch (Throwable t) {
                error = Completions.failed(r, "persisting its DMA write", t, error);
                result = Status.EIO;
            }
            return Completions.complete(r, result, error);
        }
        if (!dma.cpuMayRedo(r, status)) {
            return Completions.complete(r, Status.EIO, error);
        }
        return completions.completeByCpu(r, this, error);
    }

    @Override
    public int execute(Request r) throws IOException {
        int answer = router.answerAtOnce(r);
        if (answer != Router.EXECUTE) {
            return answer;
        }
        long off = r.offset;
        long len = r.length;
        switch (r.op) {
            case READ -> {
                if (r.sinkReadsDevice) {
                    // The frontend's gathering write copies straight out of the mapping: the CPU route's copy
                    // is the kernel's copy into the socket, and no second copy through the buffers is made.
                    // Probed first: the kernel would answer a missing page with EFAULT, mid-reply.
                    region.probe(off, len);
                    views.point(r, PerRequest.of(r).windows(views), off, (int) len);
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
                    region.writeBack().deviceWrote(off, len, r.fua);
                } else {
                    if (!copyIn(r)) {
                        return Status.EINVAL;
                    }
                    if (r.fua) {
                        region.writeBack().persistWritten(off, len);
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
                    region.writeBack().persistWritten(off, len);
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
}
