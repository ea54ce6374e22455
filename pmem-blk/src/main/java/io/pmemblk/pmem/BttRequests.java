package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * How {@link PmemBlockDriver} executes a request on the BTT layout ({@code pmem.layout=btt}): sector by sector
 * through a {@link Btt.Lane} the request holds from its first sector to its last.
 *
 * <ul>
 *   <li>Lanes: dispatch on one hardware queue is concurrent (each NBD connection dispatches from its own thread),
 *   so a lane per queue would need a lock. A request claims a lane instead, its thread's own first
 *   ({@link Btt#claim}: one CAS, no lock), so threads that keep dispatching keep their lanes.</li>
 *   <li>Copies: by the CPU, or by the driver's DMA engine where its routing rule (the raw layout's) sends a
 *   request there. WRITEs ({@link #dmaWrites}): a group's data stage is one batch of copies straight into its
 *   free blocks, and the dispatching thread goes on; when the channel reports the last of them, the blocks are
 *   written back and drained (a device's stores are not the CPU's: with DDIO they sit in its cache), then the
 *   flog, seq and map stages run, so a map entry never points at data that is not durable, nor at data that
 *   did not land (a failed copy sends the group to the CPU). READs ({@link #prepareDmaRead}): each sector's
 *   block is held in the BTT's device-read table until the request's copies are reported, so no writer
 *   reuses a block the engine still reads. Nothing is received into or sent from the mapping in place: a
 *   sector's place there is the map's, known only when it is read or written.</li>
 *   <li>Durability: every sector write and zeroing is durable when the BTT returns (each step persisted before
 *   the next), so FUA needs nothing more, and FLUSH (the region's) has nothing of the BTT's left to do.</li>
 *   <li>Alignment: WRITE, TRIM and WRITE_ZEROES must cover whole sectors (EINVAL otherwise: a read-modify-write
 *   of a partial sector would race with a concurrent writer of the same sector unless every write took a lock);
 *   a READ may start and end anywhere, its partial sectors read whole into the lane's bounce sector.</li>
 *   <li>TRIM and WRITE_ZEROES set the map's zero flag: one 4-byte durable store per sector, no data written.</li>
 *   <li>Groups ({@link #writes}): the WRITEs of a batch, and the sectors of one WRITE, are written up to
 *   {@link Btt#GROUP_BLOCKS} at a time in lockstep ({@link Btt.Group}), so their durability round trips are paid
 *   once per group instead of once per sector. The run's requests complete once all of its groups have
 *   committed (EIO where a sector failed), never before their map entries are durable.</li>
 * </ul>
 */
final class BttRequests {
    private static final System.Logger LOG = System.getLogger(BttRequests.class.getName());

    private final Btt btt;
    private final int sector;
    private final int shift;
    private final CopyStats stats;
    /** Per lane: a sector to gather a WRITE's sector into, or read a partial one into, when it is not whole in one piece. */
    private final MemorySegment[] bounce;
    /** Per lane: where a request's data stands in its pieces. */
    private final Cursor[] cursors;
    /** Per lane: the DMA state of a group whose owner is that lane ({@link Flight}), made at open. */
    private final Flight[] flights;
    private volatile long lastLog = System.nanoTime() - 2_000_000_000L;
    /** The driver whose requests these are, and the region mapping's address in its engine's IOVA space (-1: none). */
    private PmemBlockDriver driver;
    private long regionIova = -1;
    /**
     * Groups launched on the DMA route and not finished: close() waits for none left before the region is
     * unmapped. The engine's close reports every copy, but a channel closing waits only (and briefly) for its
     * completion thread, which may still be committing the last group when the close returns.
     */
    private final java.util.concurrent.atomic.AtomicInteger flying = new java.util.concurrent.atomic.AtomicInteger();

    BttRequests(Btt btt, CopyStats stats) {
        this.btt = btt;
        this.sector = btt.blockSize();
        this.shift = Integer.numberOfTrailingZeros(sector);
        this.stats = stats;
        this.bounce = new MemorySegment[btt.lanes()];
        this.cursors = new Cursor[btt.lanes()];
        this.flights = new Flight[btt.lanes()];
        Arena auto = Arena.ofAuto();
        for (int i = 0; i < bounce.length; i++) {
            bounce[i] = auto.allocate(sector, 64);
            cursors[i] = new Cursor();
            flights[i] = new Flight(this);
        }
    }

    /** Set by the driver before it serves: who completes the requests, and where the mapping is for its engine. */
    void attach(PmemBlockDriver driver, long regionIova) {
        this.driver = driver;
        this.regionIova = regionIova;
    }

    /** The device's size: the BTT's external blocks. */
    long size() {
        return btt.blocks() * sector;
    }

    Btt btt() {
        return btt;
    }

    /** Executes READ, WRITE, TRIM, WRITE_ZEROES of r, in bounds (the driver checked); the status to complete it with. */
    int execute(Request r) throws IOException {
        Op op = r.op;
        if (op != Op.READ && ((r.offset | r.length) & (sector - 1)) != 0) {
            refused(r, "is not aligned to the BTT's " + sector + "-byte sectors; allowed: offset and length multiples of "
                    + sector + " (pmem.sector-size)");
            return Status.EINVAL;
        }
        try (Btt.Lane lane = btt.claim(preferredLane())) {
            switch (op) {
                case READ, WRITE -> {
                    if (!transfer(r, lane, op == Op.WRITE)) {
                        return Status.EINVAL;
                    }
                    stats.count(Route.CPU, op == Op.WRITE, r.length);
                    r.route = Route.CPU;
                }
                case TRIM, WRITE_ZEROES -> {
                    for (long lba = r.offset >>> shift, end = (r.offset + r.length) >>> shift; lba < end; lba++) {
                        lane.zero(lba);
                    }
                }
                default -> {
                    return Status.EINVAL;
                }
            }
        } catch (IOException e) {
            // The BTT refused (an arena read-only, a block marked bad, writes stopped after a failed persist): the
            // reason is the BTT's, once a second, not a stack per request.
            refused(r, "failed: " + e.getMessage());
            return Status.EIO;
        }
        return Status.OK;
    }

    /**
     * Executes the CPU READs {@code batch[from..to)} (in bounds: the driver checked) on one lane claimed once, where
     * {@link #execute} claims and gives back a lane per request, and completes each through {@code driver} (as
     * its completeByCpu would) once the lane is given back: a frontend's completion may dispatch again on this
     * thread. The first map entry of every request is loaded before any is read, so a batch of random reads
     * overlaps its map misses.
     *
     * @return {@code error}, or the first Error thrown while executing or completing (the driver rethrows it)
     */
    Throwable reads(PmemBlockDriver driver, Request[] batch, int from, int to, Throwable error) {
        try (Btt.Lane lane = btt.claim(preferredLane())) {
            int touched = 0;
            for (int i = from; i < to; i++) {
                touched += lane.touchMap(batch[i].offset >>> shift);
            }
            cursors[lane.index()].touched = touched;
            for (int i = from; i < to; i++) {
                Request r = batch[i];
                PmemBlockDriver.PerRequest st = PmemBlockDriver.state(r);
                st.bttFailure = null;
                try {
                    st.bttStatus = readOn(lane, r);
                } catch (Throwable t) {
                    st.bttFailure = t;
                }
            }
        }
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
            Throwable t = st.bttFailure;
            st.bttFailure = null;
            error = t != null ? driver.completeFailed(r, t, error) : PmemBlockDriver.complete(r, st.bttStatus, error);
        }
        return error;
    }

    /** One READ on a held lane: the status {@link #execute} answers it with. */
    private int readOn(Btt.Lane lane, Request r) {
        try {
            if (!transfer(r, lane, false)) {
                return Status.EINVAL;
            }
        } catch (IOException e) {
            refused(r, "failed: " + e.getMessage()); // as execute: the BTT's reason, once a second
            return Status.EIO;
        }
        stats.count(Route.CPU, false, r.length);
        r.route = Route.CPU;
        return Status.OK;
    }

    /** Copies r's data between its pieces and the BTT, sector by sector; false when its pieces do not cover its length. */
    private boolean transfer(Request r, Btt.Lane lane, boolean write) throws IOException {
        Cursor c = cursors[lane.index()];
        if (!c.start(r)) {
            return false;
        }
        MemorySegment b = bounce[lane.index()];
        long off = r.offset, end = r.offset + r.length;
        while (off < end) {
            long lba = off >>> shift;
            int head = (int) (off & (sector - 1));
            int n = (int) Math.min(sector - head, end - off);
            if (head == 0 && n == sector && c.left() >= sector) {
                MemorySegment s = c.memory().asSlice(c.at(), sector);
                if (write) {
                    lane.write(lba, s);
                } else {
                    lane.read(lba, s);
                }
                c.skip(sector);
            } else if (write) { // whole (execute checked), but split over pieces
                c.copy(b, 0, sector, true);
                lane.write(lba, b);
            } else {
                lane.read(lba, b);
                c.copy(b, head, n, false);
            }
            off += n;
        }
        return true;
    }

    /**
     * The lane a caller tries first: its thread's, a group's width apart from the next thread's, so that threads
     * that keep dispatching keep their lanes and the lanes their groups grow into.
     */
    private int preferredLane() {
        return (int) Thread.currentThread().threadId() * Btt.GROUP_BLOCKS;
    }

    /**
     * Executes the WRITEs {@code batch[from..to)} and completes each through {@code driver}: their sectors in
     * order, in groups on this caller's lane and lanes the group claims ({@link Btt.Group}). The driver checked
     * each (in bounds, whole sectors, not empty, write-back not failed). A group ends where it is full, where no
     * lane is free, and before a sector already in it (two WRITEs of one sector in a batch: the later one is
     * written in a later group, so it reads the earlier one's map entry as its old entry, as if they came in
     * two batches).
     *
     * <p>A request's state is its {@link PmemBlockDriver.PerRequest} (made once per tag): its first failure, or
     * pieces not covering its length. Once a group has failed a sector of it, its later sectors are not written
     * (as Linux's btt_write_pg stops at the first error) and it answers EIO; earlier sectors stay written (no
     * atomicity across sectors).
     *
     * <p>Completions come after the last group has committed and every lane is given back: a frontend's
     * completion may dispatch again on this thread, and must not find this thread holding lanes it would wait
     * for. So no request is acknowledged before all of the run's map entries are durable.
     *
     * @return {@code error}, or the first Error thrown while executing or completing (the driver rethrows it)
     */
    Throwable writes(PmemBlockDriver driver, Request[] batch, int from, int to, Throwable error) {
        for (int i = from; i < to; i++) {
            PmemBlockDriver.PerRequest st = PmemBlockDriver.state(batch[i]);
            st.bttFailure = null;
            st.bttInvalid = false;
        }
        try {
            Btt.Lane lane = btt.claim(preferredLane());
            try {
                Btt.Group g = lane.group();
                Cursor c = cursors[lane.index()];
                for (int i = from; i < to; i++) {
                    Request r = batch[i];
                    PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
                    try {
                        if (!c.start(r)) {
                            st.bttInvalid = true; // pieces not covering the length: EINVAL, as execute answers
                            continue;
                        }
                        for (long off = r.offset, end = r.offset + r.length; off < end && st.bttFailure == null;
                             off += sector) {
                            long lba = off >>> shift;
                            int slot = g.add(lba, i);
                            if (slot < 0) {
                                commit(g, batch); // may fail this request's earlier sectors
                                if (st.bttFailure != null) {
                                    break;
                                }
                                slot = g.add(lba, i); // an empty group takes any block
                            }
                            try {
                                if (c.left() >= sector) {
                                    g.source(slot, c.memory(), c.at());
                                    c.skip(sector);
                                } else { // whole, but split over pieces: gathered into the slot's lane's bounce sector
                                    MemorySegment b = bounce[g.lane(slot)];
                                    c.copy(b, 0, sector, true);
                                    g.source(slot, b, 0);
                                }
                            } catch (Throwable t) {
                                g.fail(slot, t); // recorded by its group's commit, which fails the request
                                break;
                            }
                        }
                    } catch (Throwable t) { // not expected (the driver checked the bounds): the request fails alone
                        if (st.bttFailure == null) {
                            st.bttFailure = t;
                        }
                    }
                }
                commit(g, batch);
            } finally {
                lane.close(); // also gives back the lanes the group claimed
            }
        } catch (Throwable t) { // not expected (commit throws nothing): every request not failed yet answers it
            for (int i = from; i < to; i++) {
                PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) batch[i].driverData;
                if (st.bttFailure == null) {
                    st.bttFailure = t;
                }
            }
        }
        for (int i = from; i < to; i++) {
            error = finish(driver, batch[i], (PmemBlockDriver.PerRequest) batch[i].driverData, error);
        }
        return error;
    }

    /**
     * Whether a WRITE the driver routes to DMA can go as one copy per sector, each straight from its piece into
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
     * {@link #writes}): their sectors in order, in groups as on the CPU route, but each group's data stage is one
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
            PmemBlockDriver.PerRequest st = PmemBlockDriver.state(r);
            st.bttFailure = null;
            st.bttInvalid = false;
            st.bttRedone = false;
            st.bttAdded = 0;
            // Set before any of its sectors is placed: a group's report may drop it before this loop ends.
            st.outstanding = 1 + (int) (r.length >>> shift);
        }
        Flight f = null;
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
            try {
                boolean caller = r.segments() == 0;
                if (caller && r.iovBytes() != r.length) {
                    st.bttInvalid = true; // pieces not covering the length: EINVAL, as execute answers
                    continue;
                }
                MemorySegment poolMemory = caller ? null : r.queue().pool().memory();
                int piece = 0;
                long in = 0;
                for (long off = r.offset, end = r.offset + r.length; off < end && st.bttFailure == null; off += sector) {
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
                    st.bttAdded++;
                    long at = (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
                    g.source(slot, caller ? r.iovMapping(piece) : poolMemory, at);
                    f.srcIova[slot] = (caller ? r.iovIova(piece) : poolIova + r.segmentPoolOffset(piece)) + in;
                    in += sector;
                }
            } catch (Throwable t) { // not expected (the driver checked the bounds): the request fails alone
                if (st.bttFailure == null) {
                    st.bttFailure = t;
                }
            }
        }
        if (f != null) {
            error = launch(f, channel, error);
        }
        error = driver.submit(channel, error);
        // This thread holds no lane now: each request's own share (and its sectors never added) may complete it.
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
            if (st.drop(1 + (int) (r.length >>> shift) - st.bttAdded) == 0) {
                error = finishWrite(r, st, error);
            }
        }
        return error;
    }

    /**
     * The flight of a newly claimed lane: claimed without waiting if any lane is free, else after the doorbell
     * (the lanes held are those of groups in flight, given back once their copies are reported).
     */
    private Flight flight(DmaChannel channel) {
        Btt.Lane lane = btt.claimNow(preferredLane());
        if (lane == null) {
            driver.submit(channel, null); // an Error here shows again at the run's own doorbell
            lane = btt.claim(preferredLane());
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
                f.failedStatus = PmemBlockDriver.STATUS_NOT_PLACED;
                f.outstanding = 1;
                error = driver.placeFailed(channel, t, error);
            }
        }
        if (f.drop(1) == 0) {
            error = finish(f, error);
        }
        return error;
    }

    /**
     * A copy of {@code f}'s group has been reported (the channel's completion thread, or a closing channel's caller):
     * the last report finishes the group. Returns the first Error of its completions, for the driver to rethrow.
     */
    Throwable copied(Flight f, int status) {
        if (status != 0 && f.failedStatus == 0) {
            f.failedStatus = status; // written before this report's drop, read after the last one
        }
        int left = f.drop(1);
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
                    if (status != PmemBlockDriver.STATUS_NOT_PLACED) {
                        driver.groupCopyFailed(f.count, status);
                    }
                }
                g.commitByCpu();
            }
        }
        Request ready = null; // the requests to complete, linked through their state: nothing allocated
        for (int s = 0, n = g.size(); s < n; s++) {
            Request r = f.request[s];
            f.request[s] = null;
            PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
            Throwable t = g.failure(s);
            if (t != null && st.bttFailure == null) {
                st.bttFailure = t;
            }
            if (status != 0) {
                st.bttRedone = true;
            }
            if (st.drop(1) == 0) {
                st.bttNext = ready;
                ready = r;
            }
        }
        Btt.Lane lane = f.lane;
        f.lane = null;
        lane.close(); // the group's lanes too; f may be another thread's from here on
        try {
            while (ready != null) {
                Request r = ready;
                PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) r.driverData;
                ready = st.bttNext;
                st.bttNext = null;
                error = finishWrite(r, st, error);
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
    private Throwable finishWrite(Request r, PmemBlockDriver.PerRequest st, Throwable error) {
        Throwable f = st.bttFailure;
        st.bttFailure = null;
        if (st.bttInvalid) {
            return PmemBlockDriver.complete(r, Status.EINVAL, error);
        }
        if (f == null) {
            Route route = st.bttRedone ? Route.CPU : Route.DMA;
            stats.count(route, true, r.length);
            r.route = route;
            return PmemBlockDriver.complete(r, Status.OK, error);
        }
        if (f instanceof IOException e) {
            refused(r, "failed: " + e.getMessage());
            return PmemBlockDriver.complete(r, Status.EIO, error);
        }
        return driver.completeFailed(r, f, error);
    }

    /**
     * A group on the DMA route from its placing to its commit: its owner lane (whose {@link Btt.Group} it is), the
     * request and source iova of each slot, and the copy list {@link DmaChannel#placeAll} reads (one copy per
     * live slot, straight into the slot's free block). One per lane, made at open; the thread that holds the lane
     * owns it, then the copies' reports do, and the last report gives the lane back.
     */
    static final class Flight implements DmaChannel.Copies {
        private static final java.lang.invoke.VarHandle OUTSTANDING;

        static {
            try {
                OUTSTANDING = java.lang.invoke.MethodHandles.lookup().findVarHandle(Flight.class, "outstanding", int.class);
            } catch (ReflectiveOperationException e) {
                throw new ExceptionInInitializerError(e);
            }
        }

        private final BttRequests owner;
        private Btt.Lane lane;
        private final Request[] request = new Request[Btt.GROUP_BLOCKS];
        private final long[] srcIova = new long[Btt.GROUP_BLOCKS];
        /** The slots placed as copies, in order: copy i is slot live[i]'s. */
        private final int[] live = new int[Btt.GROUP_BLOCKS];
        private int count;
        /** The first failed copy's status (or STATUS_NOT_PLACED), written before its report's drop. */
        private int failedStatus;
        /** Copies not reported yet, plus the placer's share while it places. */
        private volatile int outstanding;

        Flight(BttRequests owner) {
            this.owner = owner;
        }

        /** The requests these are, for the driver's completion listener. */
        BttRequests owner() {
            return owner;
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
            return owner.regionIova + lane.group().dataOffset(live[i]);
        }

        @Override
        public long length(int i) {
            return owner.sector;
        }
    }

    /**
     * Copies a DMA READ on the BTT may take at most (one per sector, two where a piece boundary splits a sector):
     * beyond, it takes the CPU route. A ring of the default 512 descriptors holds a 1 MiB READ of 4 KiB sectors.
     */
    static final int MAX_READ_COPIES = 1024;
    /** A group's status when the ring had no room for its copies: stored by the CPU, not counted as a DMA fault. */
    private static final int STATUS_RING_FULL = 0x1000_0000;

    /**
     * Prepares a READ for the DMA route ({@link ReadCopies}): every sector it touches is resolved through the map
     * and published in the device-read table ({@link Btt#beginDeviceRead}: no writer reuses its block until the
     * copy is reported), a sector that reads as zeros is zeroed in the request's memory here, and each other
     * sector's part becomes a copy (block -> the request's piece). Nothing of it is placed yet.
     *
     * @return the copies (0: every sector was zeros, the request's data is complete); -1, nothing held, when it
     *         must take the CPU route, which answers it as it would (a block marked bad, a known bad range, pieces not
     *         covering its length, more copies than {@link #MAX_READ_COPIES})
     */
    int prepareDmaRead(Request r, PmemBlockDriver.PerRequest st, long poolIova, PmemRegion region) {
        boolean caller = r.segments() == 0;
        long end = r.offset + r.length;
        long first = r.offset >>> shift, last = (end - 1) >>> shift;
        if ((caller && r.iovBytes() != r.length) || last - first + 1 > MAX_READ_COPIES) {
            return -1;
        }
        ReadCopies c = st.bttReads();
        c.count = 0;
        c.held = 0;
        MemorySegment poolMemory = caller ? null : r.queue().pool().memory();
        BadBlocks bad = region.badBlocks();
        int piece = 0;
        long in = 0;
        try {
            for (long lba = first; lba <= last; lba++) {
                long sectorStart = lba << shift;
                long from = Math.max(r.offset, sectorStart), to = Math.min(end, sectorStart + sector);
                long data = btt.beginDeviceRead(lba);
                if (data != Btt.ZEROS) {
                    c.hold(data);
                    if (!bad.isEmpty() && bad.overlaps(data, sector)) {
                        c.release(btt);
                        return -1; // the CPU's guarded read answers EIO
                    }
                }
                long inBlock = from - sectorStart;
                for (long left = to - from; left > 0; ) {
                    long pieceLength = caller ? r.iovLength(piece) : r.segmentLength(piece);
                    if (in == pieceLength) {
                        piece++;
                        in = 0;
                        continue;
                    }
                    long k = Math.min(left, pieceLength - in);
                    long at = (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
                    if (data == Btt.ZEROS) {
                        (caller ? r.iovMapping(piece) : poolMemory).asSlice(at, k).fill((byte) 0);
                    } else {
                        if (c.count == MAX_READ_COPIES) {
                            c.release(btt);
                            return -1;
                        }
                        long dst = (caller ? r.iovIova(piece) : poolIova + r.segmentPoolOffset(piece)) + in;
                        c.add(regionIova + data + inBlock, dst, k, data + inBlock,
                                caller ? r.iovMapping(piece) : poolMemory, at);
                    }
                    in += k;
                    inBlock += k;
                    left -= k;
                }
            }
        } catch (IOException | RuntimeException e) {
            c.release(btt); // the CPU route reads the map again and answers it (EIO for a block marked bad)
            return -1;
        }
        return c.count;
    }

    /** Ends the device reads of a READ whose copies have all been reported (or were never placed). */
    void endDmaRead(PmemBlockDriver.PerRequest st) {
        st.bttReads().release(btt);
    }

    /**
     * After a DMA READ's copy failed (or was never placed): makes every copy of it by the CPU, from the blocks it
     * still holds in the device-read table (no writer has reused them), through the region's guarded read. Needs
     * no lane: this runs on the channel's completion thread, which must never wait for a lane (the lanes it would
     * wait for are held by groups whose completion is that thread's to run). The caller ends the holds after.
     *
     * @throws MappingFault when a block cannot be read (a known bad range, a fault on the mapping)
     */
    void readHeldByCpu(PmemBlockDriver.PerRequest st, PmemRegion region) {
        ReadCopies c = st.bttReads();
        for (int i = 0; i < c.count; i++) {
            region.read(c.srcOffset[i], c.dstMemory[i], c.dstOffset[i], c.len[i]);
        }
    }

    /**
     * A DMA READ's copies on the BTT, and the blocks it holds in the device-read table: made on a tag's first such
     * READ, grown to its need (at most {@link #MAX_READ_COPIES}), reused after.
     */
    static final class ReadCopies implements DmaChannel.Copies {
        private long[] src = new long[16], dst = new long[16], len = new long[16];
        /** The same copies for the CPU, should the device fail: pool offset, and the request memory's place. */
        private long[] srcOffset = new long[16], dstOffset = new long[16];
        private MemorySegment[] dstMemory = new MemorySegment[16];
        private long[] heldBlocks = new long[16];
        private int count, held;

        void add(long s, long d, long l, long poolOffset, MemorySegment memory, long memoryOffset) {
            if (count == src.length) {
                int n = Math.min(MAX_READ_COPIES, 2 * count);
                src = java.util.Arrays.copyOf(src, n);
                dst = java.util.Arrays.copyOf(dst, n);
                len = java.util.Arrays.copyOf(len, n);
                srcOffset = java.util.Arrays.copyOf(srcOffset, n);
                dstOffset = java.util.Arrays.copyOf(dstOffset, n);
                dstMemory = java.util.Arrays.copyOf(dstMemory, n);
            }
            src[count] = s;
            dst[count] = d;
            len[count] = l;
            srcOffset[count] = poolOffset;
            dstMemory[count] = memory;
            dstOffset[count] = memoryOffset;
            count++;
        }

        void hold(long dataOffset) {
            if (held == heldBlocks.length) {
                heldBlocks = java.util.Arrays.copyOf(heldBlocks, 2 * held);
            }
            heldBlocks[held++] = dataOffset;
        }

        /** Ends every device read held: after the copies are reported, or when none will be placed. */
        void release(Btt btt) {
            for (int i = 0; i < held; i++) {
                btt.endDeviceRead(heldBlocks[i]);
            }
            java.util.Arrays.fill(dstMemory, 0, count, null); // the request's memory is not kept past it
            held = 0;
            count = 0;
        }

        @Override
        public int count() {
            return count;
        }

        @Override
        public long srcIova(int i) {
            return src[i];
        }

        @Override
        public long dstIova(int i) {
            return dst[i];
        }

        @Override
        public long length(int i) {
            return len[i];
        }
    }

    /** Commits the group and records each failed sector's failure on its request (the first one counts); clears the group. */
    private static void commit(Btt.Group g, Request[] batch) {
        int n = g.size();
        if (n == 0) {
            return;
        }
        g.commit();
        for (int s = 0; s < n; s++) {
            Throwable f = g.failure(s);
            if (f != null) {
                PmemBlockDriver.PerRequest st = (PmemBlockDriver.PerRequest) batch[g.tag(s)].driverData;
                if (st.bttFailure == null) {
                    st.bttFailure = f;
                }
            }
        }
        g.clear();
    }

    /** Completes a request of {@link #writes} as {@link #execute} and the driver's completeByCpu would answer it. */
    private Throwable finish(PmemBlockDriver driver, Request r, PmemBlockDriver.PerRequest st, Throwable error) {
        Throwable f = st.bttFailure;
        st.bttFailure = null;
        if (st.bttInvalid) {
            return PmemBlockDriver.complete(r, Status.EINVAL, error);
        }
        if (f == null) {
            stats.count(Route.CPU, true, r.length);
            r.route = Route.CPU;
            return PmemBlockDriver.complete(r, Status.OK, error);
        }
        if (f instanceof IOException e) {
            refused(r, "failed: " + e.getMessage());
            return PmemBlockDriver.complete(r, Status.EIO, error);
        }
        return driver.completeFailed(r, f, error);
    }

    private void refused(Request r, String why) {
        long now = System.nanoTime();
        if (now - lastLog > 1_000_000_000L) {
            lastLog = now;
            LOG.log(System.Logger.Level.WARNING, r.op + " of " + r.length + " bytes at offset " + r.offset + " " + why);
        }
    }

    /**
     * A position in a request's data pieces: its pool chunks, or its pieces of caller memory (a vhost-user guest's
     * RAM), which may split a sector anywhere.
     */
    private static final class Cursor {
        /**
         * Where {@link #reads} leaves the map entries it loaded ahead, so the JIT keeps the loads: in the lane's
         * cursor, not in a field of this shared object, whose line every dispatching thread reads (a store there
         * from each batch bounced it between the cores: 2-job reads ran 0.85-0.88x raw).
         */
        @SuppressWarnings("unused")
        private int touched;
        private Request r;
        private MemorySegment pool;
        private boolean caller;
        private int count, piece;
        private long in;

        boolean start(Request r) {
            this.r = r;
            int n = r.segments();
            caller = n == 0;
            if (caller && r.iovBytes() != r.length) {
                return false;
            }
            count = caller ? r.iovCount() : n;
            pool = caller ? null : r.queue().pool().memory();
            piece = 0;
            in = 0;
            settle();
            return true;
        }

        MemorySegment memory() {
            return caller ? r.iovMapping(piece) : pool;
        }

        long at() {
            return (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
        }

        long left() {
            return piece >= count ? 0 : (caller ? r.iovLength(piece) : r.segmentLength(piece)) - in;
        }

        void skip(long n) {
            in += n;
            settle();
        }

        /** Moves past exhausted (and empty) pieces. */
        private void settle() {
            while (piece < count && left() == 0) {
                piece++;
                in = 0;
            }
        }

        /** Copies n bytes between the pieces (from here on) and {@code b} at {@code bOff}: into b when {@code gather}. */
        void copy(MemorySegment b, long bOff, long n, boolean gather) {
            while (n > 0) {
                long k = Math.min(n, left());
                if (k == 0) {
                    throw new IllegalStateException(r + ": its data pieces end " + n + " bytes before its length");
                }
                if (gather) {
                    MemorySegment.copy(memory(), at(), b, bOff, k);
                } else {
                    MemorySegment.copy(b, bOff, memory(), at(), k);
                }
                bOff += k;
                n -= k;
                skip(k);
            }
        }
    }
}
