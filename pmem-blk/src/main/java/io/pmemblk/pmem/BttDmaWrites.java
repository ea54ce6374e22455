package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.LaneHandle;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;

import java.lang.System.Logger.Level;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * WRITEs on the BTT layout whose data copies are a DMA channel's: a group's data stage is one batch of copies
 * straight into its free blocks, and the dispatching thread goes on; when the channel reports the last of them
 * the blocks are written back and drained (with DDIO a device's stores sit in the CPU cache), then the flog, seq
 * and map stages run on the completion thread, so a map entry never points at data that is not durable, nor at
 * data that did not land (a failed copy sends the group to the CPU). Groups are as on the CPU route
 * ({@link BttCpuRequests#writes}).
 */
final class BttDmaWrites {
    private static final System.Logger LOG = System.getLogger(BttDmaWrites.class.getName());
    /** A group's status when the ring had no room for its copies: stored by the CPU, not counted as a DMA fault. */
    private static final int STATUS_RING_FULL = 0x1000_0000;

    private final Btt btt;
    private final int sector;
    private final int shift;
    private final CopyStats stats;
    private final DmaRoute dma;
    private final Completions completions;
    /** Per lane: the DMA state of a group whose owner is that lane ({@link Flight}), made at open. */
    private final Flight[] flights;
    /**
     * Groups launched on the DMA route and not finished: close() waits for none left before the region is
     * unmapped. The engine's close reports every copy, but a channel closing waits only (and briefly) for its
     * completion thread, which may still be committing the last group when the close returns.
     */
    private final AtomicInteger flying = new AtomicInteger();

    BttDmaWrites(Btt btt, CopyStats stats, DmaRoute dma, Completions completions) {
        this.btt = btt;
        this.sector = btt.blockSize();
        this.shift = Integer.numberOfTrailingZeros(sector);
        this.stats = stats;
        this.dma = dma;
        this.completions = completions;
        this.flights = new Flight[btt.lanes()];
        for (int i = 0; i < flights.length; i++) {
            flights[i] = new Flight(dma.regionIova(), sector);
        }
    }

    /**
     * Whether a WRITE the routing rule sends to DMA can go as one copy per sector, each straight from its piece into
     * its free block: pool chunks (128 KiB, the request sector-aligned) never split a sector; pieces of caller
     * memory must be whole sectors, all but the last. Else it takes the CPU route, where a split sector is gathered
     * into a bounce sector (which is not in the engine's IOVA space).
     */
    boolean dmaWritable(Request r) {
        if (r.segments() > 0) {
            return true;
        }
        for (int i = 0, last = r.iovCount() - 1; i < last; i++) {
            if ((r.iovLength(i) & (sector - 1)) != 0) {
                return false;
            }
        }
        return true;
    }

    /**
     * The DMA route of the WRITEs {@code batch[from..to)} (each {@link #dmaWritable}, checked as for
     * {@link BttCpuRequests#writes}): their sectors in order, in groups as on the CPU route, but each group's data stage is one
     * batch of copies on {@code channel} (the sector's piece -> its free block's place in the mapping), and this
     * thread does not wait for them. When the channel reports the group's last copy, on its completion thread,
     * {@link #copied} makes the data durable and runs the flog, seq and map stages ({@link Btt.Group#commitDeviceStored}),
     * gives the group's lanes back, then completes each request whose last sector that was. A failed copy (or a
     * channel that cannot take the group) sends the whole group to the CPU ({@link Btt.Group#commitByCpu}): no map
     * entry ever points at a block whose data did not land.
     *
     * <p>Lanes: a group in flight holds its lanes (its {@link Flight} gives them back), so this thread holds none
     * between two groups; it claims the next group's lane without waiting first, and when every lane is held it
     * rings the doorbell before it waits: the lanes it waits for come back only once their copies have run. Copies
     * placed before this run (DMA READs of the batch) must be submitted already: a group's read tracking may
     * wait for them. The doorbell is rung once at the end of the run.
     *
     * <p>A request completes once all its sectors have committed (or failed): on the completion thread, or here
     * at the end of the run, never while this thread holds a lane. Unlike the CPU route, a failed sector does not
     * stop the request's later sectors (they may be in flight already); the request answers EIO all the same.
     */
    Throwable dmaWrites(Request[] batch, int from, int to, Throwable error, DmaChannel channel, long poolIova) {
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PerRequest st = PerRequest.of(r);
            BttPerRequest bst = st.btt();
            bst.failure = null;
            bst.invalid = false;
            bst.redone = false;
            bst.added = 0;
            // Set before any of its sectors is placed: a group's report may drop it before this loop ends.
            st.outstanding = 1 + (int) (r.length >>> shift);
        }
        Flight f = null;
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PerRequest st = (PerRequest) r.driverData;
            BttPerRequest bst = st.btt();
            try {
                boolean caller = r.segments() == 0;
                if (caller && r.iovBytes() != r.length) {
                    bst.invalid = true; // pieces not covering the length: EINVAL, as execute answers
                    continue;
                }
                MemorySegment poolMemory = caller ? null : r.queue().pool().memory();
                int piece = 0;
                long in = 0;
                for (long off = r.offset, end = r.offset + r.length; off < end && bst.failure == null; off += sector) {
                    while ((caller ? r.iovLength(piece) : r.segmentLength(piece)) == in) { // an exhausted (or empty) piece
                        piece++;
                        in = 0;
                    }
                    long lba = off >>> shift;
                    if (f == null) {
                        f = flight(channel);
                    }
                    Btt.Group g = f.lane.group();
                    int slot = g.add(lba, i);
                    if (slot < 0) {
                        error = launch(f, channel, error);
                        f = flight(channel);
                        g = f.lane.group();
                        slot = g.add(lba, i); // an empty group takes any block
                    }
                    f.request[slot] = r; // the slot holds one of the request's shares from here on
                    bst.added++;
                    long at = (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
                    g.source(slot, caller ? r.iovMapping(piece) : poolMemory, at);
                    f.srcIova[slot] = (caller ? r.iovIova(piece) : poolIova + r.segmentPoolOffset(piece)) + in;
                    in += sector;
                }
            } catch (Throwable t) { // not expected (the driver checked the bounds): the request fails alone
                if (bst.failure == null) {
                    bst.failure = t;
                }
            }
        }
        if (f != null) {
            error = launch(f, channel, error);
        }
        error = dma.submit(channel, error);
        // This thread holds no lane now: each request's own share (and its sectors never added) may complete it.
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PerRequest st = (PerRequest) r.driverData;
            BttPerRequest bst = st.btt();
            if (st.drop(1 + (int) (r.length >>> shift) - bst.added) == 0) {
                error = completeWrite(r, bst, error);
            }
        }
        return error;
    }

    /**
     * The flight of a newly claimed lane: claimed without waiting if any lane is free, else after the doorbell
     * (the lanes held are those of groups in flight, given back once their copies are reported).
     */
    private Flight flight(DmaChannel channel) {
        LaneHandle lane = btt.claimNow(BttCpuRequests.preferredLane());
        if (lane == null) {
            dma.submit(channel, null); // an Error here shows again at the run's own doorbell
            lane = btt.claim(BttCpuRequests.preferredLane());
        }
        Flight f = flights[lane.index()];
        f.lane = lane;
        return f;
    }

    /**
     * Starts the group of {@code f}: its checks and read tracking ({@link Btt.Group#prepareStores}), then its
     * copies, placed as one unit; if the channel takes none (ring full, or it threw), the CPU stores the data here.
     * From here on {@code f} is the completion's: this thread must not touch it again.
     */
    private Throwable launch(Flight f, DmaChannel channel, Throwable error) {
        Btt.Group g = f.lane.group();
        int live = g.prepareStores();
        int n = 0;
        for (int s = 0, size = g.size(); s < size; s++) {
            if (g.live(s)) {
                f.live[n++] = s;
            }
        }
        f.count = n;
        f.failedStatus = 0;
        f.outstanding = n + 1;
        flying.incrementAndGet();
        if (live > 0) {
            try {
                if (!channel.placeAll(f, f)) {
                    f.failedStatus = STATUS_RING_FULL; // no room: the CPU, as a request on raw; not a fault
                    f.outstanding = 1;
                }
            } catch (Throwable t) {
                // Nothing placed (all or none): the group goes to the CPU now.
                f.failedStatus = DmaRoute.STATUS_NOT_PLACED;
                f.outstanding = 1;
                error = placeFailed(channel, t, error);
            }
        }
        if (f.drop(1) == 0) {
            error = finish(f, error);
        }
        return error;
    }

    /**
     * {@code copies} copies of {@code f}'s group have been reported (the channel's completion thread, or a closing
     * channel's caller): the last report finishes the group. Returns the first Error of its completions, for the
     * driver to rethrow.
     */
    Throwable copied(Flight f, int status, int copies) {
        if (status != 0 && f.failedStatus == 0) {
            f.failedStatus = status; // written before this report's drop, read after the last one
        }
        int left = f.drop(copies);
        if (left < 0) {
            LOG.log(System.Logger.Level.ERROR, "DMA channel reported a copy of a BTT group more often than it was"
                    + " placed; ignored");
            return null;
        }
        return left == 0 ? finish(f, null) : null;
    }

    /**
     * Commits the group of {@code f} once its data is stored (by the device, or by the CPU now if the device failed),
     * records each sector's fate on its request, gives the lanes back, then completes the requests whose last
     * sector this was: a completion never finds the lanes of this group held.
     */
    private Throwable finish(Flight f, Throwable error) {
        Btt.Group g = f.lane.group();
        int status = f.failedStatus;
        if (f.count > 0) {
            if (status == 0) {
                g.commitDeviceStored();
            } else {
                if (status != STATUS_RING_FULL) {
                    stats.dmaError();
                    stats.dmaFallback();
                    if (status != DmaRoute.STATUS_NOT_PLACED) {
                        groupCopyFailed(f.count, status);
                    }
                }
                g.commitByCpu();
            }
        }
        Request ready = null; // the requests to complete, linked through their state: nothing allocated
        for (int s = 0, n = g.size(); s < n; s++) {
            Request r = f.request[s];
            f.request[s] = null;
            PerRequest st = (PerRequest) r.driverData;
            BttPerRequest bst = st.btt();
            Throwable t = g.failure(s);
            if (t != null && bst.failure == null) {
                bst.failure = t;
            }
            if (status != 0) {
                bst.redone = true;
            }
            if (st.drop(1) == 0) {
                bst.next = ready;
                ready = r;
            }
        }
        LaneHandle lane = f.lane;
        f.lane = null;
        lane.close(); // the group's lanes too; f may be another thread's from here on
        try {
            while (ready != null) {
                Request r = ready;
                PerRequest st = (PerRequest) r.driverData;
                BttPerRequest bst = st.btt();
                ready = bst.next;
                bst.next = null;
                error = completeWrite(r, bst, error);
            }
        } finally {
            flying.decrementAndGet();
        }
        return error;
    }

    /**
     * Waits (at most {@code millis}) until every group launched on the DMA route has committed and completed its
     * requests: after the engine is closed (every copy reported), before the region is unmapped. False when some
     * group is still running at the deadline.
     */
    boolean awaitGroups(long millis) throws InterruptedException {
        long deadline = System.nanoTime() + millis * 1_000_000L;
        while (flying.get() > 0) {
            if (System.nanoTime() - deadline > 0) {
                return false;
            }
            Thread.sleep(1);
        }
        return true;
    }

    /** Completes a WRITE of {@link #dmaWrites}: by DMA unless a sector's group went to the CPU. */
    private Throwable completeWrite(Request r, BttPerRequest st, Throwable error) {
        return completions.completeBttWrite(r, st, st.redone ? Route.CPU : Route.DMA, error);
    }

    /** The channel threw placing a BTT group (nothing placed; the CPU takes it): logged, once a second unless an Error. */
    private Throwable placeFailed(DmaChannel channel, Throwable t, Throwable error) {
        if (t instanceof Error || completions.faults().due()) {
            completions.faults().write(Level.ERROR, "DMA channel " + channel.index() + " threw placing a BTT group's"
                    + " copies; the group is written by the CPU: " + t, t);
        }
        return Completions.firstError(error, t);
    }

    /**
     * A copy of a BTT group of {@code sectors} failed with {@code status}: the group's data is stored by the CPU
     * instead. Logged once a second at most (a halt fails every copy behind it), the line built only then.
     */
    private void groupCopyFailed(int sectors, int status) {
        if (completions.faults().due()) {
            completions.faults().write(Level.WARNING, "DMA copy of a BTT group of " + sectors + " sectors failed"
                    + " (CHANERR 0x" + Integer.toHexString(status) + "); the group and the copies behind it are stored"
                    + " by the CPU (" + stats.dmaFallbacks() + " so far)", null);
        }
    }

    /**
     * A group on the DMA route from its placing to its commit: its owner lane (whose {@link Btt.Group} it is), the
     * request and source iova of each slot, and the copy list {@link DmaChannel#placeAll} reads (one copy per
     * live slot, straight into the slot's free block). One per lane, made at open; the thread that holds the lane
     * owns it, then the copies' reports do, and the last report gives the lane back.
     */
    static final class Flight implements DmaChannel.Copies {
        private static final VarHandle OUTSTANDING;

        static {
            try {
                OUTSTANDING = MethodHandles.lookup().findVarHandle(Flight.class, "outstanding", int.class);
            } catch (ReflectiveOperationException e) {
                throw new ExceptionInInitializerError(e);
            }
        }

        private final long regionIova;
        private final int sector;
        private LaneHandle lane;
        private final Request[] request = new Request[Btt.GROUP_BLOCKS];
        private final long[] srcIova = new long[Btt.GROUP_BLOCKS];
        /** The slots placed as copies, in order: copy i is slot live[i]'s. */
        private final int[] live = new int[Btt.GROUP_BLOCKS];
        private int count;
        /** The first failed copy's status (or STATUS_NOT_PLACED), written before its report's drop. */
        private int failedStatus;
        /** Copies not reported yet, plus the placer's share while it places. */
        private volatile int outstanding;

        /** The flight of a lane's groups into the mapping at {@code regionIova}, {@code sector} bytes a copy. */
        Flight(long regionIova, int sector) {
            this.regionIova = regionIova;
            this.sector = sector;
        }

        int drop(int n) {
            return (int) OUTSTANDING.getAndAdd(this, -n) - n;
        }

        @Override
        public int count() {
            return count;
        }

        @Override
        public long srcIova(int i) {
            return srcIova[live[i]];
        }

        @Override
        public long dstIova(int i) {
            return regionIova + lane.group().dataOffset(live[i]);
        }

        @Override
        public long length(int i) {
            return sector;
        }
    }
}
