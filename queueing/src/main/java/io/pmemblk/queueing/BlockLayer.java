package io.pmemblk.queueing;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * The multi-queue block layer: {@code queues} hardware queues in front of one driver. Frontends bind each
 * connection to a queue ({@link #nextQueue()}, round-robin), so connections on different queues never share
 * a lock or a tag.
 */
public final class BlockLayer implements AutoCloseable {
    private final BlockDriver driver;
    private final HardwareQueue[] queues;
    private final AtomicInteger next = new AtomicInteger();
    private final int maxRequestBytes;

    public BlockLayer(BlockDriver driver, int queues, int depth, long poolBytesPerQueue, int maxRequestBytes) {
        this(driver, queues, depth, poolBytesPerQueue, maxRequestBytes, 0, 0);
    }

    /**
     * With {@code reservedDepth} tags more on each of the first {@code reservedQueues} queues, for the one
     * submitter of each that must never wait behind the shared ones ({@link FrontendQueue#reserved}: ublk).
     */
    public BlockLayer(BlockDriver driver, int queues, int depth, long poolBytesPerQueue, int maxRequestBytes,
                      int reservedDepth, int reservedQueues) {
        if (queues < 1 || depth < 1) {
            throw new IllegalArgumentException("queues and depth must be >= 1");
        }
        if (reservedDepth < 0 || reservedQueues < 0 || reservedQueues > queues) {
            throw new IllegalArgumentException("reserved tags: depth " + reservedDepth + " must be >= 0 and queues "
                    + reservedQueues + " within 0.." + queues);
        }
        this.driver = driver;
        this.maxRequestBytes = maxRequestBytes;
        this.queues = new HardwareQueue[queues];
        try {
            for (int i = 0; i < queues; i++) {
                this.queues[i] = new HardwareQueue(i, depth, i < reservedQueues ? reservedDepth : 0,
                        poolBytesPerQueue, maxRequestBytes, driver);
                driver.attachQueue(this.queues[i]);
            }
        } catch (RuntimeException e) {
            close(); // the pools already allocated
            throw e;
        }
    }

    public BlockDriver driver() {
        return driver;
    }

    /** The largest data length a request may carry on any queue (what the segment arrays were sized for). */
    public int maxRequestBytes() {
        return maxRequestBytes;
    }

    public int queueCount() {
        return queues.length;
    }

    public HardwareQueue queue(int i) {
        return queues[i];
    }

    /** The queue for a new connection (round-robin). */
    public HardwareQueue nextQueue() {
        return queues[Math.floorMod(next.getAndIncrement(), queues.length)];
    }

    /** Waits (bounded) for in-flight requests on every queue to finish. */
    public boolean awaitIdle(long timeoutMillis) throws InterruptedException {
        long deadline = System.nanoTime() + java.util.concurrent.TimeUnit.MILLISECONDS.toNanos(timeoutMillis);
        for (HardwareQueue q : queues) {
            long left = java.util.concurrent.TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (!q.awaitIdle(Math.max(1, left))) {
                return false;
            }
        }
        return true;
    }

    @Override
    public void close() {
        for (HardwareQueue q : queues) {
            if (q != null) {
                q.close();
            }
        }
    }
}
