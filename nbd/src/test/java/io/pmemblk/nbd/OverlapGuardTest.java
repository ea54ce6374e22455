package io.pmemblk.nbd;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The unreplied ranges of one connection: what counts as an overlap, and a tag replied and reused. */
class OverlapGuardTest {
    @Test
    void onlyOverlapsWhereOneSideChangesDataCount() {
        OverlapGuard g = new OverlapGuard(4);
        g.register(0, 4096, 4096, false); // a READ of [4096, 8192)
        assertFalse(g.overlaps(4096, 4096, false), "a READ beside a READ is no hazard");
        assertTrue(g.overlaps(6144, 4096, true), "a WRITE over an unreplied READ waits");
        assertFalse(g.overlaps(8192, 4096, true), "adjacent is not overlapping");
        assertFalse(g.overlaps(0, 4096, true), "adjacent below is not overlapping");
        g.register(1, 0, 512, true); // a WRITE of [0, 512)
        assertTrue(g.overlaps(511, 1, false), "a READ over an unreplied WRITE waits");
        g.replied(1);
        assertFalse(g.overlaps(0, 512, false), "not once the WRITE is answered");
        g.replied(0);
        assertFalse(g.overlaps(0, 1 << 20, true), "nothing unreplied: nothing overlaps");
    }

    @Test
    void aTagRepliedAndReusedBeforeAScanCountsAsWhatItIsNow() {
        OverlapGuard g = new OverlapGuard(2);
        g.register(0, 0, 4096, true);
        g.replied(0);
        g.register(0, 1 << 20, 4096, false); // the same tag, now a READ elsewhere, still listed from before
        assertFalse(g.overlaps(0, 4096, false), "its old WRITE range no longer counts");
        assertTrue(g.overlaps(1 << 20, 4096, true), "its new READ range does");
        g.register(1, 8192, 4096, false);
        g.replied(0);
        g.replied(1);
        for (int i = 0; i < 10; i++) { // never more listed than the depth, however often tags come back
            g.register(i % 2, 0, 4096, true);
            g.replied(i % 2);
        }
        assertFalse(g.overlaps(0, 4096, true));
    }
}
