package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.*;

import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Exactly once from the block layer's side: a second release or a second completion of the same request is
 * refused loudly and leaves the free-tag stack and the buffers as they were, so no two acquirers ever share
 * a Request. The driver here completes inline and nothing else: the lifecycle is what is under test.
 */
@Timeout(60)
class RequestLifecycleTest {
    static final int CHUNK = BufferPool.CHUNK;

    /** Completes every request of a batch once with OK, on the dispatching thread. */
    static final class InlineDriver implements BlockDriver {
        @Override public long size() { return 1L << 30; }
        @Override public boolean isPmem() { return false; }
        @Override public void queueRequests(int hwq, Request[] batch, int count) {
            for (int i = 0; i < count; i++) {
                batch[i].complete(Status.OK);
            }
        }
        @Override public void persistAll() {}
        @Override public void close() {}
    }

    BlockLayer layer;

    @AfterEach
    void close() {
        if (layer != null) {
            layer.close();
        }
    }

    HardwareQueue queue(int depth, int chunks) {
        layer = new BlockLayer(new InlineDriver(), 1, depth, (long) chunks * CHUNK, CHUNK);
        return layer.queue(0);
    }

    @Test
    void aDoubleReleaseIsRefusedAndTwoAcquirersNeverShareARequest() throws Exception {
        HardwareQueue q = queue(4, 4);
        Request r = q.acquire(CHUNK);
        // Two other holders (of a tag and a chunk each), so a tag and a chunk pushed twice would fit on the
        // free stacks and go unnoticed there.
        Request h1 = q.acquire(CHUNK);
        Request h2 = q.acquire(CHUNK);
        r.release();
        IllegalStateException e = assertThrows(IllegalStateException.class, r::release);
        assertTrue(e.getMessage().contains("tag " + r.tag()) && e.getMessage().contains("released twice"),
                "the message names the request and the fault: " + e.getMessage());
        assertEquals(2, q.inflight(), "the refused release changed nothing: two tags held, two free");
        assertEquals(2, q.pool().freeChunks(), "and every chunk free once");
        // Everything free now, taken at once, must be distinct requests.
        Request a = q.tryAcquire(CHUNK);
        Request b = q.tryAcquire(CHUNK);
        assertNotNull(a, "two tags free: first");
        assertNotNull(b, "two tags free: second");
        assertNotSame(a, b, "two acquirers were given the same request (tag " + a.tag() + ")");
        assertNull(q.tryAcquire(0), "four tags, four holders: nothing left");
        for (Request x : new Request[] {a, b, h1, h2}) {
            x.release();
        }
        assertEquals(0, q.inflight());
    }

    @Test
    void aDoubleCompletionIsRefusedAndTheCompletionRunsOnce() throws Exception {
        HardwareQueue q = queue(2, 2);
        AtomicInteger calls = new AtomicInteger();
        Request r = q.acquire(0);
        r.op = Op.FLUSH;
        r.completion = x -> calls.incrementAndGet();
        q.dispatch(new Request[] {r}, 1);
        assertEquals(1, calls.get());
        assertTrue(r.isCompleted());
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> r.complete(Status.EIO));
        assertTrue(e.getMessage().contains("tag " + r.tag()) && e.getMessage().contains("completed twice"),
                e.getMessage());
        assertEquals(1, calls.get(), "the frontend's completion ran once");
        assertEquals(Status.OK, r.status(), "the refused completion did not overwrite the status");
        r.release();
        assertThrows(IllegalStateException.class, () -> r.complete(Status.OK), "completion after release");
        assertEquals(0, q.inflight());
    }

    @Test
    void aRequestReleasedWithoutCompletionIsFine() throws Exception {
        // The frontend answers some requests itself (validation errors) and releases them uncompleted.
        HardwareQueue q = queue(1, 1);
        Request r = q.acquire(CHUNK);
        r.release();
        Request again = q.acquire(CHUNK);
        assertSame(r, again, "one tag: the same request comes back, acquired afresh");
        assertFalse(again.isCompleted());
        again.release();
    }
}
