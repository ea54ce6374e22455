package io.pmemblk.pmem;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.SharedMemory;
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
import org.junit.jupiter.params.provider.EnumSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.Random;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * Caller-memory requests (a vhost-user guest's RAM) through the real driver and the software I/OAT device: the
 * pieces copied on both routes, byte for byte; the DMA route straight between the registered memory and pmem,
 * counted as DMA only; pieces the engine cannot reach kept on the CPU; memory withdrawn from the engine refused
 * with EIO; and route.dma.bounce deciding for pool-buffer requests alone.
 */
class CallerMemoryTest {
    static final int SIZE = 16 << 20;
    static final int GUEST = 8 << 20;
    @TempDir
    Path dir;
    DmaEngine engine;
    PmemBlockDriver driver;
    BlockLayer layer;
    FrontendQueue frontend;
    final CopyStats stats = new CopyStats();
    final Arena arena = Arena.ofShared();
    /** The guest's RAM: pieces are taken from it at scattered places, as a virtqueue's descriptors point. */
    final MemorySegment guest = arena.allocate(GUEST, 4096);
    final BlockingQueue<Request> done = new ArrayBlockingQueue<>(64);

    void open(Routing routing) throws IOException {
        // 64 KiB descriptors, so a piece larger than that is split by the channel
        engine = DmaEngine.soft(new IovaSpace(), 1, 512, 16);
        driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("d.img"), SIZE, false, PmemRegion.Mapper.AUTO),
                stats, engine, routing);
        layer = new BlockLayer(driver, 1, 16, 8 << 20, 4 << 20);
        frontend = new FrontendQueue(layer.queue(0));
    }

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(driver, layer, arena);
    }

    /** Where a request's pieces lie in guest memory and how long each is. */
    record Pieces(long[] at, int[] len) {
        long total() {
            long t = 0;
            for (int l : len) {
                t += l;
            }
            return t;
        }
    }

    /**
     * {@code n} pieces of odd sizes (1 byte to ~5 KiB, one of 150001 bytes: more than two descriptors), each after
     * an odd gap from {@code from}: the layout of a guest's scatter-gather list.
     */
    static Pieces scattered(long from, int n, int seed) {
        Random rnd = new Random(seed);
        int[] len = new int[n];
        for (int i = 0; i < n; i++) {
            len[i] = i == n / 2 ? 150_001 : 1 + rnd.nextInt(i % 3 == 0 ? 7 : 5000);
        }
        return laidOut(from, len, seed);
    }

    /** Pieces of these lengths from {@code from}, each after an odd gap. */
    static Pieces laidOut(long from, int[] len, int seed) {
        Random rnd = new Random(seed);
        long[] at = new long[len.length];
        long pos = from;
        for (int i = 0; i < len.length; i++) {
            pos += 1 + rnd.nextInt(97);
            at[i] = pos;
            pos += len[i];
        }
        return new Pieces(at, len);
    }

    Request submit(Op op, long offset, Pieces p, long guestIova, boolean fua) throws InterruptedException {
        Request r = frontend.acquireIov(op, offset, p.total());
        for (int i = 0; i < p.at().length; i++) {
            r.addIov(guest.asSlice(p.at()[i], p.len()[i]), guestIova == Request.NO_IOVA ? Request.NO_IOVA
                    : guestIova + p.at()[i]);
        }
        r.fua = fua;
        r.completion = done::add;
        frontend.add(r);
        frontend.dispatch();
        Request got = done.poll(10, TimeUnit.SECONDS);
        assertThat(got).as("%s completed within 10 s", r).isSameAs(r);
        return got;
    }

    void fillGuest(Pieces p, int seed) {
        Random rnd = new Random(seed);
        for (int i = 0; i < p.at().length; i++) {
            for (int b = 0; b < p.len()[i]; b++) {
                guest.set(ValueLayout.JAVA_BYTE, p.at()[i] + b, (byte) rnd.nextInt());
            }
        }
    }

    /** The pieces' bytes, in order: what the request's data is. */
    byte[] gather(Pieces p) {
        byte[] out = new byte[(int) p.total()];
        int pos = 0;
        for (int i = 0; i < p.at().length; i++) {
            MemorySegment.copy(guest, ValueLayout.JAVA_BYTE, p.at()[i], out, pos, p.len()[i]);
            pos += p.len()[i];
        }
        return out;
    }

    byte[] device(long off, int len) {
        return driver.region().memory().asSlice(off, len).toArray(ValueLayout.JAVA_BYTE);
    }

    @ParameterizedTest(name = "{0}")
    @EnumSource(Route.class)
    void aWriteThenAReadOfManyOddPiecesRoundTripsOnEitherRoute(Route route) throws Exception {
        open(route == Route.DMA ? new Routing(1, Integer.MAX_VALUE) : new Routing(Long.MAX_VALUE, Integer.MAX_VALUE));
        long iova = driver.registerMemory(guest);
        assertThat(iova).as("the engine maps guest memory").isNotEqualTo(Request.NO_IOVA);
        Pieces w = scattered(0, 200, 1);
        fillGuest(w, 2);
        byte[] data = gather(w);
        long off = 3 * 4096 + 7;
        Request wr = submit(Op.WRITE, off, w, iova, false);
        assertThat(wr.status()).isEqualTo(Status.OK);
        assertThat(wr.route).isEqualTo(route);
        wr.release();
        assertThat(device(off, data.length)).as("the device holds the pieces in order").isEqualTo(data);

        // read back into other pieces, split elsewhere
        Pieces r = laidOut(GUEST / 2, fit(7, data.length), 3);
        Request rd = submit(Op.READ, off, r, iova, false);
        assertThat(rd.status()).isEqualTo(Status.OK);
        assertThat(rd.route).isEqualTo(route);
        rd.release();
        assertThat(gather(r)).as("read back byte for byte").isEqualTo(data);

        Route other = route == Route.DMA ? Route.CPU : Route.DMA;
        assertThat(stats.bytes(route, true)).isEqualTo(data.length);
        assertThat(stats.bytes(route, false)).isEqualTo(data.length);
        assertThat(stats.bytes(other, true) + stats.bytes(other, false)).as("nothing on the other route").isZero();
        assertThat(stats.dmaErrors()).isZero();
    }

    /**
     * A 1 MiB request in 256 pages (HardwareQueue.MAX_IOVS) that lie one after the other in guest memory (as a
     * guest's pages often do, and as a virtqueue splits them at size_max) goes to the device as runs of its 64 KiB
     * descriptors, 16 of them, not 256, and completes once, by DMA, when the last run's copies are counted down;
     * byte for byte both ways.
     */
    @Test
    void contiguousPagesArePlacedAsRunsAndCompleteOnceByDma() throws Exception {
        open(new Routing(1, Integer.MAX_VALUE));
        long iova = driver.registerMemory(guest);
        int pages = HardwareQueue.MAX_IOVS;
        long[] at = new long[pages];
        int[] len = new int[pages];
        for (int i = 0; i < pages; i++) {
            at[i] = 4096L * (i + 1);
            len[i] = 4096;
        }
        Pieces w = new Pieces(at, len);
        fillGuest(w, 11);
        byte[] data = gather(w);
        var device = engine.softDevice().orElseThrow();
        long before = device.descriptorsCompleted(0);
        Request wr = submit(Op.WRITE, 8192, w, iova, false);
        assertThat(wr.status()).isEqualTo(Status.OK);
        assertThat(wr.route).isEqualTo(Route.DMA);
        wr.release();
        assertThat(device.descriptorsCompleted(0) - before).as("descriptors of a WRITE of %d contiguous pages", pages)
                .isEqualTo(pages * 4096 / (64 * 1024));
        assertThat(device(8192, data.length)).as("the device holds the pages in order").isEqualTo(data);
        for (int i = 0; i < pages; i++) {
            at[i] += GUEST / 2;
        }
        long beforeRead = device.descriptorsCompleted(0);
        Request rd = submit(Op.READ, 8192, w, iova, false);
        assertThat(rd.status()).isEqualTo(Status.OK);
        assertThat(rd.route).isEqualTo(Route.DMA);
        rd.release();
        assertThat(device.descriptorsCompleted(0) - beforeRead).as("descriptors of the READ back").isEqualTo(pages * 4096 / (64 * 1024));
        assertThat(gather(w)).as("read back byte for byte").isEqualTo(data);
        assertThat(done).as("no request completed twice").isEmpty();
        assertThat(stats.dmaErrors()).isZero();
    }

    /** {@code n} piece lengths adding up to {@code total} (the last takes the rest). */
    static int[] fit(int n, int total) {
        int[] out = new int[n];
        int each = total / n;
        for (int i = 0; i < n; i++) {
            out[i] = i == n - 1 ? total - each * (n - 1) : each;
        }
        return out;
    }

    @Test
    void aPieceWithoutAnIovaKeepsItsRequestOnTheCpuEvenWhenDmaIsForced() throws Exception {
        open(new Routing(1, 1));
        long iova = driver.registerMemory(guest);
        assertThat(driver.force(Route.DMA)).isTrue();
        Pieces p = scattered(4096, 3, 4);
        fillGuest(p, 5);
        Request r = frontend.acquireIov(Op.WRITE, 0, p.total());
        r.addIov(guest.asSlice(p.at()[0], p.len()[0]), iova + p.at()[0]);
        r.addIov(guest.asSlice(p.at()[1], p.len()[1]), Request.NO_IOVA);
        r.addIov(guest.asSlice(p.at()[2], p.len()[2]), iova + p.at()[2]);
        r.completion = done::add;
        frontend.add(r);
        frontend.dispatch();
        assertThat(done.poll(10, TimeUnit.SECONDS)).isSameAs(r);
        assertThat(r.status()).isEqualTo(Status.OK);
        assertThat(r.route).isEqualTo(Route.CPU);
        r.release();
        assertThat(device(0, (int) p.total())).isEqualTo(gather(p));
        assertThat(stats.bytes(Route.DMA, true)).isZero();
        assertThat(stats.dmaErrors()).as("never offered to the engine").isZero();
        assertThat(stats.bytes(Route.CPU, true)).isEqualTo(p.total());
    }

    /**
     * Caller memory truncated under the requests (a front end that truncates guest RAM must neither kill the soft
     * engine's thread, hanging DMA-routed I/O, nor have a CPU copy's fault taken for the pmem file's): each DMA copy
     * halts the channel with a data error (READ_DATA out of it, WRITE_DATA into it), the driver redoes the request by
     * the CPU, whose copy faults too, and the request alone answers EIO, the fault the request's own memory's, not the
     * pmem file's; the device is untouched, and the next request goes by DMA.
     */
    @Test
    void callerMemoryTruncatedUnderItsRequestsFailsThemAloneNamingTheirMemoryNotThePmemFile() throws Exception {
        open(new Routing(1, 1));
        int fd = SharedMemory.memfd("guest-ram", 1 << 20);
        try (Arena files = Arena.ofShared()) {
            MemorySegment ram = SharedMemory.map(fd, 0, 1 << 20, files);
            long ramIova = driver.registerMemory(ram);
            byte[] before = device(0, 65536);
            FileCalls.ftruncate(fd, 0); // the front end takes its memory away
            // On real pmem the CPU's WRITE is libpmem's non-temporal copy, native code that a fault in its source
            // kills: the reason vhost-user serves only guest RAM sealed against shrinking. So only READ there.
            boolean pmem = driver.region().isPmem();
            Op[] ops = pmem ? new Op[]{Op.READ} : new Op[]{Op.WRITE, Op.READ};
            for (Op op : ops) {
                Request r = frontend.acquireIov(op, 0, 65536);
                r.addIov(ram.asSlice(4096, 65536), ramIova + 4096);
                r.completion = done::add;
                frontend.add(r);
                frontend.dispatch();
                assertThat(done.poll(10, TimeUnit.SECONDS)).as("%s completed within 10 s", op).isSameAs(r);
                assertThat(r.status()).as("%s out of or into truncated memory", op).isEqualTo(Status.EIO);
                r.release();
            }
            assertThat(stats.dmaErrors()).as("the channel halted on each copy").isEqualTo(ops.length);
            assertThat(stats.dmaFallbacks()).as("and the CPU redid each").isEqualTo(ops.length);
            assertThat(device(0, 65536)).as("the device is untouched").isEqualTo(before);
            // what the driver logged them as (callerMemoryFault, not mappingFault): the region's verdict
            assertThatThrownBy(() -> driver.region().read(0, ram, 4096, 65536)).isInstanceOf(CallerMemoryFault.class)
                    .hasMessageContaining("read of 65536 bytes at offset 0 of the device failed: the request's own"
                            + " memory (65536 bytes at address 0x" + Long.toHexString(ram.address() + 4096))
                    .hasMessageContaining("guest RAM on vhost-user) faulted, not the pmem mapping");
            if (!pmem) {
                assertThatThrownBy(() -> driver.region().write(ram, 4096, 0, 65536)).isInstanceOf(CallerMemoryFault.class);
            }
            driver.unregisterMemory(ram);
        } finally {
            Libc.close(fd);
        }
        long iova = driver.registerMemory(guest);
        Pieces p = scattered(0, 4, 9);
        fillGuest(p, 10);
        Request ok = submit(Op.WRITE, 1 << 20, p, iova, false);
        assertThat(ok.status()).as("the next request").isEqualTo(Status.OK);
        assertThat(ok.route).as("by DMA: the channel recovered").isEqualTo(Route.DMA);
        ok.release();
        assertThat(device(1 << 20, (int) p.total())).isEqualTo(gather(p));
    }

    @Test
    void memoryWithdrawnFromTheEngineIsRefusedAndItsRequestFailsEioWithoutTouchingTheDevice() throws Exception {
        open(new Routing(1, Integer.MAX_VALUE));
        long iova = driver.registerMemory(guest);
        int spaceRegions = engine.iovaSpace().regions();
        driver.unregisterMemory(guest);
        assertThat(engine.iovaSpace().regions()).as("withdrawn from the IOVA space").isEqualTo(spaceRegions - 1);
        byte[] before = new byte[300_000];
        new Random(6).nextBytes(before);
        driver.region().memory().asSlice(1 << 20, before.length).copyFrom(MemorySegment.ofArray(before));
        Pieces p = scattered(0, 4, 7);
        fillGuest(p, 8);
        byte[] guestBefore = gather(p);

        Request w = submit(Op.WRITE, 1 << 20, p, iova, true);
        assertThat(w.status()).as("%s on withdrawn memory", w).isEqualTo(Status.EIO);
        w.release();
        assertThat(device(1 << 20, before.length)).as("the device is untouched").isEqualTo(before);
        Request r = submit(Op.READ, 1 << 20, p, iova, false);
        assertThat(r.status()).isEqualTo(Status.EIO);
        r.release();
        assertThat(gather(p)).as("nothing read into memory the engine may not reach").isEqualTo(guestBefore);
        assertThat(stats.dmaErrors()).as("the engine refused both").isEqualTo(2);
        assertThat(stats.dmaFallbacks()).as("and the CPU did not step in").isZero();
        assertThat(stats.bytes(Route.CPU, true) + stats.bytes(Route.CPU, false)).isZero();

        // registered again, the same requests go by DMA: the channel recovered from the refusal
        long again = driver.registerMemory(guest);
        Request ok = submit(Op.WRITE, 1 << 20, p, again, false);
        assertThat(ok.status()).isEqualTo(Status.OK);
        assertThat(ok.route).isEqualTo(Route.DMA);
        ok.release();
        assertThat(device(1 << 20, (int) p.total())).isEqualTo(guestBefore);
    }

    @Test
    void piecesThatDoNotCoverTheLengthAnswerEinvalOnEitherRoute() throws Exception {
        open(new Routing(1, Integer.MAX_VALUE));
        long iova = driver.registerMemory(guest);
        byte[] before = device(0, 8192);
        for (Op op : new Op[]{Op.WRITE, Op.READ}) {
            Request r = frontend.acquireIov(op, 0, 8192);
            r.addIov(guest.asSlice(0, 4096), iova);
            r.completion = done::add;
            frontend.add(r);
            frontend.dispatch();
            assertThat(done.poll(10, TimeUnit.SECONDS)).isSameAs(r);
            assertThat(r.status()).as("%s", r).isEqualTo(Status.EINVAL);
            r.release();
        }
        assertThat(device(0, 8192)).isEqualTo(before);
        assertThat(stats.ops(Route.DMA, true) + stats.ops(Route.CPU, true)).isZero();
    }

    /**
     * route.dma.bounce decides for requests in pool buffers only (NBD, ublk: the kernel made its CPU copy into
     * them already); a caller-memory request of the same size goes by the threshold either way.
     */
    @Test
    void bounceSendsPoolBufferRequestsToDmaOnlyWhenSet() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, false));
        int len = 256 << 10;
        assertThat(driver.receivesInPlace(0, len)).as("above the threshold, still the CPU: in place").isTrue();
        assertThat(driver.sendsInPlace(0, len)).isTrue();
        assertThat(poolWrite(0, len).route).isEqualTo(Route.CPU);
        long iova = driver.registerMemory(guest);
        Pieces p = new Pieces(new long[]{0}, new int[]{len});
        Request vhost = submit(Op.WRITE, 1 << 20, p, iova, false);
        assertThat(vhost.route).as("caller memory goes by the threshold").isEqualTo(Route.DMA);
        vhost.release();

        driver.routing(new Routing(65536, Integer.MAX_VALUE, true));
        assertThat(driver.receivesInPlace(0, len)).isFalse();
        assertThat(driver.sendsInPlace(0, len)).isFalse();
        assertThat(driver.sendsInPlace(0, 4096)).as("below the threshold: the CPU").isTrue();
        assertThat(poolWrite(0, len).route).isEqualTo(Route.DMA);
        assertThat(stats.bytes(Route.DMA, true)).isEqualTo(2L * len);
        assertThat(stats.bytes(Route.CPU, true)).isEqualTo(len);
    }

    private Request poolWrite(long off, int len) throws InterruptedException {
        Request r = frontend.acquire(len);
        r.op = Op.WRITE;
        r.offset = off;
        for (ByteBuffer b : r.buffers()) {
            if (b == null) break;
            while (b.hasRemaining()) b.put((byte) 0x5a);
        }
        r.completion = done::add;
        frontend.add(r);
        frontend.dispatch();
        Request got = done.poll(10, TimeUnit.SECONDS);
        assertThat(got).isSameAs(r);
        assertThat(got.status()).isEqualTo(Status.OK);
        got.release();
        return got;
    }

    @Test
    void withoutAnEngineMemoryGetsNoIovaAndGoesByTheCpu() throws Exception {
        driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("c.img"), SIZE, false, PmemRegion.Mapper.AUTO), stats);
        layer = new BlockLayer(driver, 1, 4, 8 << 20, 4 << 20);
        frontend = new FrontendQueue(layer.queue(0));
        assertThat(driver.registerMemory(guest)).isEqualTo(Request.NO_IOVA);
        driver.unregisterMemory(guest); // nothing registered: nothing to withdraw
        Pieces p = scattered(0, 20, 9);
        fillGuest(p, 10);
        Request r = submit(Op.WRITE, 4096, p, Request.NO_IOVA, false);
        assertThat(r.status()).isEqualTo(Status.OK);
        assertThat(r.route).isEqualTo(Route.CPU);
        r.release();
        assertThat(device(4096, (int) p.total())).isEqualTo(gather(p));
    }
}
