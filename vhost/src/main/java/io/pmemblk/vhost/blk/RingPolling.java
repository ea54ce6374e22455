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
 * window does with its default {@code poll-shrink=0}.
 *
 * <p>Why bounded: at most {@code maxPollers} threads of the server poll at once (by default one fewer than the
 * CPUs, as NBD's readers), the others sleep at once; polling never takes every CPU.
 */
public final class RingPolling {
    /** Where a window that grows starts (QEMU's first step too). */
    static final long START_NANOS = 4_000;

    private final long maxNanos;
    private final int maxPollers;
    private final AtomicInteger polling = new AtomicInteger();

    /**
     * @param maxNanos   the longest window (vhost.busy-poll); 0 turns polling off
     * @param maxPollers how many queue threads may poll at the same time, at least 1
     */
    public RingPolling(long maxNanos, int maxPollers) {
        if (maxNanos < 0) {
            throw new IllegalArgumentException("polling window must not be negative, got " + maxNanos + " ns");
        }
        if (maxPollers < 1) {
            throw new IllegalArgumentException("maxPollers must be >= 1, got " + maxPollers);
        }
        this.maxNanos = maxNanos;
        this.maxPollers = maxPollers;
    }

    /** The default bound on pollers: leave at least one CPU to the guest's vCPUs. */
    public static int defaultMaxPollers() {
        return Math.max(1, Runtime.getRuntime().availableProcessors() - 1);
    }

    public long maxNanos() {
        return maxNanos;
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

        private Window() {
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
            if (nanos == 0) {
                return false;
            }
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
