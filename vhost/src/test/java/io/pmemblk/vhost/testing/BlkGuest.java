package io.pmemblk.vhost.testing;

import io.pmemblk.vhost.testing.GuestDriver.Buf;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static io.pmemblk.vhost.spec.Le.U32_UNALIGNED;
import static io.pmemblk.vhost.spec.Le.U64_UNALIGNED;

/**
 * A virtio-blk driver in a test guest (virtio 1.2 section 5.2.6, laid out independently of the code under test):
 * builds requests (header, data in as many pieces as asked, status byte) in guest memory, directly in the ring or
 * through an indirect table, and reads their answers back. Buffers come from a bump allocator over a data area
 * the test chooses (one that crosses from one region into the next makes buffers that do too).
 */
public final class BlkGuest {
    public static final int IN = 0, OUT = 1, FLUSH = 4, GET_ID = 8, DISCARD = 11, WRITE_ZEROES = 13;

    public final GuestDriver ring;
    public final GuestRam ram;
    private final long areaStart, areaEnd;
    private long next;
    private final Map<Integer, Sent> inFlight = new HashMap<>();

    /** What was sent: the head, where its status byte and its data (device-writable part) are. */
    public record Sent(int head, long statusGpa, long dataGpa, int dataLen) {}

    public BlkGuest(GuestDriver ring, long areaStart, long areaEnd) {
        this.ring = ring;
        this.ram = ring.ram;
        this.areaStart = areaStart;
        this.areaEnd = areaEnd;
        this.next = areaStart;
    }

    /** {@code len} bytes of guest memory (64-byte aligned), from the data area, wrapping round at its end. */
    public long alloc(long len) {
        long at = (next + 63) & ~63L;
        if (at + len > areaEnd) {
            at = areaStart;
        }
        next = at + len;
        return at;
    }

    /**
     * Moves the allocator on to {@code gpa} (a test wants the next buffer to cross a region boundary); never back,
     * so buffers still in flight are not handed out again.
     */
    public void allocAt(long gpa) {
        next = Math.max(next, gpa);
    }

    byte[] header(int type, long sector) {
        byte[] h = new byte[16];
        MemorySegment s = MemorySegment.ofArray(h);
        s.set(U32_UNALIGNED, 0, type);
        s.set(U64_UNALIGNED, 8, sector);
        return h;
    }

    /** A request: header, {@code out} readable data (or none), {@code inLen} writable data bytes, status. */
    public Sent send(int type, long sector, byte[] out, int inLen, int pieces, boolean indirect) {
        List<Buf> bufs = new ArrayList<>();
        long h = alloc(16);
        ram.write(h, header(type, sector));
        bufs.add(new Buf(h, 16, false));
        if (out != null && out.length > 0) {
            long d = alloc(out.length);
            ram.write(d, out);
            split(bufs, d, out.length, pieces, false);
        }
        long in = 0;
        if (inLen > 0) {
            in = alloc(inLen);
            ram.write(in, new byte[inLen]);
            split(bufs, in, inLen, pieces, true);
        }
        long st = alloc(1);
        ram.write(st, new byte[]{(byte) 0xee});
        bufs.add(new Buf(st, 1, true));
        int head = indirect ? ring.indirect(bufs, alloc(16L * bufs.size())) : ring.chain(bufs);
        Sent s = new Sent(head, st, in, inLen);
        inFlight.put(head, s);
        ring.offer(head);
        return s;
    }

    /** A chain the test lays out itself, its status byte at {@code statusGpa}; offered, and awaited like the rest. */
    public Sent raw(List<Buf> bufs, long statusGpa) {
        int head = ring.chain(bufs);
        Sent s = new Sent(head, statusGpa, 0, 0);
        inFlight.put(head, s);
        ring.offer(head);
        return s;
    }

    private static void split(List<Buf> bufs, long gpa, int len, int pieces, boolean writable) {
        int n = Math.max(1, Math.min(pieces, len));
        long at = gpa;
        for (int i = 0; i < n; i++) {
            int part = i == n - 1 ? (int) (gpa + len - at) : len / n;
            bufs.add(new Buf(at, part, writable));
            at += part;
        }
    }

    public Sent write(long sector, byte[] data, int pieces, boolean indirect) {
        return send(OUT, sector, data, 0, pieces, indirect);
    }

    public Sent read(long sector, int len, int pieces, boolean indirect) {
        return send(IN, sector, null, len, pieces, indirect);
    }

    /** DISCARD / WRITE_ZEROES with one segment. */
    public Sent range(int type, long sector, int count, int flags) {
        byte[] seg = new byte[16];
        MemorySegment s = MemorySegment.ofArray(seg);
        s.set(U64_UNALIGNED, 0, sector);
        s.set(U32_UNALIGNED, 8, count);
        s.set(U32_UNALIGNED, 12, flags);
        return send(type, sector, seg, 0, 1, false);
    }

    public int status(Sent s) {
        return ram.read(s.statusGpa(), 1)[0] & 0xff;
    }

    public byte[] data(Sent s) {
        return ram.read(s.dataGpa(), s.dataLen());
    }

    /** The answered requests since the last call, by head: used.len. */
    public Map<Integer, Integer> answered() {
        Map<Integer, Integer> out = new HashMap<>();
        for (GuestDriver.Used u : ring.takeUsed()) {
            if (inFlight.remove(u.id()) == null) {
                throw new AssertionError("head " + u.id() + " answered but not in flight (or answered twice)");
            }
            out.put(u.id(), u.len());
        }
        return out;
    }

    public int inFlight() {
        return inFlight.size();
    }
}
