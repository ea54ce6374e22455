package io.pmemblk.dma;

/**
 * One DMA copy queue. place/submit may be called from several threads; completions are reported to the
 * channel's {@link DmaCompletionListener}.
 */
public interface DmaChannel extends AutoCloseable {
    int index();

    /** Sets who hears about completions; set it before placing copies (a {@link DmaEngine} sets it for its channels). */
    void listener(DmaCompletionListener listener);

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

    /** The copies of one unit of work (a request's segments), read by {@link #placeAll} while it places them. */
    interface Copies {
        int count();

        long srcIova(int i);

        long dstIova(int i);

        long length(int i);
    }

    /**
     * Places every copy of {@code copies} as one unit, without ringing the doorbell: all of them or none, also
     * when it throws. Each copy reports {@code ctx} (not null) when its last descriptor completes, so ctx is
     * reported {@code copies.count()} times; copies that continue one another may be moved as one run of
     * descriptors, and then are reported together when the run's last completes, failed together when it fails
     * ({@link DmaCompletionListener#completed(Object, int, int)}). The room check and the placing are one step under the channel's
     * own submission lock: no caller-side lock around {@link #freeSlots} and {@link #place}, and no halt recovery
     * between two copies of the unit (SPDK gives a channel one owner; here several queues may share one).
     *
     * @return false, placing nothing, when the ring lacks room for all of them now (or ever)
     * @throws IllegalArgumentException for a copy length below 1 (nothing placed)
     * @throws IllegalStateException when the channel is closed or broken (nothing placed)
     */
    boolean placeAll(Copies copies, Object ctx);

    /** Rings the doorbell once for everything placed since the last submit. */
    void submit();

    /** Reaps completions now (poll mode); returns how many copies were reported. */
    int poll();

    /**
     * The eventfd this channel's interrupt signals, for a thread that reaps the completions itself ({@link #poll})
     * and sleeps on it beside its own input, as SPDK reaps on the thread that submits; -1 when the channel has
     * none (its completions are reported on its own thread only). Owned by the channel: never closed by its users.
     */
    default int completionFd() {
        return -1;
    }

    /**
     * A thread starts ({@code true}) or stops ({@code false}) reaping this channel's completions itself: it calls
     * {@link #poll} whenever it wakes or loops, and sleeps on {@link #completionFd}. While at least one does, the
     * channel's completion thread stands by: it no longer takes the interrupt (that wake-up per completion is what
     * the poller saves) and reaps only what the pollers leave, tens of milliseconds late (a poller blocked
     * elsewhere). Counted: every start has its stop. Ignored by a channel without a {@link #completionFd}.
     */
    default void pollers(boolean start) {}

    /** Waits for outstanding copies (bounded), reports what remains with STATUS_CLOSED, stops the channel. Idempotent. */
    @Override
    void close();
}
