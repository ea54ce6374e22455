package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.spec.SplitRingLayout;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;

import static io.pmemblk.vhost.spec.Le.U16;
import static io.pmemblk.vhost.spec.Le.U16_UNALIGNED;
import static io.pmemblk.vhost.spec.Le.U32;
import static io.pmemblk.vhost.spec.Le.U32_UNALIGNED;
import static io.pmemblk.vhost.spec.Le.U64_UNALIGNED;
import static io.pmemblk.vhost.spec.SplitRingLayout.*;

/**
 * The device's side of the three areas of a split virtqueue of {@code size} entries in guest memory, at
 * {@link SplitRingLayout}'s offsets (virtio 1.2 section 2.7; little-endian once VERSION_1 is negotiated).
 * Only reads and writes of single fields live here; their ordering is the caller's, with the fences libvhost-user
 * uses (qemu/qemu {@code subprojects/libvhost-user/include/atomic.h}: {@code smp_rmb} = acquire, {@code smp_wmb} =
 * release, {@code smp_mb} = full): {@link #acquire()}, {@link #release()}, {@link #full()}. Each guest-written field
 * is read once per use by the caller and kept in a local: the guest may change it at any moment.
 */
public final class SplitRing {
    private final int size;
    private final boolean eventIdx;
    private final MemorySegment desc;
    private final MemorySegment avail;
    private final MemorySegment used;
    private final long usedEventAt;
    private final long availEventAt;

    /**
     * @param eventIdx whether EVENT_IDX was negotiated: only then do the areas hold used_event and avail_event
     * @throws IllegalArgumentException when size is not a power of 2 in 1..32768, an area is shorter than its layout, or not
     *         aligned as virtio_ring.h requires (the areas come from the front-end and are checked once here)
     */
    public SplitRing(int size, boolean eventIdx, MemorySegment desc, MemorySegment avail, MemorySegment used) {
        if (size < 1 || size > MAX_SIZE || Integer.bitCount(size) != 1) {
            throw new IllegalArgumentException("virtqueue size " + size + ": allowed a power of 2 in 1.." + MAX_SIZE
                    + " (virtio 1.2 2.7: a split queue's size is a power of 2)");
        }
        check("descriptor table", desc, descBytes(size), 16);
        check("avail ring", avail, availBytes(size, eventIdx), 2);
        check("used ring", used, usedBytes(size, eventIdx), 4);
        this.size = size;
        this.eventIdx = eventIdx;
        this.desc = desc;
        this.avail = avail;
        this.used = used;
        this.usedEventAt = usedEventOffset(size);
        this.availEventAt = availEventOffset(size);
    }

    private static void check(String what, MemorySegment area, long bytes, int align) {
        if (area.byteSize() < bytes) {
            throw new IllegalArgumentException(what + " of " + area.byteSize() + " bytes: a ring of this size needs " + bytes);
        }
        if (area.address() % align != 0) {
            throw new IllegalArgumentException(what + " at 0x" + Long.toHexString(area.address()) + ": must be "
                    + align + "-byte aligned (virtio 1.2 2.7 Table: Virtqueue Part Alignment)");
        }
    }

    public int size() {
        return size;
    }

    /** Whether the event fields exist (EVENT_IDX negotiated); without, they must not be touched. */
    public boolean eventIdx() {
        return eventIdx;
    }

    public MemorySegment descriptorTable() {
        return desc;
    }

    // The driver's fields: read once, plainly; the caller orders them (acquire after idx, full before re-checks).

    public int availIdx() {
        return Short.toUnsignedInt(avail.get(U16, AVAIL_IDX));
    }

    public int availFlags() {
        return Short.toUnsignedInt(avail.get(U16, AVAIL_FLAGS));
    }

    /** avail.ring[slot], slot already reduced mod size. */
    public int availRing(int slot) {
        return Short.toUnsignedInt(avail.get(U16, AVAIL_RING + 2L * slot));
    }

    /** EVENT_IDX: interrupt the driver when used.idx passes this. */
    public int usedEvent() {
        return Short.toUnsignedInt(avail.get(U16, usedEventAt));
    }

    // The device's fields.

    public int usedIdx() {
        return Short.toUnsignedInt(used.get(U16, USED_IDX));
    }

    /** Publishes used.idx; the caller has fenced ({@link #release()}) after the entries it covers. */
    public void usedIdx(int idx) {
        used.set(U16, USED_IDX, (short) idx);
    }

    public int usedFlags() {
        return Short.toUnsignedInt(used.get(U16, USED_FLAGS));
    }

    public void usedFlags(int flags) {
        used.set(U16, USED_FLAGS, (short) flags);
    }

    /** used.ring[slot] = {id, len}, slot already reduced mod size. */
    public void usedElem(int slot, int id, int len) {
        long at = USED_RING + USED_ELEM_BYTES * slot;
        used.set(U32, at, id);
        used.set(U32, at + 4, len);
    }

    /** used.ring[slot].id (read back at restart, to see which heads the last incarnation completed). */
    public int usedElemId(int slot) {
        return used.get(U32, USED_RING + USED_ELEM_BYTES * slot);
    }

    /** EVENT_IDX: the driver kicks when avail.idx passes this. */
    public void availEvent(int idx) {
        used.set(U16, availEventAt, (short) idx);
    }

    public int availEvent() {
        return Short.toUnsignedInt(used.get(U16, availEventAt));
    }

    // A descriptor in a table at byte offset base (the ring's own table, or an indirect one anywhere in memory).

    static long descAddr(MemorySegment table, long base) {
        return table.get(U64_UNALIGNED, base + DESC_ADDR);
    }

    static long descLen(MemorySegment table, long base) {
        return Integer.toUnsignedLong(table.get(U32_UNALIGNED, base + DESC_LEN));
    }

    static int descFlags(MemorySegment table, long base) {
        return Short.toUnsignedInt(table.get(U16_UNALIGNED, base + DESC_FLAGS));
    }

    static int descNext(MemorySegment table, long base) {
        return Short.toUnsignedInt(table.get(U16_UNALIGNED, base + DESC_NEXT));
    }

    /** {@code smp_rmb}: reads after it (ring entries, descriptors) see what the driver wrote before avail.idx. */
    public static void acquire() {
        VarHandle.acquireFence();
    }

    /** {@code smp_wmb}: used entries (and the data and status before them) are visible before used.idx. */
    public static void release() {
        VarHandle.releaseFence();
    }

    /** {@code smp_mb}: a store (used.idx, avail_event, used.flags) is visible before the load that follows it. */
    public static void full() {
        VarHandle.fullFence();
    }
}
