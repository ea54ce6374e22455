package io.pmemblk.bench.load;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.Route;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.Routing;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.fail;

/**
 * The load generator over a queue whose buffer pool is far smaller than jobs x iodepth x bs (the shape of
 * {@code pmemblk bench --bs 4M --iodepth 32 --jobs 2} on one queue): the jobs must take turns and finish,
 * never each hold part of what the other waits for, nor wait for buffers their own undispatched or unreaped
 * requests hold.
 */
class LoadGeneratorTest {
    static final long SIZE = 64 << 20;
    static final long BOUND_MILLIS = 60_000;

    @TempDir
    Path dir;

    @ParameterizedTest
    @EnumSource(Route.class)
    void aPoolSmallerThanJobsTimesDepthTimesBlockSizeFinishes(Route route) throws Exception {
        DmaEngine engine = DmaEngine.soft(new IovaSpace(), 1, 512);
        try (PmemBlockDriver driver = new PmemBlockDriver(PmemRegion.open(dir.resolve("d.img"), SIZE, false,
                PmemRegion.Mapper.AUTO), new CopyStats(), engine, Routing.CPU_ONLY);
             // 16 MiB of buffers: four 4 MiB requests, against 2 jobs x 32 deep x 4 MiB = 256 MiB asked for.
             BlockLayer layer = new BlockLayer(driver, 1, 128, 16 << 20, 4 << 20)) {
            assertThat(driver.force(route)).isTrue();
            runBounded(layer);
        }
    }

    private static void runBounded(BlockLayer layer) throws Exception {
        LoadGenerator.Job job = new LoadGenerator.Job(LoadGenerator.Pattern.RANDRW, 4 << 20, 32, 2, 0.3, 0);
        AtomicReference<Object> outcome = new AtomicReference<>();
        Thread runner = Thread.ofPlatform().name("bench-runner").start(() -> {
            try {
                outcome.set(new LoadGenerator(layer).run(job));
            } catch (Throwable t) {
                outcome.set(t);
            }
        });
        runner.join(BOUND_MILLIS);
        if (runner.isAlive()) {
            StringBuilder stacks = new StringBuilder();
            Thread.getAllStackTraces().forEach((t, st) -> {
                if (t.getName().startsWith("bench-job-")) {
                    stacks.append(t.getName()).append(' ').append(t.getState()).append('\n');
                    for (StackTraceElement e : st) {
                        stacks.append("    at ").append(e).append('\n');
                    }
                }
            });
            layer.close(); // wakes the jobs stuck in acquire, so the test run can end
            fail("bench of 2 jobs x 32 x 4 MiB over a 16 MiB pool did not finish within " + BOUND_MILLIS
                    + " ms (" + layer.queue(0).inflight() + " tags held); jobs:\n" + stacks);
        }
        if (outcome.get() instanceof Throwable t) {
            throw new AssertionError("the bench failed", t);
        }
        LoadGenerator.Result r = (LoadGenerator.Result) outcome.get();
        assertThat(r.ops()).as("requests done").isPositive();
        assertThat(r.errors()).isZero();
        assertThat(layer.queue(0).inflight()).as("every tag back").isZero();
    }
}
