package io.pmemblk.dma;

/**
 * Told once per placed copy (with a non-null ctx) when the copy is finished, for better or worse; copies of one
 * unit that finished together may come in one call ({@link #completed(Object, int, int)}).
 */
@FunctionalInterface
public interface DmaCompletionListener {
    /** Status of copies abandoned because their channel was closed before they completed. */
    int STATUS_CLOSED = 0x8000_0000;
    /** Status of copies lost to a halt that left no CHANERR cause (an ABORT command). */
    int STATUS_ABORTED = 0x4000_0000;
    /**
     * Status of copies whose device went away before it reported them (a vfio-user device process that died or
     * stopped answering): they may be partly done or not started, as after a halt.
     */
    int STATUS_DEVICE_LOST = 0x0800_0000;

    /**
     * status 0 = copied; otherwise the CHANERR bits of the halt (or {@link #STATUS_CLOSED}). Every placed ctx is
     * reported exactly once: on a halt, the failed descriptor's copy and every copy placed after it are reported
     * with the error (they may be partly done or not started), then the channel is reset and re-armed so later
     * copies work. Called on the channel's completion thread (or a thread in {@link DmaChannel#poll}), never while
     * the channel's submission lock is held, so it may place and submit more copies; it should not block long.
     */
    void completed(Object ctx, int status);

    /**
     * {@code copies} placed copies of ctx (a run of contiguous copies of one unit that the channel moved as one,
     * {@link RingPlacement}) finished with the same {@code status}: the same as {@code copies} calls of
     * {@link #completed(Object, int)}, which is what this default makes of it, every one made even when one
     * throws (the first throwable is rethrown after the last). A listener that counts its copies down overrides it
     * to count them in one step; the channel calls only this one.
     */
    default void completed(Object ctx, int status, int copies) {
        Throwable first = null;
        for (int i = 0; i < copies; i++) {
            try {
                completed(ctx, status);
            } catch (Throwable t) {
                if (first == null) {
                    first = t;
                }
            }
        }
        if (first instanceof RuntimeException e) {
            throw e;
        }
        if (first instanceof Error e) {
            throw e;
        }
        if (first != null) {
            throw new java.lang.reflect.UndeclaredThrowableException(first);
        }
    }
}
