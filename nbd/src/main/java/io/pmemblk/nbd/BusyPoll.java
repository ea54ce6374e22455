package io.pmemblk.nbd;

import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Busy-polling a connection's socket before its reader sleeps in a blocking read: Linux's {@code busy_poll}
 * (and SPDK's polling) for a socket the JDK reads. Waking a thread that slept in {@code read} costs a futex-like
 * wake-up, a context switch and, in a VM, an inter-processor interrupt through the hypervisor: tens of
 * microseconds, as much as a whole 64 KiB request. At low queue depth that wake-up is on every request's
 * path; polling the socket (FIONREAD) for a short budget after the reply went out finds the client's next
 * request without it. Measured on this 2-core VM: 64 KiB writes at QD1 1.86x, 64 KiB reads at QD1 1.50x, 2 MiB
 * writes at QD1 1.43x with a 50 us budget (bench-nbd A/B, same run).
 *
 * <p>Bounded twice, so the polling never takes the CPU the clients need: at most {@code maxPolling} readers of
 * the whole server poll at once (by default one fewer than the CPUs: on 2 cores, one), the others sleep at
 * once; and a connection whose client keeps it waiting past the budget {@link #MISSES_BEFORE_REST} times in
 * a row stops polling for its next {@link #REST} waits (an idle or slow client costs no CPU).
 *
 * <p>One {@link Poller} per connection (its reader thread only); the budget and the count of pollers are the
 * server's.
 */
final class BusyPoll {
    static final int MISSES_BEFORE_REST = 4;
    static final int REST = 64;

    private final long budgetNanos;
    private final int maxPolling;
    private final AtomicInteger polling = new AtomicInteger();

    /**
     * @param budget     how long one wait polls before it sleeps; zero turns polling off
     * @param maxPolling how many readers may poll at the same time, at least 1
     */
    BusyPoll(Duration budget, int maxPolling) {
        if (budget.isNegative()) {
            throw new IllegalArgumentException("busy-poll budget must not be negative, got " + budget);
        }
        if (maxPolling < 1) {
            throw new IllegalArgumentException("maxPolling must be >= 1, got " + maxPolling);
        }
        this.budgetNanos = budget.toNanos();
        this.maxPolling = maxPolling;
    }

    /** The default bound: leave at least one CPU to the clients. */
    static int defaultMaxPolling() {
        return Math.max(1, Runtime.getRuntime().availableProcessors() - 1);
    }

    Duration budget() {
        return Duration.ofNanos(budgetNanos);
    }

    /** Readers polling right now. */
    int polling() {
        return polling.get();
    }

    /** A poller for one connection's socket, or null when polling is off or the fd is unknown ({@code fd < 0}). */
    Poller forSocket(int fd) {
        return budgetNanos == 0 || fd < 0 ? null : new Poller(fd);
    }

    /** One connection's polling: its socket, and how its recent waits went. Its reader thread only. */
    final class Poller {
        private final int fd;
        private final MemorySegment queued = Arena.ofAuto().allocate(ValueLayout.JAVA_INT);
        private int misses;
        private int resting;
        /** Waits that polling ended (the data came within the budget), and that ran out of budget. */
        long hits;
        long timeouts;

        private Poller(int fd) {
            this.fd = fd;
        }

        /**
         * Before a read that may block: returns once bytes wait in the socket, the budget is spent, or at once
         * when polling is not this wait's to do (resting, or enough readers poll already).
         * @return true when the bytes are there (the read will not block)
         */
        boolean awaitReadable() {
            if (readable()) {
                return true;
            }
            if (resting > 0) {
                resting--;
                return false;
            }
            if (polling.incrementAndGet() > maxPolling) {
                polling.decrementAndGet();
                return false;
            }
            try {
                long deadline = System.nanoTime() + budgetNanos;
                do {
                    Thread.onSpinWait();
                    if (readable()) {
                        misses = 0;
                        hits++;
                        return true;
                    }
                } while (System.nanoTime() - deadline < 0);
            } finally {
                polling.decrementAndGet();
            }
            timeouts++;
            if (++misses >= MISSES_BEFORE_REST) {
                misses = 0;
                resting = REST;
            }
            return false;
        }

        /** Bytes wait in the socket right now, so a read will not block (true when it cannot tell: the read says why). */
        boolean readable() {
            try {
                return Sockets.bytesQueued(fd, queued) > 0;
            } catch (NativeException e) {
                return true; // closed or broken: the read itself says so, at once
            }
        }
    }
}
