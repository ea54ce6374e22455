package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.testing.Closing;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The tracking layer's write path as a frontend drives it: a write received straight into the device ends its
 * record when it is dispatched (its payload is in the device then), not at the device's completion; and such
 * writes allocate nothing on the submitting thread.
 */
class TrackedWritePathTest {
    private static final int BLOCK = 4096, BATCH = 32;
    private static final long SIZE = 16 << 20;

    @TempDir
    Path dir;

    /**
     * The device holds the completion of a write received in place: a checkpoint still returns at once, the write
     * in the frozen bitmap alone, since its payload was in the device when it was dispatched.
     */
    @Test
    void aCheckpointDoesNotWaitForTheCompletionOfAWriteWhosePayloadLandedInPlace() throws Exception {
        try (TrackedDevice d = TrackedDevice.holding(dir, SIZE, BLOCK, r -> r.dataInPlace,
                TimeUnit.SECONDS.toNanos(3))) {
            HeldCompletions device = d.held();
            FrontendQueue frontend = new FrontendQueue(d.layer.queue(0));
            Request r = frontend.acquireWrite(5L * BLOCK, BLOCK);
            assertThat(r.dataInPlace).as("the CPU route receives in place").isTrue();
            receive(r);
            AtomicInteger status = new AtomicInteger(-1);
            r.completion = req -> status.set(req.status());
            frontend.add(r);
            frontend.dispatch();
            assertThat(device.held()).as("completions the device holds").isEqualTo(1);

            assertThat(d.bitmaps.checkpoint("b")).isEqualTo("b@1");
            assertThat(d.bitmaps.find("b@1").dirty(5)).as("in the bitmap it marked, now frozen").isTrue();
            assertThat(d.bitmaps.find("b").dirty(5)).as("in the successor too").isFalse();

            device.release();
            assertThat(status.get()).isZero();
            r.release();
        }
    }

    /**
     * Tens of thousands of writes received in place, every bit durable already (the steady state), through the
     * tracking layer and, beside it in the same JVM, through the same stack without it: the submitting thread,
     * which also completes them (the CPU route completes inline), allocates nothing more for the tracking. Read from
     * the JVM's per-thread allocation counter after a warm-up that lets the JIT compile both paths. The difference
     * is what is asserted: the pmem driver below has allocations of its own on this path (the mapping's slices its
     * receive probe and its write-back accounting make), which are not the tracking layer's to remove.
     */
    @Test
    void theTrackingLayerAllocatesNothingForWritesReceivedInPlace() throws Exception {
        PmemRegion bareRegion = PmemRegion.open(dir.resolve("bare.img"), SIZE, false, PmemRegion.Mapper.JAVA);
        PmemBlockDriver bareDriver = new PmemBlockDriver(bareRegion, new CopyStats());
        BlockLayer bareLayer = new BlockLayer(bareDriver, 1, 64, 8 << 20, 1 << 20);
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, 64 << 10, List.of("b"), 1)) {
            Writes tracked = new Writes(new FrontendQueue(d.layer.queue(0)));
            Writes bare = new Writes(new FrontendQueue(bareLayer.queue(0)));
            for (int round = 0; round < 5; round++) { // the JIT compiles both paths; every bit becomes durable
                tracked.run(2_000);
                bare.run(2_000);
            }
            // the least of three rounds each: a compilation finishing during one round allocates in that round
            long trackedBytes = Long.MAX_VALUE, bareBytes = Long.MAX_VALUE;
            for (int round = 0; round < 3; round++) {
                trackedBytes = Math.min(trackedBytes, tracked.allocatedBy(2_000));
                bareBytes = Math.min(bareBytes, bare.allocatedBy(2_000));
            }
            int n = 2_000 * BATCH;
            System.out.println("writes received in place: " + trackedBytes + " bytes allocated over " + n
                    + " through the tracking layer, " + bareBytes + " without it");
            assertThat(trackedBytes - bareBytes).as("bytes the tracking layer allocated for %d writes received in"
                    + " place (%d with it, %d without): fewer than one per write", n, trackedBytes, bareBytes)
                    .isLessThan(n);
        } finally {
            Closing.closeAll(bareDriver, bareLayer);
        }
    }

    /** Batches of random 4 KiB writes received in place, completed inline and released by their completion. */
    private static final class Writes {
        private final FrontendQueue frontend;
        private final SplittableRandom random = new SplittableRandom(1);
        private int completed;
        private final Request.Completion done = r -> {
            if (r.status() != 0) {
                throw new AssertionError(r + " completed with status " + r.status());
            }
            completed++;
            r.release();
        };

        Writes(FrontendQueue frontend) {
            this.frontend = frontend;
        }

        /** Bytes this thread allocated running {@code batches} batches, all of which completed. */
        long allocatedBy(int batches) throws InterruptedException {
            var threads = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
            long before = threads.getCurrentThreadAllocatedBytes();
            int n = run(batches);
            long bytes = threads.getCurrentThreadAllocatedBytes() - before;
            if (n != batches * BATCH) {
                throw new AssertionError(n + " of " + batches * BATCH + " writes completed inline");
            }
            return bytes;
        }

        /** {@code batches} batches of BATCH writes; how many completed. */
        int run(int batches) throws InterruptedException {
            int before = completed;
            for (int b = 0; b < batches; b++) {
                for (int k = 0; k < BATCH; k++) {
                    long offset = random.nextLong(SIZE / BLOCK) * BLOCK;
                    Request r = frontend.acquireWrite(offset, BLOCK);
                    if (!r.dataInPlace) {
                        throw new AssertionError(r + " was not received in place");
                    }
                    // the payload's first bytes, as the socket read starts it; the copy is the kernel's
                    ByteBuffer data = r.dataBuffers()[0];
                    data.putLong(data.position(), offset);
                    r.completion = done;
                    frontend.add(r);
                }
                frontend.dispatch();
            }
            return completed - before;
        }
    }

    /** The payload, as a frontend's read from its socket puts it: straight into the device range. */
    private static void receive(Request r) {
        ByteBuffer[] bufs = r.dataBuffers();
        for (int i = 0; i < r.dataBufferCount(); i++) {
            while (bufs[i].hasRemaining()) bufs[i].put((byte) 7);
        }
    }
}
