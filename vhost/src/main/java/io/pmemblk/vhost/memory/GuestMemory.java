package io.pmemblk.vhost.memory;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;

/**
 * STUB of contract C4 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one.
 */
public final class GuestMemory {
    public static final GuestMemory EMPTY = new GuestMemory(new GuestRegion[0]);
    private final GuestRegion[] regions;

    private GuestMemory(GuestRegion[] regions) {
        this.regions = regions;
    }

    public GuestMemory with(GuestRegion r) {
        GuestRegion[] n = Arrays.copyOf(regions, regions.length + 1);
        n[regions.length] = r;
        return new GuestMemory(n);
    }

    public GuestMemory without(long guestPhys, long userAddr, long size) {
        return new GuestMemory(Arrays.stream(regions).filter(r -> !(r.guestPhys() == guestPhys
                && r.userAddr() == userAddr && r.size() == size)).toArray(GuestRegion[]::new));
    }

    public MemorySegment userSlice(long userAddr, long len) {
        for (GuestRegion r : regions) {
            if (userAddr >= r.userAddr() && len >= 0 && userAddr - r.userAddr() <= r.size() - len) {
                return r.mapping().asSlice(userAddr - r.userAddr(), len);
            }
        }
        return null;
    }

    public MemorySegment slice(long gpa, long len) {
        for (GuestRegion r : regions) {
            if (gpa >= r.guestPhys() && len >= 0 && gpa - r.guestPhys() <= r.size() - len) {
                return r.mapping().asSlice(gpa - r.guestPhys(), len);
            }
        }
        return null;
    }
}
