package io.pmemblk.block;

import java.util.concurrent.atomic.LongAdder;

/**
 * One hardware queue (blk-mq's hctx): a fixed set of tags, each a preallocated {@link Request}, and a
 * registered {@link BufferPool}. Frontends bound to this queue acquire a tag per request; when the tags or
 * buffers run out they wait, which stops them reading more from their clients: memory stays bounded.
 * Batches go to the driver whole ({@link #dispatch}), so the driver can place every DMA descriptor of the
 * batch and ring a doorbell once (as blk-mq's plug does: per-request doorbells cost more than the copies).
 *
 * <p>A frontend holding requests it has not dispatched yet must use {@link #tryAcquire} and, when that
 * returns null, dispatch what it holds before calling {@link #acquire}: the tags or chunks it would wait for
 * may be the ones in its own batch, which never complete before they are dispatched.
 */
public final class HardwareQueue implements AutoCloseable {
    private final int index;
    private final int maxRequestBytes;
    private final BlockDriver driver;
    private final BufferPool pool;
    private final Request[] tags;
    private final int[] freeTags;
    private int freeTagCount;
    private boolean closed;
    private final LongAdder requests = new LongAdder();
    private final LongAdder completed = new LongAdder();
    private final LatencyBuckets[] latency;

    HardwareQueue(int index, int depth, long poolBytes, int maxRequestBytes, BlockDriver driver) {
        if (maxRequestBytes < 1) {
            throw new IllegalArgumentException("maxRequestBytes " + maxRequestBytes + " must be >= 1");
        }
        this.index = index;
        this.maxRequestBytes = maxRequestBytes;
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
        Op[] ops = Op.values();
        this.latency = new LatencyBuckets[ops.length];
        for (Op op : ops) {
            latency[op.ordinal()] = new LatencyBuckets();
        }
    }

    public int index() {
        return index;
    }

    public int depth() {
        return tags.length;
    }

    public BlockDriver driver() {
        return driver;
    }

    public BufferPool pool() {
        return pool;
    }

    /** The largest {@code dataBytes} {@link #acquire} accepts: what each request's segment arrays were sized for. */
    public int maxRequestBytes() {
        return maxRequestBytes;
    }

    /**
     * Takes a tag, and buffers for {@code dataBytes} (0 for requests without data), waiting while none are
     * free. The returned request is reset, with its segments attached and {@code length == dataBytes}.
     * @throws IllegalArgumentException when {@code dataBytes} is negative or above {@link #maxRequestBytes()}
     * @throws IllegalStateException when the queue is closed (also while waiting)
     * @throws InterruptedException when interrupted while waiting (nothing is taken)
     */
    public Request acquire(int dataBytes) throws InterruptedException {
        int n = chunksFor(dataBytes);
        Request r;
        synchronized (this) {
            while (freeTagCount == 0 && !closed) {
                waiters++;
                try {
                    wait();
                } finally {
                    waiters--;
                }
            }
            if (closed) {
                throw new IllegalStateException("hardware queue " + index + " is closed");
            }
            r = tags[freeTags[--freeTagCount]];
        }
        if (n > 0) {
            try {
                pool.take(n, r.chunks());
            } catch (InterruptedException | RuntimeException e) {
                releaseTag(r);
                throw e;
            }
        }
        return prepare(r, n, dataBytes);
    }

    /**
     * Like {@link #acquire} but never waits: returns null unless a tag and all the chunks for
     * {@code dataBytes} are free right now (and nobody is already waiting for chunks). Nothing is held on null.
     * @throws IllegalArgumentException when {@code dataBytes} is negative or above {@link #maxRequestBytes()}
     * @throws IllegalStateException when the queue is closed
     */
    public Request tryAcquire(int dataBytes) {
        int n = chunksFor(dataBytes);
        Request r;
        synchronized (this) {
            if (closed) {
                throw new IllegalStateException("hardware queue " + index + " is closed");
            }
            if (freeTagCount == 0) {
                return null;
            }
            r = tags[freeTags[--freeTagCount]];
        }
        if (n > 0) {
            boolean taken;
            try {
                taken = pool.tryTake(n, r.chunks());
            } catch (RuntimeException e) {
                releaseTag(r);
                throw e;
            }
            if (!taken) {
                releaseTag(r);
                return null;
            }
        }
        return prepare(r, n, dataBytes);
    }

    private int chunksFor(int dataBytes) {
        if (dataBytes < 0 || dataBytes > maxRequestBytes) {
            throw new IllegalArgumentException("request of " + dataBytes + " data bytes on hardware queue " + index
                    + ": allowed 0.." + maxRequestBytes + " (maxRequestBytes)");
        }
        return dataBytes == 0 ? 0 : BufferPool.chunksFor(dataBytes);
    }

    private static Request prepare(Request r, int chunks, int dataBytes) {
        r.reset();
        r.acquired();
        r.attach(chunks);
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
        if (waiters > 0) { // the common case, nobody waiting, skips the monitor's wake-up machinery
            notifyAll();
        }
    }

    /** Threads waiting on this monitor (for a tag, or in awaitIdle); guarded by this. */
    private int waiters;

    /** Requests dispatched so far. */
    public long requestsTotal() {
        return requests.sum();
    }

    /**
     * Latency of completed {@code op} requests on this queue, from {@link #acquire} (tag taken) to
     * {@link Request#complete} (driver done). Requests without an op (answered by the frontend itself) and
     * requests released without being completed are not counted.
     */
    public LatencyBuckets latency(Op op) {
        return latency[op.ordinal()];
    }

    /** Requests holding a tag right now. */
    public synchronized int inflight() {
        return tags.length - freeTagCount;
    }

    /** Waits (bounded) until every tag is back: used at shutdown so in-flight requests finish. */
    public synchronized boolean awaitIdle(long timeoutMillis) throws InterruptedException {
        long deadline = System.nanoTime() + java.util.concurrent.TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        while (freeTagCount < tags.length) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            waiters++;
            try {
                java.util.concurrent.TimeUnit.NANOSECONDS.timedWait(this, left);
            } finally {
                waiters--;
            }
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
