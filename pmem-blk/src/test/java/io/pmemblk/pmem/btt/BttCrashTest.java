package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.Persistence;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Crash consistency of the BTT under the project's power-failure model ({@link CrashModel}): random writes and
 * zeroings from several lanes at once, a few LBAs shared so that lanes contend for the same map entries and cache
 * lines, crashed after every durability step (each drain or msync, on whichever thread). Every crash image is
 * opened (recovery runs) and must be
 * <ul>
 *   <li>consistent: every internal block referenced exactly once by the map and the flog's free blocks;</li>
 *   <li>sector-atomic: every touched block reads wholly as one version that was written to it (or zeros);</li>
 *   <li>true to every completed operation: a block reads the last completed write or zeroing, or one that
 *       overlapped it in time or came after it (in flight at the crash).</li>
 * </ul>
 * Two models: the page cache (4 KiB pages made durable by msync) and pmem (64-byte lines made durable by a
 * write-back and a drain on the same thread).
 */
class BttCrashTest {
    static final int LANES = 4, OPS_PER_LANE = 40, LBAS = 12;
    /**
     * The blocks the workload touches: the first 8 each in a map cache line (and mostly a page) of their own, so a
     * map store left unpersisted is not persisted by a neighbour's write (all in one line, a zeroing's missing
     * persist went unseen); the last 4 share one line, so lanes still contend for a line and its map lock.
     */
    static int lbaOf(int i) {
        return i < 8 ? i * 317 : 8 * 317 + (i - 8);
    }
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
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            Persistence real = modelName.equals("pmem") ? Pools.modelledPmem() : Pools.pageCache();
            Btt.format(m.memory(), real, sector, LANES);
            CrashModel model = new CrashModel(real);
            model.attach(m.memory());
            History history = new History();
            Random crashes = new Random(seed * 31);
            ConcurrentLinkedQueue<String> violations = new ConcurrentLinkedQueue<>();
            AtomicBoolean stop = new AtomicBoolean();
            int before = CHECKED.get();
            model.afterEachStep(() -> {
                if (stop.get()) {
                    return;
                }
                record Snap(byte[] image, List<Op> ops) {}
                Snap s = model.atomically(() -> new Snap(model.crashImage(crashes), history.snapshot()));
                String v = judge(s.image(), s.ops(), sector);
                CHECKED.incrementAndGet();
                if (v != null) {
                    violations.add(v);
                    stop.set(true);
                }
            });
            Btt btt = Btt.open(m.memory(), model, LANES);
            AtomicInteger versions = new AtomicInteger();
            CountDownLatch start = new CountDownLatch(1);
            List<Thread> threads = new ArrayList<>();
            ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
            for (int lane = 0; lane < LANES; lane++) {
                int me = lane;
                threads.add(Thread.ofPlatform().start(() -> {
                    try (Arena arena = Arena.ofConfined()) {
                        MemorySegment buf = arena.allocate(sector, 4096);
                        Random rnd = new Random(seed * 1000 + me);
                        start.await();
                        for (int i = 0; i < OPS_PER_LANE && !stop.get(); i++) {
                            int lba = lbaOf(rnd.nextInt(LBAS));
                            boolean zero = rnd.nextInt(5) == 0;
                            long version = zero ? 0 : versions.incrementAndGet();
                            if (!zero) {
                                BttTest.fill(buf, lba, version);
                            }
                            int index = model.atomically(() -> history.started(lba, version));
                            if (zero) {
                                btt.zero(me, lba);
                            } else {
                                btt.write(me, lba, buf);
                            }
                            model.atomically(() -> {
                                history.ended(index);
                                return null;
                            });
                        }
                    } catch (Throwable t) {
                        failures.add(t);
                        stop.set(true);
                    }
                }));
            }
            start.countDown();
            for (Thread t : threads) {
                t.join();
            }
            assertThat(failures).isEmpty();
            assertThat(violations).as("crash images violating the BTT's guarantees (first of them)")
                    .isEmpty();
            int checked = CHECKED.get() - before;
            System.out.println("BTT crash images checked (" + modelName + ", sector " + sector + "): " + checked);
            // Every operation costs at least one durability step (a zeroing of a zero block costs none).
            assertThat(checked).isGreaterThanOrEqualTo(LANES * OPS_PER_LANE);
        }
    }

    /**
     * Opens a copy of the crash image (recovery on the copy) and judges it; null when it keeps every guarantee.
     */
    static String judge(byte[] image, List<Op> ops, int sector) {
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
            for (int i = 0; i < LBAS; i++) {
                int lba = lbaOf(i);
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
}
