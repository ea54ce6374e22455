package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.InlineRequests;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Predicate;
import java.util.function.UnaryOperator;

/**
 * The real stack the server builds, for the bitmap tests: a region, the pmem driver (no DMA engine: the CPU
 * route, completing on the caller's stack), the tracking layer with its bitmaps, and the block layer.
 */
final class TrackedDevice implements AutoCloseable {
    final PmemRegion region;
    final DirtyBitmaps bitmaps;
    final TrackingDriver driver;
    final BlockLayer layer;
    /** The device between the tracking layer and the pmem driver (the pmem driver itself when none was put there). */
    final BlockDriver under;

    TrackedDevice(PmemRegion region, BitmapDirectory dir, long granularity, List<String> names, int queues)
            throws IOException {
        this(region, dir, granularity, names, queues, UnaryOperator.identity(), DirtyBitmaps.SETTLE);
    }

    /**
     * As {@link #TrackedDevice(PmemRegion, BitmapDirectory, long, List, int)}, with {@code under} put between the
     * tracking layer and the pmem driver (a test device), and swaps waiting at most {@code settleNanos}.
     */
    TrackedDevice(PmemRegion region, BitmapDirectory dir, long granularity, List<String> names, int queues,
                  UnaryOperator<BlockDriver> under, long settleNanos) throws IOException {
        this.region = region;
        this.bitmaps = DirtyBitmaps.open(dir, region.size(), granularity, names, queues, settleNanos);
        this.under = under.apply(new PmemBlockDriver(region, new CopyStats()));
        this.driver = new TrackingDriver(this.under, bitmaps);
        this.layer = new BlockLayer(driver, queues, 64, 8 << 20, 1 << 20);
    }

    static TrackedDevice open(Path dir, long size, long granularity, List<String> names, int queues)
            throws IOException {
        return open(dir, size, granularity, names, queues, UnaryOperator.identity(), DirtyBitmaps.SETTLE);
    }

    /**
     * The device at {@code dir}/d.img with its bitmaps in d.img.bitmaps, both mapped as the JDK maps, built as
     * {@link #TrackedDevice(PmemRegion, BitmapDirectory, long, List, int, UnaryOperator, long)} builds it.
     */
    static TrackedDevice open(Path dir, long size, long granularity, List<String> names, int queues,
                              UnaryOperator<BlockDriver> under, long settleNanos) throws IOException {
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), size, false, PmemRegion.Mapper.JAVA);
        return new TrackedDevice(region, BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir",
                PmemRegion.Mapper.JAVA), granularity, names, queues, under, settleNanos);
    }

    /**
     * One queue and the bitmap "b", with a {@link HeldCompletions} under the tracking layer that holds the
     * completions of the requests {@code hold} picks ({@link #held}).
     */
    static TrackedDevice holding(Path dir, long size, long granularity, Predicate<Request> hold, long settleNanos)
            throws IOException {
        return open(dir, size, granularity, List.of("b"), 1, pmem -> new HeldCompletions(pmem, hold), settleNanos);
    }

    /** The device {@link #holding} put under the tracking layer. */
    HeldCompletions held() {
        return (HeldCompletions) under;
    }

    /**
     * Dispatches one batch on queue {@code q}: {@code ops[i]} at {@code offsets[i]} of {@code length} bytes (a
     * WRITE's data is {@code fill}), and checks that each completed OK.
     */
    void batch(int q, Op[] ops, long[] offsets, int length, byte fill) throws InterruptedException {
        HardwareQueue hq = layer.queue(q);
        Request[] batch = new Request[ops.length];
        AtomicInteger failed = new AtomicInteger();
        AtomicInteger done = new AtomicInteger();
        for (int i = 0; i < ops.length; i++) {
            Request r = InlineRequests.acquire(hq, ops[i], offsets[i], length, fill, false);
            r.completion = req -> {
                if (req.status() != 0) failed.incrementAndGet();
                done.incrementAndGet();
            };
            batch[i] = r;
        }
        hq.dispatch(batch, batch.length);
        if (done.get() != batch.length || failed.get() != 0) {
            throw new AssertionError("batch on queue " + q + ": " + done.get() + " of " + batch.length
                    + " completed inline, " + failed.get() + " failed");
        }
        for (Request r : batch) {
            r.release();
        }
    }

    /**
     * Dispatches one request on queue {@code q} without waiting for it ({@code done} runs at its completion, and
     * releases it after); a WRITE's data is {@code fill}.
     */
    void start(int q, Op op, long offset, int length, byte fill, Request.Completion done) throws InterruptedException {
        Request r = InlineRequests.acquire(layer.queue(q), op, offset, length, fill, false);
        r.completion = req -> {
            done.completed(req);
            req.release();
        };
        layer.queue(q).dispatch(new Request[] {r}, 1);
    }

    /** One request on queue {@code q}, completed inline (the CPU route): its status. */
    int status(int q, Op op, long offset, int length) throws InterruptedException {
        AtomicInteger status = new AtomicInteger(Integer.MIN_VALUE);
        start(q, op, offset, length, (byte) 0x5a, r -> status.set(r.status()));
        if (status.get() == Integer.MIN_VALUE) {
            throw new AssertionError(op + " at " + offset + " on queue " + q + " did not complete inline");
        }
        return status.get();
    }

    void write(long offset, int length) throws InterruptedException {
        batch(0, new Op[] {Op.WRITE}, new long[] {offset}, length, (byte) 0x5a);
    }

    @Override
    public void close() throws IOException {
        try {
            driver.close(); // the device's region with it
            layer.close();
        } finally {
            bitmaps.close();
        }
    }
}
