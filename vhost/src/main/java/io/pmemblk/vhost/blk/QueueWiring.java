package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.vhost.memory.GuestMemory;

import java.lang.foreign.MemorySegment;
import java.util.concurrent.ThreadFactory;
import java.util.function.Supplier;

/**
 * What a {@link VhostBlkQueue} serves its ring ({@link VringAddress}) with.
 * @param features the negotiated virtio features
 * @param kick     the kick eventfd the queue thread sleeps on
 * @param call     the call eventfd, or null when the queue has no interrupt vector
 * @param err      the err eventfd (SET_VRING_ERR), signalled when the guest breaks the ring, or null
 * @param frontend the block layer's queue its requests go to
 * @param memory   the memory table now (read once a batch: the session replaces it whole)
 * @param inflight this queue's slice of the inflight region (its desc_num written), or null
 * @param device   the disk: geometry, capabilities, serial
 * @param polling  the server's polling bounds, of which the queue takes one window
 * @param threads  makes the queue thread, unstarted (the server's: {@link VhostBlkQueue#start} survives a
 *                 system that makes no more threads)
 */
public record QueueWiring(long features, EventFd kick, EventFd call, EventFd err, FrontendQueue frontend,
                          Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device,
                          RingPolling polling, ThreadFactory threads) {
    /** Without an err eventfd (a queue served without a session). */
    public QueueWiring(long features, EventFd kick, EventFd call, FrontendQueue frontend,
                       Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device,
                       RingPolling polling, ThreadFactory threads) {
        this(features, kick, call, null, frontend, memory, inflight, device, polling, threads);
    }

    /** With a polling of its own, at the default busy-poll and hold (a queue served without a session). */
    public QueueWiring(long features, EventFd kick, EventFd call, FrontendQueue frontend,
                       Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device) {
        this(features, kick, call, frontend, memory, inflight, device, new RingPolling(VhostBlkQueue.DEFAULT_POLL_NANOS,
                VhostBlkQueue.DEFAULT_HOLD_NANOS, RingPolling.defaultMaxPollers()), Thread.ofPlatform().factory());
    }
}
