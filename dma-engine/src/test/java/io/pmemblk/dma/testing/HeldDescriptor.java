package io.pmemblk.dma.testing;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Holds the first descriptor a {@link SoftIoatDevice}'s engine takes, inside the engine (awake, the channel lock
 * held), until {@link #release}: for what must wait for a descriptor in flight (a fence, a DMA_UNMAP), or happen
 * while the device is busy. {@link #later()}: only a descriptor taken after {@link #hold}, so that a driver can
 * start its channel first (its start-up descriptor runs free). Bounded: a test that never releases it frees the
 * engine after 30 s. Every later descriptor runs as it would without faults.
 */
public final class HeldDescriptor implements SoftFaults {
    private final CountDownLatch taken = new CountDownLatch(1);
    private final CountDownLatch released = new CountDownLatch(1);
    private volatile boolean holding;

    /** Holds the first descriptor taken. */
    public HeldDescriptor() {
        this(true);
    }

    private HeldDescriptor(boolean holding) {
        this.holding = holding;
    }

    /** Holds the first descriptor taken after {@link #hold}. */
    public static HeldDescriptor later() {
        return new HeldDescriptor(false);
    }

    public void hold() {
        holding = true;
    }

    @Override
    public int failDescriptor(int channel) {
        if (holding && taken.getCount() > 0) {
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

    /** Waits (10 s at most) until the engine is held, failing the test otherwise. */
    public void awaitTaken() throws InterruptedException {
        assertThat(awaitTaken(10, TimeUnit.SECONDS)).as("an engine took a descriptor and is held in it").isTrue();
    }

    /** Lets the held descriptor finish. */
    public void release() {
        released.countDown();
    }
}
