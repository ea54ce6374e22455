package io.pmemblk.vhost.blk;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;

/**
 * One vhost-blk queue over the real pmem driver, by one route (the CPU, or the soft DMA engine with guest RAM
 * registered in its IOVA space): the fixture of the tests that run guest requests into pmem. Guest RAM is
 * [0, 4M) and [4M, 8M) adjacent, so buffers may cross from one region into the next; the ring is at 0x10000.
 */
final class PmemQueue implements AutoCloseable {
    static final long MIB = 1 << 20;
    static final int N = 128;

    final CopyStats stats = new CopyStats();
    final GuestRam ram = GuestRam.of(0, 4 * MIB, 4 * MIB, 4 * MIB);
    final PmemBlockDriver driver;
    final BlockLayer layer;
    final GuestDriver ring;
    final EventFd kick, call;
    final VhostBlkQueue queue;

    /** Not started: a test may set the queue up (its write cache) before {@code queue.start()}. */
    PmemQueue(PmemRegion region, Route route) throws Exception {
        DmaEngine engine = route == Route.DMA ? DmaEngine.soft(new IovaSpace(), 1, 512, 16) : null;
        driver = new PmemBlockDriver(region, stats, engine, route == Route.DMA ? new Routing(0, 1) : Routing.CPU_ONLY);
        layer = new BlockLayer(driver, 1, 64, 4 * MIB, 1 << 20);
        ram.register(driver::registerMemory);
        ring = new GuestDriver(ram, N, 0x10000);
        kick = EventFd.create(true);
        call = EventFd.create(true);
        queue = new VhostBlkQueue(new VringAddress(0, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                new QueueWiring(GuestDriver.LINUX_FEATURES, kick, call, new FrontendQueue(layer.queue(0)), ram::memory, null,
                        BlkDevice.of(region.size(), false, true, true, "pmem0")));
    }

    @Override
    public void close() throws Exception {
        queue.stop();
        for (int i = 0; i < 2; i++) {
            driver.unregisterMemory(ram.region(i).mapping()); // after the queue drained, before guest RAM goes
        }
        Closing.closeAll(kick, call, driver, layer);
        ram.assertGuardsIntact();
        ram.close();
    }
}
