package io.pmemblk.dma.soft;

import java.util.ServiceLoader;

/**
 * Faults a test puts into the software I/OAT device's engines, which hardware has no equivalent of: the device
 * asks this before each descriptor and before it sleeps. The policy (which descriptor, how often, for how long)
 * lives in test code; production builds its device with {@link #NONE}, and no setting can change that.
 *
 * <p>An end-to-end test of a served device installs a provider of this service on the module path of the server it
 * starts ({@link #installed()}); a packaged server has none.
 */
public interface SoftFaults {
    /** No faults: the device model as the hardware behaves. */
    SoftFaults NONE = new SoftFaults() { };

    /** While true, channel {@code channel}'s engine processes nothing; doorbells are remembered. */
    default boolean stalled(int channel) {
        return false;
    }

    /** Before each descriptor, under the channel lock: 0 to process it, else the CHANERR bits to halt with instead. */
    default int failDescriptor(int channel) {
        return 0;
    }

    /** When the engine has nothing to run (idle or stalled): CHANERR bits to halt with now, or 0. */
    default int haltNow(int channel) {
        return 0;
    }

    /** A broken channel never arms again (a wedged device, or one gone from the bus): a driver's recovery times out. */
    default boolean broken(int channel) {
        return false;
    }

    /** The provider on the module or class path, if a test put one there; else {@link #NONE}. */
    static SoftFaults installed() {
        return ServiceLoader.load(SoftFaults.class).findFirst().orElse(NONE);
    }
}
