package io.pmemblk.vhost.blk;

import io.pmemblk.dma.DmaEngine;
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
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.testing.BlkGuest;
import io.pmemblk.vhost.testing.BlkGuest.Sent;
import io.pmemblk.vhost.testing.GuestDriver;
import io.pmemblk.vhost.testing.GuestRam;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * With two or more requests on a DMA engine whose completions the queue thread reaps, the queue sleeps with the
 * guest's kicks off ({@link VhostBlkQueue#KICKLESS_IN_FLIGHT}): a request the guest makes available meanwhile needs no
 * kick (virtio's kick_prepare with EVENT_IDX says so), and the next completion's wake-up takes it. The real stack:
 * the pmem driver's DMA route, the I/OAT driver and the software I/OAT device interrupting through an eventfd, as
 * on the vfio-user route, held by the test while the requests are to stay in flight.
 */
@Timeout(60)
class KicklessWhileCopyingTest {
    private static final long MIB = 1 << 20;
    private static final int N = 64;
    private static final int WRITE = 64 << 10;

    @TempDir
    Path dir;

    @Test
    void aRequestMadeAvailableWhileTwoAreOnTheEngineNeedsNoKickAndIsTakenAtTheNextCompletion() throws Exception {
        IovaSpace space = new IovaSpace();
        EventfdInterrupt vector = new EventfdInterrupt();
        Stall stall = new Stall();
        SoftIoatDevice device = new SoftIoatDevice(space, 1, 20, stall, n -> vector);
        stall.device = device;
        DmaEngine engine = DmaEngine.ioat(device, space, device::interrupt, 1, 512, device);
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), 8 * MIB, false, PmemRegion.Mapper.AUTO);
        PmemBlockDriver pmem = new PmemBlockDriver(region, new CopyStats(), engine, new Routing(0, 1));
        BlockLayer layer = new BlockLayer(pmem, 1, 64, 4 * MIB, 1 << 20);
        GuestRam ram = GuestRam.of(0, 4 * MIB, 4 * MIB, 4 * MIB);
        ram.register(pmem::registerMemory);
        GuestDriver ring = new GuestDriver(ram, N, 0x10000);
        BlkGuest guest = new BlkGuest(ring, MIB, 7 * MIB);
        EventFd kick = EventFd.create(true);
        EventFd call = EventFd.create(true);
        VhostBlkQueue queue = new VhostBlkQueue(new VringAddress(0, N, ring.descUser(), ring.availUser(), ring.usedUser(), 0),
                new QueueWiring(GuestDriver.LINUX_FEATURES, kick, call, new FrontendQueue(layer.queue(0)), ram::memory,
                        null, BlkDevice.of(region.size(), false, true, true, "pmem0"), new RingPolling(0, 1)));
        queue.start();
        try {
            stall.on = true;
            Sent first = guest.write(0, filled(1), 4, false);
            Sent second = guest.write(WRITE / 512, filled(2), 4, false);
            kick.signal();
            Waits.await("both writes taken and held on the engine", () -> queue.inFlight() == 2);
            Waits.await("the queue thread asleep, both writes on the engine", KicklessWhileCopyingTest::queueThreadSleeps);
            int before = ring.availIdx();
            Sent third = guest.write(2L * WRITE / 512, filled(3), 4, false);
            int event = ring.availEvent();
            // virtqueue_kick_prepare with EVENT_IDX: kick when avail.idx passed avail_event since the last kick
            boolean kickWanted = SplitRingLayout.needEvent(event, ring.availIdx(), before);
            assertThat(kickWanted).as("a kick wanted for a request made available while two were on the engine"
                    + " (avail_event " + event + ", avail.idx " + before + " -> " + ring.availIdx() + ")").isFalse();
            stall.release(); // no kick for the third: the first completion's wake-up takes it
            Waits.await("all three answered", () -> {
                guest.answered();
                return guest.inFlight() == 0;
            });
            for (Sent s : new Sent[]{first, second, third}) {
                assertThat(guest.status(s)).isZero();
            }
            assertThat(region.memory().asSlice(2L * WRITE, WRITE).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE))
                    .as("the third write's data in the region").isEqualTo(filled(3));
        } finally {
            stall.release(); // a failed assertion above leaves the writes held: let them finish before the stop
            try {
                queue.stop();
                for (int i = 0; i < 2; i++) {
                    pmem.unregisterMemory(ram.region(i).mapping());
                }
                Closing.closeAll(kick, call, pmem, layer);
            } finally {
                vector.close();
                ram.assertGuardsIntact();
                ram.close();
            }
        }
    }

    /** The queue thread is in its sleep (EdgeWait.await), not in its loop. */
    private static boolean queueThreadSleeps() {
        for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
            if (e.getKey().getName().equals("vhost-blk-q0")) {
                return Arrays.stream(e.getValue()).anyMatch(f -> f.getClassName().equals(EdgeWait.class.getName())
                        && f.getMethodName().equals("await"));
            }
        }
        return false;
    }

    private static byte[] filled(int n) {
        byte[] b = new byte[WRITE];
        Arrays.fill(b, (byte) n);
        return b;
    }

    /** The channel's engine processes nothing while {@link #on} (doorbells are remembered). */
    private static final class Stall implements SoftFaults {
        volatile boolean on;
        volatile SoftIoatDevice device;

        @Override
        public boolean stalled(int channel) {
            return on;
        }

        void release() {
            on = false;
            device.wake(0);
        }
    }
}
