package io.pmemblk.vhost.driver;

import io.pmemblk.vhost.spec.SplitRingLayout;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;

import static io.pmemblk.vhost.spec.Le.U16_UNALIGNED;
import static io.pmemblk.vhost.spec.Le.U32_UNALIGNED;
import static io.pmemblk.vhost.spec.Le.U64_UNALIGNED;
import static io.pmemblk.vhost.spec.SplitRingLayout.*;

/**
 * The driver's side of one split virtqueue with EVENT_IDX, as Linux's {@code drivers/virtio/virtio_ring.c} keeps it
 * (virtio 1.2 section 2.7.13), at {@link SplitRingLayout}'s offsets: descriptors, the avail ring it publishes (a kick
 * only when {@code vring_need_event} says the device asked for one), the used ring it reads back and the used_event
 * it moves to ask for the next interrupt. The fences are Linux's: {@code virtio_wmb} before the index is published,
 * {@code virtio_mb} between a publish and the read of the other side's event index, {@code virtio_rmb} after reading
 * used.idx. Raw access to single fields lets a test guest write what no well-behaved driver would.
 */
public class DriverRing {
    public final int size;
    public final long descGpa, availGpa, usedGpa;
    private final GuestPhysical ram;
    private final MemorySegment desc, avail, used;
    private int availIdx;
    private int kickedIdx;
    private int lastUsed;

    /**
     * A ring of {@code size} whose areas start at {@code gpa}, each page-aligned ({@link #bytes} of them), zeroed as a
     * driver initialises its rings (a reused ring starts over).
     */
    public DriverRing(GuestPhysical ram, long gpa, int size) {
        this.ram = ram;
        this.size = size;
        descGpa = gpa;
        availGpa = descGpa + pages(descBytes(size));
        usedGpa = availGpa + pages(availBytes(size, true));
        desc = ram.at(descGpa, descBytes(size));
        avail = ram.at(availGpa, availBytes(size, true));
        used = ram.at(usedGpa, usedBytes(size, true));
        desc.fill((byte) 0);
        avail.fill((byte) 0);
        used.fill((byte) 0);
    }

    /** The guest RAM a ring of {@code size} takes. */
    public static long bytes(int size) {
        return pages(descBytes(size)) + pages(availBytes(size, true)) + pages(usedBytes(size, true));
    }

    private static long pages(long n) {
        return (n + 4095) & ~4095L;
    }

    /** The front end's addresses of the three areas (SET_VRING_ADDR). */
    public long descUser() {
        return ram.user(descGpa);
    }

    public long availUser() {
        return ram.user(availGpa);
    }

    public long usedUser() {
        return ram.user(usedGpa);
    }

    /** The descriptor at byte {@code at} of {@code mem} (the ring's own table, or an indirect one anywhere). */
    public static void desc(MemorySegment mem, long at, long addr, long len, int flags, int next) {
        mem.set(U64_UNALIGNED, at + DESC_ADDR, addr);
        mem.set(U32_UNALIGNED, at + DESC_LEN, (int) len);
        mem.set(U16_UNALIGNED, at + DESC_FLAGS, (short) flags);
        mem.set(U16_UNALIGNED, at + DESC_NEXT, (short) next);
    }

    /** Descriptor {@code i} of the ring's table. */
    public void desc(int i, long addr, long len, int flags, int next) {
        desc(desc, (long) DESC_BYTES * i, addr, len, flags, next);
    }

    /** Ring descriptor {@code head}: an indirect table of {@code entries} at {@code tableGpa}. */
    public void indirect(int head, long tableGpa, int entries) {
        desc(head, tableGpa, descBytes(entries), F_INDIRECT, 0);
    }

    /** Puts {@code head} in the avail ring; seen by the device at the next {@link #publish}. */
    public void add(int head) {
        avail.set(U16_UNALIGNED, AVAIL_RING + 2L * (availIdx % size), (short) head);
        availIdx = (availIdx + 1) & 0xffff;
    }

    /** Publishes what was added; whether the device must be kicked (virtqueue_kick_prepare with EVENT_IDX). */
    public boolean publish() {
        VarHandle.releaseFence();
        avail.set(U16_UNALIGNED, AVAIL_IDX, (short) availIdx);
        VarHandle.fullFence();
        int event = availEvent();
        int old = kickedIdx;
        kickedIdx = availIdx;
        return needEvent(event, availIdx, old);
    }

    /** Offers one head: avail.ring[idx % size] = head, then (release) avail.idx + 1; the caller kicks or not. */
    public void offer(int head) {
        add(head);
        VarHandle.releaseFence();
        avail.set(U16_UNALIGNED, AVAIL_IDX, (short) availIdx);
    }

    /** used.idx as the device last published it (acquire: the entries it covers are read after it). */
    public int usedIdx() {
        int v = Short.toUnsignedInt(used.get(U16_UNALIGNED, USED_IDX));
        VarHandle.acquireFence();
        return v;
    }

    /** Whether the device has used entries not taken yet. */
    public boolean hasUsed() {
        return usedIdx() != lastUsed;
    }

    /** The used entry the driver takes next (its index, free-running u16). */
    public int lastUsed() {
        return lastUsed;
    }

    /** The id (head) of the next used entry; call only when {@link #hasUsed}; then {@link #next}. */
    public int usedId() {
        return used.get(U32_UNALIGNED, USED_RING + USED_ELEM_BYTES * (lastUsed % size));
    }

    /** The bytes the device wrote for the next used entry. */
    public int usedLen() {
        return used.get(U32_UNALIGNED, USED_RING + USED_ELEM_BYTES * (lastUsed % size) + 4);
    }

    public void next() {
        lastUsed = (lastUsed + 1) & 0xffff;
    }

    /**
     * virtqueue_enable_cb_prepare with EVENT_IDX: used_event = the next entry, so the device interrupts when it
     * passes it; then (full fence) whether entries came meanwhile, which the caller takes before it waits.
     */
    public boolean armInterrupt() {
        usedEvent(lastUsed);
        VarHandle.fullFence();
        return hasUsed();
    }

    /** EVENT_IDX: interrupt me when used.idx passes {@code idx}. */
    public void usedEvent(int idx) {
        avail.set(U16_UNALIGNED, usedEventOffset(size), (short) idx);
    }

    /** EVENT_IDX: the device wants a kick when avail.idx passes this. */
    public int availEvent() {
        return Short.toUnsignedInt(used.get(U16_UNALIGNED, availEventOffset(size)));
    }

    // Raw fields, for a guest that misbehaves on purpose.

    /** The driver's own avail index (what the next publish writes). */
    public int availIdx() {
        return availIdx;
    }

    /** Publishes avail.idx = {@code idx} as is (a hostile jump); the driver's count follows it. */
    public void availIdx(int idx) {
        VarHandle.releaseFence();
        availIdx = idx & 0xffff;
        avail.set(U16_UNALIGNED, AVAIL_IDX, (short) idx);
    }

    /** Writes avail.ring[slot] without publishing. */
    public void availRing(int slot, int head) {
        avail.set(U16_UNALIGNED, AVAIL_RING + 2L * slot, (short) head);
    }

    public void availFlags(int flags) {
        avail.set(U16_UNALIGNED, AVAIL_FLAGS, (short) flags);
    }

    public int usedFlags() {
        return Short.toUnsignedInt(used.get(U16_UNALIGNED, USED_FLAGS));
    }

    /** used.ring[slot] raw (a restart test writes what a dead back-end left). */
    public void usedElem(int slot, int id, int len) {
        long at = USED_RING + USED_ELEM_BYTES * slot;
        used.set(U32_UNALIGNED, at, id);
        used.set(U32_UNALIGNED, at + 4, len);
    }

    public void usedIdxRaw(int idx) {
        used.set(U16_UNALIGNED, USED_IDX, (short) idx);
    }
}
