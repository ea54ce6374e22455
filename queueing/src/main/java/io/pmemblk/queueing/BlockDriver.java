package io.pmemblk.queueing;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * The device behind the block layer (the pmem driver, or a test double in tests of this module).
 * Contract in one line each, after nbdkit's plugin table:
 * <ul>
 *   <li>{@link #size()}: bytes of the device, fixed while it is open.</li>
 *   <li>{@link #queueRequests}: executes a batch taken from hardware queue {@code hwq}; every request is
 *       completed exactly once with {@link Request#complete(int)}, possibly later and on another thread.
 *       A WRITE with fua, and a FLUSH, complete only when persistent; FLUSH covers every write completed
 *       before it on any queue.</li>
 *   <li>Bounds are checked here too: a frontend's checks are not trusted.</li>
 *   <li>{@link #registerMemory} / {@link #unregisterMemory}: a frontend's own memory (caller-memory requests,
 *       {@link FrontendQueue#acquireIov}) made reachable by the driver's DMA engine once, and withdrawn.</li>
 *   <li>Capability queries ({@link #isReadOnly} .. {@link #canMultiConn}), nbdkit's {@code can_*} callbacks: what
 *       a frontend advertises (NBD's transmission flags) and refuses. Asked when a client connects, never per
 *       request; the answers stay fixed while the driver is open. A driver advertises only what it implements:
 *       each defaults to no, as nbdkit's do when a plugin has no such callback.</li>
 * </ul>
 */
public interface BlockDriver extends AutoCloseable {
    long size();

    /** True when stores reach persistence by CPU cache flushes (real pmem), false when msync is needed. */
    boolean isPmem();

    /** No WRITE, TRIM or WRITE_ZEROES is accepted (nbdkit {@code can_write} false). */
    default boolean isReadOnly() {
        return false;
    }

    /** FLUSH makes every completed write persistent (nbdkit {@code can_flush}). */
    default boolean canFlush() {
        return false;
    }

    /** A request with fua completes only once its data is persistent, without a FLUSH (nbdkit {@code can_fua}). */
    default boolean canFua() {
        return false;
    }

    /** TRIM is served (nbdkit {@code can_trim}); what a trimmed range reads back as is the driver's. */
    default boolean canTrim() {
        return false;
    }

    /** WRITE_ZEROES is served (nbdkit {@code can_zero}). */
    default boolean canZero() {
        return false;
    }

    /**
     * WRITE_ZEROES with FAST_ZERO is served: zeroing is never slower than writing zeros, else the driver
     * answers {@link Status#ENOTSUP} (nbdkit {@code can_fast_zero}).
     */
    default boolean canFastZero() {
        return false;
    }

    /** CACHE (prefetch a range) is served (nbdkit {@code can_cache}). */
    default boolean canCache() {
        return false;
    }

    /** Seeks cost time: clients may sort their requests (nbdkit {@code is_rotational}). */
    default boolean isRotational() {
        return false;
    }

    /**
     * Connections see one another's completed writes and one FLUSH covers them all, so a client may spread its
     * requests over several connections (nbdkit {@code can_multi_conn}).
     */
    default boolean canMultiConn() {
        return false;
    }

    /**
     * The unit WRITE, TRIM and WRITE_ZEROES must be aligned to and a multiple of (EINVAL otherwise), a power of
     * two: 1 on a byte-addressable device, the sector size of a sector-atomic layout (nbdkit {@code block_size}'s
     * minimum). Frontends advertise it: NBD as the minimum block size, vhost-user-blk as blk_size.
     */
    default int minimumBlockSize() {
        return 1;
    }

    /** Called once per hardware queue at start-up, with its registered buffer pool. */
    default void attachQueue(HardwareQueue queue) {}

    void queueRequests(int hwq, Request[] batch, int count);

    /**
     * Makes the calling thread, which dispatches hwq's batches and sleeps on eventfds of its own, a reaper of
     * hwq's DMA completions: it sleeps on the returned eventfd too (edge-triggered, never reading it or closing
     * it) and calls {@link #reapCompletions} whenever it wakes or loops, until {@link #stopReaping}. Saves a
     * thread wake-up per completion (SPDK's pollers reap on the thread that submits). -1: nothing to reap here
     * (no engine, or one whose completions come only on its own thread); then no stopReaping is due.
     */
    default int startReaping(int hwq) {
        return -1;
    }

    /** Reports hwq's finished DMA copies on the calling thread (their requests complete here); how many. */
    default int reapCompletions(int hwq) {
        return 0;
    }

    /** The thread {@link #startReaping} made a reaper stops being one (before it leaves its loop). */
    default void stopReaping(int hwq) {}

    /**
     * Whether a WRITE of {@code length} bytes at {@code offset} would take the CPU route and can be received
     * straight into the device: the frontend then acquires the request without buffers ({@code acquire(0)}),
     * sets op, offset and length, calls {@link #receiveInPlace(Request)}, receives the payload into
     * {@link Request#dataBuffers()} and dispatches as usual. One copy (the kernel's) instead of two. A payload
     * cut short by a vanished client leaves that part of the range written: no write is atomic on a block device.
     */
    default boolean receivesInPlace(long offset, long length) {
        return false;
    }

    /**
     * Whether a READ of {@code length} bytes at {@code offset} would take the CPU route and be sent straight out
     * of the device by a frontend that sets {@link Request#sinkReadsDevice}: the frontend then acquires it
     * without buffers ({@link FrontendQueue#acquireRead}), and the driver points {@link Request#dataBuffers()}
     * at the device range when it executes it. The same rule as {@link #receivesInPlace}: the route is decided
     * once, before anything is acquired, so such a READ never holds (or waits for) buffer chunks. A driver that
     * answers true must serve a READ without segments that way.
     */
    default boolean sendsInPlace(long offset, long length) {
        return false;
    }

    /** Points the request's data buffers at the device range and marks it {@link Request#dataInPlace}. */
    default void receiveInPlace(Request r) {
        throw new UnsupportedOperationException("this driver does not receive in place");
    }

    /**
     * A request received in place ({@link #receiveInPlace}) is being released: after its completion, or without
     * ever being dispatched (a payload cut short, a refused digest, a frontend's teardown). A driver that holds
     * something for it from {@link #receiveInPlace} to its completion lets go of it here in the second case.
     */
    default void releasedInPlace(Request r) {}

    /**
     * Makes {@code region} (native memory a frontend holds, e.g. a vhost-user guest's RAM) reachable by the
     * driver's DMA engine, once, when the frontend maps it, never per request; returns the iova of its byte 0 for
     * {@link Request#addIov} (the iova of a piece is that plus its offset in the region), or
     * {@link Request#NO_IOVA} when there is no engine to reach it: its requests are then copied by the CPU.
     */
    default long registerMemory(MemorySegment region) {
        return Request.NO_IOVA;
    }

    /**
     * Withdraws a region {@link #registerMemory} made reachable. The frontend calls it after its requests on the
     * region are released and before it unmaps the region: the engine must not copy into memory given back.
     */
    default void unregisterMemory(MemorySegment region) {}

    /**
     * Memory for a hardware queue's buffer pool, {@code bytes} page-aligned, owned by {@code owner}: plain native
     * memory, unless the driver's DMA engine must be given memory of its own kind (a device in another process
     * reaches only memory mapped from a file it is given: the engine's {@code IovaSpace.allocate}).
     */
    default MemorySegment allocateBuffers(long bytes, Arena owner) {
        return owner.allocate(bytes, 4096);
    }

    /** Makes everything written so far persistent (used at shutdown). */
    void persistAll() throws java.io.IOException;

    @Override
    void close() throws java.io.IOException;
}
