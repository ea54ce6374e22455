package io.pmemblk.vhost.blk;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * How long the queue threads of one server poll their rings when idle before they re-arm the kick and sleep: the
 * polling QEMU's event loop does for its own virtqueues ({@code util/aio-posix.c}, {@code adjust_polling_time}),
 * adaptive and bounded.
 *
 * <p>Why adaptive: polling pays only when the guest's next request comes within the window; a kick then costs the
 * guest no VM exit and this thread no wake-up. When requests come further apart than {@code vhost.busy-poll}, every
 * poll is CPU taken from the guest's vCPUs for nothing (on a host whose few CPUs the vCPUs share, throughput
 * falls), so each queue's window starts at zero, grows (4 us, doubling) while the measured idle gaps are longer
 * than the window but shorter than the maximum, and drops to zero after a gap longer than the maximum, as QEMU's
 * window does with its default {@code poll-shrink=0}. A queue whose requests are in flight on a DMA engine takes
 * neither a window nor a hold until one completes ({@link VhostBlkQueue}, Polling): it sleeps, and such sleeps are
 * not gaps of the guest's and leave the window as it was.
 *
 * <p>Why bounded: at most {@code maxPollers} threads of the server poll at once (by default one fewer than the
 * CPUs, as NBD's readers), the others sleep at once; polling never takes every CPU.
 *
 * <p>The hold ({@code vhost.coalesce}): completions a queue thread made are held back (unpublished, no interrupt)
 * while it polls for the guest's next requests, for at most the hold and {@link VhostBlkQueue#HOLD_COMPLETIONS} of
 * them, and published together: one interrupt for several completions. An interrupt costs the guest far more
 * than a request's copy costs here (an exit, its handler, and under emulation much more), and this server
 * completes a request within microseconds of its kick, so without the hold a guest that submits a request at a
 * time takes an interrupt for every one or two (bench-vhost: 0.4-0.5 a request at 4k QD32, against
 * qemu-storage-daemon's 0.2-0.3, whose thread-pool completions come bunched). It adapts ({@link Window#held}), so a
 * guest waiting for the completions held does not keep paying for it.
 */
public final class RingPolling {
    /** Where a window that grows starts (QEMU's first step too). */
    static final long START_NANOS = 4_000;
    /**
     * Publishes with the hold closed before it is tried again, at first; each try that closes again without a
     * request caught doubles it, up to {@link #HOLD_PROBE_MAX_PUBLISHES}, and a catch brings it back here.
     */
    static final int HOLD_PROBE_PUBLISHES = 64;
    /**
     * The longest wait between tries: a guest that keeps waiting for its answers (QD1) pays {@link #HOLD_MISSES}
     * holds per this many requests, 8 x 100 us per 4096 round trips, where it paid them per 64 (6% of its
     * throughput at QD1 with a 100 us hold, bench-vhost).
     */
    static final int HOLD_PROBE_MAX_PUBLISHES = 4096;
    /** Holds in a row that ran out without a request coming in them before the hold closes. */
    static final int HOLD_MISSES = 8;

    private final long maxNanos;
    private final long maxHoldNanos;
    private final int maxPollers;
    private final AtomicInteger polling = new AtomicInteger();

    /** Polling only: completions are published at the end of every dispatch (no {@link Window#holdNanos hold}). */
    public RingPolling(long maxNanos, int maxPollers) {
        this(maxNanos, 0, maxPollers);
    }

    /**
     * @param maxNanos     the longest window (vhost.busy-poll); 0 turns polling off
     * @param maxHoldNanos the longest a queue holds its completions back for more (vhost.coalesce); 0: never
     * @param maxPollers   how many queue threads may poll (or hold) at the same time, at least 1
     */
    public RingPolling(long maxNanos, long maxHoldNanos, int maxPollers) {
        if (maxNanos < 0) {
            throw new IllegalArgumentException("polling window must not be negative, got " + maxNanos + " ns");
        }
        if (maxHoldNanos < 0) {
            throw new IllegalArgumentException("completion hold must not be negative, got " + maxHoldNanos + " ns");
        }
        if (maxPollers < 1) {
            throw new IllegalArgumentException("maxPollers must be >= 1, got " + maxPollers);
        }
        this.maxNanos = maxNanos;
        this.maxHoldNanos = maxHoldNanos;
        this.maxPollers = maxPollers;
    }

    /** The default bound on pollers: leave at least one CPU to the guest's vCPUs. */
    public static int defaultMaxPollers() {
        return Math.max(1, Runtime.getRuntime().availableProcessors() - 1);
    }

    public long maxNanos() {
        return maxNanos;
    }

    public long maxHoldNanos() {
        return maxHoldNanos;
    }

    /** Queue threads polling right now. */
    int polling() {
        return polling.get();
    }

    /** One queue's window (its thread only). */
    public Window window() {
        return new Window();
    }

    /** One queue thread's adaptive window and its share of the server's pollers. */
    public final class Window {
        private long nanos;
        /** The hold: how long completions may wait now (0..maxHoldNanos); see {@link #held}. */
        private long holdNanos = maxHoldNanos;
        /** While the hold is closed: publishes left before it opens again to try. */
        private int holdProbeIn;
        /** Holds in a row that ran out without a request coming in them. */
        private int holdMisses;
        /** Publishes the next close waits before the hold is tried again (doubling while tries catch nothing). */
        private int probeEvery = HOLD_PROBE_PUBLISHES;
        /** The hold is open as a try after a close (not from the start), and no request came in it yet. */
        private boolean tryingInVain;

        private Window() {
        }

        /** How long this queue may hold its completions back now (0: publish at the end of every dispatch). */
        public long holdNanos() {
            return holdNanos;
        }

        /**
         * A hold ended: {@code caught}, a request came inside it (the guest went on submitting while its answers
         * waited); else it ran out with none, and the guest was perhaps waiting for what was held: at QD1, or at
         * QD4 with all four held, where the hold is the guest's latency. {@link #HOLD_MISSES} misses in a row close
         * the hold, and it opens again after {@link #HOLD_PROBE_PUBLISHES} publishes ({@link #published}) to try
         * again: a waiting guest then pays a few holds once per that many interrupts; twice as many after each try
         * that caught nothing, up to {@link #HOLD_PROBE_MAX_PUBLISHES}. How many completions a hold
         * gathered says nothing of this: a QD4 guest's four are gathered every time, and counting that as a catch
         * (as this did before) kept the hold, and its wait, on every round trip of a guest at low depth. Misses
         * are not counted against a catch: a busy emulated guest's holds (bench-vhost) often run out, and halving
         * the hold on each, as the polling window shrinks, closed it for good and kept nothing of the gain a fixed
         * hold showed.
         */
        public void held(boolean caught) {
            if (caught) {
                holdMisses = 0;
                tryingInVain = false;
                probeEvery = HOLD_PROBE_PUBLISHES;
            } else if (++holdMisses >= HOLD_MISSES) {
                if (tryingInVain) { // a try that caught nothing: the guest still waits for its answers
                    probeEvery = Math.min(HOLD_PROBE_MAX_PUBLISHES, probeEvery * 2);
                }
                holdNanos = 0;
                holdMisses = 0;
                holdProbeIn = probeEvery;
            }
        }

        /** Completions were published without a hold (it is closed): counts towards the next try. */
        public void published() {
            if (holdNanos == 0 && maxHoldNanos > 0 && --holdProbeIn <= 0) {
                holdNanos = maxHoldNanos;
                tryingInVain = true;
            }
        }

        /** Takes a polling place for a hold (as {@link #beginPoll}, whatever the polling window); then {@link #endPoll}. */
        public boolean beginHold() {
            return holdNanos != 0 && takePlace();
        }

        /** How long this queue polls now (0..maxNanos). */
        public long nanos() {
            return nanos;
        }

        /**
         * Takes one of the server's polling places when this window is open and one is free; a true answer must be
         * followed by {@link #endPoll()}.
         */
        public boolean beginPoll() {
            return nanos != 0 && takePlace();
        }

        private boolean takePlace() {
            if (polling.incrementAndGet() > maxPollers) {
                polling.decrementAndGet();
                return false;
            }
            return true;
        }

        public void endPoll() {
            polling.decrementAndGet();
        }

        /**
         * The queue was idle for {@code idleNanos} (from the end of its last work to the next work, or to a wake-up
         * without work): adapts the window as QEMU's {@code adjust_polling_time} does.
         */
        public void idled(long idleNanos) {
            if (idleNanos <= nanos) {
                return; // polling caught it: the window is right
            }
            if (idleNanos > maxNanos) {
                nanos = 0; // the gap was longer than any window: polling would only have burned CPU
            } else {
                nanos = Math.min(maxNanos, nanos == 0 ? START_NANOS : nanos * 2);
            }
        }
    }
}
