package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.spec.Le;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * One queue's part of the vhost-user inflight region (docs/interop/vhost-user.rst "Inflight I/O tracking",
 * {@code QueueRegionSplit}; kept as qemu/qemu {@code subprojects/libvhost-user} {@code vu_queue_inflight_get},
 * {@code _pre_put}, {@code _post_put} and {@code vu_check_queue_inflights} keep it). The region is shared memory
 * that outlives this process: QEMU holds it across a back-end crash and hands it to the next one.
 * <pre>
 * u64 features @0; u16 version @8 (1; 0 = fresh); u16 desc_num @10; u16 last_batch_head @12; u16 used_idx @14;
 * DescStateSplit desc[desc_num] @16, 16 bytes each: u8 inflight @0, u8 padding[5], u16 next @6, u64 counter @8
 * </pre>
 * Bookkeeping: a popped head gets the next counter and inflight = 1; a completion is recorded around the
 * publication of used.idx (see {@link #beforePublish} / {@link #afterPublish}). Restart ({@link #recover}): heads
 * still marked are resubmitted in counter order, before any new avail entry.
 *
 * <p>Unlike libvhost-user, used entries are published in batches, so a crash can fall between a batch's used.idx
 * and the clearing of its heads' marks. The region's used_idx is the used.idx before the batch, so at restart
 * the heads in used.ring[used_idx .. used.idx) are exactly those completed but still marked: they are cleared
 * (libvhost-user clears only last_batch_head, right for its batches of one, and so is this for a batch of one).
 * A head cannot be popped again inside that window: the marks are changed under the queue's lock (the caller's).
 */
public final class Inflight {
    static final long VERSION = 8, DESC_NUM = 10, LAST_BATCH_HEAD = 12, USED_IDX = 14, DESC = 16;
    static final long DESC_STATE_BYTES = 16, STATE_INFLIGHT = 0, STATE_COUNTER = 8;
    static final int VERSION_1 = 1;
    // Unaligned: the front-end chooses where the region and each queue's part start.
    private static final ValueLayout.OfShort U16 = Le.U16_UNALIGNED;
    private static final ValueLayout.OfLong U64 = Le.U64_UNALIGNED;

    private final MemorySegment region;
    private final int descNum;
    private long counter;

    /**
     * @param region this queue's slice of the inflight region; a desc_num of 0 (a region fresh from
     *               GET_INFLIGHT_FD, nobody having written it) becomes the ring's size, as libvhost-user's
     *               {@code vu_set_inflight_fd} writes its queue size there
     * @param queueSize the ring's size: every head must have a slot
     * @throws IllegalArgumentException when the slice is shorter than its desc_num says, or desc_num is below the
     *         ring's size (QEMU sizes the region by its queue-size property; a guest may program a larger ring)
     */
    public Inflight(MemorySegment region, int queueSize) {
        if (region.byteSize() < DESC) {
            throw new IllegalArgumentException("inflight region of " + region.byteSize() + " bytes: at least " + DESC);
        }
        int n = Short.toUnsignedInt(region.get(U16, DESC_NUM));
        boolean unset = n == 0;
        if (unset) {
            n = queueSize;
        }
        if (region.byteSize() < DESC + DESC_STATE_BYTES * n) {
            throw new IllegalArgumentException("inflight region of " + region.byteSize() + " bytes for desc_num " + n
                    + ": needs " + (DESC + DESC_STATE_BYTES * n));
        }
        if (unset) {
            region.set(U16, DESC_NUM, (short) n);
        }
        if (n < queueSize) {
            throw new IllegalArgumentException("inflight region tracks " + n + " descriptors, the ring has "
                    + queueSize + ": QEMU's queue-size must be at least the ring size the guest programs");
        }
        this.region = region;
        this.descNum = n;
    }

    /**
     * Heads popped and not yet completed by an earlier incarnation, in the order they were popped; fresh: the
     * region was new (version 0), so SET_VRING_BASE's index stands.
     */
    public record Recovered(boolean fresh, int[] heads, int usedIdx) {}

    /**
     * The restart rule: a fresh region (version 0) is marked version 1 and nothing is pending. Else the marks of
     * heads whose completion reached used.idx are cleared, and the heads still marked are returned in counter
     * order (the order they were popped); the queue's last_avail_idx is then used.idx + their number.
     * @param ring the ring, mapped (its used ring tells which heads completed since the region's used_idx)
     * @throws IllegalStateException when the region contradicts the ring (a used.idx more than a ring ahead of the
     *         region's, a used id outside the ring, more marks than the ring holds): it cannot be trusted
     */
    public Recovered recover(SplitRing ring) {
        int usedIdx = ring.usedIdx();
        if (Short.toUnsignedInt(region.get(U16, VERSION)) == 0) {
            region.set(U16, VERSION, (short) VERSION_1);
            counter = 0;
            region.set(U16, USED_IDX, (short) usedIdx);
            return new Recovered(true, new int[0], usedIdx);
        }
        int size = ring.size();
        int recorded = Short.toUnsignedInt(region.get(U16, USED_IDX));
        int behind = (usedIdx - recorded) & 0xffff;
        if (behind > size) {
            throw new IllegalStateException("inflight region's used_idx " + recorded + " is " + behind
                    + " entries behind the ring's used.idx " + usedIdx + ": at most the ring size " + size);
        }
        for (int i = recorded; i != ((recorded + behind) & 0xffff); i = (i + 1) & 0xffff) {
            int id = ring.usedElemId(i % size);
            if (id < 0 || id >= size) {
                throw new IllegalStateException("used.ring[" + (i % size) + "].id " + Integer.toUnsignedString(id)
                        + " is outside the ring of " + size);
            }
            region.set(ValueLayout.JAVA_BYTE, state(id) + STATE_INFLIGHT, (byte) 0);
        }
        region.set(U16, USED_IDX, (short) usedIdx);
        int[] heads = java.util.stream.IntStream.range(0, descNum)
                .filter(h -> region.get(ValueLayout.JAVA_BYTE, state(h) + STATE_INFLIGHT) != 0)
                .boxed().sorted((a, b) -> Long.compareUnsigned(counter(a), counter(b)))
                .mapToInt(Integer::intValue).toArray();
        long max = -1;
        for (int h : heads) {
            if (h >= size) {
                throw new IllegalStateException("inflight head " + h + " is outside the ring of " + size);
            }
            max = Math.max(max, counter(h));
        }
        counter = max + 1;
        return new Recovered(false, heads, usedIdx);
    }

    private long counter(int head) {
        return region.get(U64, state(head) + STATE_COUNTER);
    }

    private static long state(int head) {
        return DESC + DESC_STATE_BYTES * head;
    }

    /** A head was popped (called under the queue's lock). */
    public void popped(int head) {
        long s = state(head);
        region.set(U64, s + STATE_COUNTER, counter++);
        region.set(ValueLayout.JAVA_BYTE, s + STATE_INFLIGHT, (byte) 1);
    }

    /**
     * Before used.idx moves from {@code usedIdx} over a batch whose last head is {@code lastHead}: the region's
     * used_idx already says {@code usedIdx} (it was written after the previous batch), last_batch_head as
     * libvhost-user keeps it.
     */
    public void beforePublish(int lastHead) {
        region.set(U16, LAST_BATCH_HEAD, (short) lastHead);
    }

    /** After used.idx became {@code usedIdx}: the batch's heads are unmarked, then used_idx records it. */
    public void completed(int head) {
        region.set(ValueLayout.JAVA_BYTE, state(head) + STATE_INFLIGHT, (byte) 0);
    }

    public void afterPublish(int usedIdx) {
        // Stores to one shared mapping are seen in program order on x86 (TSO); the release fence keeps the JIT from
        // moving the used_idx store before the unmarking, the compiler barrier libvhost-user puts there.
        SplitRing.release();
        region.set(U16, USED_IDX, (short) usedIdx);
    }
}
