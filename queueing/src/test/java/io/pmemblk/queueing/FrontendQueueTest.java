package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The frontend seam: each clause of {@link FrontendQueue}'s contract, against the in-memory driver. */
@Timeout(60)
class FrontendQueueTest {
    static final int CHUNK = BufferPool.CHUNK;
    static final int DEPTH = 4;

    MemoryBlockDriver driver = new MemoryBlockDriver(16L << 20);
    BlockLayer layer;
    /** Completions seen, with the status of the last one; each releases its request as a frontend would. */
    final AtomicInteger completions = new AtomicInteger();
    volatile int lastStatus = -1;
    final Request.Completion releasing = r -> {
        lastStatus = r.status();
        completions.incrementAndGet();
        r.release();
    };

    FrontendQueue frontend(long poolBytes, int maxRequestBytes) {
        layer = new BlockLayer(driver, 1, DEPTH, poolBytes, maxRequestBytes);
        return new FrontendQueue(layer.queue(0));
    }

    @AfterEach
    void stop() {
        if (layer != null) {
            layer.close();
        }
        driver.close();
    }

    Request filled(FrontendQueue f, Op op, long offset, int dataBytes) throws InterruptedException {
        Request r = f.acquire(dataBytes);
        r.op = op;
        r.offset = offset;
        r.completion = releasing;
        return r;
    }

    @Test
    void outOfTagsItDispatchesItsOwnBatchBeforeWaiting() {
        FrontendQueue f = frontend(4L * CHUNK, CHUNK);
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            for (int i = 0; i < DEPTH; i++) {
                f.add(filled(f, Op.FLUSH, 0, 0));
            }
            assertTrue(f.full());
            assertEquals(0, driver.requests.get(), "nothing dispatched yet");
            // Every tag is in our own undispatched batch: waiting for one without dispatching never returns.
            Request r = f.acquire(0);
            assertEquals(1, driver.batches.get(), "the batch went to the driver in one call");
            assertEquals(DEPTH, driver.largestBatch.get());
            assertEquals(0, f.batched());
            r.release();
        }, "acquire waited for a tag held by its own undispatched batch");
    }

    @Test
    void outOfBufferChunksItDispatchesItsOwnBatchBeforeWaiting() {
        FrontendQueue f = frontend(2L * CHUNK, CHUNK);
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            f.add(filled(f, Op.READ, 0, CHUNK));
            f.add(filled(f, Op.READ, CHUNK, CHUNK));
            assertFalse(f.full(), "tags are left; the chunks are not");
            Request r = f.acquire(CHUNK);
            assertEquals(2, driver.requests.get());
            assertEquals(1, r.segments());
            r.release();
        }, "acquire waited for chunks held by its own undispatched batch");
    }

    @Test
    void dispatchHandsTheWholeBatchOverInOneCallAndNothingWhenEmpty() throws Exception {
        FrontendQueue f = frontend(4L * CHUNK, CHUNK);
        f.dispatch();
        assertEquals(0, driver.batches.get(), "an empty batch is not dispatched");
        for (int i = 0; i < 3; i++) {
            f.add(filled(f, Op.TRIM, i * 4096L, 0));
        }
        assertEquals(3, f.batched());
        f.dispatch();
        assertEquals(1, driver.batches.get());
        assertEquals(3, driver.largestBatch.get());
        assertEquals(3, completions.get());
        assertEquals(0, f.queue().inflight(), "the completions released every tag");
    }

    @Test
    void aWriteIsReceivedStraightIntoTheDeviceWhenTheDriverOffersIt() throws Exception {
        FrontendQueue f = frontend(4L * CHUNK, CHUNK);
        driver.receiveInPlace(true);
        int freeBefore = f.queue().pool().freeChunks();
        Request r = f.acquireWrite(8192, 4096);
        assertTrue(r.dataInPlace);
        assertEquals(Op.WRITE, r.op);
        assertEquals(8192, r.offset);
        assertEquals(4096, r.length);
        assertEquals(0, r.segments(), "no buffers taken: the device is the buffer");
        assertEquals(freeBefore, f.queue().pool().freeChunks());
        receive(r, (byte) 0x5a);
        assertEquals((byte) 0x5a, driver.memory.get(java.lang.foreign.ValueLayout.JAVA_BYTE, 8192),
                "the payload is in the device before the request is even dispatched");
        r.completion = releasing;
        f.add(r);
        f.dispatch();
        assertEquals(1, driver.inPlaceWrites.get());
        assertEquals(0, lastStatus);
        assertEquals(-1, MemorySegment.ofArray(filledWith(4096, (byte) 0x5a))
                .mismatch(driver.memory.asSlice(8192, 4096)));
    }

    @Test
    void aWriteTheDriverDoesNotTakeInPlaceGetsBuffersAndTheSameResult() throws Exception {
        FrontendQueue f = frontend(4L * CHUNK, CHUNK);
        driver.receiveInPlace(false);
        Request r = f.acquireWrite(4096, 4096);
        assertFalse(r.dataInPlace);
        assertEquals(Op.WRITE, r.op);
        assertEquals(1, r.segments());
        receive(r, (byte) 0x33);
        r.completion = releasing;
        f.add(r);
        f.dispatch();
        assertEquals(0, driver.inPlaceWrites.get());
        assertEquals(-1, MemorySegment.ofArray(filledWith(4096, (byte) 0x33))
                .mismatch(driver.memory.asSlice(4096, 4096)));
    }

    @Test
    void aDriverFailingToReceiveInPlaceLeaksNoTag() throws Exception {
        BlockDriver failing = new BlockDriver() {
            @Override public long size() { return 1 << 20; }
            @Override public boolean isPmem() { return false; }
            @Override public void queueRequests(int hwq, Request[] batch, int count) { }
            @Override public boolean receivesInPlace(long offset, long length) { return true; }
            @Override public void receiveInPlace(Request r) { throw new IllegalStateException("mapping gone"); }
            @Override public void persistAll() { }
            @Override public void close() { }
        };
        try (BlockLayer l = new BlockLayer(failing, 1, DEPTH, 4L * CHUNK, CHUNK)) {
            FrontendQueue f = new FrontendQueue(l.queue(0));
            assertThrows(IllegalStateException.class, () -> f.acquireWrite(0, 4096));
            assertEquals(0, l.queue(0).inflight(), "the tag went back");
            assertEquals(0, f.releaseUndispatched(), "and is not released a second time at teardown");
        }
    }

    @Test
    void aRequestAnsweredHereRunsItsCompletionAndIsNoLongerTheFrontendsToRelease() throws Exception {
        FrontendQueue f = frontend(4L * CHUNK, CHUNK);
        Request r = filled(f, null, 0, 0);
        f.completeHere(r, Status.EINVAL);
        assertEquals(1, completions.get());
        assertEquals(Status.EINVAL, lastStatus);
        assertEquals(0, driver.requests.get(), "the driver never saw it");
        assertEquals(0, f.releaseUndispatched(), "the completion released it; teardown must not again");
        assertEquals(0, f.queue().inflight());
    }

    @Test
    void teardownReleasesTheRequestBeingFilledAndTheBatchButNotWhatTheDriverHas() throws Exception {
        // 8 chunks: a lone frontend's share is half the pool, and it holds 3 here
        FrontendQueue f = frontend(8L * CHUNK, CHUNK);
        driver.hold();
        f.add(filled(f, Op.READ, 0, CHUNK));
        f.dispatch(); // the driver holds this one
        f.add(filled(f, Op.READ, CHUNK, CHUNK));
        f.add(filled(f, Op.FLUSH, 0, 0));
        Request filling = f.acquireWrite(0, 4096); // acquired, payload not yet in
        assertSame(Op.WRITE, filling.op);
        assertEquals(4, f.queue().inflight());
        assertEquals(3, f.releaseUndispatched(), "the WRITE being filled and the two batched");
        assertEquals(1, f.queue().inflight(), "the dispatched READ is the completion's to release");
        assertEquals(0, f.batched());
        assertEquals(0, f.releaseUndispatched(), "idempotent");
        driver.releaseHeld();
        assertEquals(0, f.queue().inflight());
        assertEquals(f.queue().pool().chunks(), f.queue().pool().freeChunks(), "every chunk is back");
        assertEquals(1, driver.requests.get());
    }

    /**
     * The shape of a ublk frontend: one thread per hardware queue, request ids (tags) handed out by the
     * "kernel" in sets deeper than our queue, WRITE data copied in as a pread from /dev/ublkcN would, and a
     * dispatch before waiting for the kernel's next set. Every id completes exactly once and the data lands.
     */
    @Test
    void aUblkShapedFrontendWithOneThreadPerQueueAndItsOwnTags() throws Exception {
        int queues = 2;
        int kernelDepth = 2 * DEPTH; // deeper than ours: acquire must dispatch and wait, never deadlock
        int rounds = 200;
        layer = new BlockLayer(driver, queues, DEPTH, 4L * CHUNK, CHUNK);
        driver.mode(MemoryBlockDriver.Mode.ASYNC);
        driver.receiveInPlace(true);
        java.util.concurrent.atomic.AtomicIntegerArray done =
                new java.util.concurrent.atomic.AtomicIntegerArray(queues * kernelDepth);
        java.util.concurrent.atomic.AtomicReference<Throwable> failed = new java.util.concurrent.atomic.AtomicReference<>();
        Thread[] threads = new Thread[queues];
        for (int q = 0; q < queues; q++) {
            int qi = q;
            threads[q] = Thread.ofPlatform().name("ublk-queue-" + q).start(() -> {
                FrontendQueue f = new FrontendQueue(layer.queue(qi));
                try {
                    for (int round = 0; round < rounds; round++) {
                        java.util.concurrent.CountDownLatch set = new java.util.concurrent.CountDownLatch(kernelDepth);
                        Request.Completion reply = r -> { // COMMIT_AND_FETCH_REQ would go here
                            if (r.status() != Status.OK) {
                                failed.compareAndSet(null, new AssertionError(r + " failed: " + r.status()));
                            }
                            done.incrementAndGet((int) r.cookie);
                            r.release();
                            set.countDown();
                        };
                        for (int tag = 0; tag < kernelDepth; tag++) {
                            long offset = ((long) qi * kernelDepth + tag) * 4096;
                            Request r;
                            if ((tag & 1) == 0) {
                                r = f.acquireWrite(offset, 4096);
                                receive(r, (byte) (round + tag)); // the pread from /dev/ublkcN
                            } else {
                                r = f.acquire(4096);
                                r.op = Op.READ;
                                r.offset = offset - 4096; // the WRITE just before, from an earlier round
                            }
                            r.cookie = qi * kernelDepth + tag;
                            r.completion = reply;
                            f.add(r);
                            if (f.full()) {
                                f.dispatch();
                            }
                        }
                        f.dispatch(); // before waiting for the kernel
                        if (!set.await(Waits.BOUND.toMillis(), java.util.concurrent.TimeUnit.MILLISECONDS)) {
                            throw new AssertionError("round " + round + " on queue " + qi + " did not complete");
                        }
                    }
                } catch (Throwable e) {
                    failed.compareAndSet(null, e);
                    f.releaseUndispatched();
                }
            });
        }
        for (Thread t : threads) {
            Waits.join("a ublk-shaped queue thread", t);
        }
        assertNull(failed.get(), () -> "failed: " + failed.get());
        for (int id = 0; id < queues * kernelDepth; id++) {
            assertEquals(rounds, done.get(id), "completions of id " + id);
        }
        for (int q = 0; q < queues; q++) {
            assertEquals(0, layer.queue(q).inflight());
            for (int tag = 0; tag < kernelDepth; tag += 2) {
                long offset = ((long) q * kernelDepth + tag) * 4096;
                assertEquals((byte) (rounds - 1 + tag), driver.memory.get(java.lang.foreign.ValueLayout.JAVA_BYTE,
                        offset + 4095), "last round's data at " + offset);
            }
        }
        assertEquals((long) queues * rounds * kernelDepth / 2, driver.inPlaceWrites.get());
    }

    static void receive(Request r, byte value) {
        ByteBuffer[] bufs = r.dataBuffers();
        for (int i = 0; i < r.dataBufferCount(); i++) {
            while (bufs[i].hasRemaining()) {
                bufs[i].put(value);
            }
        }
    }

    static byte[] filledWith(int n, byte v) {
        byte[] b = new byte[n];
        java.util.Arrays.fill(b, v);
        return b;
    }
}
