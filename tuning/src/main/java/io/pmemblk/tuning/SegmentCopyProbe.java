package io.pmemblk.tuning;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.Route;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * The segment dimension on real parts: {@code size} bytes between a buffer and the region, copied as
 * {@code segments} equal segments or as one, by the driver's own primitives: on the CPU route one region copy
 * per segment ({@link PmemRegion#write}, {@link PmemRegion#read}, as the driver copies a request's chunks); on
 * the DMA route one channel copy per segment placed as a unit, one doorbell, and a DMA write written back
 * ({@link WriteBack#deviceWrote}) as the driver does. A request's segments are its 128 KiB pool chunks, so the
 * block layer cannot make one segment of a larger size: this is where the two forms can be compared alike.
 * One copy at a time, so what differs is the per-segment cost alone.
 *
 * <p>The engine is this probe's own (the device's engine reports its completions to its driver), of the same
 * kind; the probe closes it.
 */
public final class SegmentCopyProbe implements Autotuner.SegmentProbe, AutoCloseable {
    private static final long TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(30);

    private final PmemRegion region;
    private final DmaEngine engine;
    private final DmaChannel channel;
    private final Arena arena = Arena.ofShared();
    /** What writes copy from (a pattern) and, apart, what reads copy into: a read never changes what is written. */
    private final MemorySegment source, sink;
    private final long sourceIova, sinkIova, regionIova;
    private final AtomicInteger reported = new AtomicInteger();
    private final AtomicInteger failed = new AtomicInteger();
    private volatile Thread waiter;
    private final EqualSegments copies = new EqualSegments();

    /** Copies of up to {@code maxSize} bytes on {@code region}, DMA by channel 0 of {@code engine} (owned from here). */
    public SegmentCopyProbe(PmemRegion region, DmaEngine engine, int maxSize) {
        if (maxSize <= 0 || maxSize > region.size()) {
            engine.close();
            throw new IllegalArgumentException("segment probe of " + maxSize + " bytes on a region of " + region.size()
                    + ": allowed 1.." + region.size());
        }
        this.region = region;
        this.engine = engine;
        this.channel = engine.channel(0);
        this.source = arena.allocate(maxSize, 4096);
        this.sink = arena.allocate(maxSize, 4096);
        for (long b = 0; b < maxSize; b++) {
            source.set(ValueLayout.JAVA_BYTE, b, pattern(b)); // not zeroes, as fio does
        }
        this.sourceIova = engine.iovaSpace().map(source);
        this.sinkIova = engine.iovaSpace().map(sink);
        this.regionIova = engine.iovaSpace().map(region.memory());
        engine.onCompletion((ctx, status) -> {
            if (status != 0) {
                failed.incrementAndGet();
            }
            reported.incrementAndGet();
            Thread t = waiter;
            if (t != null) {
                LockSupport.unpark(t);
            }
        });
    }

    @Override
    public Autotuner.Sample measure(Route route, boolean write, int size, int segments, double seconds) {
        if (segments < 1 || size % segments != 0 || size > source.byteSize()) {
            throw new IllegalArgumentException(size + " bytes in " + segments + " segments: allowed: a size up to "
                    + source.byteSize() + " that the segment count divides");
        }
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        long slots = region.size() / size;
        long engine0 = engineCpuNanos(), cpu0 = mx.getCurrentThreadCpuTime(), t0 = System.nanoTime();
        long end = t0 + (long) (seconds * 1e9);
        long copied = 0, i = 0;
        do {
            long offset = (i++ % slots) * size;
            if (route == Route.CPU) {
                byCpu(write, offset, size, segments);
            } else {
                byDma(write, offset, size, segments);
            }
            copied += size;
        } while (System.nanoTime() < end);
        double elapsed = (System.nanoTime() - t0) / 1e9;
        return new Autotuner.Sample(copied / elapsed / (1 << 20), (mx.getCurrentThreadCpuTime() - cpu0) / 1e9 / elapsed,
                (engineCpuNanos() - engine0) / 1e9 / elapsed);
    }

    private void byCpu(boolean write, long offset, int size, int segments) {
        int each = size / segments;
        for (int s = 0; s < segments; s++) {
            long at = (long) s * each;
            if (write) {
                region.write(source, at, offset + at, each);
            } else {
                region.read(offset + at, sink, at, each);
            }
        }
    }

    private void byDma(boolean write, long offset, int size, int segments) {
        copies.set(write ? sourceIova : regionIova + offset, write ? regionIova + offset : sinkIova, size / segments,
                segments);
        int before = reported.get();
        if (!channel.placeAll(copies, copies)) {
            throw new IllegalStateException("DMA ring has no room for " + segments + " copies of " + size / segments
                    + " bytes; allowed: a segment count the ring holds (dma.ring-size)");
        }
        channel.submit();
        long deadline = System.nanoTime() + TIMEOUT_NANOS;
        waiter = Thread.currentThread();
        try {
            while (reported.get() - before < segments) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new IllegalStateException("DMA channel reported " + (reported.get() - before) + " of "
                            + segments + " copies within " + TimeUnit.NANOSECONDS.toSeconds(TIMEOUT_NANOS) + " s");
                }
                LockSupport.parkNanos(this, left);
            }
        } finally {
            waiter = null;
        }
        if (failed.get() != 0) {
            throw new IllegalStateException("DMA channel failed " + failed.get() + " copies of the segment probe");
        }
        if (write) {
            try {
                region.writeBack().deviceWrote(offset, size, false);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    /** The byte at {@code i} of what the probe writes. */
    static byte pattern(long i) {
        return (byte) (i * 31 + 7);
    }

    private long engineCpuNanos() {
        return engine.softDevice().map(d -> d.engineCpuTimeNanos()).orElse(0L);
    }

    /** Closes the engine (draining it), then frees the buffers. */
    @Override
    public void close() {
        try {
            engine.close();
        } finally {
            arena.close();
        }
    }

    /** {@code count} copies of {@code length} bytes, back to back from src and dst: reused, nothing per copy. */
    private static final class EqualSegments implements DmaChannel.Copies {
        private long src, dst;
        private int length, count;

        void set(long src, long dst, int length, int count) {
            this.src = src;
            this.dst = dst;
            this.length = length;
            this.count = count;
        }

        @Override
        public int count() {
            return count;
        }

        @Override
        public long srcIova(int i) {
            return src + (long) i * length;
        }

        @Override
        public long dstIova(int i) {
            return dst + (long) i * length;
        }

        @Override
        public long length(int i) {
            return length;
        }
    }
}
