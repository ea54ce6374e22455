package io.pmemblk.vhost.testing;

import io.pmemblk.vhost.driver.GuestPhysical;
import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.memory.GuestRegion;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.function.ToLongFunction;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A guest's RAM for tests: regions at chosen guest-physical addresses, laid out in one backing segment with a
 * guard zone of canary bytes before, between and after them, so a write anywhere outside the regions shows up
 * ({@link #assertGuardsIntact}). QEMU's addresses (what SET_VRING_ADDR carries) are the backing's own addresses.
 * The backing is an Arena segment, or a MAP_SHARED file mapping given by the test (two processes' views).
 */
public final class GuestRam implements GuestPhysical, AutoCloseable {
    public static final long GUARD = 64 << 10;
    public static final byte CANARY = (byte) 0xA5;
    /** A QEMU-like user address base for the regions (the backing's real address is used for nothing else). */
    public static final long USER_BASE = 0x7f00_0000_0000L;

    private final Arena arena;
    public final MemorySegment backing;
    private final List<long[]> layout = new ArrayList<>(); // {gpa, size, backing offset}
    private final List<GuestRegion> regions = new ArrayList<>();
    private volatile GuestMemory memory = GuestMemory.EMPTY;

    /** Regions as {gpa, size} pairs, in an Arena segment of their own. */
    public static GuestRam of(long... gpaSize) {
        Arena a = Arena.ofShared();
        return new GuestRam(a, a.allocate(bytesFor(gpaSize), 4096), gpaSize);
    }

    /** The bytes a backing for these regions needs. */
    public static long bytesFor(long... gpaSize) {
        long n = GUARD;
        for (int i = 1; i < gpaSize.length; i += 2) {
            n += gpaSize[i] + GUARD;
        }
        return n;
    }

    /**
     * Regions over {@code backing} (owned by {@code arena}, closed with this; null: the caller's), filled with
     * canaries between them when {@code fresh}.
     */
    public GuestRam(Arena arena, MemorySegment backing, long... gpaSize) {
        this(arena, backing, true, gpaSize);
    }

    public GuestRam(Arena arena, MemorySegment backing, boolean fresh, long... gpaSize) {
        this.arena = arena;
        this.backing = backing;
        if (fresh) {
            backing.fill(CANARY);
        }
        long at = GUARD;
        GuestMemory m = GuestMemory.EMPTY;
        for (int i = 0; i < gpaSize.length; i += 2) {
            long gpa = gpaSize[i], size = gpaSize[i + 1];
            layout.add(new long[]{gpa, size, at});
            if (fresh) {
                backing.asSlice(at, size).fill((byte) 0);
            }
            GuestRegion r = new GuestRegion(gpa, size, USER_BASE + at, backing.asSlice(at, size), -1);
            regions.add(r);
            m = m.with(r);
            at += size + GUARD;
        }
        memory = m;
    }

    /** The table the back-end reads (a supplier for VhostBlkQueue). */
    public GuestMemory memory() {
        return memory;
    }

    /**
     * Registers every region with {@code registrar} (a driver's registerMemory: its iova, or NO_IOVA) and
     * republishes the table with those iovas, as the session does when QEMU announces a region.
     */
    public void register(ToLongFunction<MemorySegment> registrar) {
        GuestMemory m = GuestMemory.EMPTY;
        for (int i = 0; i < regions.size(); i++) {
            GuestRegion r = regions.get(i);
            GuestRegion n = new GuestRegion(r.guestPhys(), r.size(), r.userAddr(), r.mapping(),
                    registrar.applyAsLong(r.mapping()));
            regions.set(i, n);
            m = m.with(n);
        }
        memory = m;
    }

    public GuestRegion region(int i) {
        return regions.get(i);
    }

    /** The guest's view of {@code len} bytes at {@code gpa}, found by the test's own layout (not GuestMemory). */
    @Override
    public MemorySegment at(long gpa, long len) {
        for (long[] l : layout) {
            if (gpa >= l[0] && gpa + len <= l[0] + l[1]) {
                return backing.asSlice(l[2] + (gpa - l[0]), len);
            }
        }
        throw new IllegalArgumentException("test bug: gpa 0x" + Long.toHexString(gpa) + " + " + len + " not in one region");
    }

    /** Writes {@code data} at {@code gpa}, across adjacent regions if need be. */
    public void write(long gpa, byte[] data) {
        for (int done = 0; done < data.length; ) {
            MemorySegment s = upToRegionEnd(gpa + done, data.length - done);
            MemorySegment.copy(MemorySegment.ofArray(data), done, s, 0, s.byteSize());
            done += (int) s.byteSize();
        }
    }

    public byte[] read(long gpa, int len) {
        byte[] b = new byte[len];
        for (int done = 0; done < len; ) {
            MemorySegment s = upToRegionEnd(gpa + done, len - done);
            MemorySegment.copy(s, 0, MemorySegment.ofArray(b), done, s.byteSize());
            done += (int) s.byteSize();
        }
        return b;
    }

    /** At most {@code len} bytes from {@code gpa} to the end of its region. */
    private MemorySegment upToRegionEnd(long gpa, long len) {
        for (long[] l : layout) {
            if (gpa >= l[0] && gpa < l[0] + l[1]) {
                return backing.asSlice(l[2] + (gpa - l[0]), Math.min(len, l[0] + l[1] - gpa));
            }
        }
        throw new IllegalArgumentException("test bug: gpa 0x" + Long.toHexString(gpa) + " not in a region");
    }

    /** QEMU's address of guest-physical {@code gpa}. */
    @Override
    public long user(long gpa) {
        for (long[] l : layout) {
            if (gpa >= l[0] && gpa < l[0] + l[1]) {
                return USER_BASE + l[2] + (gpa - l[0]);
            }
        }
        throw new IllegalArgumentException("test bug: gpa 0x" + Long.toHexString(gpa) + " not in a region");
    }

    /** Every guard byte still holds the canary: nothing was written outside the regions. */
    public void assertGuardsIntact() {
        long at = 0;
        for (long[] l : layout) {
            assertGuard(at, l[2] - at);
            at = l[2] + l[1];
        }
        assertGuard(at, GUARD);
    }

    private void assertGuard(long from, long len) {
        MemorySegment g = backing.asSlice(from, len);
        for (long i = 0; i < len; i++) {
            if (g.get(ValueLayout.JAVA_BYTE, i) != CANARY) {
                assertThat(i).as("guard byte at backing offset " + (from + i) + " was overwritten").isNegative();
            }
        }
    }

    @Override
    public void close() {
        if (arena != null) {
            arena.close();
        }
    }
}
