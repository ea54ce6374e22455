package io.pmemblk.dma;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.LockSupport;

/** {@link Interrupt} for the software device: a latched flag plus park/unpark of the single waiter. */
public final class SoftInterrupt implements Interrupt {
    private final AtomicBoolean pending = new AtomicBoolean();
    private volatile Thread waiter;

    @Override
    public void signal() {
        pending.set(true);
        Thread w = waiter;
        if (w != null) {
            LockSupport.unpark(w);
        }
    }

    @Override
    public boolean await(long timeout, TimeUnit unit) throws InterruptedException {
        long deadline = System.nanoTime() + unit.toNanos(timeout);
        waiter = Thread.currentThread();
        try {
            while (!pending.compareAndSet(true, false)) {
                if (Thread.interrupted()) {
                    throw new InterruptedException();
                }
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                LockSupport.parkNanos(this, left);
            }
            return true;
        } finally {
            waiter = null;
        }
    }
}
