package io.pmemblk.pmem.bitmap;

import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.SyncFaults;
import io.pmemblk.pmem.WriteBackFailedException;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Waits;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A bitmap file whose write-back fails (msync EIO; Linux reports it once, to one caller, and marks the pages clean):
 * the bitmap may then have lost bits on its storage, so no write it should cover may reach the device: the write
 * whose bits failed answers EIO, and so does every write after it, even once msync succeeds again.
 */
class BitmapWriteBackTest {
    private static final int BLOCK = 4096;
    private static final long SIZE = 16 << 20;

    @TempDir
    Path dir;

    private final Map<Path, SyncFaults> faults = new ConcurrentHashMap<>();

    private TrackedDevice open(int queues) throws Exception {
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), SIZE, false, PmemRegion.Mapper.JAVA);
        BitmapDirectory files = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir", (p, size) -> {
            SyncFaults.Faulty f = SyncFaults.open(p, size, PmemRegion.Mapper.JAVA);
            faults.put(p, f.faults());
            return f.region();
        });
        return new TrackedDevice(region, files, BLOCK, List.of("b"), queues);
    }

    private SyncFaults bitmapFile() {
        return faults.get(dir.resolve("d.img.bitmaps/b.pbm"));
    }

    private static byte at(TrackedDevice d, long offset) {
        return d.region.memory().get(java.lang.foreign.ValueLayout.JAVA_BYTE, offset);
    }

    @Test
    void aFailedWriteBackOfTheBitsFailsTheWriteAndEveryOneAfterIt() throws Exception {
        TrackedDevice d = open(1);
        try {
            assertThat(d.status(0, Op.WRITE, 1L * BLOCK, BLOCK)).isEqualTo(Status.OK);
            bitmapFile().failNext(1);
            assertThat(d.status(0, Op.WRITE, 2L * BLOCK, BLOCK)).as("the write whose bit's msync failed")
                    .isEqualTo(Status.EIO);
            assertThat(at(d, 2L * BLOCK)).as("the refused write reached the device").isZero();
            assertThat(d.status(0, Op.WRITE, 3L * BLOCK, BLOCK)).as("a write after it, its msync working again"
                    + " (the failure was reported once)").isEqualTo(Status.EIO);
            assertThat(d.status(0, Op.WRITE, 1L * BLOCK, BLOCK)).as("a write whose bit is durable already")
                    .isEqualTo(Status.EIO);
            assertThat(d.status(0, Op.TRIM, 4L * BLOCK, BLOCK)).isEqualTo(Status.EIO);
            assertThat(d.status(0, Op.READ, 1L * BLOCK, BLOCK)).as("reads go on").isEqualTo(Status.OK);
            assertThat(d.driver.receivesInPlace(5L * BLOCK, BLOCK)).as("nothing received in place").isFalse();
            assertThat(d.bitmaps.failure()).contains("could not be made durable", "writes are refused (EIO)",
                    "d.img.bitmaps");
        } finally {
            closeAfterFailure(d);
        }
    }

    /** Closes {@code d}; the bitmap's region says at its close that its write-back failed, as it should. */
    private static void closeAfterFailure(TrackedDevice d) throws IOException {
        try {
            d.close();
        } catch (WriteBackFailedException expected) {
            assertThat(expected).hasMessageContaining("b.pbm");
        }
    }

    /**
     * Two queues persist bits of the same bitmap at once and the kernel reports the write-back failure to one of
     * them only: the other's msync returns 0, though its bits may be in the pages lost. Its write must fail too.
     */
    @Test
    void aPersistBesideTheOneThatFailedIsRefusedToo() throws Exception {
        TrackedDevice d = open(2);
        try {
            SyncFaults f = bitmapFile();
            CountDownLatch inSync = new CountDownLatch(1), release = new CountDownLatch(1);
            AtomicBoolean armed = new AtomicBoolean(true);
            f.beforeEachSync(() -> { // the first msync is held, then fails
                if (!armed.compareAndSet(true, false)) {
                    return false;
                }
                inSync.countDown();
                try {
                    release.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                return true;
            });
            AtomicInteger first = new AtomicInteger(-1), second = new AtomicInteger(-1);
            Thread a = Thread.ofPlatform().name("queue-0").start(() -> {
                try {
                    first.set(d.status(0, Op.WRITE, 2L * BLOCK, BLOCK));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            assertThat(inSync.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS)).as("queue 0 in its msync").isTrue();
            Thread b = Thread.ofPlatform().name("queue-1").start(() -> {
                try {
                    second.set(d.status(1, Op.WRITE, 900L * BLOCK, BLOCK));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            Waits.await("queue 1 to persist its bit or wait for queue 0's",
                    () -> second.get() != -1 || b.getState() == Thread.State.BLOCKED);
            release.countDown();
            Waits.join("queue 0", a);
            Waits.join("queue 1", b);
            assertThat(first.get()).isEqualTo(Status.EIO);
            assertThat(second.get()).as("a write whose bit's msync ran beside the one that failed").isEqualTo(Status.EIO);
            assertThat(at(d, 900L * BLOCK)).as("its data reached the device").isZero();
        } finally {
            closeAfterFailure(d);
        }
    }
}
