package io.pmemblk.pmem;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.testing.InjectedFaults;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Crash consistency of the pmem path, checked on possible post-crash images ({@link CrashModel}): random
 * workloads through the real driver (CPU copies, payloads received in place as the NBD and ublk frontends do,
 * soft DMA with injected faults, three hardware queues, FLUSH on a queue other than the writes'), crashed at
 * thousands of points while requests are in flight. The invariant, for every byte of every image:
 * <ul>
 *   <li>it holds the data of the last <em>promised</em> write covering it (a FUA write acknowledged before the
 *       crash, or a write acknowledged before a FLUSH that was acknowledged before the crash), or of a write
 *       submitted after that one (acknowledged or not: it may have reached the media);</li>
 *   <li>with no promised write, the initial content or any write submitted before the crash;</li>
 *   <li>nothing else (no byte from outside a request's own range, no stale version behind a promise).</li>
 * </ul>
 * Overlapping writes are never in flight together (as a filesystem does), so submission order is completion
 * order where they overlap. Runs on both mappers; the surefire execution forced-pmem runs it again with
 * PMEM_IS_PMEM_FORCE=1, where persistence is cache-line write-backs and drains per thread.
 *
 * <p>On a violation the same seed is run again with fewer steps, and the smallest failing workload is reported.
 */
class CrashConsistencyTest {
    static final int SIZE = 256 << 10;
    static final int STEPS = 150;
    static final int IMAGES_PER_STEP = 2;
    static final boolean FORCED = "1".equals(System.getenv("PMEM_IS_PMEM_FORCE"));
    /** Crash images checked by this JVM's runs (reported in the log, for the note). */
    static final AtomicInteger CHECKED = new AtomicInteger();

    @TempDir
    Path dir;

    static Stream<Object[]> cases() {
        List<Object[]> l = new ArrayList<>();
        for (PmemRegion.Mapper m : new PmemRegion.Mapper[]{PmemRegion.Mapper.JAVA, PmemRegion.Mapper.LIBPMEM}) {
            for (long seed = 1; seed <= 4; seed++) {
                l.add(new Object[]{m, seed});
            }
        }
        return l.stream();
    }

    @ParameterizedTest(name = "{0} seed {1}")
    @MethodSource("cases")
    void everyPromisedWriteSurvivesEveryCrash(PmemRegion.Mapper mapper, long seed) throws Exception {
        if (mapper == PmemRegion.Mapper.LIBPMEM) {
            assumeTrue(Libpmem.load().isPresent(), "libpmem not installed");
        }
        Optional<String> violation = new Run(dir.resolve("full"), mapper, seed, STEPS).call();
        if (violation.isPresent()) {
            String smallest = violation.get();
            int steps = STEPS;
            for (int n = 1; n < STEPS; n = n < 8 ? n + 1 : n * 3 / 2) { // the smallest workload that still fails
                Optional<String> v = new Run(dir.resolve("shrink-" + n), mapper, seed, n).call();
                if (v.isPresent()) {
                    smallest = v.get();
                    steps = n;
                    break;
                }
            }
            throw new AssertionError("crash image violates a promise (" + mapper + ", seed " + seed + "); smallest failing"
                    + " workload: " + steps + " steps:\n" + smallest);
        }
        System.out.println("crash images checked so far: " + CHECKED.get());
    }

    /** One random workload on a fresh device, crashed after every step. */
    static final class Run {
        final Path dir;
        final PmemRegion.Mapper mapper;
        final long seed;
        final int steps;
        final Random rnd;
        CrashModel model;
        PmemBlockDriver driver;
        BlockLayer layer;
        final List<W> writes = new ArrayList<>();
        final List<String> log = new ArrayList<>();
        final AtomicInteger inFlight = new AtomicInteger();

        /** A write (or a range zeroed: TRIM/WRITE_ZEROES) in submission order. Fields under the model's lock. */
        static final class W {
            final int index;
            final long off;
            final int len;
            final boolean fua;
            final boolean zero;
            final long pattern;
            boolean acked;
            boolean promised;

            W(int index, long off, int len, boolean fua, boolean zero, long pattern) {
                this.index = index;
                this.off = off;
                this.len = len;
                this.fua = fua;
                this.zero = zero;
                this.pattern = pattern;
            }

            byte value(long b) {
                return zero ? 0 : (byte) ((pattern * 0x9E3779B97F4A7C15L + b * 0xC2B2AE3D27D4EB4FL) >>> 56);
            }

            boolean covers(long b) {
                return b >= off && b < off + len;
            }

            @Override
            public String toString() {
                return "#" + index + " " + (zero ? "ZERO" : "WRITE") + (fua ? " FUA" : "") + " [" + off + ", " + (off + len) + ")";
            }
        }

        Run(Path dir, PmemRegion.Mapper mapper, long seed, int steps) {
            this.dir = dir;
            this.mapper = mapper;
            this.seed = seed;
            this.steps = steps;
            this.rnd = new Random(seed);
        }

        Optional<String> call() throws Exception {
            Files.createDirectories(dir);
            PmemRegion region = RegionFile.open(dir.resolve("d.img"), SIZE, false, mapper, true, p -> model = new CrashModel(p));
            model.attach(region.memory());
            assertThat(region.isPmem()).isEqualTo(mapper == PmemRegion.Mapper.LIBPMEM && FORCED);
            InjectedFaults faults = new InjectedFaults();
            DmaEngine engine = DmaEngine.soft(new IovaSpace(), 2, 64, 12, faults);
            if (seed % 2 == 0) { // faults: halted copies are redone by the CPU
                faults.failEvery(0, 7, IoatSpec.CHANERR_DEST_ADDR);
            }
            driver = new PmemBlockDriver(region, new CopyStats(), engine, new Routing(16 << 10, Integer.MAX_VALUE, true));
            layer = new BlockLayer(driver, 3, 16, 4 << 20, 64 << 10);
            try {
                Random crash = new Random(seed * 31);
                for (int step = 0; step < steps; step++) {
                    step();
                    for (int i = 0; i < IMAGES_PER_STEP; i++) {
                        Optional<String> v = crashAndCheck(crash);
                        if (v.isPresent()) {
                            return Optional.of(v.get() + "\nworkload:\n  " + String.join("\n  ", log));
                        }
                    }
                }
                awaitIdle();
                return crashAndCheck(crash).map(v -> v + "\nworkload:\n  " + String.join("\n  ", log));
            } finally {
                awaitIdle();
                driver.close();
                layer.close();
            }
        }

        /** One to three requests on random queues, or a FLUSH, or a pause for everything in flight. */
        void step() throws Exception {
            int kind = rnd.nextInt(10);
            if (kind == 0) {
                flush(layer.queue(rnd.nextInt(3)));
                return;
            }
            if (kind == 1) {
                awaitIdle();
                log.add("(all acknowledged)");
                return;
            }
            for (int n = 1 + rnd.nextInt(3); n > 0; n--) {
                long off = 512L * rnd.nextInt(SIZE / 512 - 1);
                int len = (int) Math.min(512 * (1 + rnd.nextInt(96)), SIZE - off);
                boolean zero = rnd.nextInt(8) == 0;
                boolean fua = rnd.nextInt(5) < 2;
                synchronized (this) {
                    for (W w : writes) {
                        if (!w.acked && w.off < off + len && off < w.off + w.len) {
                            awaitIdle(); // never two overlapping writes in flight
                            break;
                        }
                    }
                }
                submit(layer.queue(rnd.nextInt(3)), off, len, fua, zero);
            }
        }

        void submit(HardwareQueue q, long off, int len, boolean fua, boolean zero) throws InterruptedException {
            W w = model.atomically(() -> {
                W x = new W(writes.size(), off, len, fua, zero, rnd.nextLong());
                writes.add(x);
                return x;
            });
            Request r;
            boolean inPlace = !zero && rnd.nextBoolean() && driver.receivesInPlace(off, len);
            if (zero) {
                r = q.acquire(0);
                r.op = rnd.nextBoolean() ? Op.TRIM : Op.WRITE_ZEROES;
                r.length = len;
            } else if (inPlace) { // what the NBD reader's recv and ublk's pread do: the kernel stores into the mapping
                r = q.acquire(0);
                r.op = Op.WRITE;
                r.offset = off;
                r.length = len;
                driver.receiveInPlace(r);
            } else {
                r = q.acquire(len);
                r.op = Op.WRITE;
            }
            r.offset = off;
            r.fua = fua;
            if (!zero) {
                long b = off;
                ByteBuffer[] bufs = r.dataBuffers();
                for (int i = 0; i < r.dataBufferCount(); i++) {
                    ByteBuffer v = bufs[i];
                    while (v.hasRemaining()) {
                        v.put(w.value(b++));
                    }
                }
            }
            log.add(w + (inPlace ? " in place" : "") + " on q" + q.index());
            r.completion = done -> {
                boolean ok = done.status() == Status.OK;
                model.atomically(() -> {
                    w.acked = ok;
                    w.promised = ok && fua;
                    return null;
                });
                done.release();
                inFlight.decrementAndGet();
            };
            inFlight.incrementAndGet();
            q.dispatch(new Request[]{r}, 1);
        }

        /** A FLUSH promises every write acknowledged before it was submitted, once it is acknowledged. */
        void flush(HardwareQueue q) throws InterruptedException {
            List<W> covered = model.atomically(() -> writes.stream().filter(w -> w.acked).toList());
            Request r = q.acquire(0);
            r.op = Op.FLUSH;
            log.add("FLUSH on q" + q.index() + " (covers " + covered.size() + " acknowledged)");
            r.completion = done -> {
                boolean ok = done.status() == Status.OK;
                model.atomically(() -> {
                    if (ok) {
                        covered.forEach(w -> w.promised = true);
                    }
                    return null;
                });
                done.release();
                inFlight.decrementAndGet();
            };
            inFlight.incrementAndGet();
            q.dispatch(new Request[]{r}, 1);
        }

        void awaitIdle() throws InterruptedException {
            long deadline = System.nanoTime() + 20_000_000_000L;
            while (inFlight.get() > 0) {
                if (System.nanoTime() > deadline) {
                    throw new AssertionError(inFlight.get() + " requests still in flight after 20 s");
                }
                Thread.sleep(1);
            }
        }

        Optional<String> crashAndCheck(Random crash) {
            record Snap(byte[] image, boolean[] promised, int n) {}
            Snap s = model.atomically(() -> {
                boolean[] p = new boolean[writes.size()];
                for (int i = 0; i < p.length; i++) {
                    p[i] = writes.get(i).promised;
                }
                return new Snap(model.crashImage(crash), p, p.length);
            });
            CHECKED.incrementAndGet();
            int[] last = new int[SIZE];
            java.util.Arrays.fill(last, -1);
            for (int i = 0; i < s.n; i++) {
                if (s.promised[i]) {
                    W w = writes.get(i);
                    java.util.Arrays.fill(last, (int) w.off, (int) (w.off + w.len), i);
                }
            }
            boolean[] ok = new boolean[SIZE];
            for (int b = 0; b < SIZE; b++) {
                ok[b] = s.image[b] == (last[b] < 0 ? 0 : writes.get(last[b]).value(b));
            }
            for (int i = 0; i < s.n; i++) {
                W w = writes.get(i);
                for (int b = (int) w.off, end = (int) (w.off + w.len); b < end; b++) {
                    if (!ok[b] && i > last[b] && s.image[b] == w.value(b)) {
                        ok[b] = true;
                    }
                }
            }
            for (int b = 0; b < SIZE; b++) {
                if (!ok[b]) {
                    String promise = last[b] < 0 ? "no promised write" : "promised " + writes.get(last[b]);
                    return Optional.of("byte " + b + " reads 0x" + Integer.toHexString(s.image[b] & 0xFF) + " after the crash; "
                            + promise + " expects 0x" + Integer.toHexString((last[b] < 0 ? 0 : writes.get(last[b]).value(b)) & 0xFF)
                            + " (or a later write's byte); unit " + model.unit() + " B, crash after " + s.n + " submissions");
                }
            }
            return Optional.empty();
        }
    }
}
