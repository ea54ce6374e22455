package io.pmemblk.vhost.memory;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * The guest's memory table: immutable, so the session builds a new one per SET_MEM_TABLE / ADD_MEM_REG /
 * REM_MEM_REG and publishes it with a volatile write, and a queue thread reads one table per batch without a lock.
 * Every guest address and length is the guest's (or QEMU's) u64, compared unsigned: a range is served only when
 * every byte lies in mapped regions, and arithmetic that could wrap (gpa + len past 2^64) is never done: a range is
 * tested by its offset into a region against the region's room.
 *
 * <p>Lookups are a binary search over primitive arrays sorted by start address (QEMU sends at most 256 regions,
 * {@code ACPI_MAX_RAM_SLOTS} on x86, typically 1 to 3): nothing is allocated by {@link #scatter}; {@link #slice}
 * and {@link #userSlice} allocate the slice they return. Regions overlap in neither address space ({@link #with}
 * refuses that), so at most one region holds a given address.
 */
public final class GuestMemory {
    public static final GuestMemory EMPTY = new GuestMemory(new GuestRegion[0]);

    private final GuestRegion[] byGpa;
    private final long[] gpaStart;
    private final long[] gpaSize;
    private final GuestRegion[] byUser;
    private final long[] userStart;

    private GuestMemory(GuestRegion[] regions) {
        this.byGpa = regions.clone();
        Arrays.sort(byGpa, (a, b) -> Long.compareUnsigned(a.guestPhys(), b.guestPhys()));
        this.byUser = regions.clone();
        Arrays.sort(byUser, (a, b) -> Long.compareUnsigned(a.userAddr(), b.userAddr()));
        int n = regions.length;
        this.gpaStart = new long[n];
        this.gpaSize = new long[n];
        this.userStart = new long[n];
        for (int i = 0; i < n; i++) {
            gpaStart[i] = byGpa[i].guestPhys();
            gpaSize[i] = byGpa[i].size();
            userStart[i] = byUser[i].userAddr();
        }
    }

    public int regionCount() {
        return byGpa.length;
    }

    /** Region {@code i} in guest-physical order. */
    public GuestRegion region(int i) {
        return byGpa[i];
    }

    /**
     * This table plus {@code r}.
     * @throws IllegalArgumentException when r overlaps a region of the table in guest-physical or QEMU address
     *         space (naming both)
     */
    public GuestMemory with(GuestRegion r) {
        for (GuestRegion o : byGpa) {
            if (overlaps(r.guestPhys(), r.size(), o.guestPhys(), o.size())
                    || overlaps(r.userAddr(), r.size(), o.userAddr(), o.size())) {
                throw new IllegalArgumentException("guest memory " + r + " overlaps " + o
                        + ": regions may share neither guest-physical nor QEMU addresses");
            }
        }
        GuestRegion[] all = Arrays.copyOf(byGpa, byGpa.length + 1);
        all[byGpa.length] = r;
        return new GuestMemory(all);
    }

    /**
     * This table without the region at {@code guestPhys} / {@code userAddr} of {@code size} bytes (REM_MEM_REG
     * matches those three and ignores mmap_offset, docs/interop/vhost-user.rst "VHOST_USER_REM_MEM_REG").
     * @throws IllegalArgumentException when no region matches (listing the table)
     */
    public GuestMemory without(long guestPhys, long userAddr, long size) {
        GuestRegion match = find(guestPhys, userAddr, size);
        if (match == null) {
            throw new IllegalArgumentException("no guest memory region gpa 0x" + Long.toHexString(guestPhys) + " uaddr 0x"
                    + Long.toHexString(userAddr) + " size 0x" + Long.toHexString(size) + " to remove; the table has "
                    + Arrays.toString(byGpa));
        }
        GuestRegion[] rest = new GuestRegion[byGpa.length - 1];
        int k = 0;
        for (GuestRegion o : byGpa) {
            if (o != match) {
                rest[k++] = o;
            }
        }
        return new GuestMemory(rest);
    }

    /** The region with exactly these addresses and size, or null. */
    public GuestRegion find(long guestPhys, long userAddr, long size) {
        for (GuestRegion o : byGpa) {
            if (o.guestPhys() == guestPhys && o.userAddr() == userAddr && o.size() == size) {
                return o;
            }
        }
        return null;
    }

    /**
     * The {@code len} bytes at guest-physical {@code gpa} as one slice, when they lie in one region; else null
     * (also for a negative len). A zero len gives an empty slice when gpa lies in a region.
     */
    public MemorySegment slice(long gpa, long len) {
        int i = indexOf(gpaStart, gpaSize, gpa);
        if (i < 0 || len < 0) {
            return null;
        }
        long off = gpa - gpaStart[i];
        return len <= gpaSize[i] - off ? byGpa[i].mapping().asSlice(off, len) : null;
    }

    /**
     * Hands {@code sink} the pieces of the {@code len} bytes at {@code gpa}, one per region, when every byte lies
     * in regions that follow one another without a gap; the range is checked whole before the first piece is
     * handed over, so a sink never sees part of a range that is refused.
     * @return the number of pieces (0 for len 0), or -1 when some byte is in no region (or len is negative)
     */
    public int scatter(long gpa, long len, ScatterSink sink) {
        if (len <= 0) {
            return len == 0 ? 0 : -1;
        }
        int first = indexOf(gpaStart, gpaSize, gpa);
        if (first < 0) {
            return -1;
        }
        int pieces = 1;
        long left = len - (gpaSize[first] - (gpa - gpaStart[first]));
        for (int j = first; left > 0; ) {
            long end = gpaStart[j] + gpaSize[j];
            if (++j == gpaStart.length || gpaStart[j] != end) {
                return -1; // runs past a region into a hole
            }
            pieces++;
            left -= gpaSize[j];
        }
        long at = gpa;
        left = len;
        for (int j = first; left > 0; j++) {
            long off = at - gpaStart[j];
            long take = Math.min(left, gpaSize[j] - off);
            GuestRegion r = byGpa[j];
            sink.piece(r.mapping(), off, take, r.iovaAt(off));
            left -= take;
            at += take;
        }
        return pieces;
    }

    /**
     * The {@code len} bytes at {@code userAddr} in QEMU's address space (the ring addresses of SET_VRING_ADDR are
     * QEMU's virtual addresses, docs/interop/vhost-user.rst "Memory access") when they lie in one region; else null.
     */
    public MemorySegment userSlice(long userAddr, long len) {
        int i = indexOf(userStart, null, userAddr);
        if (i < 0 || len < 0) {
            return null;
        }
        GuestRegion r = byUser[i];
        long off = userAddr - r.userAddr();
        return len <= r.size() - off ? r.mapping().asSlice(off, len) : null;
    }

    /** The index of the region holding {@code addr} (sizes null: those of {@link #byUser}), or -1. */
    private int indexOf(long[] starts, long[] sizes, long addr) {
        int lo = 0, hi = starts.length - 1, found = -1;
        while (lo <= hi) {
            int mid = (lo + hi) >>> 1;
            if (Long.compareUnsigned(starts[mid], addr) <= 0) {
                found = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (found < 0) {
            return -1;
        }
        long size = sizes != null ? sizes[found] : byUser[found].size();
        return Long.compareUnsigned(addr - starts[found], size) < 0 ? found : -1;
    }

    /** Whether [a, a+as) and [b, b+bs) share a byte; neither wraps (GuestRegion refuses that). */
    private static boolean overlaps(long a, long as, long b, long bs) {
        return Long.compareUnsigned(a, b + bs) < 0 && Long.compareUnsigned(b, a + as) < 0;
    }

    @Override
    public String toString() {
        return "GuestMemory" + Arrays.toString(byGpa);
    }
}
