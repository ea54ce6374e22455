package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Tags, buffers, back-pressure, idle and close of the block layer, driven by {@link MemoryBlockDriver}. */
@Timeout(60)
class HardwareQueueTest {
    static final int CHUNK = BufferPool.CHUNK;

    MemoryBlockDriver driver;
    BlockLayer layer;

    BlockLayer layer(int queues, int depth, long poolBytes, int maxRequestBytes) {
        driver = new MemoryBlockDriver(64L << 20);
        layer = new BlockLayer(driver, queues, depth, poolBytes, maxRequestBytes);
        return layer;
    }

    @AfterEach
    void close() {
        if (layer != null) {
            layer.close();
        }
        if (driver != null) {
            driver.close();
        }
    }

    static Request write(HardwareQueue q, Request r, long offset, Request.Completion c) {
        r.op = Op.WRITE;
        r.offset = offset;
        r.completion = c;
        return r;
    }

    @Test
    void tryAcquireReturnsNullWhenTagsAreExhaustedAndTakesNothing() throws Exception {
        HardwareQueue q = layer(1, 4, 16L * CHUNK, 4 * CHUNK).queue(0);
        Request[] held = new Request[4];
        for (int i = 0; i < 4; i++) {
            held[i] = q.tryAcquire(CHUNK);
            assertNotNull(held[i], "tag " + i + " of 4 should be free");
        }
        int freeChunks = q.pool().freeChunks();
        assertEquals(12, freeChunks);
        assertNull(q.tryAcquire(0), "no tag left: tryAcquire(0) must return null");
        assertNull(q.tryAcquire(CHUNK), "no tag left: tryAcquire(CHUNK) must return null");
        assertEquals(freeChunks, q.pool().freeChunks(), "a failed tryAcquire must not keep chunks");
        assertEquals(4, q.inflight());
        held[2].release();
        Request again = q.tryAcquire(2 * CHUNK);
        assertNotNull(again, "a released tag is available to tryAcquire");
        assertEquals(2, again.segments());
        assertEquals(2L * CHUNK, again.length);
    }

    @Test
    void tryAcquireWithTooFewChunksReturnsTheTag() throws Exception {
        HardwareQueue q = layer(1, 8, 4L * CHUNK, 4 * CHUNK).queue(0);
        Request a = q.acquire(3 * CHUNK);
        assertNull(q.tryAcquire(2 * CHUNK), "2 chunks asked, 1 free: no partial take");
        assertEquals(1, q.inflight(), "the tag taken for the failed tryAcquire went back");
        assertEquals(1, q.pool().freeChunks(), "the one free chunk is still free");
        Request b = q.tryAcquire(CHUNK);
        assertNotNull(b, "1 chunk asked, 1 free");
        a.release();
        b.release();
        assertEquals(4, q.pool().freeChunks());
        assertEquals(0, q.inflight());
    }

    @Test
    void requestsAboveMaxRequestBytesAreRefusedWithTheLimit() {
        BlockLayer l = layer(2, 4, 8L * CHUNK, 3 * CHUNK);
        assertEquals(3 * CHUNK, l.maxRequestBytes());
        assertEquals(3 * CHUNK, l.queue(1).maxRequestBytes());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> l.queue(0).acquire(3 * CHUNK + 1));
        assertTrue(e.getMessage().contains(Integer.toString(3 * CHUNK)), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> l.queue(0).tryAcquire(-1));
        assertEquals(0, l.queue(0).inflight(), "a refused request holds no tag");
    }

    @Test
    void segmentsCoverTheLengthExactly() throws Exception {
        HardwareQueue q = layer(1, 4, 8L * CHUNK, 4 * CHUNK).queue(0);
        int len = 2 * CHUNK + 100;
        Request r = q.acquire(len);
        assertEquals(3, r.segments());
        long sum = 0;
        java.nio.ByteBuffer[] bufs = r.buffers();
        for (int i = 0; i < r.segments(); i++) {
            assertEquals(r.segmentLength(i), bufs[i].remaining());
            assertEquals(r.segmentLength(i), r.segment(i).byteSize());
            sum += r.segmentLength(i);
        }
        assertEquals(len, sum);
        r.release();
        Request trim = q.acquire(0);
        trim.length = 0xFFFF_FFFFL; // a data-less request may cover 4 GiB - 1
        assertEquals(0, trim.segments());
        assertEquals(4294967295L, trim.length);
        trim.release();
    }

    /**
     * A submitter wanting 200 requests of a depth-4 queue blocks once it holds 4; the pool (8 chunks) never
     * hands out more than it has; everything completes once the driver lets go.
     */
    @Test
    void submitterBeyondDepthBlocksUntilTheDriverCompletes() throws Exception {
        HardwareQueue q = layer(1, 4, 8L * CHUNK, 2 * CHUNK).queue(0);
        driver.mode(MemoryBlockDriver.Mode.HOLD);
        int total = 200;
        CountDownLatch done = new CountDownLatch(total);
        AtomicInteger failed = new AtomicInteger();
        AtomicInteger submitted = new AtomicInteger();
        Request.Completion onDone = r -> {
            if (r.status() != Status.OK) {
                failed.incrementAndGet();
            }
            r.release();
            done.countDown();
        };
        AtomicReference<Throwable> error = new AtomicReference<>();
        Thread submitter = Thread.ofPlatform().name("submitter").start(() -> {
            try {
                for (int i = 0; i < total; i++) {
                    Request r = q.acquire(2 * CHUNK);
                    write(q, r, (long) i * 2 * CHUNK % (32L << 20), onDone);
                    q.dispatch(new Request[] {r}, 1);
                    submitted.incrementAndGet();
                }
            } catch (Throwable t) {
                error.set(t);
            }
        });
        assertTrue(driver.awaitHeld(4, 10_000), "the driver should receive the first 4 requests");
        Waits.awaitWaiting("the submitter to block for a tag", submitter);
        assertEquals(4, submitted.get(), "depth 4: a 5th request must wait for a tag");
        assertEquals(4, q.inflight());
        assertEquals(0, q.pool().freeChunks(), "4 requests x 2 chunks hold the whole pool");
        assertNull(q.tryAcquire(0), "tryAcquire returns null while the queue is exhausted");

        driver.releaseHeld(MemoryBlockDriver.Mode.ASYNC);
        Waits.join("the submitter to finish", submitter);
        assertNull(error.get(), () -> "submitter failed: " + error.get());
        assertTrue(done.await(10, TimeUnit.SECONDS), () -> "completed " + (total - done.getCount()) + " of " + total);
        assertEquals(0, failed.get());
        assertTrue(q.awaitIdle(10_000), "all tags back");
        assertEquals(8, q.pool().freeChunks(), "all chunks back");
        assertEquals(total, q.requestsTotal());
        assertTrue(driver.maxChunksInDriver.get() <= 8, "chunks in flight " + driver.maxChunksInDriver.get()
                + " exceed the pool of 8");
    }

    /** A 32 MiB request waits for chunks held by others, takes none of them early, and gets all once they return. */
    @Test
    void largeRequestWaitsForChunksWithoutPartialTakeOrStarvation() throws Exception {
        int big = 32 << 20;
        HardwareQueue q = layer(1, 8, big, big).queue(0);
        int poolChunks = q.pool().chunks();
        driver.mode(MemoryBlockDriver.Mode.HOLD);
        Request.Completion release = Request::release;
        Request[] small = new Request[4];
        for (int i = 0; i < 4; i++) {
            small[i] = write(q, q.acquire(CHUNK), (long) i * CHUNK, release);
        }
        q.dispatch(small, 4);
        AtomicReference<Request> got = new AtomicReference<>();
        AtomicReference<Throwable> error = new AtomicReference<>();
        Thread bigSubmitter = Thread.ofPlatform().name("big-submitter").start(() -> {
            try {
                got.set(q.acquire(big));
            } catch (Throwable t) {
                error.set(t);
            }
        });
        Waits.awaitWaiting("the 32 MiB request to wait for chunks", bigSubmitter);
        assertEquals(poolChunks - 4, q.pool().freeChunks(), "the waiting request must not hold part of its chunks");
        assertNull(q.tryAcquire(CHUNK), "a small tryAcquire must not overtake the waiting 32 MiB request");
        assertEquals(poolChunks - 4, q.pool().freeChunks());

        driver.releaseHeld(MemoryBlockDriver.Mode.INLINE);
        Waits.join("the 32 MiB request to get its chunks", bigSubmitter);
        assertNull(error.get(), () -> "big acquire failed: " + error.get());
        Request r = got.get();
        assertEquals(poolChunks, r.segments());
        assertEquals(big, r.length);
        assertEquals(0, q.pool().freeChunks());
        r.release();
        assertEquals(poolChunks, q.pool().freeChunks());
    }

    @Test
    void awaitIdleIsBoundedAndTrueOnceEverythingIsBack() throws Exception {
        BlockLayer l = layer(2, 4, 4L * CHUNK, CHUNK);
        driver.mode(MemoryBlockDriver.Mode.HOLD);
        HardwareQueue q = l.queue(1);
        Request r = q.acquire(CHUNK);
        r.op = Op.READ;
        r.completion = Request::release;
        q.dispatch(new Request[] {r}, 1);
        long t0 = System.nanoTime();
        assertFalse(l.awaitIdle(100), "a held request keeps the layer busy");
        long waited = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertTrue(waited >= 90 && waited < 5_000, "awaitIdle(100) returned after " + waited + " ms");
        driver.releaseHeld(MemoryBlockDriver.Mode.INLINE);
        assertTrue(l.awaitIdle(10_000), "idle once the driver completed and the request was released");
    }

    /**
     * A submitter on its own thread, returned once it waits in {@code q.acquire(bytes)} for {@code what}: whatever
     * ends the wait (close, an interrupt) lands in {@code error}; an acquire that returns lands there as a failure.
     */
    private static Thread waitingSubmitter(String name, String what, HardwareQueue q, int bytes,
                                           AtomicReference<Throwable> error) throws InterruptedException {
        Thread t = Thread.ofPlatform().name(name).start(() -> {
            try {
                q.acquire(bytes);
                error.set(new AssertionError("acquire(" + bytes + ") returned: nothing was to end its wait"));
            } catch (Throwable e) {
                error.set(e);
            }
        });
        Waits.awaitWaiting("the submitter to wait for " + what, t);
        return t;
    }

    @Test
    void closeWakesASubmitterWaitingForATagWithIllegalStateException() throws Exception {
        HardwareQueue q = layer(1, 1, 2L * CHUNK, CHUNK).queue(0);
        Request first = q.acquire(0);
        AtomicReference<Throwable> error = new AtomicReference<>();
        Thread waiter = waitingSubmitter("tag-waiter", "a tag", q, CHUNK, error);
        layer.close();
        Waits.join("the waiting submitter to be woken by close", waiter);
        assertInstanceOf(IllegalStateException.class, error.get(), () -> "got " + error.get());
        assertThrows(IllegalStateException.class, () -> q.tryAcquire(0), "tryAcquire on a closed queue");
        assertThrows(IllegalStateException.class, () -> q.acquire(0), "acquire on a closed queue");
        first.release(); // returning a request after close is harmless
    }

    @Test
    void closeWakesASubmitterWaitingForChunksAndReturnsItsTag() throws Exception {
        HardwareQueue q = layer(1, 4, 2L * CHUNK, 2 * CHUNK).queue(0);
        Request hog = q.acquire(2 * CHUNK);
        AtomicReference<Throwable> error = new AtomicReference<>();
        Thread waiter = waitingSubmitter("chunk-waiter", "chunks", q, CHUNK, error);
        assertEquals(2, q.inflight(), "the chunk waiter holds a tag while it waits");
        layer.close();
        Waits.join("the waiting submitter to be woken by close", waiter);
        assertInstanceOf(IllegalStateException.class, error.get(), () -> "got " + error.get());
        assertEquals(1, q.inflight(), "the woken submitter gave its tag back");
        hog.release();
        assertEquals(0, q.inflight());
    }

    @Test
    void interruptedChunkWaiterLeavesTheLineSoOthersProceed() throws Exception {
        HardwareQueue q = layer(1, 4, 2L * CHUNK, 2 * CHUNK).queue(0);
        Request hog = q.acquire(2 * CHUNK);
        AtomicReference<Throwable> error = new AtomicReference<>();
        Thread waiter = waitingSubmitter("chunk-waiter", "chunks", q, 2 * CHUNK, error);
        waiter.interrupt();
        Waits.join("the interrupted submitter", waiter);
        assertInstanceOf(InterruptedException.class, error.get());
        hog.release();
        assertNotNull(q.tryAcquire(2 * CHUNK), "no stale waiter may block later takers");
    }
}
