package io.pmemblk.bench.copy;

import io.pmemblk.pmem.PmemRegion;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.TearDown;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The region's own copies, the ones the driver's CPU route makes: {@link PmemRegion#write} (fault-safe, and on
 * real pmem non-temporal and drained), a FUA write ({@code write} + {@link WriteBack#persistWritten}),
 * {@link PmemRegion#read} (fault-safe {@code MemorySegment.copy}) and {@link PmemRegion#zero}, by mapper. Set
 * beside {@link PmemCopyBenchmark}'s bare copies they are what the fault barrier and persistence cost. Allocation
 * per write: run with {@code -prof gc} and read {@code gc.alloc.rate.norm} (0 B/op is the goal on every path):
 * <pre>./scripts/bench-jmh RegionCopy -p bytes=4096 -prof gc</pre>
 * {@code PMEM_IS_PMEM_FORCE=1} in the environment makes the libpmem mapper take the pmem path on tmpfs.
 */
public class RegionCopyBenchmark extends BlockWalk {
    @Param({"JAVA", "LIBPMEM"})
    public PmemRegion.Mapper mapper;

    private Path file;
    private PmemRegion region;

    @Setup(Level.Trial)
    public void setUp() throws IOException {
        long size = buffer();
        Path dir = Path.of(System.getProperty(MappedFile.DIR_PROPERTY, "/dev/shm"));
        file = dir.resolve("pmemblk-bench-region-" + ProcessHandle.current().pid() + ".img");
        region = PmemRegion.open(file, size, false, mapper);
        region.memory().fill((byte) 1); // every page faulted in here, not in the measurement
    }

    @TearDown(Level.Trial)
    public void tearDown() throws IOException {
        arena.close();
        region.close();
        Files.deleteIfExists(file);
    }

    @Benchmark
    public void write(Throughput t) {
        region.write(buffer, 0, nextOffset(), bytes);
        t.add(bytes);
    }

    @Benchmark
    public void fuaWrite(Throughput t) throws IOException {
        long off = nextOffset();
        region.write(buffer, 0, off, bytes);
        region.writeBack().persistWritten(off, bytes);
        t.add(bytes);
    }

    @Benchmark
    public void read(Throughput t) {
        region.read(nextOffset(), buffer, 0, bytes);
        t.add(bytes);
    }

    @Benchmark
    public void zero(Throughput t) {
        region.zero(nextOffset(), bytes);
        t.add(bytes);
    }
}
