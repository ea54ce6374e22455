package io.pmemblk.vhost;

import io.pmemblk.vhost.blk.VhostBlkQueue;

import java.nio.file.Path;

/**
 * What the vhost-user-blk server is asked to serve: the socket QEMU connects to, how many virtqueues a front-end
 * may use (QEMU's {@code num-queues} must be at most this, GET_QUEUE_NUM answers it), and the largest ring a
 * guest may program (SET_VRING_NUM; QEMU's {@code queue-size} at most this).
 */
public record VhostUserBlkConfig(Path socket, int queues, int maxQueueSize, long pollNanos, long coalesceNanos) {
    /** Virtqueues at most: the KICK/CALL/ERR word has 8 bits of index [S]; 64 bounds the threads one guest starts. */
    public static final int MAX_QUEUES = 64;
    /** QEMU 7.2's VIRTQUEUE_MAX_SIZE: no guest ring is larger ({@code virtio_queue_set_num}). */
    public static final int MAX_QUEUE_SIZE = 1024;
    /**
     * The least vhost.queue-size: a virtio-blk request is a header, data and a status, 3 descriptors at least
     * ({@link io.pmemblk.vhost.blk.VirtioBlkConfig#segMax} = size - 2 must be 1 or more), and a ring whose
     * queue-size cannot hold one is no disk. QEMU's own virtio-blk refuses queue-size 2 or less ("must be > 2").
     * Powers of two are not required: this bounds what the guest programs, and QEMU's vhost-user-blk does not ask
     * for one (a Linux guest refuses a split ring that is not one by itself).
     */
    public static final int MIN_QUEUE_SIZE = 3;

    /** Longest busy-poll after work (vhost.busy-poll at its maximum, 1000 us): beyond it polling costs more than a kick. */
    public static final long MAX_POLL_NANOS = 1_000_000;

    /** Longest completion hold (vhost.coalesce at its maximum, 1000 us). */
    public static final long MAX_COALESCE_NANOS = 1_000_000;

    /** With the queue threads' default busy-poll and hold ({@link VhostBlkQueue#DEFAULT_POLL_NANOS}, {@link VhostBlkQueue#DEFAULT_HOLD_NANOS}). */
    public VhostUserBlkConfig(Path socket, int queues, int maxQueueSize) {
        this(socket, queues, maxQueueSize, VhostBlkQueue.DEFAULT_POLL_NANOS, VhostBlkQueue.DEFAULT_HOLD_NANOS);
    }

    public VhostUserBlkConfig {
        java.util.Objects.requireNonNull(socket, "socket");
        if (pollNanos < 0 || pollNanos > MAX_POLL_NANOS) {
            throw new IllegalArgumentException("vhost.busy-poll " + pollNanos / 1000 + " us is not allowed; allowed: 0.."
                    + MAX_POLL_NANOS / 1000 + " us");
        }
        if (coalesceNanos < 0 || coalesceNanos > MAX_COALESCE_NANOS) {
            throw new IllegalArgumentException("vhost.coalesce " + coalesceNanos / 1000 + " us is not allowed; allowed: 0.."
                    + MAX_COALESCE_NANOS / 1000 + " us");
        }
        if (queues < 1 || queues > MAX_QUEUES) {
            throw new IllegalArgumentException("vhost.queues " + queues + " is not allowed; allowed: 1.." + MAX_QUEUES);
        }
        if (maxQueueSize < MIN_QUEUE_SIZE || maxQueueSize > MAX_QUEUE_SIZE) {
            throw new IllegalArgumentException("vhost.queue-size " + maxQueueSize + " is not allowed; allowed: "
                    + MIN_QUEUE_SIZE + ".." + MAX_QUEUE_SIZE + " (a request takes 3 descriptors: header, data, status)");
        }
    }
}
