package io.pmemblk.dma.vfiouser.device;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.posix.EventFd;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.function.IntConsumer;

/**
 * The MSI-X vectors of a served device, raised by its engine threads and delivered by the one thread that owns the
 * libvfio-user context. libvfio-user is not thread-safe: {@code vfu_irq_trigger} reads the eventfd the client gave
 * in SET_IRQS, which the context's thread may be closing or replacing at that moment. So an engine only marks its
 * vector pending and, on the first mark since the last delivery, signals {@link #wake}; the context's thread polls
 * that eventfd beside the client's socket and calls {@link #deliver}. Several completions before a delivery
 * collapse into one interrupt, as MSI-X edges do; the driver reads the completion state, never counts interrupts.
 */
final class PendingVectors {
    private final AtomicIntegerArray pending;
    private final EventFd wake;

    PendingVectors(int count, EventFd wake) {
        this.pending = new AtomicIntegerArray(count);
        this.wake = wake;
    }

    /** Channel {@code n}'s vector, as the device model raises it. */
    Interrupt vector(int n) {
        return new Interrupt() {
            @Override
            public void signal() {
                if (pending.getAndSet(n, 1) == 0) {
                    wake.signal();
                }
            }

            @Override
            public boolean await(long timeout, TimeUnit unit) {
                throw new UnsupportedOperationException("a served device's vector " + n
                        + " is waited for by its client's driver, not in the device process");
            }
        };
    }

    /** Takes every pending vector and hands it to {@code raise} (on the context's thread). */
    void deliver(IntConsumer raise) {
        wake.drain();
        for (int i = 0; i < pending.length(); i++) {
            if (pending.get(i) != 0 && pending.getAndSet(i, 0) != 0) {
                raise.accept(i);
            }
        }
    }

    /** Forgets what is pending (a reset: the client's vectors are gone or about to be set up again). */
    void clear() {
        for (int i = 0; i < pending.length(); i++) {
            pending.set(i, 0);
        }
    }
}
