package io.pmemblk.bench.dma;

import io.pmemblk.bench.MeasuredRun;
import io.pmemblk.bench.copy.MappedFile;
import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.infra.BenchmarkParams;

/**
 * Writes a batch of blocks from a request buffer into a mapped region through the I/OAT driver and the software
 * device (place {@code batch} copies, one doorbell, wait for all) against {@code MemorySegment.copy} of the same
 * bytes on the calling thread.
 *
 * <p><b>The software engine is not an offload.</b> Its copies run on an engine thread on this machine's own cores,
 * so it can never save CPU: the benchmark shows what the driver/descriptor path costs on top of the copy, and what a
 * hardware engine would have to beat. Read the counters, not only the score:
 * <ul>
 *   <li>{@code mib}: MiB/s copied;</li>
 *   <li>{@code submitterCpuPct}, {@code engineCpuPct}: CPU time of the benchmark (submitting) thread and of the
 *       engine threads, as a percentage of the iteration's wall time (100 = one core busy);</li>
 *   <li>{@code submitterCpuNsPerCopy}, {@code engineCpuNsPerCopy}: the same per copied block.</li>
 * </ul>
 * On a shared VM the hypervisor steals time a thread never sees, so even a thread that never waits may show well
 * under 100%: compare {@code dmaBatch} with {@code cpuCopy}'s {@code submitterCpuPct} in the same run, not with 100.
 * Region mapping, IOVA mapping and engine start happen in {@code @Setup}, outside the measurement.
 */
@AuxCounters(AuxCounters.Type.EVENTS)
@BenchmarkMode(Mode.Throughput)
@OutputTimeUnit(TimeUnit.SECONDS)
public class SoftDmaCopyBenchmark extends MeasuredRun {
    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();

    @Param({"4096", "65536", "2097152"})
    int bytes;

    @Param({"1", "8"})
    int batch;

    @Param({"256"})
    int regionMiB;

    // CPU time per thread over each measured iteration; JMH reports these public fields next to the score
    // (this state is also the @AuxCounters holder so the counters see the engine this trial started).
    public double submitterCpuPct;
    public double engineCpuPct;
    public double submitterCpuNsPerCopy;
    public double engineCpuNsPerCopy;
    private long copies;
    /** JMH sums EVENTS counters over the measured iterations: each iteration contributes its share of the mean. */
    private int measuredIterations;
    private long wallStart, submitterStart, engineStart;

    private Arena arena;
    private MappedFile region;
    private MemorySegment pmem;
    private DmaEngine engine;
    private DmaChannel channel;
    private SoftIoatDevice device;
    private MemorySegment src;
    private long srcIova;
    private long pmemIova;
    private long regionBatches;
    private long nextBatch;
    private final AtomicLong completed = new AtomicLong();

    @Setup(Level.Trial)
    public void setUp(BenchmarkParams params) {
        measuredIterations = Math.max(1, params.getMeasurement().getCount());
        long size = (long) regionMiB << 20;
        long batchBytes = (long) bytes * batch;
        if (size < batchBytes) {
            throw new IllegalArgumentException("regionMiB " + regionMiB + " is smaller than one batch of " + batchBytes + " bytes");
        }
        region = new MappedFile(size);
        pmem = region.memory();
        regionBatches = size / batchBytes;
        arena = Arena.ofShared();
        src = arena.allocate(bytes, 4096);
        src.fill((byte) 0x5a);
        IovaSpace space = new IovaSpace();
        srcIova = space.map(src);
        pmemIova = space.map(pmem);
        engine = DmaEngine.soft(space, 1, 256);
        engine.onCompletion((ctx, status) -> {
            if (status != 0) {
                throw new IllegalStateException("DMA copy failed, CHANERR 0x" + Integer.toHexString(status));
            }
            completed.incrementAndGet();
        });
        channel = engine.channel(0);
        device = engine.softDevice().orElseThrow();
        if (THREADS.isThreadCpuTimeSupported() && !THREADS.isThreadCpuTimeEnabled()) {
            THREADS.setThreadCpuTimeEnabled(true);
        }
    }

    @Setup(Level.Iteration)
    public void startCpuClocks() {
        copies = 0;
        wallStart = System.nanoTime();
        submitterStart = THREADS.getCurrentThreadCpuTime();
        engineStart = device.engineCpuTimeNanos();
    }

    @TearDown(Level.Iteration)
    public void readCpuClocks() {
        double wall = System.nanoTime() - wallStart;
        long submitter = THREADS.getCurrentThreadCpuTime() - submitterStart;
        long eng = device.engineCpuTimeNanos() - engineStart;
        double share = 1.0 / measuredIterations;
        submitterCpuPct = share * 100.0 * submitter / wall;
        engineCpuPct = share * 100.0 * eng / wall;
        submitterCpuNsPerCopy = copies == 0 ? 0 : share * submitter / copies;
        engineCpuNsPerCopy = copies == 0 ? 0 : share * eng / copies;
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        engine.close();
        arena.close();
        region.close();
    }

    /** Bytes copied, reported as MiB/s. */
    @AuxCounters(AuxCounters.Type.OPERATIONS)
    @State(Scope.Thread)
    public static class Throughput {
        public double mib;
    }

    private long nextBatchOffset() {
        long b = nextBatch;
        nextBatch = b + 1 == regionBatches ? 0 : b + 1;
        return b * bytes * batch;
    }

    @Benchmark
    public void dmaBatch(Throughput t) {
        long base = pmemIova + nextBatchOffset();
        long target = completed.get() + batch;
        for (int i = 0; i < batch; i++) {
            if (!channel.place(srcIova, base + (long) i * bytes, bytes, channel)) {
                throw new IllegalStateException("ring full placing copy " + i + " of " + batch);
            }
        }
        channel.submit();
        while (completed.get() < target) {
            channel.poll();
            LockSupport.parkNanos(1_000);
        }
        copies += batch;
        t.mib += (double) bytes * batch / 1048576.0;
    }

    @Benchmark
    public void cpuCopy(Throughput t) {
        long base = nextBatchOffset();
        for (int i = 0; i < batch; i++) {
            MemorySegment.copy(src, 0, pmem, base + (long) i * bytes, bytes);
        }
        copies += batch;
        t.mib += (double) bytes * batch / 1048576.0;
    }
}
