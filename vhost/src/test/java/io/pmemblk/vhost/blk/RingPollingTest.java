package io.pmemblk.vhost.blk;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class RingPollingTest {
    private static final long MAX = 20_000;

    @Test
    void aWindowStartsClosedAndGrowsWhileTheGapsAreShorterThanTheMaximum() {
        RingPolling.Window w = new RingPolling(MAX, 1).window();
        assertEquals(0, w.nanos(), "no polling before a gap says it would pay");
        assertFalse(w.beginPoll(), "a closed window takes no polling place");
        w.idled(10_000);
        assertEquals(RingPolling.START_NANOS, w.nanos());
        w.idled(10_000);
        assertEquals(2 * RingPolling.START_NANOS, w.nanos());
        w.idled(10_000);
        assertEquals(4 * RingPolling.START_NANOS, w.nanos());
        w.idled(10_000);
        assertEquals(16_000, w.nanos(), "16 us: gaps of 10 us are inside it now");
        w.idled(19_000);
        assertEquals(MAX, w.nanos(), "never above the maximum");
        w.idled(19_000);
        assertEquals(MAX, w.nanos());
    }

    @Test
    void aGapThatPollingCaughtLeavesTheWindowAlone() {
        RingPolling.Window w = new RingPolling(MAX, 1).window();
        w.idled(10_000);
        w.idled(10_000);
        long open = w.nanos();
        w.idled(open - 1);
        w.idled(open);
        assertEquals(open, w.nanos());
    }

    @Test
    void aGapLongerThanTheMaximumClosesTheWindow() {
        RingPolling.Window w = new RingPolling(MAX, 1).window();
        for (int i = 0; i < 8; i++) {
            w.idled(19_000);
        }
        assertEquals(MAX, w.nanos());
        w.idled(MAX + 1);
        assertEquals(0, w.nanos(), "an idle guest: polling would only burn the vCPUs' CPU");
    }

    @Test
    void withPollingOffTheWindowNeverOpens() {
        RingPolling.Window w = new RingPolling(0, 1).window();
        w.idled(1);
        w.idled(1_000);
        assertEquals(0, w.nanos());
        assertFalse(w.beginPoll());
    }

    @Test
    void atMostMaxPollersPollAtOnceAndAPlaceIsGivenBack() {
        RingPolling polling = new RingPolling(MAX, 1);
        RingPolling.Window a = polling.window(), b = polling.window();
        a.idled(1_000);
        b.idled(1_000);
        assertTrue(a.beginPoll());
        assertFalse(b.beginPoll(), "the one place is a's");
        assertEquals(1, polling.polling());
        a.endPoll();
        assertTrue(b.beginPoll(), "a gave it back");
        b.endPoll();
        assertEquals(0, polling.polling());
    }

    @Test
    void aHoldClosesAfterMissesInARowAndIsTriedAgainAfterSomePublishes() {
        long hold = 50_000;
        RingPolling.Window w = new RingPolling(0, hold, 1).window();
        assertEquals(hold, w.holdNanos(), "open from the start: a busy guest's first burst is gathered too");
        for (int i = 1; i < RingPolling.HOLD_MISSES; i++) {
            w.held(false);
        }
        w.held(true);
        for (int i = 1; i < RingPolling.HOLD_MISSES; i++) {
            w.held(false);
        }
        assertEquals(hold, w.holdNanos(), "a catch between misses keeps it open");
        w.held(false);
        assertEquals(0, w.holdNanos(), "misses in a row: a guest waiting for its completions pays no more holds");
        assertFalse(w.beginHold(), "a closed hold takes no polling place");
        for (int i = 1; i < RingPolling.HOLD_PROBE_PUBLISHES; i++) {
            w.published();
        }
        assertEquals(0, w.holdNanos());
        w.published();
        assertEquals(hold, w.holdNanos(), "tried again");
        for (int i = 0; i < RingPolling.HOLD_MISSES; i++) {
            w.held(false);
        }
        assertEquals(0, w.holdNanos(), "and closed again by as many misses");
    }

    /** Publishes until the closed hold opens again; returns how many it took. */
    private static int publishesUntilOpen(RingPolling.Window w) {
        int n = 0;
        while (w.holdNanos() == 0) {
            w.published();
            if (++n > 10 * RingPolling.HOLD_PROBE_MAX_PUBLISHES) {
                throw new AssertionError("the hold did not open again after " + n + " publishes");
            }
        }
        return n;
    }

    private static void missInARow(RingPolling.Window w) {
        for (int i = 0; i < RingPolling.HOLD_MISSES; i++) {
            w.held(false);
        }
        assertEquals(0, w.holdNanos(), "closed by " + RingPolling.HOLD_MISSES + " misses in a row");
    }

    /**
     * A guest that keeps waiting for its answers (QD1): every try of the hold closes again with nothing caught, and
     * each makes the next one twice as far off, up to HOLD_PROBE_MAX_PUBLISHES; a try that catches a request puts
     * the tries back at HOLD_PROBE_PUBLISHES.
     */
    @Test
    void triesThatCatchNothingGrowRarerAndACatchBringsThemBack() {
        RingPolling.Window w = new RingPolling(0, 100_000, 1).window();
        missInARow(w);
        assertEquals(RingPolling.HOLD_PROBE_PUBLISHES, publishesUntilOpen(w), "the first close: tried again soon");
        int expected = RingPolling.HOLD_PROBE_PUBLISHES;
        for (int tries = 0; tries < 10; tries++) {
            missInARow(w);
            expected = Math.min(RingPolling.HOLD_PROBE_MAX_PUBLISHES, expected * 2);
            assertEquals(expected, publishesUntilOpen(w), "after " + (tries + 1) + " tries in vain");
        }
        assertEquals(RingPolling.HOLD_PROBE_MAX_PUBLISHES, expected, "capped");
        w.held(true); // the guest submitted in a hold again
        missInARow(w);
        assertEquals(RingPolling.HOLD_PROBE_PUBLISHES, publishesUntilOpen(w), "a catch brings the tries back");
        missInARow(w);
        assertEquals(2 * RingPolling.HOLD_PROBE_PUBLISHES, publishesUntilOpen(w));
    }

    @Test
    void withTheHoldOffItNeverOpensAndAHoldTakesAPollingPlace() {
        RingPolling.Window off = new RingPolling(MAX, 0, 1).window();
        off.held(true);
        for (int i = 0; i < 2 * RingPolling.HOLD_PROBE_PUBLISHES; i++) {
            off.published();
        }
        assertEquals(0, off.holdNanos());
        assertFalse(off.beginHold());
        RingPolling polling = new RingPolling(0, 50_000, 1);
        RingPolling.Window a = polling.window(), b = polling.window();
        assertTrue(a.beginHold(), "a hold is a poll: it needs a place even with polling off");
        assertFalse(b.beginHold(), "the one place is a's: b publishes at once");
        a.endPoll();
        assertTrue(b.beginHold());
        b.endPoll();
        assertEquals(0, polling.polling());
    }

    @Test
    void badBoundsAreRefused() {
        assertThrows(IllegalArgumentException.class, () -> new RingPolling(MAX, -1, 1));
        assertThrows(IllegalArgumentException.class, () -> new RingPolling(-1, 1));
        assertThrows(IllegalArgumentException.class, () -> new RingPolling(MAX, 0));
    }
}
