package io.pmemblk.dma.testing;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.soft.SoftFaults;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Holds the software device's engines inside the first descriptor they take after {@link #hold} (awake, the channel
 * lock held) until {@link #release}: a device busy with a long copy, on cue, for tests of what a driver does
 * meanwhile. At most 10 s, so that a failed test does not leave an engine stuck.
 */
public final class HeldEngine implements SoftFaults {
    private final CountDownLatch inside = new CountDownLatch(1);
    private final CountDownLatch release = new CountDownLatch(1);
    private volatile boolean holding;

    public void hold() {
        holding = true;
    }

    /** Waits (10 s at most) until an engine is held. */
    public void awaitInside() throws InterruptedException {
        assertThat(inside.await(10, TimeUnit.SECONDS)).as("an engine took a descriptor and is held in it").isTrue();
    }

    public void release() {
        holding = false;
        release.countDown();
    }

    @Override
    public int failDescriptor(int channel) {
        if (holding) {
            inside.countDown();
            try {
                release.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        return 0;
    }
}
