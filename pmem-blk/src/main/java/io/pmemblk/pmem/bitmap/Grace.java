package io.pmemblk.pmem.bitmap;

import java.util.concurrent.atomic.AtomicLongArray;

/**
 * A grace period for the bitmaps' swaps, as userspace RCU's: markers {@link #enter} before they read the set of
 * bitmaps and {@link #exit} once they are done with it (bits durable, writes recorded); {@link #await} returns only
 * when every marker that could have read the set before a swap has exited. Markers never wait and take no lock: an
 * atomic add on a counter of their own stripe (a cache line per stripe, so queues do not share one), and a
 * volatile read of the epoch.
 *
 * <p>Why two phases: a marker reads the epoch, then counts itself in that epoch's parity. If the epoch flips
 * between the two, the swapper may have found that parity empty already; the marker then reads the set after its
 * count, so after the swap published the new set (all of these are sequentially consistent atomics), and holds
 * nothing old. But it stays counted in the old parity, which the next flip would not wait for: so {@link #await}
 * flips twice, waiting for each parity in turn, and a marker counted in either is waited for. An await that gave
 * up leaves that true: the next one still waits for both parities.
 */
final class Grace {
    /** Longs per stripe: 128 bytes, two cache lines (the adjacent-line prefetcher pairs them). */
    private static final int PAD = 16;
    private final int stripes;
    private final AtomicLongArray counts;
    private volatile int epoch;

    Grace(int stripes) {
        this.stripes = stripes;
        this.counts = new AtomicLongArray(2 * stripes * PAD);
    }

    /** Counts a marker in on {@code stripe} (any int: reduced here); returns the token for {@link #exit}. */
    int enter(int stripe) {
        int slot = ((epoch & 1) * stripes + Math.floorMod(stripe, stripes)) * PAD;
        counts.getAndIncrement(slot);
        return slot;
    }

    void exit(int token) {
        counts.getAndDecrement(token);
    }

    /**
     * Returns true once every marker that entered before this call has exited, false when one still had not at
     * {@code deadline} ({@link System#nanoTime}). The caller has published what the markers read (a volatile
     * store) before calling. Callers are serialised by the caller's lock.
     */
    boolean await(long deadline) {
        for (int phase = 0; phase < 2; phase++) {
            int old = epoch & 1;
            epoch = old ^ 1;
            for (int s = 0; s < stripes; s++) {
                int slot = (old * stripes + s) * PAD;
                if (!Backoff.until(() -> counts.get(slot) == 0, deadline)) {
                    return false;
                }
            }
        }
        return true;
    }
}
