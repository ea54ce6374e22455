package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;

/**
 * The BTT layout ({@code pmem.layout=btt}), a layer over the region as SPDK's vbdevs and nbdkit's filters are over
 * their devices, with its own per-request state ({@link BttPerRequest}): the device is the BTT's external blocks,
 * executed sector by sector (sector-atomic writes; nothing received or sent in place: the mapping's bytes are the
 * BTT's, not the device's). By the CPU ({@link BttCpuRequests}), or with data copies on the DMA route
 * ({@link BttDmaWrites}, {@link BttDmaReads}) where the raw layout's routing rule sends a request there.
 */
final class BttExecutor implements Executor {
    private static final System.Logger LOG = Completions.LOG;

    private final PmemRegion region;
    private final int sector;
    private final CopyStats stats;
    private final Router router;
    private final DmaRoute dma;
    private final Completions completions;
    private final BttCpuRequests cpu;
    private final BttDmaWrites writes;
    private final BttDmaReads reads;

    BttExecutor(Btt btt, PmemRegion region, CopyStats stats, Router router, DmaRoute dma, Completions completions) {
        this.region = region;
        this.sector = btt.blockSize();
        this.stats = stats;
        this.router = router;
        this.dma = dma;
        this.completions = completions;
        this.cpu = new BttCpuRequests(btt, stats, completions);
        this.writes = new BttDmaWrites(btt, stats, dma, completions);
        this.reads = new BttDmaReads(btt, region, stats, dma, completions);
    }

    /**
     * A batch on the BTT layout: each run of consecutive WRITEs that together cover more than one sector is
     * written in groups ({@link BttCpuRequests#writes}: the BTT's durability round trips paid once per group of
     * sectors, not once per sector); everything else, and a lone one-sector WRITE, is executed alone as before.
     * A run ends at any other request (a READ, TRIM, FLUSH ...), so what the batch orders around it stays
     * ordered. Completion and errors as on the raw layout ({@link RawExecutor#queueRequests}).
     *
     * <p>With an engine, a run of WRITEs the routing rule sends to DMA ({@link #wantsDmaOnBtt}, the raw layout's
     * rule) is written in groups whose data copies are the channel's ({@link BttDmaWrites#dmaWrites}); they
     * complete on its completion thread. A run is of one route: where the route changes, the next run starts.
     */
    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        DmaChannel channel = dma.channel(hwq);
        Throwable error = null;
        boolean unsubmitted = false; // DMA READs placed since the last doorbell
        int i = 0;
        while (i < count) {
            Request r = batch[i];
            if (channel != null && r.op == Op.READ && router.wantsDma(r)) {
                int rc = DmaRoute.CPU;
                try {
                    rc = reads.place(channel, hwq, r);
                } catch (Throwable t) { // not expected (it catches what the BTT and the channel throw): the CPU's
                    error = Completions.failed(r, "routing", t, error);
                }
                if (rc == DmaRoute.PLACED) {
                    PerRequest st = (PerRequest) r.driverData; // ours until its count is dropped, as on raw
                    unsubmitted |= st.placed > 0;
                    error = Completions.firstError(error, st.placeError);
                    st.placeError = null;
                    if (st.drop(1 + st.count - st.placed) == 0) {
                        error = reads.finish(r, st, error);
                    }
                    i++;
                    continue;
                }
                if (rc == BttDmaReads.ZEROS) {
                    stats.count(Route.CPU, false, r.length);
                    r.route = Route.CPU;
                    error = Completions.complete(r, Status.OK, error);
                    i++;
                    continue;
                }
            }
            if (unsubmitted) {
                // Whatever comes next may wait: for a lane (held by a writer that waits for a block one of these
                // READs holds), or in a write's read tracking. Their copies must be on their way first.
                error = dma.submit(channel, error);
                unsubmitted = false;
            }
            if (cpuReadOnBtt(channel, r)) {
                // A run of CPU READs on one lane, their map entries loaded ahead together.
                int j = i + 1;
                while (j < count && cpuReadOnBtt(channel, batch[j])) {
                    j++;
                }
                if (j - i > 1) {
                    error = cpu.reads(batch, i, j, error);
                    i = j;
                    continue;
                }
            }
            if (!groupable(r)) {
                error = completions.completeByCpu(r, this, error);
                i++;
                continue;
            }
            boolean byDma = channel != null && wantsDmaOnBtt(batch[i]);
            int j = i + 1; // the run holds batch[i] whatever the route of the next ones says
            long sectors = batch[i].length / sector;
            while (j < count && groupable(batch[j]) && (channel != null && wantsDmaOnBtt(batch[j])) == byDma) {
                sectors += batch[j].length / sector;
                j++;
            }
            if (byDma) {
                error = writes.dmaWrites(batch, i, j, error, channel, dma.poolIova(hwq));
                i = j;
            } else if (sectors > 1) {
                error = cpu.writes(batch, i, j, error);
                i = j;
            } else {
                error = completions.completeByCpu(batch[i], this, error);
                i++;
            }
        }
        if (unsubmitted) {
            error = dma.submit(channel, error);
        }
        if (error != null) {
            throw (Error) error;
        }
    }

    /** Whether a WRITE on the BTT goes to DMA: the raw layout's rule, and sectors whole in its pieces. */
    private boolean wantsDmaOnBtt(Request r) {
        return router.wantsDma(r) && writes.dmaWritable(r);
    }

    /** Whether r is a READ that {@link #execute} would hand to the BTT on the CPU route (no DMA wanted for it). */
    private boolean cpuReadOnBtt(DmaChannel channel, Request r) {
        return r.op == Op.READ && router.inBounds(r) && (channel == null || !router.wantsDma(r));
    }

    /**
     * Whether r is a WRITE that {@link #execute} would hand to the BTT whole: in bounds, not empty, of whole
     * sectors, write-back not failed. Anything else takes {@link Completions#completeByCpu}, which answers it as before.
     */
    private boolean groupable(Request r) {
        return r.op == Op.WRITE && r.length > 0 && router.inBounds(r)
                && ((r.offset | r.length) & (sector - 1)) == 0 && !region.writeBack().writeBackFailed();
    }

    /** A group's data copy ({@link BttDmaWrites.Flight}), or one of a READ's ({@link BttDmaReads}). */
    @Override
    public void dmaCompleted(Object ctx, int status, int copies) {
        Throwable error;
        if (ctx instanceof BttDmaWrites.Flight f) {
            error = writes.copied(f, status, copies);
        } else {
            Request r = (Request) ctx;
            if (!dma.reported(r, status, copies)) {
                return;
            }
            error = reads.finish(r, (PerRequest) r.driverData, null);
        }
        if (error != null) {
            throw (Error) error;
        }
    }

    @Override
    public int execute(Request r) throws IOException {
        int answer = router.answerAtOnce(r);
        if (answer != Router.EXECUTE) {
            return answer;
        }
        // CACHE: nothing to prefetch; the rest sector by sector, each write durable on return (FUA)
        return r.op == Op.CACHE ? Status.OK : cpu.execute(r);
    }

    /**
     * After the engine's close: every copy is reported, but the last group's flog and map steps may still run on a
     * completion thread the channel's close stopped waiting for. The mapping must outlive them.
     */
    @Override
    public void engineClosed() throws IOException {
        try {
            if (!writes.awaitGroups(30_000)) {
                LOG.log(System.Logger.Level.ERROR, "BTT groups written by DMA were still committing 30 s after the"
                        + " engine closed; unmapping anyway (the next open finishes a swap whose flog entry is"
                        + " durable)");
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while BTT groups written by DMA were committing", e);
        }
    }
}
