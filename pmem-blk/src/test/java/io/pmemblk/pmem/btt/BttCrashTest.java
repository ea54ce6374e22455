package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.BttRegion;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.CrashSweep;
import io.pmemblk.pmem.Persistence;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.RegionPorts;
import io.pmemblk.pmem.Routing;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.testing.InjectedFaults;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Crash consistency of the BTT under the project's power-failure model ({@link CrashModel}): random writes and
 * zeroings from several lanes at once, a few LBAs shared so that lanes contend for the same map entries and cache
 * lines, crashed after every durability step (each drain or msync, on whichever thread) and every write-back: every
 * point is reached, and a seeded sample of them judged ({@link CrashSweep}; every one under {@code ./scripts/test
 * --long}). Every crash image judged is opened (recovery runs) and must be
 * <ul>
 *   <li>consistent: every internal block referenced exactly once by the map and the flog's free blocks;</li>
 *   <li>sector-atomic: every touched block reads wholly as one version that was written to it (or zeros);</li>
 *   <li>true to every completed operation: a block reads the last completed write or zeroing, or one that
 *       overlapped it in time or came after it (in flight at the crash).</li>
 * </ul>
 * Two models: the page cache (4 KiB pages made durable by msync) and pmem (lines made durable by a write-back and
 * a drain on the same thread; at a crash each aligned 8 bytes of a line not yet drained is old or new, x86's
 * power-fail atomicity, so the two 8-byte halves of a flog entry can land apart).
 *
 * <p>Writes come one by one and in groups ({@link Btt.Group}: several blocks in lockstep, one drain per step for
 * all), two blocks of one LBA often among a group's writes (the group must split there). The second test drives
 * the same through the block driver on both mappers (the surefire execution forced-pmem runs it again with
 * PMEM_IS_PMEM_FORCE=1, where libpmem's mapper is pmem): batches of multi-sector WRITEs, overlapping one another
 * within a batch, dispatched from two queues at once.
 */
class BttCrashTest {
    static final int LANES = 4, OPS_PER_LANE = 40, LBAS = 12;
    /** Blocks a thread puts in one group at most: with 3 lanes a thread, groups also end where lanes run out. */
    static final int GROUP = 5;
    static final boolean FORCED = "1".equals(System.getenv("PMEM_IS_PMEM_FORCE"));
    /**
     * The blocks the workload touches: the first 8 each in a map cache line (and mostly a page) of their own, so a
     * map store left unpersisted is not persisted by a neighbour's write (all in one line, a zeroing's missing
     * persist went unseen); the last 4 share one line, so lanes still contend for a line and its map lock.
     */
    static int lbaOf(int i) {
        return i < 8 ? i * 317 : 8 * 317 + (i - 8);
    }
    /** Crash points reached (not stopped): each judged in a whole sweep, a sample of them otherwise. */
    static final AtomicInteger CHECKED = new AtomicInteger();

    @TempDir
    Path dir;

    static Stream<Object[]> cases() {
        List<Object[]> l = new ArrayList<>();
        for (String model : new String[]{"page cache", "pmem"}) {
            for (int sector : new int[]{4096, 512}) {
                for (long seed = 1; seed <= 2; seed++) {
                    l.add(new Object[]{model, sector, seed * 7919 + sector + model.length()});
                }
            }
        }
        return l.stream();
    }

    /** One write (or zeroing, version 0) in the order operations started; times on the model's clock. */
    record Op(int lba, long version, long start, long end) {
        @Override
        public String toString() {
            return (version == 0 ? "ZERO" : "WRITE v" + version) + " of " + lba + " [" + start + ", "
                    + (end < 0 ? "in flight" : end) + "]";
        }
    }

    /** The workload's history, under the model's lock (so a crash image and the history it is judged by agree). */
    static final class History {
        final List<int[]> lbas = new ArrayList<>();
        final List<long[]> times = new ArrayList<>(); // {version, start, end or -1}
        long clock;

        int started(int lba, long version) {
            lbas.add(new int[]{lba});
            times.add(new long[]{version, ++clock, -1});
            return times.size() - 1;
        }

        void ended(int index) {
            times.get(index)[2] = ++clock;
        }

        List<Op> snapshot() {
            List<Op> ops = new ArrayList<>(times.size());
            for (int i = 0; i < times.size(); i++) {
                long[] t = times.get(i);
                ops.add(new Op(lbas.get(i)[0], t[0], t[1], t[2]));
            }
            return ops;
        }
    }

    @ParameterizedTest(name = "{0}, sector {1}, seed {2}")
    @MethodSource("cases")
    void everySectorIsOldOrNewAfterEveryCrash(String modelName, int sector, long seed) throws Exception {
        assumeFalse(FORCED, "the engine under a model port: the same in the forced-pmem execution");
        int[] lbas = new int[LBAS];
        for (int i = 0; i < LBAS; i++) {
            lbas[i] = lbaOf(i);
        }
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            Persistence real = modelName.equals("pmem") ? Pools.modelledPmem() : Pools.pageCache();
            Btt.format(m.memory(), real, sector, LANES);
            // 8-byte units on pmem: the flog halves share a line, and only their drain in between keeps the seq half
            // from reaching the media without the first (a whole-line unit could not tell).
            CrashModel model = new CrashModel(real, CrashModel.ATOMIC_UNIT);
            model.attach(m.memory());
            History history = new History();
            Random crashes = new Random(seed * 31);
            ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
            AtomicBoolean stop = new AtomicBoolean();
            int before = CHECKED.get();
            CrashSweep.Sampler sample = CrashSweep.sampler("engine, " + modelName + ", sector " + sector + ", seed " + seed);
            crashAfterEveryStep(model, history, crashes, sector, lbas, violations, stop, sample);
            Btt btt = Btt.open(m.memory(), model, 3 * LANES); // room for groups: 3 lanes a thread
            AtomicInteger versions = new AtomicInteger();
            ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
            runTogether(LANES, stop, failures, me -> {
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment[] bufs = new MemorySegment[GROUP];
                    for (int b = 0; b < GROUP; b++) {
                        bufs[b] = arena.allocate(sector, 4096);
                    }
                    Random rnd = new Random(seed * 1000 + me);
                    for (int i = 0; i < OPS_PER_LANE && !stop.get(); ) {
                        int kind = rnd.nextInt(5); // 0 zero, 1-2 one write, 3-4 a group
                        try (LaneHandle held = btt.claim(3 * me)) {
                            if (kind >= 3) {
                                i += groupOfWrites(held, bufs, rnd, versions, model, history);
                                continue;
                            }
                            int lba = lbaOf(rnd.nextInt(LBAS));
                            boolean zero = kind == 0;
                            long version = zero ? 0 : versions.incrementAndGet();
                            if (!zero) {
                                BttTest.fill(bufs[0], lba, version);
                            }
                            int index = model.atomically(() -> history.started(lba, version));
                            if (zero) {
                                held.zero(lba);
                            } else {
                                held.write(lba, bufs[0]);
                            }
                            model.atomically(() -> {
                                history.ended(index);
                                return null;
                            });
                            i++;
                        }
                    }
                }
            });
            assertThat(failures).isEmpty();
            assertThat(violations).as("crash images violating the BTT's guarantees (first of them)")
                    .isEmpty();
            int checked = CHECKED.get() - before;
            System.out.println("BTT crash points reached (" + modelName + ", sector " + sector + "): " + checked + "; "
                    + sample.describe());
            assertThat(sample.judged()).as("crash images judged").isPositive();
            // A single write costs 4 durability steps on pmem, a group of up to 5 writes 4 too (more where it
            // splits), a zeroing 1 (none for a zero block): on average well over one step for every two operations.
            assertThat(checked).isGreaterThanOrEqualTo(LANES * OPS_PER_LANE / 2);
        }
    }

    /**
     * 2 to {@link #GROUP} writes through the lane's group, often two of one LBA: a block the group refuses
     * (full, no lane, its LBA already in it) is written in the next one, as a driver does. Each write starts
     * before it is added and ends when its group has committed. How many were written.
     */
    static int groupOfWrites(LaneHandle lane, MemorySegment[] bufs, Random rnd, AtomicInteger versions, CrashModel model,
                             History history) {
        Btt.Group g = lane.group();
        int n = 2 + rnd.nextInt(GROUP - 1);
        int lba = lbaOf(rnd.nextInt(LBAS));
        for (int b = 0; b < n; b++) {
            if (b > 0 && rnd.nextInt(3) != 0) {
                lba = lbaOf(rnd.nextInt(LBAS)); // else the same LBA again: the group must split there
            }
            long version = versions.incrementAndGet();
            BttTest.fill(bufs[b], lba, version);
            int at = lba;
            int index = model.atomically(() -> history.started(at, version));
            int slot = g.add(lba, index);
            if (slot < 0) {
                commitAndEnd(g, model, history);
                slot = g.add(lba, index);
            }
            g.source(slot, bufs[b], 0);
        }
        commitAndEnd(g, model, history);
        return n;
    }

    private static void commitAndEnd(Btt.Group g, CrashModel model, History history) {
        g.commit();
        for (int s = 0; s < g.size(); s++) {
            if (g.failure(s) != null) {
                throw new AssertionError("a grouped write failed", g.failure(s));
            }
            int index = g.tag(s);
            model.atomically(() -> {
                history.ended(index);
                return null;
            });
        }
        g.clear();
    }

    /** The file the driver test serves: a pool header and one 16 MiB arena, plus a little (as BttDriverTest's). */
    static final long DRIVER_SIZE = BttLayout.BTT_OFFSET + (16 << 20) + (1 << 20);
    /** Clusters of the driver test's LBAs, each in a map line (and page) of its own; requests fall within one. */
    static final int[] CLUSTERS = {0, 317, 634, 951};
    static final int CLUSTER_SPAN = 6, BATCHES = 8;

    static Stream<Object[]> driverCases() {
        List<Object[]> l = new ArrayList<>();
        for (PmemRegion.Mapper mapper : new PmemRegion.Mapper[]{PmemRegion.Mapper.JAVA, PmemRegion.Mapper.LIBPMEM}) {
            for (int sector : new int[]{4096, 512}) {
                l.add(new Object[]{mapper, sector});
            }
        }
        return l.stream();
    }

    /**
     * Through the driver, on the region's own port under the crash model: two threads, each dispatching batches
     * of 2-5 WRITEs of 1-3 sectors on its own hardware queue, a request often over the sectors of an earlier one
     * in the same batch, crashed after every durability step and write-back. The driver writes each batch's sectors in groups;
     * every image must be consistent, sector-atomic and true to every completed request.
     */
    @ParameterizedTest(name = "{0}, sector {1}")
    @MethodSource("driverCases")
    void groupedBatchesThroughTheDriverKeepEveryGuaranteeAfterEveryCrash(PmemRegion.Mapper mapper, int sector)
            throws Exception {
        int[] lbas = driverLbas(mapper);
        CrashModel.Modelled mm = CrashModel.open(dir.resolve("d.img"), DRIVER_SIZE, mapper, CrashModel.ATOMIC_UNIT);
        PmemRegion region = mm.region();
        CrashModel model = mm.model();
        assertThat(region.isPmem()).isEqualTo(mapper == PmemRegion.Mapper.LIBPMEM && FORCED);
        BttRegion.format(region, sector);
        PmemBlockDriver driver = PmemBlockDriver.onBtt(region, new CopyStats(), BttRegion.open(region, 2, 0));
        BlockLayer layer = new BlockLayer(driver, 2, 16, 4 << 20, 1 << 20);
        History history = new History();
        Random crashes = new Random(sector * 31L + mapper.ordinal());
        ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
        ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
        AtomicBoolean stop = new AtomicBoolean();
        int before = CHECKED.get();
        CrashSweep.Sampler sample = CrashSweep.sampler("driver, " + mapper + ", sector " + sector);
        try {
            crashAfterEveryStep(model, history, crashes, sector, lbas, violations, stop, sample);
            AtomicInteger versions = new AtomicInteger();
            int batches = region.isPmem() ? 3 * BATCHES : BATCHES; // a drain costs less than an msync: more of them
            dispatchFromTwoQueues(batches, stop, failures, violations, driver,
                    me -> sector + 7L * me + 1000L * mapper.ordinal(),
                    (me, rnd) -> dispatchBatch(layer.queue(me), rnd, sector, versions, model, history));
            int checked = CHECKED.get() - before;
            System.out.println("BTT crash points reached through the driver (" + mapper + ", sector " + sector
                    + ", pmem " + region.isPmem() + "): " + checked + "; " + sample.describe());
            assertThat(sample.judged()).as("crash images judged").isPositive();
            assertThat(checked).as("every batch costs at least 4 durability steps").isGreaterThanOrEqualTo(2 * 4 * batches);
        } finally {
            stop.set(true);
            layer.close();
            driver.close();
        }
    }

    static Stream<Object[]> dmaCases() {
        List<Object[]> l = new ArrayList<>();
        for (PmemRegion.Mapper mapper : new PmemRegion.Mapper[]{PmemRegion.Mapper.JAVA, PmemRegion.Mapper.LIBPMEM}) {
            for (int sector : new int[]{4096, 512}) {
                for (boolean faults : new boolean[]{false, true}) {
                    l.add(new Object[]{mapper, sector, faults});
                }
            }
        }
        return l.stream();
    }

    /**
     * The DMA route on the BTT (soft I/OAT engine), crashed after every durability step and write-back, on whichever
     * thread takes it (the groups' flog and map stages run on the channel's completion thread): as the CPU test
     * above, the WRITEs of 2 or more sectors routed to DMA (route.dma.bounce, a threshold of 2 sectors) and
     * the one-sector ones to the CPU, so both routes are in flight at once on the same blocks. With faults, every
     * 5th descriptor halts the channel: those groups are stored by the CPU. Every image must be consistent,
     * sector-atomic and true to every completed request: a device-written block is durable before the flog and
     * map entries naming it (remove the write-back and drain of the device-stored data in
     * {@code WriteGroup.commitStored} and this fails).
     */
    @ParameterizedTest(name = "{0}, sector {1}, faults {2}")
    @MethodSource("dmaCases")
    void dmaGroupsThroughTheDriverKeepEveryGuaranteeAfterEveryCrash(PmemRegion.Mapper mapper, int sector,
                                                                   boolean withFaults) throws Exception {
        int[] lbas = driverLbas(mapper);
        CrashModel.Modelled mm = CrashModel.open(dir.resolve("d.img"), DRIVER_SIZE, mapper, CrashModel.ATOMIC_UNIT);
        PmemRegion region = mm.region();
        CrashModel model = mm.model();
        BttRegion.format(region, sector);
        InjectedFaults faults = new InjectedFaults();
        DmaEngine engine = DmaEngine.soft(new IovaSpace(), 2, 64, 16, faults);
        faults.attach(engine.softDevice().orElseThrow());
        if (withFaults) {
            faults.failEvery(0, 5, IoatSpec.CHANERR_DEST_ADDR);
            faults.failEvery(1, 5, IoatSpec.CHANERR_DEST_ADDR);
        }
        CopyStats stats = new CopyStats();
        PmemBlockDriver driver = PmemBlockDriver.onBtt(region, stats, BttRegion.open(region, 2, 0), engine,
                new Routing(2L * sector, Integer.MAX_VALUE, true));
        BlockLayer layer = new BlockLayer(driver, 2, 16, 4 << 20, 1 << 20);
        History history = new History();
        Random crashes = new Random(sector * 37L + mapper.ordinal() + (withFaults ? 5 : 0));
        ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
        ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicInteger[] routes = {new AtomicInteger(), new AtomicInteger()};
        int before = CHECKED.get();
        CrashSweep.Sampler sample = CrashSweep.sampler("DMA, " + mapper + ", sector " + sector + ", faults " + withFaults);
        try {
            crashAfterEveryStep(model, history, crashes, sector, lbas, violations, stop, sample);
            AtomicInteger versions = new AtomicInteger();
            int batches = region.isPmem() ? 3 * BATCHES : BATCHES;
            dispatchFromTwoQueues(batches, stop, failures, violations, driver,
                    me -> sector + 11L * me + 1000L * mapper.ordinal() + (withFaults ? 77 : 0),
                    (me, rnd) -> dispatchBatch(layer.queue(me), rnd, sector, versions, model, history, routes));
            int checked = CHECKED.get() - before;
            System.out.println("BTT crash points reached through the driver's DMA route (" + mapper + ", sector "
                    + sector + ", pmem " + region.isPmem() + ", faults " + withFaults + "): " + checked + "; requests by"
                    + " DMA " + routes[Route.DMA.ordinal()] + ", by CPU " + routes[Route.CPU.ordinal()] + ", DMA"
                    + " fallbacks " + stats.dmaFallbacks() + "; " + sample.describe());
            assertThat(sample.judged()).as("crash images judged").isPositive();
            assertThat(checked).as("every batch costs at least 4 durability steps").isGreaterThanOrEqualTo(2 * 4 * batches);
            assertThat(stats.bytes(Route.DMA, true)).as("the DMA route was taken").isPositive();
            assertThat(stats.bytes(Route.CPU, true)).as("and the CPU route").isPositive();
            if (withFaults) {
                assertThat(stats.dmaFallbacks()).as("failed copies were stored by the CPU").isPositive();
            }
        } finally {
            stop.set(true);
            driver.close();
            layer.close();
        }
    }

    /**
     * One batch of 2-5 WRITEs dispatched in one call: each 1-3 sectors within a cluster, a third of them over
     * the sectors of the request before (two writes of one sector in a batch). Every sector of a request holds
     * its (LBA, version) pattern; its history entries start before the dispatch and end at its completion.
     */
    static void dispatchBatch(HardwareQueue q, Random rnd, int sector, AtomicInteger versions, CrashModel model,
                              History history) throws InterruptedException {
        dispatchBatch(q, rnd, sector, versions, model, history, null);
    }

    /**
     * As {@link #dispatchBatch(HardwareQueue, Random, int, AtomicInteger, CrashModel, History)}; with {@code routes}
     * (the DMA route) the requests may complete later, on the channel's completion thread: waited for (60 s at
     * most), and each one's route counted in routes[route.ordinal()].
     */
    static void dispatchBatch(HardwareQueue q, Random rnd, int sector, AtomicInteger versions, CrashModel model,
                              History history, AtomicInteger[] routes) throws InterruptedException {
        int n = 2 + rnd.nextInt(4);
        CountDownLatch completed = new CountDownLatch(n);
        Request[] batch = new Request[n];
        int[][] index = new int[n][];
        int first = 0, len = 0;
        for (int k = 0; k < n; k++) {
            if (k == 0 || rnd.nextInt(3) != 0) {
                int c = CLUSTERS[rnd.nextInt(CLUSTERS.length)];
                int from = rnd.nextInt(CLUSTER_SPAN);
                first = c + from;
                len = 1 + rnd.nextInt(Math.min(3, CLUSTER_SPAN - from));
            } // else: the same sectors as the request before
            long version = versions.incrementAndGet();
            Request r = q.acquire(len * sector);
            r.op = io.pmemblk.queueing.Op.WRITE;
            r.offset = (long) first * sector;
            r.length = (long) len * sector;
            byte[] data = new byte[len * sector];
            MemorySegment d = MemorySegment.ofArray(data);
            for (int s = 0; s < len; s++) {
                BttTest.fill(d.asSlice((long) s * sector, sector), first + s, version);
            }
            int pos = 0;
            ByteBuffer[] bufs = r.dataBuffers();
            for (int i = 0; i < r.dataBufferCount(); i++) {
                int k2 = bufs[i].remaining();
                bufs[i].put(data, pos, k2);
                pos += k2;
            }
            int f = first, l = len;
            index[k] = model.atomically(() -> {
                int[] ix = new int[l];
                for (int s = 0; s < l; s++) {
                    ix[s] = history.started(f + s, version);
                }
                return ix;
            });
            int[] mine = index[k];
            r.completion = done -> {
                try {
                    if (done.status() != Status.OK) {
                        throw new AssertionError("WRITE [" + f + ", " + (f + l) + ") answered " + done.status());
                    }
                    model.atomically(() -> {
                        for (int ix : mine) {
                            history.ended(ix);
                        }
                        return null;
                    });
                    if (routes != null) {
                        routes[done.route.ordinal()].incrementAndGet();
                    }
                } finally {
                    completed.countDown();
                }
            };
            batch[k] = r;
        }
        q.dispatch(batch, n);
        if (routes != null && !completed.await(60, TimeUnit.SECONDS)) {
            throw new AssertionError(completed.getCount() + " of " + n + " WRITEs not completed within 60 s");
        }
        for (Request r : batch) {
            if (!r.isCompleted()) {
                throw new AssertionError(r + " was not completed " + (routes == null ? "inline" : "within 60 s"));
            }
            if (r.status() != Status.OK) {
                throw new AssertionError(r + " answered " + r.status());
            }
            r.release();
        }
    }

    /**
     * Opens a copy of the crash image (recovery on the copy) and judges it on {@code lbas}; null when it keeps
     * every guarantee.
     */
    static String judge(byte[] image, List<Op> ops, int sector, int[] lbas) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment copy = Pools.offHeap(arena, image);
            Btt btt;
            try {
                btt = Btt.open(copy, Pools.none(), 1);
            } catch (IOException | RuntimeException e) {
                return "the crash image does not open: " + e + describe(ops, -1);
            }
            List<String> problems = btt.check();
            if (!problems.isEmpty()) {
                return "the crash image is inconsistent after recovery: " + problems + "; recovery: " + btt.notes()
                        + describe(ops, -1);
            }
            MemorySegment buf = arena.allocate(sector, 4096);
            for (int lba : lbas) {
                long v;
                try {
                    btt.read(0, lba, buf);
                    v = BttTest.verify(buf, lba);
                } catch (IOException | AssertionError e) {
                    return "block " + lba + ": " + e.getMessage() + describe(ops, lba);
                }
                if (!allowed(ops, lba, v)) {
                    return "block " + lba + " reads " + (v == 0 ? "zeros" : "version " + v) + ", which a completed"
                            + " later operation had replaced (or was never written)" + describe(ops, lba);
                }
            }
            return null;
        }
    }

    /**
     * Whether {@code lba} may read version {@code v} (0: zeros, from a zeroing or the initial state): some operation
     * producing it is in flight, or completed with no operation on the LBA that started after it and completed.
     */
    static boolean allowed(List<Op> ops, int lba, long v) {
        List<Op> on = new ArrayList<>();
        on.add(new Op(lba, 0, 0, 0)); // the initial state: zeros, "completed" at time 0
        for (Op o : ops) {
            if (o.lba() == lba) {
                on.add(o);
            }
        }
        for (Op c : on) {
            if (c.version() != v) {
                continue;
            }
            if (c.end() < 0) {
                return true;
            }
            boolean replaced = false;
            for (Op later : on) {
                if (later.end() >= 0 && later.start() > c.end()) {
                    replaced = true;
                    break;
                }
            }
            if (!replaced) {
                return true;
            }
        }
        return false;
    }

    private static String describe(List<Op> ops, int lba) {
        StringBuilder b = new StringBuilder("\nhistory" + (lba >= 0 ? " of block " + lba : "") + " at the crash:");
        for (Op o : ops) {
            if (lba < 0 || o.lba() == lba) {
                b.append("\n  ").append(o);
            }
        }
        return b.toString();
    }

    /**
     * A crash point after every persistence step of {@code model} and between every write-back and its drain (a
     * missing drain shows there), its image judged when {@code sample} picks it; the first violation is added, with
     * the sample's seed, and stops the crashes.
     */
    private static void crashAfterEveryStep(CrashModel model, History history, Random crashes, int sector, int[] lbas,
            ConcurrentLinkedQueue<String> violations, AtomicBoolean stop, CrashSweep.Sampler sample) {
        record Snap(byte[] image, List<Op> ops) {}
        java.util.function.Consumer<CrashSweep.Point> crash = kind -> {
            if (stop.get()) {
                return;
            }
            CHECKED.incrementAndGet();
            if (!sample.judge(kind)) {
                return;
            }
            Snap s = model.atomically(() -> new Snap(model.crashImage(crashes), history.snapshot()));
            String v = judge(s.image(), s.ops(), sector, lbas);
            if (v != null) {
                violations.add(v + "\n" + sample.describe());
                stop.set(true);
            }
        };
        model.afterEachStep(() -> crash.accept(CrashSweep.Point.AFTER_STEP));
        model.afterEachWriteBack(() -> crash.accept(CrashSweep.Point.AFTER_WRITE_BACK));
    }

    /** One batch of a submitter: on queue {@code queue}, drawing from its own seeded {@code rnd}. */
    interface QueueBatch {
        void dispatch(int queue, Random rnd) throws Exception;
    }

    /**
     * Two submitters, thread i dispatching up to {@code batches} batches on queue i (its Random seeded by
     * {@code seedOf(i)}) while the crash hook judges images; a failure stops both. Then: no failure, no violating
     * image, and a consistent BTT.
     */
    private static void dispatchFromTwoQueues(int batches, AtomicBoolean stop, ConcurrentLinkedQueue<Throwable> failures,
                                              ConcurrentLinkedQueue<String> violations, PmemBlockDriver driver,
                                              java.util.function.IntToLongFunction seedOf, QueueBatch batch)
            throws InterruptedException {
        runTogether(2, stop, failures, me -> {
            Random rnd = new Random(seedOf.applyAsLong(me));
            for (int b = 0; b < batches && !stop.get(); b++) {
                batch.dispatch(me, rnd);
            }
        });
        stop.set(true);
        assertThat(failures).isEmpty();
        assertThat(violations).as("crash images violating the BTT's guarantees (first of them)").isEmpty();
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * The driver cases' assumptions (libpmem for its mapper; the JDK mapper once, not again when forced) and the
     * LBAs their workloads use: clusters of neighbours, so batches overlap and share map locks.
     */
    private static int[] driverLbas(PmemRegion.Mapper mapper) {
        if (mapper == PmemRegion.Mapper.LIBPMEM) {
            assumeTrue(RegionPorts.libpmemLoads(), "libpmem not installed");
        }
        assumeFalse(FORCED && mapper == PmemRegion.Mapper.JAVA, "the JDK mapper is the page cache either way: run once");
        int[] lbas = new int[CLUSTERS.length * CLUSTER_SPAN];
        for (int i = 0; i < lbas.length; i++) {
            lbas[i] = CLUSTERS[i / CLUSTER_SPAN] + i % CLUSTER_SPAN;
        }
        return lbas;
    }

    /** The work of thread {@code me} of {@link #runTogether}. */
    interface Submitter {
        void run(int me) throws Throwable;
    }

    /** n threads run {@code body} from one start; a failure is kept and stops the others (stop); returns when all ended. */
    private static void runTogether(int n, AtomicBoolean stop, ConcurrentLinkedQueue<Throwable> failures, Submitter body)
            throws InterruptedException {
        CountDownLatch start = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < n; t++) {
            int me = t;
            threads.add(Thread.ofPlatform().start(() -> {
                try {
                    start.await();
                    body.run(me);
                } catch (Throwable e) {
                    failures.add(e);
                    stop.set(true);
                }
            }));
        }
        start.countDown();
        for (Thread t : threads) {
            t.join();
        }
    }
}
