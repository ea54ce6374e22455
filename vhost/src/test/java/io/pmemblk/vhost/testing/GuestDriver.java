package io.pmemblk.vhost.testing;

import io.pmemblk.vhost.driver.DriverRing;
import io.pmemblk.vhost.spec.SplitRingLayout;

import java.lang.foreign.MemorySegment;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

/**
 * A test guest's side of one split virtqueue: the driver's ring ({@link DriverRing}) over a test's {@link GuestRam},
 * with the bookkeeping a test wants on top: a free list of descriptors, chains laid out from buffers, directly or
 * through an indirect table, and used entries that give their descriptors back.
 */
public final class GuestDriver extends DriverRing {
    public static final int NEXT = SplitRingLayout.F_NEXT, WRITE = SplitRingLayout.F_WRITE,
            INDIRECT = SplitRingLayout.F_INDIRECT;
    /** What a Linux guest negotiates for its rings: EVENT_IDX (29), INDIRECT_DESC (28), VERSION_1 (32). */
    public static final long LINUX_FEATURES = 1L << 29 | 1L << 28 | 1L << 32;

    public final GuestRam ram;
    private final ArrayDeque<Integer> free = new ArrayDeque<>();
    /** Descriptors each in-flight head took (returned to the free list when it is used). */
    private final List<List<Integer>> taken = new ArrayList<>();

    /** A ring of {@code size} whose three areas start at {@code ringGpa} (one 64 KiB-aligned block each). */
    public GuestDriver(GuestRam ram, int size, long ringGpa) {
        super(ram, ringGpa, size);
        this.ram = ram;
        for (int i = 0; i < size; i++) {
            free.add(i);
            taken.add(null);
        }
    }

    /** One buffer of a chain: {@code len} bytes at {@code gpa}, device-writable or not. */
    public record Buf(long gpa, long len, boolean writable) {}

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
            byte[] d = new byte[SplitRingLayout.DESC_BYTES];
            MemorySegment s = MemorySegment.ofArray(d);
            desc(s, 0, b.gpa(), b.len(), (b.writable() ? WRITE : 0) | (last ? 0 : NEXT), last ? 0 : i + 1);
            ram.write(tableGpa + (long) SplitRingLayout.DESC_BYTES * i, d); // a table may run across two adjacent regions
        }
        indirect(head, tableGpa, bufs.size());
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

    /** A used entry: the head and the bytes written. */
    public record Used(int id, int len) {}

    /** The used entries since the last call; their descriptors go back to the free list. */
    public List<Used> takeUsed() {
        int idx = usedIdx();
        List<Used> out = new ArrayList<>();
        while (lastUsed() != idx) {
            Used u = new Used(usedId(), usedLen());
            out.add(u);
            List<Integer> ids = u.id() >= 0 && u.id() < size ? taken.get(u.id()) : null;
            if (ids != null) {
                free.addAll(ids);
                taken.set(u.id(), null);
            }
            next();
        }
        return out;
    }
}
