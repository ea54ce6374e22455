package io.pmemblk.vhost;

import java.nio.file.Path;

/**
 * What the vhost-user-blk server is asked to serve: the socket QEMU connects to, how many virtqueues a front-end
 * may use (QEMU's {@code num-queues} must be at most this, GET_QUEUE_NUM answers it), and the largest ring a
 * guest may program (SET_VRING_NUM; QEMU's {@code queue-size} at most this).
 */
public record VhostUserBlkConfig(Path socket, int queues, int maxQueueSize) {
    /** Virtqueues at most: the KICK/CALL/ERR word has 8 bits of index [S]; 64 bounds the threads one guest starts. */
    public static final int MAX_QUEUES = 64;
    /** QEMU 7.2's VIRTQUEUE_MAX_SIZE: no guest ring is larger ({@code virtio_queue_set_num}). */
    public static final int MAX_QUEUE_SIZE = 1024;

    public VhostUserBlkConfig {
        java.util.Objects.requireNonNull(socket, "socket");
        if (queues < 1 || queues > MAX_QUEUES) {
            throw new IllegalArgumentException("vhost.queues " + queues + " is not allowed; allowed: 1.." + MAX_QUEUES);
        }
        if (maxQueueSize < 1 || maxQueueSize > MAX_QUEUE_SIZE) {
            throw new IllegalArgumentException("vhost.queue-size " + maxQueueSize + " is not allowed; allowed: 1.."
                    + MAX_QUEUE_SIZE);
        }
    }
}
