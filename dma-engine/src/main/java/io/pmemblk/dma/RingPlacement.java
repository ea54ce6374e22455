package io.pmemblk.dma;

import java.util.concurrent.locks.ReentrantLock;

/**
 * The placing half of a channel's ring, written once for every channel that keeps its copies in a ring of slots
 * ({@link DmaChannel#place} and {@link DmaChannel#placeAll}): each length checked, then under the channel's
 * submission lock the open check, the room check for the whole unit and the placing, so that no other placer and
 * no recovery comes between the room found and the slots filled. The channel says how a copy fills its slots.
 *
 * <p>A unit's copies that continue one another (each one's source and destination start where the previous one's
 * end) are put as one run, up to the ring's {@link Ring#mergeLimit}: a request of 512 guest pages that are
 * contiguous in guest memory costs a couple of descriptors, not 512, to place, for the device to fetch and to reap.
 * The run carries the number of copies it stands for, and each of them is still reported once
 * ({@link DmaCompletionListener#completed(Object, int, int)}). Runs never reach across two mappings of an
 * {@link IovaSpace} that hands out its own addresses: it leaves an unmapped guard page after every region, so two
 * copies that continue one another lie in one region or fault as they would apart. Copies placed by separate
 * {@link #place} calls are never merged: each is reported on its own descriptor.
 */
public final class RingPlacement {
    /** What the channel's ring answers; every call but {@link #slotsFor} and {@link #mergeLimit} under the submission lock. */
    public interface Ring {
        /** Throws IllegalStateException when the channel takes no copy (closed, broken). */
        void checkOpen();

        /** Slots free now (the reaper only frees more meanwhile, so what is found here stays). */
        long room();

        /** Slots one copy of this length takes. */
        int slotsFor(long length);

        /**
         * The longest run of contiguous copies put as one (the bytes one descriptor moves): a merged run never
         * takes more slots than its longest copy would alone.
         */
        long mergeLimit();

        /**
         * Fills the slots of one run of {@code copies} contiguous copies (1: a copy alone) at the ring's head, ctx
         * reported {@code copies} times when the last slot completes.
         */
        void put(long srcIova, long dstIova, long length, Object ctx, int copies);
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
            ring.put(srcIova, dstIova, length, ctx, 1);
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** {@link DmaChannel#placeAll}: all of them or none, contiguous copies merged into runs. */
    public boolean placeAll(DmaChannel.Copies copies, Object ctx) {
        long need = runs(copies, ctx, false); // checks every length before anything is placed
        lock.lock();
        try {
            ring.checkOpen();
            if (ring.room() < need) {
                return false;
            }
            runs(copies, ctx, true);
            return true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Walks {@code copies} run by run: counts the slots the runs take, and when {@code put} (under the lock, the
     * room checked) puts each run. Both passes cut the same runs, so what is counted is what is put.
     */
    private long runs(DmaChannel.Copies copies, Object ctx, boolean put) {
        int n = copies.count();
        long limit = ring.mergeLimit();
        long need = 0;
        long runSrc = 0, runDst = 0, runLength = 0;
        int runCopies = 0;
        for (int i = 0; i < n; i++) {
            long length = copies.length(i);
            if (length < 1) {
                throw new IllegalArgumentException("copy " + i + " of " + n + ": length " + length + " must be at least 1");
            }
            long src = copies.srcIova(i), dst = copies.dstIova(i);
            if (runCopies > 0 && src == runSrc + runLength && dst == runDst + runLength && length <= limit - runLength) {
                runLength += length;
                runCopies++;
                continue;
            }
            if (runCopies > 0) {
                need += run(runSrc, runDst, runLength, ctx, runCopies, put);
            }
            runSrc = src;
            runDst = dst;
            runLength = length;
            runCopies = 1;
        }
        if (runCopies > 0) {
            need += run(runSrc, runDst, runLength, ctx, runCopies, put);
        }
        return need;
    }

    /** One run: its slots, and put in the ring on the placing pass. */
    private int run(long src, long dst, long length, Object ctx, int copies, boolean put) {
        if (put) {
            ring.put(src, dst, length, ctx, copies);
        }
        return ring.slotsFor(length);
    }
}
