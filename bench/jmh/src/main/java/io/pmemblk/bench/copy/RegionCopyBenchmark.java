package io.pmemblk.bench.copy;

import io.pmemblk.pmem.PmemRegion;
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

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/**
 * The region's own copies, the ones the driver's CPU route makes: {@link PmemRegion#write} (fault-safe, and on
 * real pmem non-temporal and drained), a FUA write ({@code write} + {@link PmemRegion#persistWritten}),
 * {@link PmemRegion#read} (fault-safe {@code MemorySegment.copy}) and {@link PmemRegion#zero}, by mapper. Set
 * beside {@link PmemCopyBenchmark}'s bare copies they are what the fault barrier and persistence cost. Allocation
 * per write: run with {@code -prof gc} and read {@code gc.alloc.rate.norm} (0 B/op is the goal on every path):
 * <pre>./scripts/bench-jmh RegionCopy -p bytes=4096 -prof gc</pre>
 * {@code PMEM_IS_PMEM_FORCE=1} in the environment makes the libpmem mapper take the pmem path on tmpfs.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class RegionCopyBenchmark {
    @Param({"4096", "65536", "2097152"})
    int bytes;

    @Param({"JAVA", "LIBPMEM"})
    PmemRegion.Mapper mapper;

    @Param({"256"})
    int regionMiB;

    private Path file;
    private PmemRegion region;
    private Arena arena;
    private MemorySegment buffer;
    private long regionBlocks;
    private long block;

    @AuxCounters(AuxCounters.Type.OPERATIONS)
    @State(Scope.Thread)
    public static class Throughput {
        public double mib;
    }

    @Setup(Level.Trial)
    public void setUp() throws IOException {
        long size = (long) regionMiB << 20;
        if (size < bytes) {
            throw new IllegalArgumentException("regionMiB " + regionMiB + " is smaller than one block of " + bytes + " bytes");
        }
        Path dir = Path.of(System.getProperty(MappedFile.DIR_PROPERTY, "/dev/shm"));
        file = dir.resolve("pmemblk-bench-region-" + ProcessHandle.current().pid() + ".img");
        region = PmemRegion.open(file, size, false, mapper);
        region.memory().fill((byte) 1); // every page faulted in here, not in the measurement
        arena = Arena.ofShared();
        buffer = arena.allocate(bytes, 4096);
        buffer.fill((byte) 0x5a);
        regionBlocks = size / bytes;
    }

    @TearDown(Level.Trial)
    public void tearDown() throws IOException {
        arena.close();
        region.close();
        Files.deleteIfExists(file);
    }

    private long nextOffset() {
        long b = block;
        block = b + 1 == regionBlocks ? 0 : b + 1;
        return b * bytes;
    }

    @Benchmark
    public void write(Throughput t) {
        region.write(buffer, 0, nextOffset(), bytes);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void fuaWrite(Throughput t) throws IOException {
        long off = nextOffset();
        region.write(buffer, 0, off, bytes);
        region.persistWritten(off, bytes);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void read(Throughput t) {
        region.read(nextOffset(), buffer, 0, bytes);
        t.mib += bytes / 1048576.0;
    }

    @Benchmark
    public void zero(Throughput t) {
        region.zero(nextOffset(), bytes);
        t.mib += bytes / 1048576.0;
    }
}
