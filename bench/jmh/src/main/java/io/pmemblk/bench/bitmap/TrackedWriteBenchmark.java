package io.pmemblk.bench.bitmap;

import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.bitmap.BitmapDirectory;
import io.pmemblk.pmem.bitmap.DirtyBitmaps;
import io.pmemblk.pmem.bitmap.TrackingDriver;
import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * The block layer's 4 KiB write path with one dirty bitmap against none, in isolation from sockets and the
 * kernel: the real stack a server builds (pmem driver on the CPU route, the tracking layer, the block layer), one
 * frontend submitting batches of {@link #BATCH} random writes and completing them inline, as an NBD connection at
 * queue depth 32 does. {@code route=inPlace} is NBD's: each write is received straight into the device
 * ({@link FrontendQueue#acquireWrite}); {@code route=pool} is the load generator's and ublk's: the payload sits in
 * the queue's buffers and the driver copies it. Every block's bit is already durable after the warm-up, as in a
 * long run: what is left is the tracking layer's per-write cost. Allocation per write: {@code -prof gc}.
 * <pre>./scripts/bench-jmh TrackedWrite -prof gc</pre>
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public class TrackedWriteBenchmark {
    /** Writes per batch: fio's iodepth in the NBD job. */
    public static final int BATCH = 32;
    private static final int BLOCK = 4096;
    private static final int OFFSETS = 1 << 16;

    /** none: the pmem driver alone; one: the tracking layer with one bitmap. */
    @Param({"none", "one"})
    public String bitmaps;

    /** inPlace: received straight into the device (NBD); pool: copied from the queue's buffers. */
    @Param({"inPlace", "pool"})
    public String route;

    @Param({"256"})
    public int deviceMiB;

    private Path dir;
    private PmemRegion region;
    private DirtyBitmaps dirty;
    private BlockDriver driver;
    private BlockLayer layer;
    private FrontendQueue frontend;
    private final long[] offsets = new long[OFFSETS];
    private int next;
    private boolean inPlace;
    private int completed;
    /** Releases each write as a frontend's reply would, once it has completed. */
    private final Request.Completion done = r -> {
        completed++;
        r.release();
    };

    @Setup(Level.Trial)
    public void setUp() throws IOException {
        long size = (long) deviceMiB << 20;
        dir = Files.createTempDirectory(Path.of("/dev/shm"), "pmemblk-bench-bitmap-");
        region = PmemRegion.open(dir.resolve("d.img"), size, false, PmemRegion.Mapper.JAVA);
        region.memory().fill((byte) 1); // every page faulted in here, not in the measurement
        BlockDriver pmem = new PmemBlockDriver(region, new CopyStats());
        if (bitmaps.equals("one")) {
            BitmapDirectory files = BitmapDirectory.open(dir.resolve("bitmaps"), "bitmap.dir", PmemRegion.Mapper.JAVA);
            dirty = DirtyBitmaps.open(files, size, 64 << 10, List.of("b"), 1);
            driver = new TrackingDriver(pmem, dirty);
        } else {
            driver = pmem;
        }
        layer = new BlockLayer(driver, 1, 2 * BATCH, 8 << 20, 1 << 20);
        frontend = new FrontendQueue(layer.queue(0));
        inPlace = route.equals("inPlace");
        SplittableRandom random = new SplittableRandom(1);
        for (int i = 0; i < OFFSETS; i++) {
            offsets[i] = random.nextLong(size / BLOCK) * BLOCK;
        }
    }

    @TearDown(Level.Trial)
    public void tearDown() throws IOException {
        try {
            driver.close();
            layer.close();
            if (dirty != null) {
                dirty.close();
            }
        } finally {
            try (Stream<Path> files = Files.walk(dir)) {
                for (Path p : files.sorted(Comparator.reverseOrder()).toList()) {
                    Files.deleteIfExists(p);
                }
            }
        }
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public int writeBatch() throws InterruptedException {
        int before = completed;
        for (int k = 0; k < BATCH; k++) {
            long offset = offsets[next];
            next = (next + 1) & (OFFSETS - 1);
            Request r;
            if (inPlace) {
                r = frontend.acquireWrite(offset, BLOCK);
            } else {
                r = frontend.acquire(BLOCK);
                r.op = Op.WRITE;
                r.offset = offset;
            }
            // the payload's first bytes, as a socket read would start it: the copy itself is not the subject here
            ByteBuffer b = r.dataBuffers()[0];
            b.putLong(b.position(), offset);
            r.completion = done;
            frontend.add(r);
        }
        frontend.dispatch();
        int n = completed - before;
        if (n != BATCH) {
            throw new IllegalStateException(n + " of " + BATCH + " writes completed inline (the CPU route completes"
                    + " on the dispatching thread)");
        }
        return n;
    }
}
