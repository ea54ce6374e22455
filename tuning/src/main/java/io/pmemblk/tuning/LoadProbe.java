package io.pmemblk.tuning;

import io.pmemblk.bench.load.LoadGenerator;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.Route;

/**
 * The tuner's size sweep on real parts: each point is a {@link LoadGenerator} run through the frontend seam
 * over the block layer, on the route forced on the driver; the DMA engine's own CPU time is counted apart.
 */
public final class LoadProbe implements Autotuner.Probe {
    /**
     * The copy path this probe measures, and so the requests the thresholds it finds are right for: printed under
     * the table and written beside the thresholds. NBD and ublk requests take another path (the kernel's copy
     * straight to or from the mapping), which the thresholds leave alone unless route.dma.bounce.
     */
    public static final String MEASURED = "buffer <-> pmem in process, the vhost-user path; NBD/ublk requests stay on"
            + " the CPU unless route.dma.bounce=true";

    private final PmemBlockDriver driver;
    private final LoadGenerator generator;

    public LoadProbe(BlockLayer layer, PmemBlockDriver driver) {
        this.driver = driver;
        this.generator = new LoadGenerator(layer);
    }

    @Override
    public Autotuner.Sample measure(Route route, boolean write, int blockSize, int jobs, int depth, double seconds)
            throws InterruptedException {
        if (!driver.force(route)) {
            throw new IllegalArgumentException("route " + route.label() + " forced on a driver without a DMA engine;"
                    + " allowed: a device with dma.engine soft or vfio");
        }
        long engine0 = driver.engineCpuNanos();
        LoadGenerator.Result r = generator.run(new LoadGenerator.Job(write ? LoadGenerator.Pattern.WRITE
                : LoadGenerator.Pattern.READ, blockSize, depth, jobs, seconds, 0));
        long engine = driver.engineCpuNanos() - engine0;
        return new Autotuner.Sample(r.mibPerSecond(), r.submitCpuNanos() / 1e9 / r.seconds(), engine / 1e9 / r.seconds());
    }
}
