package io.pmemblk.nbd;

import io.pmemblk.block.BufferPool;
import io.pmemblk.block.HardwareQueue;
import io.pmemblk.block.Request;
import java.util.concurrent.Semaphore;

/**
 * Mirrors a hardware queue's free tags and buffer chunks so a reader can ask "would acquire block?" first.
 * A reader holding an undispatched batch must never block in {@link HardwareQueue#acquire}: the tags it waits
 * for may be the ones in its own batch (or in another reader's batch), which would never complete. So a
 * reader tries here, and only when that fails does it dispatch its batch and then wait.
 * (A {@code tryAcquire} on HardwareQueue itself would make this class unnecessary.)
 */
final class QueueAdmission {
    final HardwareQueue queue;
    private final Semaphore tags;
    private final Semaphore chunks;

    QueueAdmission(HardwareQueue queue) {
        this.queue = queue;
        this.tags = new Semaphore(queue.depth());
        this.chunks = new Semaphore(queue.pool().chunks());
    }

    /** Takes a tag and buffers without waiting, or returns null. */
    Request tryAcquire(int dataBytes) throws InterruptedException {
        int n = chunksFor(dataBytes);
        if (!tags.tryAcquire()) {
            return null;
        }
        if (n > 0 && !chunks.tryAcquire(n)) {
            tags.release();
            return null;
        }
        return take(dataBytes, n);
    }

    /** Takes a tag and buffers, waiting for them. */
    Request acquire(int dataBytes) throws InterruptedException {
        int n = chunksFor(dataBytes);
        tags.acquire();
        if (n > 0) {
            try {
                chunks.acquire(n);
            } catch (InterruptedException e) {
                tags.release();
                throw e;
            }
        }
        return take(dataBytes, n);
    }

    private Request take(int dataBytes, int n) throws InterruptedException {
        try {
            // Cannot wait: our permits say a tag and n chunks are free for us.
            return queue.acquire(dataBytes);
        } catch (InterruptedException | RuntimeException e) {
            tags.release();
            chunks.release(n);
            throw e;
        }
    }

    /** Returns the request to its queue, then the permits (in that order, so permits never overstate). */
    void release(Request r) {
        int n = r.segments();
        r.release();
        if (n > 0) {
            chunks.release(n);
        }
        tags.release();
    }

    private static int chunksFor(int dataBytes) {
        return dataBytes == 0 ? 0 : BufferPool.chunksFor(dataBytes);
    }
}
