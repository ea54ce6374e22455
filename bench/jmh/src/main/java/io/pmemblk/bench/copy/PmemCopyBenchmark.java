package io.pmemblk.bench.copy;

import io.pmemblk.pmem.Libpmem;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The CPU copy paths between a request buffer (off-heap, allocated once, hot in cache like a registered NBD buffer)
 * and a mapped file region standing in for pmem, at the seed workloads' block sizes:
 * <ul>
 *   <li>{@link #segmentCopyWrite} / {@link #segmentCopyRead}: {@code MemorySegment.copy}, what the server does when
 *       the region is not real pmem (and for every read);</li>
 *   <li>{@link #libpmemNonTemporalWrite}: {@code pmem_memcpy} with {@code PMEM_F_MEM_NONTEMPORAL | NODRAIN}, the
 *       write path on real pmem (stores bypass the cache; a FLUSH drains them later);</li>
 *   <li>{@link #libpmemNonTemporalWriteDrained}: the same copy with {@code pmem_drain} after each, what a writer
 *       that drains its own stores pays per write (the two side by side are the drain's cost).</li>
 * </ul>
 * Each operation moves to the next block of the region, wrapping at {@code regionMiB}, so the region side is
 * mostly not in cache (as on a block device). The {@code mib} counter is the copy throughput in MiB/s.
 * Mapping, pre-faulting and buffer allocation happen in {@code @Setup}, outside the measurement.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class PmemCopyBenchmark {
    @Param({"4096", "65536", "2097152"})
    int bytes;

    /** The region the destination offset walks through: larger than the last-level cache by default. */
    @Param({"256"})
    int regionMiB;

    private Arena arena;
    private MappedFile region;
    private MemorySegment pmem;
    private MemorySegment buffer;
    private long regionBlocks;
    private long block;

    /** Bytes copied, reported by JMH as MiB per second next to the operations per second. */
    @AuxCounters(AuxCounters.Type.OPERATIONS)
    @State(Scope.Thread)
    public static class Throughput {
        public double mib;
    }

    /** libpmem, or a setup failure that says why it is missing (JMH then skips only the libpmem benchmark). */
    @State(Scope.Benchmark)
    public static class Pmem {
        Libpmem lib;

        @Setup(Level.Trial)
        public void load() {
            lib = Libpmem.load().orElseThrow(() -> new IllegalStateException(
                    "SKIPPED libpmemNonTemporalWrite: " + Libpmem.unavailableReason()
                            + " (apt-get install libpmem1); the MemorySegment.copy benchmarks still run"));
        }
    }

    @Setup(Level.Trial)
    public void setUp() {
        long size = (long) regionMiB << 20;
        if (size < bytes) {
            throw new IllegalArgumentException("regionMiB " + regionMiB + " is smaller than one block of " + bytes + " bytes");
        }
        region = new MappedFile(size);
        pmem = region.memory();
        arena = Arena.ofShared();
        buffer = arena.allocate(bytes, 4096);
        buffer.fill((byte) 0x5a);
        regionBlocks = size / bytes;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        arena.close();
        region.close();
    }

    private long nextOffset() {
        long b = block;
        block = b + 1 == regionBlocks ? 0 : b + 1;
        return b * bytes;
    }

    @Benchmark
    public void segmentCopyWrite(Throughput t) {
        MemorySegment.copy(buffer, 0, pmem, nextOffset(), bytes);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void segmentCopyRead(Throughput t) {
        MemorySegment.copy(pmem, nextOffset(), buffer, 0, bytes);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void libpmemNonTemporalWrite(Pmem p, Throughput t) {
        p.lib.memcpy(pmem.asSlice(nextOffset(), bytes), buffer,
                Libpmem.PMEM_F_MEM_NONTEMPORAL | Libpmem.PMEM_F_MEM_NODRAIN);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void libpmemNonTemporalWriteDrained(Pmem p, Throughput t) {
        p.lib.memcpy(pmem.asSlice(nextOffset(), bytes), buffer,
                Libpmem.PMEM_F_MEM_NONTEMPORAL | Libpmem.PMEM_F_MEM_NODRAIN);
        p.lib.drain();
        t.mib += bytes / 1048576.0;
    }
}
