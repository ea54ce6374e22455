package io.pmemblk.queueing;

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
 * </ul>
 */
public interface BlockDriver extends AutoCloseable {
    long size();

    /** True when stores reach persistence by CPU cache flushes (real pmem), false when msync is needed. */
    boolean isPmem();

    /** Called once per hardware queue at start-up, with its registered buffer pool. */
    default void attachQueue(HardwareQueue queue) {}

    void queueRequests(int hwq, Request[] batch, int count);

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

    /** Makes everything written so far persistent (used at shutdown). */
    void persistAll() throws java.io.IOException;

    @Override
    void close() throws java.io.IOException;
}
