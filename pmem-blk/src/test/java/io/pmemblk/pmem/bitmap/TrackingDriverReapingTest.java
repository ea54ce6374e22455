package io.pmemblk.pmem.bitmap;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.soft.SoftFaults;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfio.EventfdInterrupt;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.InlineRequests;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.testing.Closing;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The tracking layer sits between every frontend and the pmem driver: a queue thread that asks it to reap the
 * DMA completions of its queue must get the driver's channel, or every completion would silently stay on the
 * engine's thread. The real stack on a software I/OAT device whose interrupt is an eventfd (the kind a queue
 * thread can sleep on, as on the vfio-user route).
 */
class TrackingDriverReapingTest {
    private static final long SIZE = 4L << 20;
    private static final int WRITE = 64 << 10;

    @TempDir
    Path dir;

    @Test
    void aQueueThreadReapsItsDmaWritesThroughTheLayer() throws Exception {
        IovaSpace space = new IovaSpace();
        EventfdInterrupt vector = new EventfdInterrupt();
        SoftIoatDevice device = new SoftIoatDevice(space, 1, 20, SoftFaults.NONE, n -> vector);
        DmaEngine engine = DmaEngine.ioat(device, space, device::interrupt, 1, 64, device);
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), SIZE, false, PmemRegion.Mapper.JAVA);
        // 4 KiB and up by DMA, pool buffers included: every write of this test is the device's copy
        PmemBlockDriver pmem = new PmemBlockDriver(region, new CopyStats(), engine, new Routing(4096, Integer.MAX_VALUE, true));
        DirtyBitmaps bitmaps = DirtyBitmaps.open(BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir",
                PmemRegion.Mapper.JAVA), SIZE, WRITE, List.of("b"), 1);
        TrackingDriver tracking = new TrackingDriver(pmem, bitmaps);
        BlockLayer layer = new BlockLayer(tracking, 1, 8, 4 << 20, 1 << 20);
        try {
            int fd = tracking.startReaping(0);
            assertThat(fd).as("queue 0's channel's completion eventfd, asked through the layer")
                    .isNotNegative().isEqualTo(engine.channel(0).completionFd());
            String me = Thread.currentThread().getName();
            Map<Integer, String> completedOn = new ConcurrentHashMap<>();
            Map<Integer, Integer> status = new ConcurrentHashMap<>();
            int reaped = 0;
            HardwareQueue hq = layer.queue(0);
            for (int i = 0; i < 16; i++) {
                Request r = InlineRequests.acquire(hq, Op.WRITE, (long) i * WRITE, WRITE, (byte) (i + 1), false);
                int n = i;
                r.completion = req -> {
                    status.put(n, req.status());
                    completedOn.put(n, Thread.currentThread().getName());
                };
                hq.dispatch(new Request[] {r}, 1);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
                while (!status.containsKey(i)) {
                    assertThat(System.nanoTime() - deadline).as("write %d completed within 10 s", i).isNegative();
                    reaped += tracking.reapCompletions(0);
                }
                r.release();
            }
            tracking.stopReaping(0);
            assertThat(status.values()).as("every write OK").hasSize(16).containsOnly(0);
            assertThat(reaped).as("copies the layer's reapCompletions reported on this thread").isPositive();
            assertThat(completedOn.values()).as("writes completed on the reaping thread").contains(me);
            for (int i = 0; i < 16; i++) {
                assertThat(region.memory().asSlice((long) i * WRITE, WRITE).mismatch(MemorySegment.ofArray(filled(i + 1))))
                        .as("write %d's data in the region", i).isEqualTo(-1);
            }
        } finally {
            try {
                Closing.closeAll(tracking, layer);
            } finally {
                bitmaps.close();
                vector.close();
            }
        }
    }

    private static byte[] filled(int value) {
        byte[] b = new byte[WRITE];
        Arrays.fill(b, (byte) value);
        return b;
    }
}
