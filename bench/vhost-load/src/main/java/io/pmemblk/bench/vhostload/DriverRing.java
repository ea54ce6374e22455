package io.pmemblk.bench.vhostload;

import io.pmemblk.vhost.virtq.SplitRing;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

import static io.pmemblk.vhost.virtq.SplitRing.*;

/**
 * The driver's side of one split virtqueue with EVENT_IDX, as Linux's {@code drivers/virtio/virtio_ring.c} keeps
 * it: descriptors, the avail ring it publishes (a kick only when {@code vring_need_event} says the device asked for
 * one), the used ring it reads back and the used_event it moves to ask for the next interrupt. Layout: virtio 1.2
 * section 2.7 ({@code include/uapi/linux/virtio_ring.h}), written once, in vhost's {@link SplitRing}. The fences
 * are Linux's: {@code virtio_wmb} before the index is published, {@code virtio_mb} between a publish and the read of
 * the other side's event index, {@code virtio_rmb} after reading used.idx.
 */
final class DriverRing {
    static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    final int size;
    final long descGpa, availGpa, usedGpa;
    private final MemorySegment desc, avail, used;
    private int availIdx;
    private int kickedIdx;
    private int lastUsed;

    /** A ring of {@code size} whose areas start at {@code gpa}, each page-aligned; {@link #bytes} of them. */
    DriverRing(GuestRam ram, long gpa, int size) {
        this.size = size;
        descGpa = gpa;
        availGpa = descGpa + pages(descBytes(size));
        usedGpa = availGpa + pages(availBytes(size, true));
        desc = ram.at(descGpa, descBytes(size));
        avail = ram.at(availGpa, availBytes(size, true));
        used = ram.at(usedGpa, usedBytes(size, true));
    }

    static long bytes(int size) {
        return pages(descBytes(size)) + pages(availBytes(size, true)) + pages(usedBytes(size, true));
    }

    private static long pages(long n) {
        return (n + 4095) & ~4095L;
    }

    /** The descriptor at byte {@code at} of {@code mem}. */
    static void desc(MemorySegment mem, long at, long addr, long len, int flags, int next) {
        mem.set(U64, at + DESC_ADDR, addr);
        mem.set(U32, at + DESC_LEN, (int) len);
        mem.set(U16, at + DESC_FLAGS, (short) flags);
        mem.set(U16, at + DESC_NEXT, (short) next);
    }

    /** Ring descriptor {@code head}: an indirect table of {@code entries} at {@code tableGpa}. */
    void indirect(int head, long tableGpa, int entries) {
        desc(desc, (long) DESC_BYTES * head, tableGpa, (long) DESC_BYTES * entries, F_INDIRECT, 0);
    }

    /** Puts {@code head} in the avail ring; seen by the device at the next {@link #publish}. */
    void add(int head) {
        avail.set(U16, AVAIL_RING + 2L * (availIdx % size), (short) head);
        availIdx = (availIdx + 1) & 0xffff;
    }

    /** Publishes what was added; whether the device must be kicked (virtqueue_kick_prepare with EVENT_IDX). */
    boolean publish() {
        VarHandle.releaseFence();
        avail.set(U16, AVAIL_IDX, (short) availIdx);
        VarHandle.fullFence();
        int event = Short.toUnsignedInt(used.get(U16, USED_RING + USED_ELEM_BYTES * size));
        int old = kickedIdx;
        kickedIdx = availIdx;
        return needEvent(event, availIdx, old);
    }

    /** vring_need_event: whether moving an index from {@code old} to {@code now} passes {@code event}. */
    static boolean needEvent(int event, int now, int old) {
        return ((now - event - 1) & 0xffff) < ((now - old) & 0xffff);
    }

    /** Whether the device has used entries not taken yet. */
    boolean hasUsed() {
        int idx = Short.toUnsignedInt(used.get(U16, USED_IDX));
        VarHandle.acquireFence();
        return idx != lastUsed;
    }

    /** The id (head) of the next used entry; call only when {@link #hasUsed}; then {@link #next}. */
    int usedId() {
        return used.get(U32, USED_RING + USED_ELEM_BYTES * (lastUsed % size));
    }

    void next() {
        lastUsed = (lastUsed + 1) & 0xffff;
    }

    /**
     * virtqueue_enable_cb_prepare with EVENT_IDX: used_event = the next entry, so the device interrupts when it
     * passes it; then (full fence) whether entries came meanwhile, which the caller takes before it waits.
     */
    boolean armInterrupt() {
        avail.set(U16, AVAIL_RING + 2L * size, (short) lastUsed);
        VarHandle.fullFence();
        return hasUsed();
    }
}
