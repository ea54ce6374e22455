package io.pmemblk.pmem;

import io.pmemblk.queueing.testing.Closing;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;
import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.testing.InjectedFaults;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Every request handed to the driver completes exactly once, whatever throws: a channel whose placeAll()
 * throws (once, or from some call on), an Error out of it, a frontend completion that throws, a zero-length request
 * forced to DMA, a channel the device breaks for good. Each test checks the data, that each request's
 * completion ran once (also after the driver is closed, when no late report can come any more) and that
 * every tag came back.
 */
@Timeout(120)
class ExactlyOnceTest {
    static final int SIZE = 32 << 20;
    /** Four segments of the block layer's 128 KiB chunks: four copies in one placeAll() per DMA request. */
    static final int DMA_LEN = 3 * 131072 + 4096;
    static final int CPU_LEN = 4096;

    @TempDir
    Path dir;
    DmaEngine engine;
    PmemBlockDriver driver;
    BlockLayer layer;
    HardwareQueue q;
    final CopyStats stats = new CopyStats();
    final BlockingQueue<Request> done = new ArrayBlockingQueue<>(256);
    /** Completions seen per request, by identity of (request, cookie): a second run of one would count 2. */
    final Map<Long, AtomicInteger> completions = new ConcurrentHashMap<>();
    long nextCookie = 1;

    /** Places through to the real channel, but its placeAll() throws what {@code fault} gives on the chosen calls. */
    static final class ThrowingChannel implements DmaChannel {
        final DmaChannel inner;
        final AtomicInteger calls = new AtomicInteger();
        volatile int firstFailing = Integer.MAX_VALUE;
        volatile int lastFailing = Integer.MAX_VALUE;
        volatile Supplier<Throwable> fault = () -> new IllegalStateException("DMA channel 0 is closed (injected)");

        ThrowingChannel(DmaChannel inner) {
            this.inner = inner;
        }

        /** placeAll() calls first..last (counting from 1) throw; one call per DMA request. */
        void failCalls(int first, int last) {
            calls.set(0);
            firstFailing = first;
            lastFailing = last;
        }

        @Override public int index() { return inner.index(); }
        @Override public void listener(io.pmemblk.dma.DmaCompletionListener l) { inner.listener(l); }
        @Override public int freeSlots() { return inner.freeSlots(); }
        @Override public int slotsFor(long length) { return inner.slotsFor(length); }
        @Override public void submit() { inner.submit(); }
        @Override public int poll() { return inner.poll(); }
        @Override public void close() { inner.close(); }

        @Override
        public boolean place(long srcIova, long dstIova, long length, Object ctx) {
            return inner.place(srcIova, dstIova, length, ctx);
        }

        @Override
        public boolean placeAll(Copies copies, Object ctx) {
            int n = calls.incrementAndGet();
            if (n >= firstFailing && n <= lastFailing) {
                Throwable t = fault.get();
                if (t instanceof RuntimeException e) throw e;
                throw (Error) t;
            }
            return inner.placeAll(copies, ctx);
        }
    }

    ThrowingChannel channel;
    final InjectedFaults faults = new InjectedFaults();

    void open(Routing routing) throws IOException {
        DmaEngine soft = DmaEngine.soft(new IovaSpace(), 1, 256, 16, faults);
        faults.attach(soft.softDevice().orElseThrow());
        // The driver's engine places through the throwing wrapper; closing it closes the wrapped engine after.
        channel = new ThrowingChannel(soft.channel(0));
        engine = DmaEngine.of(soft.iovaSpace(), List.of(channel), soft);
        PmemDevices device = PmemDevices.on(dir.resolve("d.img"), SIZE).stats(stats).dma(engine, routing)
                .layer(1, 64, 32 << 20, 4 << 20).open();
        driver = device.driver();
        layer = device.layer();
        q = layer.queue(0);
    }

    @AfterEach
    void close() throws Exception {
        Closing.closeAll(driver, layer); // the driver may be closed by the test already
    }

    private Request prepare(Op op, long off, int len, int seed) throws InterruptedException {
        Request r = q.acquire(len);
        r.op = op;
        r.offset = off;
        r.cookie = nextCookie++;
        r.completion = req -> {
            completions.computeIfAbsent(req.cookie, k -> new AtomicInteger()).incrementAndGet();
            done.add(req);
        };
        if (op == Op.WRITE) {
            SeededBytes.fill(r, seed);
        }
        return r;
    }

    private Request[] mixedWrites(int n, long base) throws InterruptedException {
        Request[] batch = new Request[n];
        for (int i = 0; i < n; i++) {
            int len = i % 3 == 1 ? CPU_LEN : DMA_LEN; // DMA, CPU, DMA, DMA, CPU, ...
            batch[i] = prepare(Op.WRITE, base + (long) i * (DMA_LEN + 4096), len, 1000 + i);
        }
        return batch;
    }

    /** Waits for n completions (bounded), checks each status, releases them. */
    private void awaitAndRelease(int n, int status) throws InterruptedException {
        for (int i = 0; i < n; i++) {
            Request r = done.poll(10, TimeUnit.SECONDS);
            assertThat(r).as("completion %d of %d within 10 s (%d tags still held)", i + 1, n, q.inflight()).isNotNull();
            assertThat(r.status()).as("status of %s", r).isEqualTo(status);
            r.release();
        }
    }

    private void assertWritesLanded(int n, long base) {
        for (int i = 0; i < n; i++) {
            long off = base + (long) i * (DMA_LEN + 4096);
            int len = i % 3 == 1 ? CPU_LEN : DMA_LEN;
            SeededBytes.assertRegionHolds(driver.region(), off, len, 1000 + i, "request " + i);
        }
    }

    /** After the driver is closed no report can come any more: each completion ran exactly once. */
    private void closeAndAssertEachCompletedOnce(int requests) throws IOException {
        PmemBlockDriver d = driver;
        driver = null; // closed here, not again after the test
        d.close();
        assertThat(completions).as("one entry per request").hasSize(requests);
        completions.forEach((cookie, count) ->
                assertThat(count.get()).as("completions of request with cookie %d", cookie).isEqualTo(1));
        assertThat(done).as("no completion after the last awaited one").isEmpty();
    }

    @Test
    void aPlaceThatThrowsSendsThatRequestToTheCpuAndTheRestOfTheBatchRuns() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        // DMA requests are 0, 2, 3, 5, 6, 8: the second (request 2) throws, the ones after it place again.
        channel.failCalls(2, 2);
        int n = 9;
        Request[] batch = mixedWrites(n, 0);
        q.dispatch(batch, n);
        awaitAndRelease(n, Status.OK);
        assertWritesLanded(n, 0);
        assertThat(q.inflight()).as("every tag is back").isZero();
        assertThat(stats.dmaFallbacks()).as("the request whose place threw went to the CPU").isEqualTo(1);
        assertThat(stats.ops(Route.DMA, true)).as("the other DMA requests stayed on DMA").isEqualTo(5);
        closeAndAssertEachCompletedOnce(n);
    }

    /**
     * A DMA request is completed when its copies have reported, not before, also when the request after it in
     * the batch cannot be placed: were it completed at once, the frontend could reuse its buffers while the
     * device still reads them, and the late copy would write someone else's data at this request's offset.
     */
    @Test
    void aRequestIsNotCompletedWhileItsCopiesAreStillInTheRing() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        faults.stall(true);
        channel.failCalls(2, 2);
        Request r = prepare(Op.WRITE, 0, DMA_LEN, 1000);
        Request thrown = prepare(Op.WRITE, 1 << 20, DMA_LEN, 1001);
        Request cpu = prepare(Op.WRITE, 2 << 20, CPU_LEN, 1002);
        q.dispatch(new Request[] {r, thrown, cpu}, 3);
        Request first = done.poll(10, TimeUnit.SECONDS);
        Request second = done.poll(10, TimeUnit.SECONDS);
        assertThat(java.util.List.of(first, second)).as("the CPU ones complete inline").containsExactly(thrown, cpu);
        assertThat(thrown.route).isEqualTo(Route.CPU);
        assertThat(done.poll()).as("the request with its copies in the stalled ring is still waiting for them").isNull();
        assertThat(completions.get(r.cookie)).isNull();
        faults.stall(false);
        Request third = done.poll(10, TimeUnit.SECONDS);
        assertThat(third).as("completed once the ring has reported its copies").isSameAs(r);
        assertThat(third.status()).isEqualTo(Status.OK);
        assertThat(third.route).isEqualTo(Route.DMA);
        for (Request x : new Request[] {first, second, third}) {
            x.release();
        }
        SeededBytes.assertRegionHolds(driver.region(), 0, DMA_LEN, 1000, "the first write");
        assertThat(q.inflight()).isZero();
        closeAndAssertEachCompletedOnce(3);
    }

    @Test
    void aChannelThatThrowsFromSomeCallOnLosesNothing() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        channel.failCalls(2, Integer.MAX_VALUE); // request 0 is placed, then the channel is closed for good
        int n = 12;
        q.dispatch(mixedWrites(n, 0), n);
        awaitAndRelease(n, Status.OK);
        assertWritesLanded(n, 0);
        assertThat(q.inflight()).isZero();
        assertThat(stats.ops(Route.DMA, true)).as("request 0, placed before").isEqualTo(1);
        assertThat(stats.dmaFallbacks()).as("the 7 DMA requests after it went to the CPU").isEqualTo(7);
        closeAndAssertEachCompletedOnce(n);
    }

    @Test
    void anErrorFromPlaceIsRethrownOnlyAfterEveryRequestIsCompleted() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        channel.fault = () -> new AssertionError("injected Error in placeAll()");
        channel.failCalls(2, 2);
        int n = 6;
        Request[] batch = mixedWrites(n, 0);
        assertThatThrownBy(() -> q.dispatch(batch, n)).isInstanceOf(AssertionError.class)
                .hasMessageContaining("injected Error");
        awaitAndRelease(n, Status.OK);
        assertWritesLanded(n, 0);
        assertThat(q.inflight()).isZero();
        closeAndAssertEachCompletedOnce(n);
    }

    @Test
    void aZeroLengthReadOrWriteForcedToDmaCompletes() throws Exception {
        open(Routing.CPU_ONLY);
        assertThat(driver.force(Route.DMA)).isTrue();
        Request read = prepare(Op.READ, 4096, 0, 1);
        Request write = prepare(Op.WRITE, SIZE, 0, 2); // at the very end: still in bounds
        Request real = prepare(Op.WRITE, 0, 8192, 3);
        q.dispatch(new Request[] {read, write, real}, 3);
        awaitAndRelease(3, Status.OK);
        assertThat(q.inflight()).isZero();
        assertThat(stats.ops(Route.DMA, true)).as("the non-empty write did go by DMA").isEqualTo(1);
        closeAndAssertEachCompletedOnce(3);
    }

    @Test
    void aFrontendCompletionThatThrowsDoesNotCostTheRestOfTheBatch() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        int n = 6;
        Request[] batch = mixedWrites(n, 0);
        for (int i = 0; i < n; i++) { // CPU ones complete inline, DMA ones on the channel's thread: both throw
            Request.Completion c = batch[i].completion;
            batch[i].completion = r -> {
                c.completed(r);
                throw new IllegalStateException("frontend completion of " + r + " throws (injected)");
            };
        }
        q.dispatch(batch, n);
        awaitAndRelease(n, Status.OK);
        // and the channel's completion thread is still at work
        Request after = prepare(Op.WRITE, 16 << 20, DMA_LEN, 7);
        q.dispatch(new Request[] {after}, 1);
        awaitAndRelease(1, Status.OK);
        assertThat(q.inflight()).isZero();
        closeAndAssertEachCompletedOnce(n + 1);
    }

    @Test
    void aChannelTheDeviceBreaksMidRunLosesNothing() throws Exception {
        open(new Routing(65536, Integer.MAX_VALUE, true));
        // The 10th descriptor halts the channel and it never arms again: the driver's recovery times out,
        // what was placed is reported failed, and from then on placeAll() throws.
        faults.breakAfter(0, 10, IoatSpec.CHANERR_DEST_ADDR);
        int n = 12, rounds = 3;
        for (int round = 0; round < rounds; round++) {
            q.dispatch(mixedWrites(n, 0), n);
            awaitAndRelease(n, Status.OK);
            assertWritesLanded(n, 0);
        }
        assertThat(faults.isBroken(0)).isTrue();
        assertThat(stats.dmaFallbacks()).isPositive();
        assertThat(q.inflight()).isZero();
        closeAndAssertEachCompletedOnce(n * rounds);
    }
}
