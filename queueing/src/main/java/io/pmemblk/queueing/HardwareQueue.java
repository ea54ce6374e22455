package io.pmemblk.queueing;

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
 *
 * <h2>Fair sharing</h2>
 * Many submitters share a queue (every NBD connection bound to it, the ublk queue), and a tag comes back only
 * when its reply is out: a client that stops reading its replies keeps its tags. So each submitter
 * ({@link FrontendQueue}, through its {@link Share}) holds at most a fair share, as blk-mq bounds the users of a
 * shared tag set (block/blk-mq-tag.c, hctx_may_queue: the depth divided among the active users, at least 4):
 * here {@code ceil(sharedDepth / (users + 1))} tags, at least {@link #MIN_SHARE}, and
 * {@code ceil(chunks / (users + 1))} buffer chunks, where users are the submitters holding or waiting for a
 * tag now. The one share left over is room for the next submitter: blk-mq can wait for an idle user's tags to
 * come back, but a stalled client's never do, so a share is never all there is. A submitter holding no chunks
 * may take as many as one request needs (else a request as large as the share could never run). A submitter
 * over its share waits, after dispatching its own batch, while the others take tags.
 *
 * <p>{@link #reservedDepth()} tags on top of the shared ones belong to one submitter only
 * ({@link FrontendQueue#reserved}, the ublk queue): it never waits for a tag behind the shared ones. Its
 * chunks are a share like any other's.
 *
 * <p>The counts are kept under the monitor the free-tag stack already takes: no further lock, nothing allocated.
 * {@link #acquire(int)} and {@link #tryAcquire(int)} take shared tags for a caller without a share (the load
 * generator, tests), bounded by nothing but the shared depth.
 */
public final class HardwareQueue implements AutoCloseable {
    /** The fewest tags a shared submitter's share drops to (blk-mq's floor), so a batch keeps going. */
    public static final int MIN_SHARE = 4;
    /**
     * The most pieces of caller memory one request holds ({@link Request#addIov}), made once per tag that uses
     * them. A virtio driver may not chain more descriptors than its queue holds (QEMU's vhost-user-blk queue-size
     * is 128 by default), and the data pieces are fewer by the header and status; qemu-storage-daemon and SPDK
     * advertise seg_max 126. A frontend advertises a seg_max that leaves room for the pieces a descriptor
     * straddling two memory regions splits into, and refuses longer chains.
     */
    public static final int MAX_IOVS = 256;

    private final int index;
    private final int maxRequestBytes;
    private final int sharedDepth;
    private final int reservedDepth;
    /** Tags held by shared submitters and callers without a share; guarded by this. */
    private int sharedHeld;
    /** Shared submitters holding or waiting for a tag / all submitters doing so; guarded by this. */
    private int tagUsers, chunkUsers;
    /** The current fair shares (recomputed when a user comes or goes, never per request); guarded by this. */
    private int tagShare, chunkShare;
    private boolean reservedTaken;
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
        this(index, depth, 0, poolBytes, maxRequestBytes, driver);
    }

    /** {@code depth} shared tags and {@code reservedDepth} more for the one {@link FrontendQueue#reserved} submitter. */
    HardwareQueue(int index, int depth, int reservedDepth, long poolBytes, int maxRequestBytes, BlockDriver driver) {
        if (maxRequestBytes < 1) {
            throw new IllegalArgumentException("maxRequestBytes " + maxRequestBytes + " must be >= 1");
        }
        if (depth < 1 || reservedDepth < 0) {
            throw new IllegalArgumentException("hardware queue " + index + ": depth " + depth + " must be >= 1 and"
                    + " reserved depth " + reservedDepth + " >= 0");
        }
        this.index = index;
        this.sharedDepth = depth;
        this.reservedDepth = reservedDepth;
        depth += reservedDepth;
        this.maxRequestBytes = maxRequestBytes;
        this.driver = driver;
        this.pool = new BufferPool(poolBytes, arena -> driver.allocateBuffers(poolBytes, arena));
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
        recomputeShares();
        Op[] ops = Op.values();
        this.latency = new LatencyBuckets[ops.length];
        for (Op op : ops) {
            latency[op.ordinal()] = new LatencyBuckets();
        }
    }

    public int index() {
        return index;
    }

    /** Every tag: the shared ones and the reserved ones (a tag number is below this). */
    public int depth() {
        return tags.length;
    }

    /** Tags the shared submitters (and callers without a share) divide among them. */
    public int sharedDepth() {
        return sharedDepth;
    }

    /** Tags for the one reserved submitter ({@link FrontendQueue#reserved}), on top of the shared ones. */
    public int reservedDepth() {
        return reservedDepth;
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
     * Takes a shared tag, and buffers for {@code dataBytes} (0 for requests without data), waiting while none
     * are free; for a caller without a {@link Share} (the load generator, tests): bounded by the shared depth
     * only. The returned request is reset, with its segments attached and {@code length == dataBytes}.
     * @throws IllegalArgumentException when {@code dataBytes} is negative or above {@link #maxRequestBytes()}
     * @throws IllegalStateException when the queue is closed (also while waiting)
     * @throws InterruptedException when interrupted while waiting (nothing is taken)
     */
    public Request acquire(int dataBytes) throws InterruptedException {
        return acquire(null, dataBytes);
    }

    /**
     * Like {@link #acquire} but never waits: returns null unless a tag and all the chunks for
     * {@code dataBytes} are free right now (and nobody is already waiting for chunks). Nothing is held on null.
     * @throws IllegalArgumentException when {@code dataBytes} is negative or above {@link #maxRequestBytes()}
     * @throws IllegalStateException when the queue is closed
     */
    public Request tryAcquire(int dataBytes) {
        return tryAcquire(null, dataBytes);
    }

    /** {@link #acquire(int)} for submitter {@code s} (null: none), within its fair share (or its reserved tags). */
    Request acquire(Share s, int dataBytes) throws InterruptedException {
        int n = chunksFor(dataBytes);
        Request r;
        synchronized (this) {
            if (!closed && !mayTake(s, n)) {
                if (s != null) {
                    s.waiting = true;
                    activate(s); // a waiting submitter counts: the others' shares shrink to leave it room
                }
                waiters++;
                boolean taking = false;
                try {
                    while (!closed && !mayTake(s, n)) {
                        wait();
                    }
                    taking = !closed;
                } finally {
                    waiters--;
                    if (s != null) {
                        s.waiting = false;
                        if (!taking && s.tags == 0) {
                            deactivate(s); // interrupted or closed holding nothing: the others' shares grow
                            if (waiters > 0) {
                                notifyAll();
                            }
                        }
                    }
                }
            }
            if (closed) {
                throw new IllegalStateException("hardware queue " + index + " is closed");
            }
            r = take(s, n);
        }
        if (n > 0) {
            try {
                pool.take(n, r.chunks());
            } catch (InterruptedException | RuntimeException e) {
                releaseTag(r, n);
                throw e;
            }
        }
        return prepare(r, n, dataBytes);
    }

    /** {@link #tryAcquire(int)} for submitter {@code s} (null: none): null also when s is at its share. */
    Request tryAcquire(Share s, int dataBytes) {
        int n = chunksFor(dataBytes);
        Request r;
        synchronized (this) {
            if (closed) {
                throw new IllegalStateException("hardware queue " + index + " is closed");
            }
            if (!mayTake(s, n)) {
                return null;
            }
            r = take(s, n);
        }
        if (n > 0) {
            boolean taken;
            try {
                taken = pool.tryTake(n, r.chunks());
            } catch (RuntimeException e) {
                releaseTag(r, n);
                throw e;
            }
            if (!taken) {
                releaseTag(r, n);
                return null;
            }
        }
        return prepare(r, n, dataBytes);
    }

    /** A new submitter's share of this queue: shared tags, or (once) the reserved ones. */
    synchronized Share newShare(boolean reserved) {
        if (reserved) {
            if (reservedDepth == 0) {
                throw new IllegalStateException("hardware queue " + index + " has no reserved tags (the block layer"
                        + " reserves them for ublk: BlockLayer's reservedDepth)");
            }
            if (reservedTaken) {
                throw new IllegalStateException("hardware queue " + index + "'s reserved tags already belong to"
                        + " another submitter: one reserved submitter per queue");
            }
            reservedTaken = true;
        }
        return new Share(reserved);
    }

    /** Whether s may take a tag and n chunks now (the chunks may still have to be waited for in the pool). */
    private boolean mayTake(Share s, int n) {
        if (freeTagCount == 0) {
            return false;
        }
        if (s == null) {
            return sharedHeld < sharedDepth;
        }
        if (n > 0 && s.chunks > 0 && s.chunks + n > chunkShare) {
            return false;
        }
        // The reserved submitter's tags are always free below its depth: the shared ones never take them.
        return s.reserved ? s.tags < reservedDepth : sharedHeld < sharedDepth && s.tags < tagShare;
    }

    private Request take(Share s, int n) {
        Request r = tags[freeTags[--freeTagCount]];
        r.share = s;
        if (s == null || !s.reserved) {
            sharedHeld++;
        }
        if (s != null) {
            if (s.tags++ == 0) {
                activate(s);
            }
            s.chunks += n;
        }
        return r;
    }

    private void activate(Share s) {
        if (!s.active) {
            s.active = true;
            chunkUsers++;
            if (!s.reserved) {
                tagUsers++;
            }
            recomputeShares();
        }
    }

    private void deactivate(Share s) {
        if (s.active) {
            s.active = false;
            chunkUsers--;
            if (!s.reserved) {
                tagUsers--;
            }
            recomputeShares();
        }
    }

    /** The shares of the active users; with none, of the first to come (who makes one). */
    private void recomputeShares() {
        tagShare = Math.max(MIN_SHARE, ceilDiv(sharedDepth, Math.max(1, tagUsers) + 1));
        chunkShare = ceilDiv(pool.chunks(), Math.max(1, chunkUsers) + 1);
    }

    private static int ceilDiv(int a, int b) {
        return (a + b - 1) / b;
    }

    /** What a shared submitter may hold right now (for tests and metrics): tags, and chunks. */
    public synchronized int tagShare() {
        return tagShare;
    }

    public synchronized int chunkShare() {
        return chunkShare;
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
        if (r.dataInPlace) {
            driver.releasedInPlace(r); // it may never have reached the driver's queueRequests
        }
        int n = r.segments();
        if (n > 0) {
            pool.give(n, r.chunks());
        }
        completed.increment();
        releaseTag(r, n);
    }

    /** Returns r's tag, and takes r's {@code chunks} (already given back to the pool) off its submitter's count. */
    private synchronized void releaseTag(Request r, int chunks) {
        freeTags[freeTagCount++] = r.tag();
        Share s = r.share;
        if (s == null || !s.reserved) {
            sharedHeld--;
        }
        if (s != null) {
            s.chunks -= chunks;
            if (--s.tags == 0 && !s.waiting) {
                deactivate(s);
            }
        }
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
