package io.pmemblk.vhost.testing;

import io.pmemblk.vhost.virtq.SplitRing;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * The guest's side of one split virtqueue, as a virtio driver keeps it (virtio 1.2 section 2.7.13), at the offsets
 * of {@link SplitRing}'s layout (virtio 1.2 section 2.7, torvalds/linux {@code include/uapi/linux/virtio_ring.h}):
 * descriptors, the avail ring it publishes, the used ring it reads back. Raw access to every field lets hostile
 * tests write what no well-behaved driver would.
 */
public final class GuestDriver {
    static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    public static final int NEXT = SplitRing.F_NEXT, WRITE = SplitRing.F_WRITE, INDIRECT = SplitRing.F_INDIRECT;
    /** What a Linux guest negotiates for its rings: EVENT_IDX (29), INDIRECT_DESC (28), VERSION_1 (32). */
    public static final long LINUX_FEATURES = 1L << 29 | 1L << 28 | 1L << 32;

    public final GuestRam ram;
    public final int size;
    public final long descGpa, availGpa, usedGpa;
    private final MemorySegment desc, avail, used;
    private int availIdx;
    private int lastUsed;
    private final ArrayDeque<Integer> free = new ArrayDeque<>();
    /** Descriptors each in-flight head took (returned to the free list when it is used). */
    private final List<List<Integer>> taken = new ArrayList<>();

    /** A ring of {@code size} whose three areas start at {@code ringGpa} (one 64 KiB-aligned block each). */
    public GuestDriver(GuestRam ram, int size, long ringGpa) {
        this.ram = ram;
        this.size = size;
        this.descGpa = ringGpa;
        this.availGpa = ringGpa + align(SplitRing.descBytes(size));
        this.usedGpa = availGpa + align(SplitRing.availBytes(size, true));
        this.desc = ram.at(descGpa, SplitRing.descBytes(size));
        this.avail = ram.at(availGpa, SplitRing.availBytes(size, true));
        this.used = ram.at(usedGpa, SplitRing.usedBytes(size, true));
        desc.fill((byte) 0); // a driver initialises its rings (a reused ring starts over)
        avail.fill((byte) 0);
        used.fill((byte) 0);
        for (int i = 0; i < size; i++) {
            free.add(i);
            taken.add(null);
        }
    }

    private static long align(long n) {
        return (n + 4095) & ~4095L;
    }

    public long descUser() {
        return ram.user(descGpa);
    }

    public long availUser() {
        return ram.user(availGpa);
    }

    public long usedUser() {
        return ram.user(usedGpa);
    }

    /** One buffer of a chain: {@code len} bytes at {@code gpa}, device-writable or not. */
    public record Buf(long gpa, long len, boolean writable) {}

    /** Descriptor i of the ring's table, raw. */
    public void desc(int i, long addr, long len, int flags, int next) {
        desc(desc, i, addr, len, flags, next);
    }

    /** Descriptor i of a table at {@code table}. */
    public static void desc(MemorySegment table, int i, long addr, long len, int flags, int next) {
        long at = (long) SplitRing.DESC_BYTES * i;
        table.set(U64, at + SplitRing.DESC_ADDR, addr);
        table.set(U32, at + SplitRing.DESC_LEN, (int) len);
        table.set(U16, at + SplitRing.DESC_FLAGS, (short) flags);
        table.set(U16, at + SplitRing.DESC_NEXT, (short) next);
    }

    public int freeDescriptors() {
        return free.size();
    }

    /** Lays out a chain in free descriptors of the ring; returns its head (not yet offered). */
    public int chain(List<Buf> bufs) {
        if (free.size() < bufs.size()) {
            throw new IllegalStateException("test bug: " + bufs.size() + " descriptors wanted, " + free.size() + " free");
        }
        List<Integer> ids = new ArrayList<>();
        for (int i = 0; i < bufs.size(); i++) {
            ids.add(free.poll());
        }
        for (int i = 0; i < bufs.size(); i++) {
            Buf b = bufs.get(i);
            boolean last = i == bufs.size() - 1;
            desc(ids.get(i), b.gpa(), b.len(), (b.writable() ? WRITE : 0) | (last ? 0 : NEXT), last ? 0 : ids.get(i + 1));
        }
        taken.set(ids.get(0), ids);
        return ids.get(0);
    }

    /** Lays out a chain as an indirect table at {@code tableGpa}, one ring descriptor pointing at it. */
    public int indirect(List<Buf> bufs, long tableGpa) {
        int head = free.poll();
        for (int i = 0; i < bufs.size(); i++) {
            Buf b = bufs.get(i);
            boolean last = i == bufs.size() - 1;
            byte[] d = new byte[SplitRing.DESC_BYTES];
            MemorySegment s = MemorySegment.ofArray(d);
            desc(s, 0, b.gpa(), b.len(), (b.writable() ? WRITE : 0) | (last ? 0 : NEXT), last ? 0 : i + 1);
            ram.write(tableGpa + (long) SplitRing.DESC_BYTES * i, d); // a table may run across two adjacent regions
        }
        desc(head, tableGpa, SplitRing.descBytes(bufs.size()), INDIRECT, 0);
        taken.set(head, List.of(head));
        return head;
    }

    /** The ring descriptors a chain laid out by {@link #chain} or {@link #indirect} took, head first. */
    public List<Integer> descriptors(int head) {
        return taken.get(head);
    }

    /** Takes descriptor i off the free list (for raw chains a test writes itself). */
    public void reserve(int... ids) {
        for (int i : ids) {
            free.remove(i);
        }
        taken.set(ids[0], toList(ids));
    }

    private static List<Integer> toList(int[] ids) {
        List<Integer> l = new ArrayList<>();
        for (int i : ids) {
            l.add(i);
        }
        return l;
    }

    /** Offers a head: avail.ring[idx % size] = head, then (release) avail.idx + 1. */
    public void offer(int head) {
        avail.set(U16, SplitRing.AVAIL_RING + 2L * (availIdx % size), (short) head);
        VarHandle.releaseFence();
        availIdx = (availIdx + 1) & 0xffff;
        avail.set(U16, SplitRing.AVAIL_IDX, (short) availIdx);
    }

    /** Writes avail.ring[slot] without publishing. */
    public void availRing(int slot, int head) {
        avail.set(U16, SplitRing.AVAIL_RING + 2L * slot, (short) head);
    }

    /** Publishes avail.idx = {@code idx} as is (a hostile jump). */
    public void availIdx(int idx) {
        VarHandle.releaseFence();
        availIdx = idx & 0xffff;
        avail.set(U16, SplitRing.AVAIL_IDX, (short) idx);
    }

    public int availIdx() {
        return availIdx;
    }

    public void availFlags(int flags) {
        avail.set(U16, SplitRing.AVAIL_FLAGS, (short) flags);
    }

    /** EVENT_IDX: interrupt me when used.idx passes {@code idx}. */
    public void usedEvent(int idx) {
        avail.set(U16, SplitRing.usedEventOffset(size), (short) idx);
    }

    public int usedIdx() {
        int v = Short.toUnsignedInt(used.get(U16, SplitRing.USED_IDX));
        VarHandle.acquireFence();
        return v;
    }

    public int usedFlags() {
        return Short.toUnsignedInt(used.get(U16, SplitRing.USED_FLAGS));
    }

    public int availEvent() {
        return Short.toUnsignedInt(used.get(U16, SplitRing.availEventOffset(size)));
    }

    /** A used entry: the head and the bytes written. */
    public record Used(int id, int len) {}

    /** The used entries since the last call; their descriptors go back to the free list. */
    public List<Used> takeUsed() {
        int idx = usedIdx();
        List<Used> out = new ArrayList<>();
        while (lastUsed != idx) {
            long at = SplitRing.USED_RING + SplitRing.USED_ELEM_BYTES * (lastUsed % size);
            Used u = new Used(used.get(U32, at), used.get(U32, at + 4));
            out.add(u);
            List<Integer> ids = u.id() >= 0 && u.id() < size ? taken.get(u.id()) : null;
            if (ids != null) {
                free.addAll(ids);
                taken.set(u.id(), null);
            }
            lastUsed = (lastUsed + 1) & 0xffff;
        }
        return out;
    }

    /** used.ring[slot] raw (a restart test writes what a dead back-end left). */
    public void usedElem(int slot, int id, int len) {
        long at = SplitRing.USED_RING + SplitRing.USED_ELEM_BYTES * slot;
        used.set(U32, at, id);
        used.set(U32, at + 4, len);
    }

    public void usedIdxRaw(int idx) {
        used.set(U16, SplitRing.USED_IDX, (short) idx);
    }
}
