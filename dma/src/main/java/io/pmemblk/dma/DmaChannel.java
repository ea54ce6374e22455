package io.pmemblk.dma;

/**
 * One DMA copy queue. place/submit may be called from several threads; completions are reported to the
 * channel's {@link DmaCompletionListener}.
 */
public interface DmaChannel extends AutoCloseable {
    int index();

    /** Descriptors that can be placed now. */
    int freeSlots();

    /** Descriptors one copy of this length takes (split at the device's maximum transfer size). */
    int slotsFor(long length);

    /**
     * Places descriptors copying length bytes srcIova->dstIova, without ringing the doorbell.
     * ctx (may be null: then nothing is reported) is reported to the completion listener when the LAST descriptor
     * of this copy completes. Returns false and places nothing if the ring lacks room.
     *
     * @throws IllegalArgumentException for a length below 1
     * @throws IllegalStateException when the channel is closed
     */
    boolean place(long srcIova, long dstIova, long length, Object ctx);

    /** Rings the doorbell once for everything placed since the last submit. */
    void submit();

    /** Reaps completions now (poll mode); returns how many contexts were reported. */
    int poll();

    /** Waits for outstanding copies (bounded), reports what remains with STATUS_CLOSED, stops the channel. Idempotent. */
    @Override
    void close();
}
