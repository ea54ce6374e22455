package io.pmemblk.ublk;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A file descriptor that threads other than its owner write to, and that the owner closes: the eventfd that
 * wakes a queue thread, {@code /dev/ublkcN} that a READ's data goes to. A completion can arrive after its queue
 * was abandoned (on a DMA channel's thread); by then the descriptor may be closed and its number given to the
 * next {@code open}, a pmem file or a client's socket, which the late write would then corrupt. So writers
 * {@link #enter} (they get the number, or -1 once it is {@link #retire retired}) and {@link #exit}; the owner
 * retires it, which waits for the writers inside, and only then closes the number.
 *
 * <p>Cost per use: two uncontended atomic adds on this object's own counter (each queue has its own guards, so
 * queues share no cache line).
 */
final class FdGuard {
    private static final int RETIRED = 1 << 30;

    private final int fd;
    /** Writers inside, plus {@link #RETIRED} once retired. */
    private final AtomicInteger users = new AtomicInteger();

    FdGuard(int fd) {
        this.fd = fd;
    }

    /** The descriptor to use until {@link #exit}, or -1 when it is retired (skip the call); always pair with exit. */
    int enter() {
        return (users.getAndIncrement() & RETIRED) == 0 ? fd : -1;
    }

    void exit() {
        users.getAndDecrement();
    }

    /**
     * Stops handing out the descriptor and waits, at most {@code millis}, for the writers inside to leave
     * (each is in one system call that does not block: an eventfd write, a user-copy pwrite). Idempotent.
     * @return true when none is left: the caller may close it; false: one is still inside, so the number must
     *         stay open (a leaked descriptor is harmless, a reused one is not)
     */
    boolean retire(long millis) {
        int u = users.get();
        while ((u & RETIRED) == 0 && !users.compareAndSet(u, u | RETIRED)) {
            u = users.get();
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while ((users.get() & ~RETIRED) != 0) {
            if (System.nanoTime() - deadline > 0) {
                return false;
            }
            Thread.yield(); // a writer descheduled inside its call (2 cores, many threads) needs the CPU to leave
        }
        return true;
    }

    int fd() {
        return fd;
    }
}
