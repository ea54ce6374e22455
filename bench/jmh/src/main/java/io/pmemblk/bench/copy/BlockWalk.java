package io.pmemblk.bench.copy;

import io.pmemblk.bench.MeasuredRun;

import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.State;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.TimeUnit;

/**
 * What the copy benchmarks share (JMH inherits the annotations and parameters): a request-sized buffer,
 * allocated once and hot in cache like a registered buffer, and a walk through a region larger than the
 * last-level cache, one block per operation, so the region side is mostly not in cache (as on a block
 * device). The {@code mib} counter is the copy throughput in MiB/s. Subclasses map the region in their
 * {@code @Setup} and call {@link #buffer()}.
 */
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
public abstract class BlockWalk extends MeasuredRun {
    @Param({"4096", "65536", "2097152"})
    public int bytes;

    /** The region the offset walks through: larger than the last-level cache by default. */
    @Param({"256"})
    public int regionMiB;

    protected Arena arena;
    protected MemorySegment buffer;
    private long regionBlocks;
    private long block;

    /** Bytes copied, reported by JMH as MiB per second next to the operations per second. */
    @AuxCounters(AuxCounters.Type.OPERATIONS)
    @State(Scope.Thread)
    public static class Throughput {
        public double mib;

        void add(int bytes) {
            mib += bytes / 1048576.0;
        }
    }

    /** The region's size, checked against one block; allocates the buffer. */
    protected long buffer() {
        long size = (long) regionMiB << 20;
        if (size < bytes) {
            throw new IllegalArgumentException("regionMiB " + regionMiB + " is smaller than one block of " + bytes + " bytes");
        }
        arena = Arena.ofShared();
        buffer = arena.allocate(bytes, 4096);
        buffer.fill((byte) 0x5a);
        regionBlocks = size / bytes;
        return size;
    }

    protected final long nextOffset() {
        long b = block;
        block = b + 1 == regionBlocks ? 0 : b + 1;
        return b * bytes;
    }
}
