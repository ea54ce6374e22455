package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Fair sharing of a hardware queue among its submitters, as ordering properties: a submitter whose replies never
 * go out (its requests complete but are never released, as an NBD client that stops reading keeps its tags)
 * blocks in acquire at its share, and another submitter's requests complete while it is still blocked. No
 * timing: "still blocked" is the stalled thread's state at the moment the other's request has completed.
 */
@Timeout(60)
class FairShareTest {
    static final int CHUNK = BufferPool.CHUNK;

    final MemoryBlockDriver driver = new MemoryBlockDriver(16L << 20);
    BlockLayer layer;

    @AfterEach
    void stop() {
        if (layer != null) {
            layer.close();
        }
        driver.close();
    }

    HardwareQueue queue(int depth, int poolChunks) {
        layer = new BlockLayer(driver, 1, depth, (long) poolChunks * CHUNK, CHUNK);
        return layer.queue(0);
    }

    /**
     * A client that stopped reading: its requests complete, their replies never go out, their tags stay.
     * {@link #failed}: what its submitter ({@link #flood}) threw, if anything.
     */
    static final class Stalled implements Request.Completion {
        final List<Request> kept = new ArrayList<>();
        final AtomicReference<Throwable> failed = new AtomicReference<>();

        @Override
        public synchronized void completed(Request r) {
            kept.add(r);
        }

        synchronized int size() {
            return kept.size();
        }

        /** The client reads its replies at last. */
        synchronized void readReplies() {
            kept.forEach(Request::release);
            kept.clear();
        }
    }

    /**
     * Starts submitter A: it sends {@code count} requests (made by {@code op}) through its own frontend,
     * dispatching each as a reader does before it blocks on its socket. Completions go to {@code stalled}.
     */
    Thread flood(HardwareQueue q, Stalled stalled, int count, Op op, int dataBytes) {
        return Thread.ofPlatform().name("submitter-A").start(() -> {
            FrontendQueue a = new FrontendQueue(q);
            try {
                for (int i = 0; i < count; i++) {
                    Request r = switch (op) {
                        case WRITE -> a.acquireWrite((long) i * 4096 % (8 << 20), 4096);
                        case READ -> a.acquireRead((long) i * dataBytes % (8 << 20), dataBytes);
                        default -> a.acquire(0);
                    };
                    r.op = op;
                    r.completion = stalled;
                    a.add(r);
                    a.dispatch();
                }
            } catch (Throwable t) {
                stalled.failed.compareAndSet(null, t);
                a.releaseUndispatched();
            }
        });
    }

    /** B's request, done and released on its own frontend; returns its status. */
    static int roundTrip(FrontendQueue b, Op op, long offset) throws InterruptedException {
        Request r = op == Op.WRITE ? b.acquireWrite(offset, 4096) : b.acquireRead(offset, 4096);
        int[] status = {-1};
        r.completion = done -> {
            status[0] = done.status();
            done.release();
        };
        if (op == Op.WRITE) {
            FrontendQueueTest.receive(r, (byte) 0x42);
        }
        b.add(r);
        b.dispatch(); // the memory driver completes inline
        return status[0];
    }

    @Test
    void aClientFloodingSmallWritesWithoutReadingRepliesLeavesTagsForAClientThatComesLater() throws Exception {
        HardwareQueue q = queue(16, 8);
        driver.receiveInPlace(true);
        Stalled stalled = new Stalled();
        Thread a = flood(q, stalled, 1000, Op.WRITE, 4096);
        Waits.awaitWaiting("A blocked at its share", a);
        int held = stalled.size();
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            FrontendQueue b = new FrontendQueue(q); // connects after A took what it may
            assertEquals(Status.OK, roundTrip(b, Op.WRITE, 12 << 20));
            assertEquals(Status.OK, roundTrip(b, Op.READ, 12 << 20));
        }, "B waited behind A's tags");
        assertTrue(a.isAlive(), "A is still stalled when B's requests complete");
        assertEquals(8, held, "A, alone, held its share: half of 16 tags (the other half is room for the next"
                + " submitter)");
        assertEquals(8, stalled.size(), "and it got no tag meanwhile");
        assertEquals((byte) 0x42, driver.memory.get(ValueLayout.JAVA_BYTE, (12 << 20) + 4095));
        assertEquals(0, q.pool().chunks() - q.pool().freeChunks(), "in-place WRITEs take no buffers");
        // A reads its replies, a batch at a time: it goes on and finishes.
        while (a.isAlive()) {
            stalled.readReplies();
            a.join(1);
        }
        stalled.readReplies();
        assertNull(stalled.failed.get());
        assertEquals(0, q.inflight());
    }

    @Test
    void twoLargeReadsOfAStalledClientSentFromTheDeviceHoldNoBuffers() throws Exception {
        // A stalled client's large READs, in small: a pool that holds one largest request; A sends two of
        // them and does not read the replies; B's 4 KiB READ and WRITE need a chunk each on the old route.
        HardwareQueue q = queue(16, 1);
        driver.sendInPlace(true);
        Stalled stalled = new Stalled();
        Thread a = flood(q, stalled, 2, Op.READ, CHUNK);
        Waits.join("A sending its two READs", a);
        assertNull(stalled.failed.get());
        assertEquals(2, stalled.size(), "both of A's READs are done, their replies unsent");
        for (Request r : stalled.kept) {
            assertEquals(0, r.segments(), "a READ sent from the device holds no chunk");
            assertEquals(1, r.dataBufferCount());
            assertEquals(CHUNK, r.dataBuffers()[0].remaining(), "its data is the device range");
        }
        assertEquals(q.pool().chunks(), q.pool().freeChunks());
        driver.receiveInPlace(false); // B's WRITE takes the one chunk
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            FrontendQueue b = new FrontendQueue(q);
            assertEquals(Status.OK, roundTrip(b, Op.READ, 0));
            assertEquals(Status.OK, roundTrip(b, Op.WRITE, 4096));
        }, "B waited for chunks A's READs held");
        assertEquals(2, stalled.size(), "A's replies are still unsent");
        stalled.readReplies();
        assertEquals(0, q.inflight());
    }

    @Test
    void aReadTheDriverDoesNotSendInPlaceGetsBuffersForItsLength() throws Exception {
        layer = new BlockLayer(driver, 1, 4, 4L * CHUNK, 2 * CHUNK);
        HardwareQueue q = layer.queue(0);
        driver.sendInPlace(false);
        driver.memory.set(ValueLayout.JAVA_BYTE, 8192 + 17, (byte) 7);
        FrontendQueue f = new FrontendQueue(q);
        Request r = f.acquireRead(8192, 2 * CHUNK);
        assertSame(Op.READ, r.op);
        assertEquals(8192, r.offset);
        assertEquals(2L * CHUNK, r.length);
        assertTrue(r.sinkReadsDevice);
        assertEquals(2, r.segments());
        Request[] seen = new Request[1];
        f.add(r);
        r.completion = done -> {
            seen[0] = done;
            assertEquals((byte) 7, done.dataBuffers()[0].get(17), "the data copied into the request's buffers");
            done.release();
        };
        f.dispatch();
        assertSame(r, seen[0]);
    }

    @Test
    void aStalledClientHoldsAtMostItsShareOfTheBuffers() throws Exception {
        // DMA-route READs hold their chunks until the reply is out: A may hold half the pool, not all of it.
        HardwareQueue q = queue(64, 8);
        Stalled stalled = new Stalled();
        Thread a = flood(q, stalled, 100, Op.READ, CHUNK);
        Waits.awaitWaiting("A blocked at its share of the chunks", a);
        int held = stalled.size();
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            FrontendQueue b = new FrontendQueue(q);
            assertEquals(Status.OK, roundTrip(b, Op.READ, 0));
        }, "B waited for chunks behind A");
        assertTrue(a.isAlive(), "A still stalled when B's READ completed");
        assertEquals(4, held, "A held 4 of 8 chunks, with tags to spare (" + q.tagShare() + ")");
        assertEquals(4, stalled.size(), "and it got nothing more meanwhile");
        assertEquals(4, q.pool().freeChunks());
        while (a.isAlive()) {
            stalled.readReplies();
            a.join(1);
        }
        stalled.readReplies();
        assertNull(stalled.failed.get());
        assertEquals(8, q.pool().freeChunks());
    }

    @Test
    void aSubmitterHoldingNoChunksMayTakeALargestRequestAboveItsShare() throws Exception {
        layer = new BlockLayer(driver, 1, 8, 4L * CHUNK, 4 * CHUNK);
        HardwareQueue q = layer.queue(0);
        new FrontendQueue(q).acquire(0); // another user: the share is a third of the pool
        FrontendQueue f = new FrontendQueue(q);
        Request r = assertTimeoutPreemptively(Waits.BOUND, () -> f.acquire(4 * CHUNK));
        assertEquals(2, q.chunkShare(), "ceil(4 / (2 + 1))");
        assertEquals(4, r.segments(), "a request larger than the share runs when it is all the submitter holds");
    }

    @Test
    void theSharesShrinkAsSubmittersComeAndGrowAsTheyLeave() throws Exception {
        HardwareQueue q = queue(32, 12);
        assertEquals(16, q.tagShare(), "nobody active: the first comer may take half");
        FrontendQueue a = new FrontendQueue(q), b = new FrontendQueue(q), c = new FrontendQueue(q);
        Request ra = a.acquire(CHUNK);
        assertEquals(16, q.tagShare(), "ceil(32 / (1 + 1))");
        assertEquals(6, q.chunkShare());
        Request rb = b.acquire(0);
        assertEquals(11, q.tagShare(), "ceil(32 / (2 + 1))");
        assertEquals(4, q.chunkShare());
        Request rc = c.acquire(0);
        assertEquals(8, q.tagShare());
        assertEquals(3, q.chunkShare());
        rb.release();
        assertEquals(11, q.tagShare(), "b holds nothing: it no longer counts");
        ra.release();
        rc.release();
        assertEquals(16, q.tagShare());
        try (BlockLayer small = new BlockLayer(driver, 1, 6, CHUNK, CHUNK)) {
            new FrontendQueue(small.queue(0)).acquire(0);
            new FrontendQueue(small.queue(0)).acquire(0);
            assertEquals(HardwareQueue.MIN_SHARE, small.queue(0).tagShare(), "never below blk-mq's floor of 4");
        }
    }

    @Test
    void theReservedSubmitterNeverWaitsBehindTheSharedOnes() throws Exception {
        layer = new BlockLayer(driver, 1, 4, 4L * CHUNK, CHUNK, 3, 1);
        HardwareQueue q = layer.queue(0);
        assertEquals(7, q.depth());
        assertEquals(4, q.sharedDepth());
        assertEquals(3, q.reservedDepth());
        for (int i = 0; i < 4; i++) {
            assertNotNull(q.tryAcquire(0), "shared tag " + i);
        }
        assertNull(q.tryAcquire(0), "the shared tags are gone; the reserved ones are not theirs");
        FrontendQueue ublk = FrontendQueue.reserved(q);
        assertTimeoutPreemptively(Waits.BOUND, () -> {
            for (int i = 0; i < 3; i++) {
                Request r = ublk.acquire(0);
                r.op = Op.FLUSH;
                r.completion = Request::release;
                ublk.add(r);
            }
        }, "the reserved submitter waited for shared tags");
        assertEquals(7, q.inflight());
        ublk.dispatch();
        assertEquals(4, q.inflight(), "its requests completed and came back");
        IllegalStateException twice = assertThrows(IllegalStateException.class, () -> FrontendQueue.reserved(q));
        assertTrue(twice.getMessage().contains("already belong"), twice.getMessage());
        try (BlockLayer plain = new BlockLayer(driver, 1, 4, CHUNK, CHUNK)) {
            IllegalStateException none = assertThrows(IllegalStateException.class,
                    () -> FrontendQueue.reserved(plain.queue(0)));
            assertTrue(none.getMessage().contains("no reserved tags"), none.getMessage());
        }
    }
}
