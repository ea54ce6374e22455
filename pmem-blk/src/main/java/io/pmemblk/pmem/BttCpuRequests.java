package io.pmemblk.pmem;

import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.pmem.btt.LaneHandle;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A request on the BTT layout ({@code pmem.layout=btt}) executed by the CPU ({@link BttExecutor} routes it there):
 * sector by sector through a {@link LaneHandle} the request holds from its first sector to its last.
 *
 * <ul>
 *   <li>Lanes: dispatch on one hardware queue is concurrent (each NBD connection dispatches from its own thread),
 *   so a lane per queue would need a lock. A request claims a lane instead, its thread's own first
 *   ({@link Btt#claim}: one CAS, no lock), so threads that keep dispatching keep their lanes.</li>
 *   <li>Copies: by the CPU, or by the driver's DMA engine where its routing rule (the raw layout's) sends a
 *   request there. WRITEs ({@link BttDmaWrites}): a group's data stage is one batch of copies straight into its
 *   free blocks, and the dispatching thread goes on; when the channel reports the last of them, the blocks are
 *   written back and drained (a device's stores are not the CPU's: with DDIO they sit in its cache), then the
 *   flog, seq and map stages run, so a map entry never points at data that is not durable, nor at data that
 *   did not land (a failed copy sends the group to the CPU). READs ({@link BttDmaReads}): each sector's
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
final class BttCpuRequests {
    private final Btt btt;
    private final int sector;
    private final int shift;
    private final CopyStats stats;
    private final Completions completions;
    /** Per lane: a sector to gather a WRITE's sector into, or read a partial one into, when it is not whole in one piece. */
    private final MemorySegment[] bounce;
    /** Per lane: where a request's data stands in its pieces. */
    private final BttCursor[] cursors;

    BttCpuRequests(Btt btt, CopyStats stats, Completions completions) {
        this.btt = btt;
        this.sector = btt.blockSize();
        this.shift = Integer.numberOfTrailingZeros(sector);
        this.stats = stats;
        this.completions = completions;
        this.bounce = new MemorySegment[btt.lanes()];
        this.cursors = new BttCursor[btt.lanes()];
        Arena auto = Arena.ofAuto();
        for (int i = 0; i < bounce.length; i++) {
            bounce[i] = auto.allocate(sector, 64);
            cursors[i] = new BttCursor();
        }
    }

    /** Executes READ, WRITE, TRIM, WRITE_ZEROES of r, in bounds (the driver checked); the status to complete it with. */
    int execute(Request r) throws IOException {
        Op op = r.op;
        if (op != Op.READ && ((r.offset | r.length) & (sector - 1)) != 0) {
            completions.bttRefused(r, "is not aligned to the BTT's " + sector + "-byte sectors; allowed: offset and"
                    + " length multiples of " + sector + " (pmem.sector-size)");
            return Status.EINVAL;
        }
        try (LaneHandle lane = btt.claim(preferredLane())) {
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
            completions.bttRefused(r, "failed: " + e.getMessage());
            return Status.EIO;
        }
        return Status.OK;
    }

    /**
     * Executes the CPU READs {@code batch[from..to)} (in bounds: the driver checked) on one lane claimed once, where
     * {@link #execute} claims and gives back a lane per request, and completes each (as {@link #execute}'s caller
     * would) once the lane is given back: a frontend's completion may dispatch again on this
     * thread. The first map entry of every request is loaded before any is read, so a batch of random reads
     * overlaps its map misses.
     *
     * @return {@code error}, or the first Error thrown while executing or completing (the driver rethrows it)
     */
    Throwable reads(Request[] batch, int from, int to, Throwable error) {
        try (LaneHandle lane = btt.claim(preferredLane())) {
            int touched = 0;
            for (int i = from; i < to; i++) {
                touched += lane.touchMap(batch[i].offset >>> shift);
            }
            cursors[lane.index()].touched = touched;
            for (int i = from; i < to; i++) {
                Request r = batch[i];
                BttPerRequest st = BttPerRequest.of(r);
                st.failure = null;
                try {
                    st.status = readOn(lane, r);
                } catch (Throwable t) {
                    st.failure = t;
                }
            }
        }
        for (int i = from; i < to; i++) {
            Request r = batch[i];
            BttPerRequest st = ((PerRequest) r.driverData).btt();
            Throwable t = st.failure;
            st.failure = null;
            error = t != null ? completions.completeFailed(r, t, error) : Completions.complete(r, st.status, error);
        }
        return error;
    }

    /** One READ on a held lane: the status {@link #execute} answers it with. */
    private int readOn(LaneHandle lane, Request r) {
        try {
            if (!transfer(r, lane, false)) {
                return Status.EINVAL;
            }
        } catch (IOException e) {
            completions.bttRefused(r, "failed: " + e.getMessage()); // as execute: the BTT's reason, once a second
            return Status.EIO;
        }
        stats.count(Route.CPU, false, r.length);
        r.route = Route.CPU;
        return Status.OK;
    }

    /** Copies r's data between its pieces and the BTT, sector by sector; false when its pieces do not cover its length. */
    private boolean transfer(Request r, LaneHandle lane, boolean write) throws IOException {
        BttCursor c = cursors[lane.index()];
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
    static int preferredLane() {
        return (int) Thread.currentThread().threadId() * Btt.GROUP_BLOCKS;
    }

    /**
     * Executes the WRITEs {@code batch[from..to)} and completes each: their sectors in
     * order, in groups on this caller's lane and lanes the group claims ({@link Btt.Group}). The driver checked
     * each (in bounds, whole sectors, not empty, write-back not failed). A group ends where it is full, where no
     * lane is free, and before a sector already in it (two WRITEs of one sector in a batch: the later one is
     * written in a later group, so it reads the earlier one's map entry as its old entry, as if they came in
     * two batches).
     *
     * <p>A request's state is its {@link BttPerRequest} (made once per tag): its first failure, or
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
    Throwable writes(Request[] batch, int from, int to, Throwable error) {
        for (int i = from; i < to; i++) {
            BttPerRequest st = BttPerRequest.of(batch[i]);
            st.failure = null;
            st.invalid = false;
        }
        try {
            LaneHandle lane = btt.claim(preferredLane());
            try {
                Btt.Group g = lane.group();
                BttCursor c = cursors[lane.index()];
                for (int i = from; i < to; i++) {
                    Request r = batch[i];
                    BttPerRequest st = ((PerRequest) r.driverData).btt();
                    try {
                        if (!c.start(r)) {
                            st.invalid = true; // pieces not covering the length: EINVAL, as execute answers
                            continue;
                        }
                        for (long off = r.offset, end = r.offset + r.length; off < end && st.failure == null;
                             off += sector) {
                            long lba = off >>> shift;
                            int slot = g.add(lba, i);
                            if (slot < 0) {
                                commit(g, batch); // may fail this request's earlier sectors
                                if (st.failure != null) {
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
                        if (st.failure == null) {
                            st.failure = t;
                        }
                    }
                }
                commit(g, batch);
            } finally {
                lane.close(); // also gives back the lanes the group claimed
            }
        } catch (Throwable t) { // not expected (commit throws nothing): every request not failed yet answers it
            for (int i = from; i < to; i++) {
                BttPerRequest st = ((PerRequest) batch[i].driverData).btt();
                if (st.failure == null) {
                    st.failure = t;
                }
            }
        }
        for (int i = from; i < to; i++) {
            error = completions.completeBttWrite(batch[i], ((PerRequest) batch[i].driverData).btt(), Route.CPU, error);
        }
        return error;
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
                BttPerRequest st = ((PerRequest) batch[g.tag(s)].driverData).btt();
                if (st.failure == null) {
                    st.failure = f;
                }
            }
        }
        g.clear();
    }
}
