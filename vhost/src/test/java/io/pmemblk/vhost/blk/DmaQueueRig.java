package io.pmemblk.vhost.blk;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import io.pmemblk.posix.EdgeWait;
import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.UnaryOperator;

/**
 * One virtqueue served over the real DMA route: the pmem driver, the I/OAT driver and the software I/OAT device
 * interrupting through an eventfd, as on the vfio-user route (so the queue thread reaps the completions itself),
 * every copy going by DMA, and a guest driving the ring; {@link #stall} holds the engine while a test wants its
 * requests to stay in flight.
 */
final class DmaQueueRig implements AutoCloseable {
    static final long MIB = 1 << 20;
    static final int RING = 128;

    final Stall stall = new Stall();
    final EventfdInterrupt vector = new EventfdInterrupt();
    /** The channel's vector as the device raises it: {@link Vector#muted} keeps the device from raising it. */
    final Vector raised = new Vector(vector);
    final PmemRegion region;
    final PmemBlockDriver pmem;
    final BlockDriver driver;
    final BlockLayer layer;
    final GuestRam ram = GuestRam.of(0, 4 * MIB, 4 * MIB, 4 * MIB);
    final GuestDriver ring;
    final BlkGuest guest;
    final EventFd kick = EventFd.create(true);
    final EventFd call = EventFd.create(true);
    final VhostBlkQueue queue;

    /** {@code wrap}: the driver the block layer sees, around the pmem driver; started before it returns. */
    DmaQueueRig(Path dir, RingPolling polling, UnaryOperator<BlockDriver> wrap) throws Exception {
        this(dir, polling, wrap, GuestDriver.LINUX_FEATURES);
    }

    /** As above, the rings negotiated with {@code features} (virtio feature bits). */
    DmaQueueRig(Path dir, RingPolling polling, UnaryOperator<BlockDriver> wrap, long features) throws Exception {
        IovaSpace space = new IovaSpace();
        SoftIoatDevice device = new SoftIoatDevice(space, 1, 20, stall, n -> raised);
        stall.device = device;
        DmaEngine engine = DmaEngine.ioat(device, space, device::interrupt, 1, 512, device);
        region = PmemRegion.open(dir.resolve("d.img"), 8 * MIB, false, PmemRegion.Mapper.AUTO);
        pmem = new PmemBlockDriver(region, new CopyStats(), engine, new Routing(0, 1));
        driver = wrap.apply(pmem);
        layer = new BlockLayer(driver, 1, 64, 4 * MIB, 1 << 20);
        ram.register(pmem::registerMemory);
        ring = new GuestDriver(ram, RING, 0x10000);
        guest = new BlkGuest(ring, MIB, 7 * MIB);
        queue = new VhostBlkQueue(new VringAddress(0, RING, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                new QueueWiring(features, kick, call, new FrontendQueue(layer.queue(0)), ram::memory,
                        null, BlkDevice.of(region.size(), false, true, true, "pmem0"), polling,
                        Thread.ofPlatform().factory()));
        queue.start();
    }

    /** The queue thread is in its sleep (EdgeWait.await), not in its loop. */
    static boolean queueThreadSleeps() {
        for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
            if (e.getKey().getName().equals("vhost-blk-q0")) {
                return Arrays.stream(e.getValue()).anyMatch(f -> f.getClassName().equals(EdgeWait.class.getName())
                        && f.getMethodName().equals("await"));
            }
        }
        return false;
    }

    /** Releases the engine first (a failed assertion may leave requests held), then stops and closes everything. */
    @Override
    public void close() throws Exception {
        stall.release();
        try {
            queue.stop();
            for (int i = 0; i < 2; i++) {
                pmem.unregisterMemory(ram.region(i).mapping());
            }
            Closing.closeAll(kick, call, driver, layer);
        } finally {
            vector.close();
            ram.assertGuardsIntact();
            ram.close();
        }
    }

    /**
     * The vector between the device and the driver. While {@link #muted} the device's raises are dropped, so the
     * queue thread sleeping on the eventfd is not woken by them and only the channel's completion thread, standing
     * by, reaps (its standby period): completions then come on a thread other than the queue's.
     */
    static final class Vector implements Interrupt {
        private final EventfdInterrupt inner;
        volatile boolean muted;

        Vector(EventfdInterrupt inner) {
            this.inner = inner;
        }

        @Override
        public void signal() {
            if (!muted) {
                inner.signal();
            }
        }

        @Override
        public boolean await(long timeout, TimeUnit unit) throws InterruptedException {
            return inner.await(timeout, unit);
        }

        @Override
        public int fd() {
            return inner.fd();
        }
    }

    /** The channel's engine processes nothing while {@link #on} (doorbells are remembered). */
    static final class Stall implements SoftFaults {
        volatile boolean on;
        volatile SoftIoatDevice device;

        @Override
        public boolean stalled(int channel) {
            return on;
        }

        /** Ends the stall and wakes the engine, which runs what was rung meanwhile. */
        void release() {
            on = false;
            SoftIoatDevice d = device;
            if (d != null) {
                d.wake(0);
            }
        }
    }
}
