package io.pmemblk.block;

import java.util.concurrent.atomic.LongAdder;

/**
 * One hardware queue (blk-mq's hctx): a fixed set of tags, each a preallocated {@link Request}, and a
 * registered {@link BufferPool}. Frontends bound to this queue acquire a tag per request; when the tags or
 * buffers run out they wait, which stops them reading more from their clients: memory stays bounded.
 * Batches go to the driver whole ({@link #dispatch}), so the driver can place every DMA descriptor of the
 * batch and ring a doorbell once (seed 004).
 */
public final class HardwareQueue implements AutoCloseable {
    private final int index;
    private final BlockDriver driver;
    private final BufferPool pool;
    private final Request[] tags;
    private final int[] freeTags;
    private int freeTagCount;
    private boolean closed;
    private final LongAdder requests = new LongAdder();
    private final LongAdder completed = new LongAdder();

    HardwareQueue(int index, int depth, long poolBytes, int maxRequestBytes, BlockDriver driver) {
        this.index = index;
        this.driver = driver;
        this.pool = new BufferPool(poolBytes);
        int maxSegments = BufferPool.chunksFor(maxRequestBytes);
        if (maxSegments > pool.chunks()) {
            pool.close();
            throw new IllegalArgumentException("queue buffer pool of " + poolBytes
                    + " bytes cannot hold one request of the maximum size " + maxRequestBytes);
        }
        this.tags = new Request[depth];
        this.freeTags = new int[depth];
        for (int t = 0; t < depth; t++) {
            tags[t] = new Request(this, t, maxSegments);
            freeTags[t] = depth - 1 - t;
        }
        this.freeTagCount = depth;
    }

    public int index() {
        return index;
    }

    public int depth() {
        return tags.length;
    }

    public BufferPool pool() {
        return pool;
    }

    /**
     * Takes a tag, and buffers for {@code dataBytes} (0 for requests without data), waiting while none are
     * free. The returned request is reset, with its segments attached.
     */
    public Request acquire(int dataBytes) throws InterruptedException {
        Request r;
        synchronized (this) {
            while (freeTagCount == 0 && !closed) {
                wait();
            }
            if (closed) {
                throw new IllegalStateException("hardware queue " + index + " is closed");
            }
            r = tags[freeTags[--freeTagCount]];
        }
        int n = dataBytes == 0 ? 0 : BufferPool.chunksFor(dataBytes);
        if (n > 0) {
            try {
                pool.take(n, r.chunks());
            } catch (InterruptedException | RuntimeException e) {
                releaseTag(r);
                throw e;
            }
        }
        r.reset();
        r.attach(n);
        r.length = dataBytes;
        r.startNanos = System.nanoTime();
        return r;
    }

    /** Hands a batch to the driver in one call. The array is the caller's and may be reused on return. */
    public void dispatch(Request[] batch, int count) {
        requests.add(count);
        driver.queueRequests(index, batch, count);
    }

    void release(Request r) {
        int n = r.segments();
        if (n > 0) {
            pool.give(n, r.chunks());
        }
        completed.increment();
        releaseTag(r);
    }

    private synchronized void releaseTag(Request r) {
        freeTags[freeTagCount++] = r.tag();
        notifyAll();
    }

    /** Requests dispatched so far. */
    public long requestsTotal() {
        return requests.sum();
    }

    /** Requests holding a tag right now. */
    public synchronized int inflight() {
        return tags.length - freeTagCount;
    }

    /** Waits (bounded) until every tag is back: used at shutdown so in-flight requests finish. */
    public synchronized boolean awaitIdle(long timeoutMillis) throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutMillis;
        while (freeTagCount < tags.length) {
            long left = deadline - System.currentTimeMillis();
            if (left <= 0) {
                return false;
            }
            wait(left);
        }
        return true;
    }

    @Override
    public void close() {
        synchronized (this) {
            closed = true;
            notifyAll();
        }
        pool.close();
    }
}
