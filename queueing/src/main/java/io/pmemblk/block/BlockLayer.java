package io.pmemblk.block;

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

    public BlockLayer(BlockDriver driver, int queues, int depth, long poolBytesPerQueue, int maxRequestBytes) {
        if (queues < 1 || depth < 1) {
            throw new IllegalArgumentException("queues and depth must be >= 1");
        }
        this.driver = driver;
        this.queues = new HardwareQueue[queues];
        for (int i = 0; i < queues; i++) {
            this.queues[i] = new HardwareQueue(i, depth, poolBytesPerQueue, maxRequestBytes, driver);
            driver.attachQueue(this.queues[i]);
        }
    }

    public BlockDriver driver() {
        return driver;
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
        long deadline = System.currentTimeMillis() + timeoutMillis;
        for (HardwareQueue q : queues) {
            if (!q.awaitIdle(Math.max(1, deadline - System.currentTimeMillis()))) {
                return false;
            }
        }
        return true;
    }

    @Override
    public void close() {
        for (HardwareQueue q : queues) {
            q.close();
        }
    }
}
