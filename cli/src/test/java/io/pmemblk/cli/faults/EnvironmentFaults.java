package io.pmemblk.cli.faults;

import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.testing.InjectedFaults;

/**
 * The faults a served soft device gets in an end-to-end test: {@value #VARIABLE}={@code fail-every=N} (every Nth
 * descriptor of each channel halts it, the channel recovers) or {@code break-after=N} (the Nth breaks each channel
 * for good), both with CHANERR_DEST_ADDR. Found by {@link SoftFaults#installed()} only when {@link FaultJar}'s jar
 * is on the server's class path: test code, never in a package.
 */
public final class EnvironmentFaults implements SoftFaults {
    public static final String VARIABLE = "PMEMBLK_TEST_SOFT_FAULTS";
    private static final int CHANNELS = 64; // dma.channels allows 1..64

    private final InjectedFaults faults = new InjectedFaults();

    public EnvironmentFaults() {
        String spec = System.getenv(VARIABLE);
        if (spec == null) {
            return;
        }
        String[] kv = spec.split("=", 2);
        int n = kv.length == 2 ? Integer.parseInt(kv[1].trim()) : -1;
        for (int c = 0; c < CHANNELS; c++) {
            switch (kv[0].trim()) {
                case "fail-every" -> faults.failEvery(c, n, IoatSpec.CHANERR_DEST_ADDR);
                case "break-after" -> faults.breakAfter(c, n, IoatSpec.CHANERR_DEST_ADDR);
                default -> throw new IllegalArgumentException(VARIABLE + "=" + spec
                        + ": expected fail-every=N or break-after=N");
            }
        }
    }

    @Override public boolean stalled(int channel) { return faults.stalled(channel); }
    @Override public int failDescriptor(int channel) { return faults.failDescriptor(channel); }
    @Override public int haltNow(int channel) { return faults.haltNow(channel); }
    @Override public boolean broken(int channel) { return faults.broken(channel); }
}
