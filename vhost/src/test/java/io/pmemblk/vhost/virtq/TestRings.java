package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.testing.GuestDriver;

/** The back-end's view of a test guest's ring: its three areas found through the guest's memory table. */
final class TestRings {
    private TestRings() {}

    static SplitRing map(GuestDriver guest, long features) {
        int n = guest.size;
        boolean eventIdx = (features & VirtioFeatures.bit(VirtioFeatures.RING_EVENT_IDX)) != 0;
        var mem = guest.ram.memory();
        return new SplitRing(n, eventIdx, mem.userSlice(guest.descUser(), SplitRingLayout.descBytes(n)),
                mem.userSlice(guest.availUser(), SplitRingLayout.availBytes(n, eventIdx)),
                mem.userSlice(guest.usedUser(), SplitRingLayout.usedBytes(n, eventIdx)));
    }
}
