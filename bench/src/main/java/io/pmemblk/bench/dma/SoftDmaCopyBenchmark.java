package io.pmemblk.bench.dma;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
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
 * Copies through the I/OAT driver and the software device (batch of copies per doorbell, wait for all) against a
 * plain MemorySegment.copy of the same bytes. Reports the soft engine thread's CPU per operation, so the cost of
 * the offload path itself is visible next to the CPU copy.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class SoftDmaCopyBenchmark {
    @Param({"4096", "65536", "1048576"})
    int bytes;

    @Param({"1", "8"})
    int batch;

    private Arena arena;
    private DmaEngine engine;
    private DmaChannel channel;
    private SoftIoatDevice device;
    private MemorySegment src;
    private MemorySegment dst;
    private long srcIova;
    private long dstIova;
    private final AtomicLong completed = new AtomicLong();
    private long engineCpuAtStart;

    @Setup(Level.Trial)
    public void setUp() {
        arena = Arena.ofShared();
        IovaSpace space = new IovaSpace();
        src = arena.allocate((long) bytes * batch, 4096);
        dst = arena.allocate((long) bytes * batch, 4096);
        srcIova = space.map(src);
        dstIova = space.map(dst);
        engine = DmaEngine.soft(space, 1, 256);
        engine.onCompletion((ctx, status) -> {
            if (status != 0) {
                throw new IllegalStateException("DMA copy failed, CHANERR 0x" + Integer.toHexString(status));
            }
            completed.incrementAndGet();
        });
        channel = engine.channel(0);
        device = engine.softDevice().orElseThrow();
        engineCpuAtStart = device.engineCpuTimeNanos();
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        engine.close();
        arena.close();
    }

    @AuxCounters(AuxCounters.Type.EVENTS)
    @State(Scope.Thread)
    public static class EngineCpu {
        public long engineCpuNanos;
    }

    @Benchmark
    public void dmaBatch(EngineCpu cpu) {
        long target = completed.get() + batch;
        for (int i = 0; i < batch; i++) {
            long off = (long) i * bytes;
            if (!channel.place(srcIova + off, dstIova + off, bytes, channel)) {
                throw new IllegalStateException("ring full");
            }
        }
        channel.submit();
        while (completed.get() < target) {
            channel.poll();
            LockSupport.parkNanos(1_000);
        }
        cpu.engineCpuNanos = device.engineCpuTimeNanos() - engineCpuAtStart;
    }

    @Benchmark
    public void cpuCopy() {
        MemorySegment.copy(src, 0, dst, 0, (long) bytes * batch);
    }
}
