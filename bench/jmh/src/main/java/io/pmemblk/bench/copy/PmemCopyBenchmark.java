package io.pmemblk.bench.copy;

import io.pmemblk.pmem.Libpmem;
import java.lang.foreign.MemorySegment;
import io.pmemblk.posix.Mman;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

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
 * The walk and the counters are {@link BlockWalk}'s. Mapping, pre-faulting and buffer allocation happen in
 * {@code @Setup}, outside the measurement.
 */
public class PmemCopyBenchmark extends BlockWalk {
    private MappedFile region;
    private MemorySegment pmem;

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
        region = new MappedFile(buffer());
        pmem = region.memory();
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        arena.close();
        region.close();
    }

    @Benchmark
    public void segmentCopyWrite(Throughput t) {
        MemorySegment.copy(buffer, 0, pmem, nextOffset(), bytes);
        t.add(bytes);
    }

    @Benchmark
    public void segmentCopyRead(Throughput t) {
        MemorySegment.copy(pmem, nextOffset(), buffer, 0, bytes);
        t.add(bytes);
    }

    /** glibc's memcpy (ERMS or non-temporal stores on long copies), which a fault inside kills the JVM. */
    @Benchmark
    public void libcMemcpyRead(Throughput t) {
        Mman.memcpy(buffer, pmem.asSlice(nextOffset(), bytes));
        t.add(bytes);
    }

    @Benchmark
    public void libpmemNonTemporalWrite(Pmem p, Throughput t) {
        p.lib.memcpy(pmem.asSlice(nextOffset(), bytes), buffer,
                Libpmem.PMEM_F_MEM_NONTEMPORAL | Libpmem.PMEM_F_MEM_NODRAIN);
        t.add(bytes);
    }

    @Benchmark
    public void libpmemNonTemporalWriteDrained(Pmem p, Throughput t) {
        p.lib.memcpy(pmem.asSlice(nextOffset(), bytes), buffer,
                Libpmem.PMEM_F_MEM_NONTEMPORAL | Libpmem.PMEM_F_MEM_NODRAIN);
        p.lib.drain();
        t.add(bytes);
    }
}
