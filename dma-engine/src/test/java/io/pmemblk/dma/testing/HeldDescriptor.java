package io.pmemblk.dma.testing;

import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Holds the first descriptor a {@link SoftIoatDevice}'s engine takes, inside the engine, until {@link #release}:
 * for what must wait for a descriptor in flight (a fence, a DMA_UNMAP). Bounded: a test that never releases it
 * frees the engine after 30 s. Every later descriptor runs as it would without faults.
 */
public final class HeldDescriptor implements SoftFaults {
    private final CountDownLatch taken = new CountDownLatch(1);
    private final CountDownLatch released = new CountDownLatch(1);

    @Override
    public int failDescriptor(int channel) {
        if (taken.getCount() > 0) {
            taken.countDown();
            try {
                released.await(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        return 0;
    }

    /** Whether the engine took the descriptor (and is held inside it) within {@code timeout}. */
    public boolean awaitTaken(long timeout, TimeUnit unit) throws InterruptedException {
        return taken.await(timeout, unit);
    }

    /** Lets the held descriptor finish. */
    public void release() {
        released.countDown();
    }
}
