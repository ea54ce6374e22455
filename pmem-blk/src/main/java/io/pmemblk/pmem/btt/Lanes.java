package io.pmemblk.pmem.btt;

import static io.pmemblk.pmem.btt.Btt.GROUP_BLOCKS;
import static io.pmemblk.pmem.btt.BttState.ARRAY;

/**
 * The lanes of a BTT and who holds them: a busy flag per lane, claimed with one CAS and no lock, and the lane's
 * handle, made at open. A lane is the caller's queue index; each owns one free block and one flog pair per arena,
 * so a lane must be used by one thread at a time (the class comment of {@link Btt}).
 */
final class Lanes {
    /** Ints per RTT slot and lane busy flag: 64 bytes, so two lanes never share a cache line. */
    static final int PAD = 16;
    /** One per lane, made at open: claiming a lane allocates nothing. */
    private final LaneHandle[] laneHandles;
    private final int lanes;
    private final int[] laneBusy;

    Lanes(BttState state, ReadTracking tracking) {
        this.lanes = state.lanes();
        this.laneBusy = new int[lanes * PAD];
        this.laneHandles = new LaneHandle[lanes];
        for (int i = 0; i < lanes; i++) {
            laneHandles[i] = new LaneHandle(i, state, tracking, this);
        }
    }

    /** {@link Btt#claim}. */
    LaneHandle claim(int preferred) {
        for (int spins = 0; ; spins++) {
            int lane = tryClaim(preferred, true);
            if (lane >= 0) {
                return laneHandles[lane];
            }
            backOff(spins);
        }
    }

    /** {@link Btt#claimNow}. */
    LaneHandle claimNow(int preferred) {
        int lane = tryClaim(preferred, true);
        return lane < 0 ? null : laneHandles[lane];
    }

    /**
     * A free lane, {@code from} (mod lanes) first, claimed without waiting; -1 when every lane is held. For a
     * {@code newGroup}'s first lane, see {@link Btt#claim}; a group grows into the next free lane. A group grows by these: it never waits for a lane while it holds others (a caller waiting in {@link Btt#claim} holds
     * none), so lanes cannot deadlock.
     */
    int tryClaim(int from, boolean newGroup) {
        int first = Math.floorMod(from, lanes);
        // For a new group, a group's width apart first: a caller whose preferred lane another holds (two threads
        // preferring one lane, two connections on one queue) starts where a whole group of free lanes may follow,
        // not on the next lane, where the holder's group grows: interleaved, each would get half a group, and
        // their groups' flog ranges would cover each other's lines.
        for (int i = 0; newGroup && i < lanes; i += GROUP_BLOCKS) {
            int lane = first + i < lanes ? first + i : first + i - lanes;
            if (free(lane)) {
                return lane;
            }
        }
        for (int i = 0; i < lanes; i++) {
            int lane = first + i < lanes ? first + i : first + i - lanes;
            if (free(lane)) {
                return lane;
            }
        }
        return -1;
    }

    /** Claims {@code lane} if nobody holds it. */
    private boolean free(int lane) {
        return (int) ARRAY.get(laneBusy, lane * PAD) == 0 && ARRAY.compareAndSet(laneBusy, lane * PAD, 0, 1);
    }

    /** Spin briefly, then yield: the holder may be a descheduled thread on a host with few CPUs. */
    static void backOff(int spins) {
        if (spins < 100) {
            Thread.onSpinWait();
        } else {
            Thread.yield();
        }
    }

    /** Lane {@code lane}, entered ({@link #enter}): the one-block calls of {@link Btt} hold it for one call. */
    LaneHandle entered(int lane) {
        enter(lane);
        return laneHandles[lane];
    }

    private void enter(int lane) {
        if (lane < 0 || lane >= lanes) {
            throw new IllegalArgumentException("lane " + lane + " is out of range: 0.." + (lanes - 1));
        }
        if (!ARRAY.compareAndSet(laneBusy, lane * PAD, 0, 1)) {
            throw new IllegalStateException("lane " + lane + " is in use by another caller: one lane per queue, used by"
                    + " one thread at a time");
        }
    }

    void leave(int lane) {
        ARRAY.setRelease(laneBusy, lane * PAD, 0);
    }
}
