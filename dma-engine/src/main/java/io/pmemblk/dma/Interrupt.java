package io.pmemblk.dma;

import java.util.concurrent.TimeUnit;

/**
 * One interrupt vector (MSI-X on hardware, where a VFIO eventfd would implement it). The device calls
 * {@link #signal}; the driver's completion thread blocks in {@link #await}. Signals arriving while nobody waits
 * are latched, not lost, and several signals before a wait collapse into one wake-up, like an edge-triggered
 * MSI that the driver answers by reading the completion state.
 */
public interface Interrupt {
    /** Raises the vector; never blocks. */
    void signal();

    /** Waits until signalled (consuming the latched signal); false on timeout. */
    boolean await(long timeout, TimeUnit unit) throws InterruptedException;

    /** The eventfd the vector signals, which another thread may sleep on (edge-triggered); -1 when it has none. */
    default int fd() {
        return -1;
    }
}
