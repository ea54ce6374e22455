package io.pmemblk.dma;

import java.util.concurrent.locks.ReentrantLock;

/**
 * The placing half of a channel's ring, written once for every channel that keeps its copies in a ring of slots
 * ({@link DmaChannel#place} and {@link DmaChannel#placeAll}): each length checked, then under the channel's
 * submission lock the open check, the room check for the whole unit and the placing, so that no other placer and
 * no recovery comes between the room found and the slots filled. The channel says how a copy fills its slots.
 */
public final class RingPlacement {
    /** What the channel's ring answers; every call but {@link #slotsFor} under the submission lock. */
    public interface Ring {
        /** Throws IllegalStateException when the channel takes no copy (closed, broken). */
        void checkOpen();

        /** Slots free now (the reaper only frees more meanwhile, so what is found here stays). */
        long room();

        /** Slots one copy of this length takes. */
        int slotsFor(long length);

        /** Fills the slots of one copy at the ring's head, ctx reported when the last completes. */
        void put(long srcIova, long dstIova, long length, Object ctx);
    }

    private final ReentrantLock lock;
    private final Ring ring;

    /** {@code lock}: the channel's submission lock, which its doorbell and recovery take too. */
    public RingPlacement(ReentrantLock lock, Ring ring) {
        this.lock = lock;
        this.ring = ring;
    }

    /** {@link DmaChannel#place}: false, placing nothing, when the ring lacks room. */
    public boolean place(long srcIova, long dstIova, long length, Object ctx) {
        if (length < 1) {
            throw new IllegalArgumentException("copy length " + length + " must be at least 1");
        }
        int need = ring.slotsFor(length);
        lock.lock();
        try {
            ring.checkOpen();
            if (ring.room() < need) {
                return false;
            }
            ring.put(srcIova, dstIova, length, ctx);
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** {@link DmaChannel#placeAll}: all of them or none. */
    public boolean placeAll(DmaChannel.Copies copies, Object ctx) {
        int n = copies.count();
        long need = 0;
        for (int i = 0; i < n; i++) {
            long length = copies.length(i);
            if (length < 1) {
                throw new IllegalArgumentException("copy " + i + " of " + n + ": length " + length + " must be at least 1");
            }
            need += ring.slotsFor(length);
        }
        lock.lock();
        try {
            ring.checkOpen();
            if (ring.room() < need) {
                return false;
            }
            for (int i = 0; i < n; i++) {
                ring.put(copies.srcIova(i), copies.dstIova(i), copies.length(i), ctx);
            }
            return true;
        } finally {
            lock.unlock();
        }
    }
}
