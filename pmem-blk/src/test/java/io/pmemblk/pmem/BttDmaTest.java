package io.pmemblk.pmem;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.testing.InjectedFaults;
import io.pmemblk.pmem.btt.BttLayout;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Closing;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The DMA route on the BTT layout, against the software I/OAT device: WRITEs whose groups' data stage is the
 * channel's, READs copied out of their blocks by the channel while the blocks are held in the device-read table,
 * beside the CPU route on the same blocks from several queues at once; a failed copy stored (or read) by the CPU;
 * a dispatcher out of lanes (they are held by groups in flight) ringing the doorbell and waiting; and close()
 * committing the groups still in flight before the mapping goes. Crash images of the route: BttCrashTest.
 */
class BttDmaTest {
    /** A pool header and one 16 MiB arena, plus a little (as BttDriverTest's). */
    static final long SIZE = BttLayout.BTT_OFFSET + (16 << 20) + (1 << 20);
    @TempDir
    Path dir;
    DmaEngine engine;
    PmemBlockDriver driver;
    BlockLayer layer;
    CopyStats stats;
    InjectedFaults faults;

    /**
     * Formats (first time) or opens the BTT of d.img with a soft engine of 2 channels ({@code ring} descriptors of
     * 64 KiB each), routed by {@code routing}, on {@code queues} hardware queues and {@code callers x lanesPerCaller}
     * lanes.
     */
    private void serve(int sector, int queues, int callers, int lanesPerCaller, Routing routing, int ring)
            throws IOException {
        Path file = dir.resolve("d.img");
        boolean fresh = !Files.exists(file);
        PmemRegion region = PmemRegion.open(file, SIZE, false, PmemRegion.Mapper.AUTO);
        if (fresh) {
            BttRegion.format(region, sector);
        }
        faults = new InjectedFaults();
        engine = DmaEngine.soft(new IovaSpace(), 2, ring, 16, faults);
        faults.attach(engine.softDevice().orElseThrow());
        stats = new CopyStats();
        driver = PmemBlockDriver.onBtt(region, stats, BttRegion.open(region, callers, 0, lanesPerCaller), engine,
                routing);
        layer = new BlockLayer(driver, queues, 32, 8 << 20, 1 << 20);
    }

    /** The driver first: its engine drains (groups in flight commit) before the pools it copies from are freed. */
    private void stop() throws Exception {
        try {
            Closing.closeAll(driver, layer);
        } finally {
            driver = null;
            layer = null;
        }
    }

    @AfterEach
    void tearDown() throws Exception {
        stop();
    }

    /** A WRITE of {@code data} at {@code off}, completing into {@code done}; not dispatched. */
    private static Request write(HardwareQueue q, long off, byte[] data, BlockingQueue<Request> done)
            throws InterruptedException {
        Request r = q.acquire(data.length);
        r.op = Op.WRITE;
        r.offset = off;
        r.length = data.length;
        InlineRequests.fill(r, data);
        r.completion = done::add;
        return r;
    }

    /** Dispatches the batch in one call and waits (10 s at most) for each completion; their statuses, released. */
    private static int[] dispatchAndAwait(HardwareQueue q, Request[] batch, BlockingQueue<Request> done)
            throws InterruptedException {
        return dispatchAndAwait(q, batch, done, new Route[batch.length]);
    }

    /** As {@link #dispatchAndAwait(HardwareQueue, Request[], BlockingQueue)}, each one's route into {@code routes}. */
    private static int[] dispatchAndAwait(HardwareQueue q, Request[] batch, BlockingQueue<Request> done,
                                          Route[] routes) throws InterruptedException {
        q.dispatch(batch, batch.length);
        int[] status = new int[batch.length];
        for (int i = 0; i < batch.length; i++) {
            Request r = done.poll(10, TimeUnit.SECONDS);
            assertThat(r).as("completion %d of %d within 10 s", i + 1, batch.length).isNotNull();
            for (int k = 0; k < batch.length; k++) {
                if (batch[k] == r) {
                    status[k] = r.status();
                    routes[k] = r.route;
                }
            }
        }
        for (Request r : batch) {
            r.release();
        }
        return status;
    }

    /** A READ of [off, off+len), waited for (10 s): its data; the route it took in {@code route[0]} if given. */
    private static byte[] read(HardwareQueue q, long off, int len, Route[] route) throws InterruptedException {
        Request r = q.acquire(len);
        r.op = Op.READ;
        r.offset = off;
        r.length = len;
        BlockingQueue<Request> done = new ArrayBlockingQueue<>(1);
        r.completion = done::add;
        q.dispatch(new Request[]{r}, 1);
        assertThat(done.poll(10, TimeUnit.SECONDS)).as("READ %d+%d completed within 10 s", off, len).isNotNull();
        assertThat(r.status()).as("READ %d+%d", off, len).isZero();
        byte[] out = new byte[len];
        int pos = 0;
        for (int s = 0; s < r.segments(); s++) {
            ByteBuffer b = r.buffers()[s].duplicate();
            b.clear();
            int k = r.segmentLength(s);
            b.limit(k);
            b.get(out, pos, k);
            pos += k;
        }
        if (route != null) {
            route[0] = r.route;
        }
        r.release();
        return out;
    }

    private static byte[] bytes(long seed, int n) {
        byte[] b = new byte[n];
        new Random(seed).nextBytes(b);
        return b;
    }

    /**
     * Both routes at once from three queues (routed by a 16 KiB threshold, route.dma.bounce): three writers, each
     * on a range of its own, dispatch batches of WRITEs of 1 sector to 64 KiB (CPU below 16 KiB, DMA from it) and
     * read back sub-ranges of any alignment (DMA from 16 KiB); two writers fill shared sectors, one value per
     * sector, while two readers read them in long READs (DMA) and find every sector wholly one value: a block is
     * never reused while the engine still reads it. Then every range reads back as its writer's shadow says, also
     * after a restart, the BTT is consistent, and every route and direction carried bytes. With {@code 4096}, every
     * 37th descriptor of channel 0 fails too: those groups and READs are done again by the CPU. Progress is counted,
     * not timed: each private writer does a fixed number of batches and the readers read until they have a fixed
     * number of READs, however long a loaded host takes; the deadline is there only so that a stall fails the test
     * instead of hanging it.
     */
    @ParameterizedTest
    @ValueSource(ints = {512, 4096})
    void bothRoutesFromManyQueuesReadBackWhatWasWrittenAndNeverTearASector(int sector) throws Exception {
        serve(sector, 3, 3, 32, new Routing(16 << 10, Integer.MAX_VALUE, true), 512); // 96 lanes
        if (sector == 4096) {
            faults.failEvery(0, 37, IoatSpec.CHANERR_DEST_ADDR);
        }
        int own = 128 << 10; // each private writer's range, bytes
        int privateWriters = 3, sharedSectors = (64 << 10) / sector; // shared READs of 32 KiB and more: DMA
        int batchesPerWriter = 15, sharedReadsWanted = 20;
        long sharedAt = (long) privateWriters * own;
        byte[][] shadow = new byte[privateWriters][own];
        Workers workers = new Workers();
        AtomicLong batches = new AtomicLong(), sharedReads = new AtomicLong();
        for (int w = 0; w < privateWriters; w++) {
            int id = w;
            workers.start("writer " + id, () -> {
                HardwareQueue q = layer.queue(id);
                Random rnd = new Random(id * 31L + sector);
                BlockingQueue<Request> done = new ArrayBlockingQueue<>(8);
                long base = (long) id * own;
                for (int b = 0; b < batchesPerWriter && !workers.stopped(); b++) {
                    // 1, 2 or 4 WRITEs, each in a slice of the range of its own: a block device orders no two
                    // overlapping WRITEs in flight at once, and here they may take different routes
                    int n = 1 << rnd.nextInt(3), slice = own / n;
                    Request[] batch = new Request[n];
                    long[] offs = new long[n];
                    byte[][] data = new byte[n][];
                    for (int k = 0; k < n; k++) {
                        int len = sector * (1 + rnd.nextInt(Math.min(64 << 10, slice) / sector));
                        offs[k] = (long) k * slice + (long) sector * rnd.nextInt((slice - len) / sector + 1);
                        data[k] = bytes(rnd.nextLong(), len);
                        batch[k] = write(q, base + offs[k], data[k], done);
                    }
                    int[] st = dispatchAndAwait(q, batch, done);
                    for (int k = 0; k < n; k++) {
                        if (st[k] != Status.OK) {
                            workers.problem("writer " + id + ": WRITE answered " + st[k]);
                        }
                        System.arraycopy(data[k], 0, shadow[id], (int) offs[k], data[k].length);
                    }
                    int len = 1 + rnd.nextInt(64 << 10);
                    int at = rnd.nextInt(own - len + 1);
                    byte[] got = read(q, base + at, len, null);
                    if (!Arrays.equals(got, 0, len, shadow[id], at, at + len)) {
                        workers.problem("writer " + id + ": READ " + at + "+" + len + " differs from what was written");
                    }
                    batches.incrementAndGet();
                }
            });
        }
        for (int w = 0; w < 2; w++) { // shared sectors: one value each
            int id = w;
            workers.start("shared writer " + id, () -> {
                HardwareQueue q = layer.queue(id);
                Random rnd = new Random(100 + id);
                BlockingQueue<Request> done = new ArrayBlockingQueue<>(4);
                while (!workers.stopped()) {
                    int n = 1 + rnd.nextInt(3);
                    Request[] batch = new Request[n];
                    for (int k = 0; k < n; k++) {
                        int first = rnd.nextInt(sharedSectors), count = 1 + rnd.nextInt(sharedSectors - first);
                        byte[] data = new byte[count * sector];
                        for (int s = 0; s < count; s++) {
                            Arrays.fill(data, s * sector, (s + 1) * sector, (byte) rnd.nextInt(256));
                        }
                        batch[k] = write(q, sharedAt + (long) first * sector, data, done);
                    }
                    for (int st : dispatchAndAwait(q, batch, done)) {
                        if (st != Status.OK) {
                            workers.problem("shared writer " + id + ": WRITE answered " + st);
                        }
                    }
                }
            });
        }
        for (int rd = 0; rd < 2; rd++) {
            int id = rd;
            workers.start("reader " + id, () -> {
                HardwareQueue q = layer.queue(2 - id);
                Random rnd = new Random(200 + id);
                while (!workers.stopped()) {
                    int first = rnd.nextInt(sharedSectors / 2), count = sharedSectors / 2 + rnd.nextInt(sharedSectors / 2 - first + 1);
                    byte[] got = read(q, sharedAt + (long) first * sector, count * sector, null);
                    for (int s = 0; s < count; s++) {
                        for (int b = s * sector; b < (s + 1) * sector; b++) {
                            if (got[b] != got[s * sector]) {
                                workers.problem("a READ of shared sector " + (first + s) + " mixes " + got[s * sector]
                                        + " and " + got[b]);
                                break;
                            }
                        }
                    }
                    sharedReads.incrementAndGet();
                    Thread.sleep(0, 200_000); // seven threads and the engine's on two cores: leave the writers some
                }
            });
        }
        // A stall, not a slow host, misses this: under load on two cores the writers have done one batch in 0.5 s.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(180);
        long wantedBatches = (long) privateWriters * batchesPerWriter;
        while (workers.noProblem() && (batches.get() < wantedBatches || sharedReads.get() < sharedReadsWanted)) {
            if (System.nanoTime() > deadline) {
                workers.stop();
                throw new AssertionError("no progress for 180 s: " + batches.get() + " of " + wantedBatches
                        + " private batches, " + sharedReads.get() + " of " + sharedReadsWanted + " shared READs");
            }
            Thread.sleep(5);
        }
        workers.stopAndJoin(20);
        assertThat(batches.get()).as("private batches done").isEqualTo(wantedBatches);
        assertThat(sharedReads.get()).as("shared READs done").isGreaterThanOrEqualTo(sharedReadsWanted);
        System.out.println("BTT DMA route, sector " + sector + ": " + batches.get() + " private batches, "
                + sharedReads.get() + " shared READs; bytes written by DMA " + stats.bytes(Route.DMA, true) + ", by CPU "
                + stats.bytes(Route.CPU, true) + "; read by DMA " + stats.bytes(Route.DMA, false) + ", by CPU "
                + stats.bytes(Route.CPU, false) + "; DMA fallbacks " + stats.dmaFallbacks());
        assertThat(stats.bytes(Route.DMA, true)).as("DMA wrote").isPositive();
        assertThat(stats.bytes(Route.CPU, true)).as("the CPU wrote").isPositive();
        assertThat(stats.bytes(Route.DMA, false)).as("DMA read").isPositive();
        assertThat(stats.bytes(Route.CPU, false)).as("the CPU read").isPositive();
        if (sector == 4096) {
            assertThat(stats.dmaFallbacks()).as("failed copies were done again by the CPU").isPositive();
        }
        for (int w = 0; w < privateWriters; w++) {
            assertThat(read(layer.queue(0), (long) w * own, own, null)).as("writer %d's range", w).isEqualTo(shadow[w]);
        }
        assertThat(driver.btt().check()).isEmpty();
        stop();
        serve(sector, 1, 1, 8, new Routing(16 << 10, Integer.MAX_VALUE, true), 128);
        assertThat(driver.btt().notes()).as("a clean close leaves nothing to recover").isEmpty();
        for (int w = 0; w < privateWriters; w++) {
            assertThat(read(layer.queue(0), (long) w * own, own, null)).as("writer %d's range after a restart", w)
                    .isEqualTo(shadow[w]);
        }
    }

    /**
     * A copy that fails (the channel halts on it, and on every copy behind it): the group it belongs to is stored
     * by the CPU before its flog and map steps, every WRITE answers OK and reads back, counted as a fallback; the
     * channel recovers and the next batch goes by DMA. A READ whose copy fails is read again by the CPU.
     */
    @Test
    void aFailedCopyIsDoneAgainByTheCpuAndTheDataIsRight() throws Exception {
        serve(4096, 1, 1, 32, new Routing(4096, Integer.MAX_VALUE, true), 256);
        HardwareQueue q = layer.queue(0);
        BlockingQueue<Request> done = new ArrayBlockingQueue<>(16);
        faults.failDescriptor(0, 3, IoatSpec.CHANERR_DEST_ADDR); // queue 0 -> channel 0
        Request[] batch = new Request[4];
        byte[][] data = new byte[4][];
        for (int i = 0; i < 4; i++) {
            data[i] = bytes(10 + i, 8 * 4096);
            batch[i] = write(q, i * 8 * 4096L, data[i], done);
        }
        q.dispatch(batch, 4);
        List<Route> routes = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            Request r = done.poll(10, TimeUnit.SECONDS);
            assertThat(r).isNotNull();
            assertThat(r.status()).isZero();
            routes.add(r.route);
        }
        for (Request r : batch) {
            r.release();
        }
        assertThat(routes).as("the group with the failed copy was stored by the CPU").contains(Route.CPU);
        assertThat(stats.dmaFallbacks()).isPositive();
        for (int i = 0; i < 4; i++) {
            assertThat(read(q, i * 8 * 4096L, 8 * 4096, null)).isEqualTo(data[i]);
        }
        assertThat(driver.btt().check()).isEmpty();
        // the channel recovered: the next WRITE goes by DMA
        byte[] next = bytes(99, 16 * 4096);
        Route[] route = new Route[1];
        assertThat(dispatchAndAwait(q, new Request[]{write(q, 64 * 4096L, next, done)}, done, route))
                .containsExactly(Status.OK);
        assertThat(route[0]).isEqualTo(Route.DMA);
        assertThat(read(q, 64 * 4096L, next.length, route)).isEqualTo(next);
        assertThat(route[0]).isEqualTo(Route.DMA);
        // a READ whose copy fails: read again by the CPU, and right
        long fallbacks = stats.dmaFallbacks();
        faults.failDescriptor(0, 1, IoatSpec.CHANERR_DEST_ADDR); // the first: its sectors, contiguous, may be one run
        assertThat(read(q, 64 * 4096L + 100, next.length - 200, route)).isEqualTo(Arrays.copyOfRange(next, 100,
                next.length - 100));
        assertThat(route[0]).isEqualTo(Route.CPU);
        assertThat(stats.dmaFallbacks()).isGreaterThan(fallbacks);
        // never written: zeros, whichever route
        assertThat(read(q, 200 * 4096L, 8 * 4096, null)).containsOnly(0);
    }

    /**
     * A block the engine still reads is not reused: with one lane, a DMA READ of sectors 0-3 in flight (its
     * channel stalled) holds their blocks; a WRITE of sector 0 goes to the lane's free block and frees sector 0's
     * old block, which becomes the lane's free block, so the next WRITE of sector 0 must wait for the READ. It
     * does, until the channel runs; the READ then holds the old data whole, and the second WRITE lands after it.
     */
    @Test
    void aWriterWaitsForABlockTheEngineStillReads() throws Exception {
        serve(4096, 2, 1, 1, new Routing(16 << 10, Integer.MAX_VALUE, true), 64);
        assertThat(driver.btt().lanes()).isEqualTo(1);
        HardwareQueue dmaQueue = layer.queue(0), cpuQueue = layer.queue(1); // channels 0 and 1
        byte[] a = bytes(1, 4 * 4096), b = bytes(2, 4096), c = bytes(3, 4096);
        BlockingQueue<Request> done = new ArrayBlockingQueue<>(4);
        assertThat(dispatchAndAwait(cpuQueue, new Request[]{write(cpuQueue, 0, a, done)}, done)).containsOnly(Status.OK);
        faults.stall(0, true);
        Request rd = dmaQueue.acquire(a.length);
        rd.op = Op.READ;
        rd.offset = 0;
        rd.length = a.length;
        BlockingQueue<Request> readDone = new ArrayBlockingQueue<>(1);
        rd.completion = readDone::add;
        dmaQueue.dispatch(new Request[]{rd}, 1);
        assertThat(readDone).as("in flight: its channel is stalled").isEmpty();
        AtomicBoolean secondWritten = new AtomicBoolean();
        ConcurrentLinkedQueue<String> problems = new ConcurrentLinkedQueue<>();
        Thread writer = Thread.ofPlatform().start(() -> {
            try {
                BlockingQueue<Request> mine = new ArrayBlockingQueue<>(1);
                if (dispatchAndAwait(cpuQueue, new Request[]{write(cpuQueue, 0, b, mine)}, mine)[0] != Status.OK
                        || dispatchAndAwait(cpuQueue, new Request[]{write(cpuQueue, 0, c, mine)}, mine)[0] != Status.OK) {
                    problems.add("a WRITE failed");
                }
                secondWritten.set(true);
            } catch (Throwable t) {
                problems.add(t.toString());
            }
        });
        Thread.sleep(300);
        assertThat(secondWritten.get()).as("the second WRITE waits for the READ's block").isFalse();
        faults.stall(0, false);
        Request got = readDone.poll(10, TimeUnit.SECONDS);
        assertThat(got).isNotNull();
        assertThat(got.status()).isZero();
        assertThat(got.route).isEqualTo(Route.DMA);
        byte[] out = new byte[a.length];
        rd.buffers()[0].get(out);
        rd.release();
        assertThat(out).as("the READ's blocks were not reused under it").isEqualTo(a);
        writer.join(10_000);
        assertThat(secondWritten.get()).isTrue();
        assertThat(problems).isEmpty();
        byte[] expect = a.clone();
        System.arraycopy(c, 0, expect, 0, 4096);
        assertThat(read(dmaQueue, 0, expect.length, null)).isEqualTo(expect);
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * Two lanes only: every group of 2 sectors holds both while its copies are in flight. A batch of 12 one-sector
     * WRITEs needs 6 groups: the dispatcher finds no lane for the second, rings the doorbell and waits, and goes on
     * as each group's completion gives its lanes back. With the channel stalled it waits (the lanes are held across
     * the asynchronous completion), and goes on once the channel runs again; it never deadlocks on lanes it holds.
     */
    @Test
    void aDispatcherOutOfLanesRingsTheDoorbellAndWaitsForTheGroupsInFlight() throws Exception {
        serve(4096, 1, 1, 2, new Routing(4096, Integer.MAX_VALUE, true), 64);
        assertThat(driver.btt().lanes()).isEqualTo(2);
        HardwareQueue q = layer.queue(0);
        BlockingQueue<Request> done = new ArrayBlockingQueue<>(16);
        byte[][] data = new byte[12][];
        Request[] batch = new Request[12];
        for (int i = 0; i < 12; i++) {
            data[i] = bytes(300 + i, 4096);
            batch[i] = write(q, i * 5 * 4096L, data[i], done);
        }
        faults.stall(true);
        AtomicBoolean dispatched = new AtomicBoolean();
        Thread dispatcher = Thread.ofPlatform().start(() -> {
            q.dispatch(batch, batch.length);
            dispatched.set(true);
        });
        Thread.sleep(300);
        assertThat(dispatched.get()).as("waiting for lanes held by groups in flight").isFalse();
        assertThat(done).as("nothing completes while the channel is stalled").isEmpty();
        faults.stall(false);
        dispatcher.join(10_000);
        assertThat(dispatched.get()).as("the dispatch ended once the channel ran").isTrue();
        for (int i = 0; i < 12; i++) {
            Request r = done.poll(10, TimeUnit.SECONDS);
            assertThat(r).isNotNull();
            assertThat(r.status()).isZero();
            assertThat(r.route).isEqualTo(Route.DMA);
        }
        for (Request r : batch) {
            r.release();
        }
        for (int i = 0; i < 12; i++) {
            assertThat(read(q, i * 5 * 4096L, 4096, null)).isEqualTo(data[i]);
        }
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * close() with groups in flight (the channel stalled under them): the engine's close waits for their copies,
     * which run once the channel does, and their flog and map steps are done before the mapping goes; every WRITE
     * completes OK, and after a restart reads back with nothing left to recover.
     */
    @Test
    void closeCommitsTheGroupsInFlightBeforeUnmapping() throws Exception {
        serve(4096, 1, 1, 32, new Routing(4096, Integer.MAX_VALUE, true), 256);
        HardwareQueue q = layer.queue(0);
        BlockingQueue<Request> done = new ArrayBlockingQueue<>(16);
        byte[][] data = new byte[6][];
        Request[] batch = new Request[6];
        for (int i = 0; i < 6; i++) {
            data[i] = bytes(400 + i, 3 * 4096);
            batch[i] = write(q, i * 4 * 4096L, data[i], done);
        }
        faults.stall(true);
        q.dispatch(batch, batch.length);
        assertThat(done).as("in flight: the channel is stalled").isEmpty();
        InjectedFaults stalled = faults;
        Thread release = Thread.ofPlatform().start(() -> {
            try {
                Thread.sleep(300);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            stalled.stall(false);
        });
        driver.close(); // waits for the copies, commits the groups, then unmaps
        release.join();
        for (int i = 0; i < 6; i++) {
            Request r = done.poll(1, TimeUnit.SECONDS);
            assertThat(r).as("completed by the close").isNotNull();
            assertThat(r.status()).isZero();
            r.release();
        }
        layer.close();
        driver = null;
        layer = null;
        serve(4096, 1, 1, 32, Routing.CPU_ONLY, 64);
        assertThat(driver.btt().notes()).as("every group committed before the unmap: nothing to recover").isEmpty();
        for (int i = 0; i < 6; i++) {
            assertThat(read(layer.queue(0), i * 4 * 4096L, 3 * 4096, null)).isEqualTo(data[i]);
        }
        assertThat(driver.btt().check()).isEmpty();
    }

    /**
     * Caller memory (a guest's RAM) on the BTT: pieces of whole sectors go by DMA straight into the free blocks
     * and back out; a WRITE whose pieces split a sector takes the CPU route (a sector split over pieces would be
     * gathered into a bounce sector the engine cannot reach); both read back right.
     */
    @Test
    void callerMemoryOfWholeSectorsGoesByDmaAndSplitSectorsByTheCpu() throws Exception {
        serve(4096, 1, 1, 32, new Routing(4096, Integer.MAX_VALUE, false), 256);
        try (Arena arena = Arena.ofShared()) {
            MemorySegment guest = arena.allocate(1 << 20, 4096);
            long iova = driver.registerMemory(guest);
            FrontendQueue f = new FrontendQueue(layer.queue(0));
            BlockingQueue<Request> done = new ArrayBlockingQueue<>(4);
            byte[] a = bytes(1, 4 * 4096), b = bytes(2, 4 * 4096);
            MemorySegment.copy(MemorySegment.ofArray(a), 0, guest, 0, a.length);
            MemorySegment.copy(MemorySegment.ofArray(b), 0, guest, 256 << 10, b.length);
            Request whole = f.acquireIov(Op.WRITE, 0, a.length); // two pieces of 2 sectors each, apart in guest RAM
            whole.addIov(guest.asSlice(0, 8192), iova);
            whole.addIov(guest.asSlice(8192, 8192), iova + 8192);
            whole.completion = done::add;
            Request split = f.acquireIov(Op.WRITE, 16 * 4096L, b.length); // 1000 + the rest: a sector split
            split.addIov(guest.asSlice(256 << 10, 1000), iova + (256 << 10));
            split.addIov(guest.asSlice((256 << 10) + 1000, b.length - 1000), iova + (256 << 10) + 1000);
            split.completion = done::add;
            f.add(whole);
            f.add(split);
            f.dispatch();
            for (int i = 0; i < 2; i++) {
                Request r = done.poll(10, TimeUnit.SECONDS);
                assertThat(r).isNotNull();
                assertThat(r.status()).isZero();
                assertThat(r.route).isEqualTo(r == whole ? Route.DMA : Route.CPU);
                r.release();
            }
            assertThat(read(layer.queue(0), 0, a.length, null)).isEqualTo(a);
            assertThat(read(layer.queue(0), 16 * 4096L, b.length, null)).isEqualTo(b);
            // and a READ into caller memory, unaligned, by DMA
            Request rd = f.acquireIov(Op.READ, 100, 3 * 4096);
            rd.addIov(guest.asSlice(512 << 10, 5000), iova + (512 << 10));
            rd.addIov(guest.asSlice((512 << 10) + 8192, 3 * 4096 - 5000), iova + (512 << 10) + 8192);
            rd.completion = done::add;
            f.add(rd);
            f.dispatch();
            Request got = done.poll(10, TimeUnit.SECONDS);
            assertThat(got).isNotNull();
            assertThat(got.status()).isZero();
            assertThat(got.route).isEqualTo(Route.DMA);
            got.release();
            byte[] out = new byte[3 * 4096];
            MemorySegment.copy(guest, (512 << 10), MemorySegment.ofArray(out), 0, 5000);
            MemorySegment.copy(guest, (512 << 10) + 8192, MemorySegment.ofArray(out), 5000, 3 * 4096 - 5000);
            assertThat(out).isEqualTo(Arrays.copyOfRange(a, 100, 100 + 3 * 4096));
            stop(); // before the arena: the engine must not outlive the guest memory it maps
        }
    }
}
