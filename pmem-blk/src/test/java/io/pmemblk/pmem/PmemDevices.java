package io.pmemblk.pmem;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.testing.Closing;

import java.io.IOException;
import java.nio.file.Path;

/**
 * A pmem device as the tests build it: a region over a file, the driver over the region and a block layer over
 * the driver, made in one call ({@link #on}, then {@link Builder#open}) and closed together. The defaults are the
 * most common fixture: the file mapped by {@code auto}, CPU copies only, one queue of 8 tags with 4 MiB of buffers
 * and requests up to 1 MiB.
 */
public final class PmemDevices implements AutoCloseable {
    private final PmemBlockDriver driver;
    private final BlockLayer layer;

    private PmemDevices(PmemBlockDriver driver, BlockLayer layer) {
        this.driver = driver;
        this.layer = layer;
    }

    /** A device over {@code file} of {@code size} bytes (created when missing), as the builder's settings say. */
    public static Builder on(Path file, long size) {
        return new Builder(file, size);
    }

    public PmemBlockDriver driver() {
        return driver;
    }

    public PmemRegion region() {
        return driver.region();
    }

    public BlockLayer layer() {
        return layer;
    }

    public HardwareQueue queue(int i) {
        return layer.queue(i);
    }

    /** The driver first (its engine drains, then its region unmaps), then the layer whose pools the engine mapped. */
    @Override
    public void close() throws Exception {
        Closing.closeAll(driver, layer);
    }

    /** The device's settings; each has the default the class describes until set. */
    public static final class Builder {
        private final Path file;
        private final long size;
        private PmemRegion.Mapper mapper = PmemRegion.Mapper.AUTO;
        private CopyStats stats = new CopyStats();
        private DmaEngine engine;
        private Routing routing = Routing.CPU_ONLY;
        private int windowShift = DeviceViews.WINDOW_SHIFT;
        private int queues = 1;
        private int depth = 8;
        private long poolBytes = 4 << 20;
        private int maxRequestBytes = 1 << 20;

        private Builder(Path file, long size) {
            this.file = file;
            this.size = size;
        }

        public Builder mapper(PmemRegion.Mapper mapper) {
            this.mapper = mapper;
            return this;
        }

        /** Where the driver counts its copies (the test reads them). */
        public Builder stats(CopyStats stats) {
            this.stats = stats;
            return this;
        }

        /** Copies offloaded to {@code engine}, which the driver owns from open on, routed by {@code routing}. */
        public Builder dma(DmaEngine engine, Routing routing) {
            this.engine = engine;
            this.routing = routing;
            return this;
        }

        /** The in-place views in windows of {@code 1 << shift} bytes ({@link DeviceViews}). */
        public Builder windowShift(int shift) {
            this.windowShift = shift;
            return this;
        }

        /** The block layer's queues, tags per queue, buffer bytes per queue and largest request. */
        public Builder layer(int queues, int depth, long poolBytes, int maxRequestBytes) {
            this.queues = queues;
            this.depth = depth;
            this.poolBytes = poolBytes;
            this.maxRequestBytes = maxRequestBytes;
            return this;
        }

        /** Opens the region, the driver and the layer; what was opened is closed again when a later part fails. */
        public PmemDevices open() throws IOException {
            PmemRegion region = PmemRegion.open(file, size, false, mapper);
            PmemBlockDriver driver;
            try {
                driver = new PmemBlockDriver(region, stats, engine, routing, windowShift);
            } catch (RuntimeException e) {
                region.close();
                throw e;
            }
            try {
                return new PmemDevices(driver, new BlockLayer(driver, queues, depth, poolBytes, maxRequestBytes));
            } catch (RuntimeException e) {
                driver.close();
                throw e;
            }
        }
    }
}
