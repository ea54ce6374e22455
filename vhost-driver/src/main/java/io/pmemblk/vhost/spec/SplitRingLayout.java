package io.pmemblk.vhost.spec;

/**
 * The three areas of a split virtqueue of {@code size} entries in guest memory, written once from torvalds/linux
 * {@code include/uapi/linux/virtio_ring.h} (virtio 1.2 section 2.7; little-endian once VERSION_1 is negotiated),
 * for the device's side and the driver's alike:
 * <pre>
 * descriptor table  size x 16: u64 addr @0 (guest-physical), u32 len @8, u16 flags @12, u16 next @14   align 16
 * avail (driver)    u16 flags @0, u16 idx @2, u16 ring[size] @4, u16 used_event @4+2*size             align 2
 * used (device)     u16 flags @0, u16 idx @2, {u32 id, u32 len}[size] @4, u16 avail_event @4+8*size   align 4
 * </pre>
 */
public final class SplitRingLayout {
    private SplitRingLayout() {}

    public static final int DESC_BYTES = 16;
    public static final long DESC_ADDR = 0, DESC_LEN = 8, DESC_FLAGS = 12, DESC_NEXT = 14;
    /** virtq_desc.flags */
    public static final int F_NEXT = 1, F_WRITE = 2, F_INDIRECT = 4;
    public static final long AVAIL_FLAGS = 0, AVAIL_IDX = 2, AVAIL_RING = 4;
    /** virtq_avail.flags: the driver asks for no interrupt (ignored with EVENT_IDX). */
    public static final int AVAIL_F_NO_INTERRUPT = 1;
    public static final long USED_FLAGS = 0, USED_IDX = 2, USED_RING = 4, USED_ELEM_BYTES = 8;
    /** virtq_used.flags: the device asks for no kick (ignored with EVENT_IDX). */
    public static final int USED_F_NO_NOTIFY = 1;
    /** The largest queue a split ring can have (virtio 1.2 2.7: Queue Size is at most 32768). */
    public static final int MAX_SIZE = 32768;

    /**
     * Bytes of each area for a queue of {@code size}; the event fields (used_event, avail_event) only with
     * EVENT_IDX, as QEMU sizes them ({@code vhost_get_vring_avail_size}): a ring may end right before a hole.
     */
    public static long descBytes(int size) {
        return (long) DESC_BYTES * size;
    }

    public static long availBytes(int size, boolean eventIdx) {
        return AVAIL_RING + 2L * size + (eventIdx ? 2 : 0);
    }

    public static long usedBytes(int size, boolean eventIdx) {
        return USED_RING + USED_ELEM_BYTES * size + (eventIdx ? 2 : 0);
    }

    /** Where used_event lies in the avail area of a queue of {@code size} (EVENT_IDX only). */
    public static long usedEventOffset(int size) {
        return AVAIL_RING + 2L * size;
    }

    /** Where avail_event lies in the used area of a queue of {@code size} (EVENT_IDX only). */
    public static long availEventOffset(int size) {
        return USED_RING + USED_ELEM_BYTES * size;
    }

    /**
     * virtio_ring.h {@code vring_need_event}: whether moving an index from {@code old} to {@code next} passes the
     * other side's {@code event} (all u16, free-running).
     */
    public static boolean needEvent(int event, int next, int old) {
        return ((next - event - 1) & 0xffff) < ((next - old) & 0xffff);
    }
}
