package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.testing.Waits;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemRegion;

import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicReference;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Writers on every queue race checkpoints: each block is written once, so each must be in exactly one bitmap of
 * the chain (the frozen ones as they were when their checkpoint returned, and the active one at the end), and a
 * frozen bitmap never changes after its checkpoint returned.
 */
class CheckpointRaceTest {
    private static final int QUEUES = 4, BLOCK = 4096, BATCH = 8;
    private static final long SIZE = 64 << 20;
    private static final int BLOCKS = (int) (SIZE / BLOCK);

    @TempDir
    Path dir;

    private static BitSet bits(BitmapFile f) {
        BitSet s = new BitSet();
        for (long b = 0; b < f.blocks(); b++) {
            if (f.dirty(b)) s.set((int) b);
        }
        return s;
    }

    @Test
    void everyWriteIsInExactlyOneBitmapAndAFrozenBitmapNeverChanges() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, BLOCK, List.of("b"), QUEUES)) {
            AtomicReference<Throwable> failed = new AtomicReference<>();
            List<Thread> writers = new ArrayList<>();
            for (int q = 0; q < QUEUES; q++) {
                int queue = q;
                writers.add(Thread.ofPlatform().name("writer-" + q).start(() -> {
                    List<Integer> mine = new ArrayList<>();
                    for (int b = queue; b < BLOCKS; b += QUEUES) mine.add(b);
                    Collections.shuffle(mine, new Random(queue));
                    Op[] ops = new Op[BATCH];
                    java.util.Arrays.fill(ops, Op.WRITE);
                    long[] offsets = new long[BATCH];
                    try {
                        for (int i = 0; i < mine.size(); i += BATCH) {
                            for (int k = 0; k < BATCH; k++) offsets[k] = (long) mine.get(i + k) * BLOCK;
                            d.batch(queue, ops, offsets, BLOCK, (byte) 7);
                        }
                    } catch (Throwable t) {
                        failed.compareAndSet(null, t);
                    }
                }));
            }
            List<String> frozen = new ArrayList<>();
            List<BitSet> atFreeze = new ArrayList<>();
            while (writers.stream().anyMatch(Thread::isAlive)) {
                String f = d.bitmaps.checkpoint("b");
                frozen.add(f);
                atFreeze.add(bits(d.bitmaps.find(f)));
            }
            for (Thread t : writers) Waits.join("writer", t);
            assertThat(failed.get()).as("a writer failed").isNull();
            assertThat(frozen).as("checkpoints taken while the writers ran").hasSizeGreaterThan(2);

            BitSet seen = new BitSet();
            for (int i = 0; i < frozen.size(); i++) {
                BitSet now = bits(d.bitmaps.find(frozen.get(i)));
                assertThat(now).as(frozen.get(i) + " changed after its checkpoint returned").isEqualTo(atFreeze.get(i));
                BitSet both = (BitSet) seen.clone();
                both.and(now);
                assertThat(both).as("blocks in " + frozen.get(i) + " and an earlier bitmap").isEqualTo(new BitSet());
                seen.or(now);
            }
            BitSet last = bits(d.bitmaps.find("b"));
            BitSet both = (BitSet) seen.clone();
            both.and(last);
            assertThat(both).as("blocks in the active bitmap and a frozen one").isEqualTo(new BitSet());
            seen.or(last);
            BitSet missing = new BitSet();
            missing.set(0, BLOCKS);
            missing.andNot(seen);
            assertThat(missing).as("blocks written but in no bitmap").isEqualTo(new BitSet());
        }
    }

    /**
     * A writer stopped between persisting its bit in the bitmap and reaching the device (where a preempted thread
     * could be) while a checkpoint runs: the checkpoint must not return before that write completes, or a backup
     * reading the frozen bitmap at once could copy the block before the write lands, and the successor would not
     * have it either.
     */
    @Test
    void aCheckpointReturnsOnlyOnceTheWritesItFrozeHaveCompleted() throws Exception {
        java.util.Map<Path, CrashModel> models = new java.util.concurrent.ConcurrentHashMap<>();
        BitmapDirectory files = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir", (p, size) -> {
            CrashModel.Modelled m = CrashModel.open(p, size, PmemRegion.Mapper.JAVA);
            models.put(p, m.model());
            return m.region();
        });
        PmemRegion region = PmemRegion.open(dir.resolve("d.img"), SIZE, false, PmemRegion.Mapper.JAVA);
        try (TrackedDevice d = new TrackedDevice(region, files, BLOCK, List.of("b"), 1)) {
            AtomicBoolean armed = new AtomicBoolean(true);
            CountDownLatch held = new CountDownLatch(1), release = new CountDownLatch(1);
            models.get(dir.resolve("d.img.bitmaps/b.pbm")).afterEachStep(() -> {
                if (armed.compareAndSet(true, false)) {
                    held.countDown();
                    try {
                        release.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
            });
            AtomicInteger order = new AtomicInteger();
            AtomicInteger writeDone = new AtomicInteger(), checkpointDone = new AtomicInteger();
            AtomicReference<Throwable> failed = new AtomicReference<>();
            Thread writer = Thread.ofPlatform().name("writer").start(() -> {
                try {
                    d.write(5L * BLOCK, BLOCK);
                    writeDone.set(order.incrementAndGet());
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            assertThat(held.await(Waits.BOUND.toSeconds(), TimeUnit.SECONDS)).as("writer persisted its bit").isTrue();
            AtomicReference<String> frozen = new AtomicReference<>();
            Thread checkpoint = Thread.ofPlatform().name("checkpoint").start(() -> {
                try {
                    frozen.set(d.bitmaps.checkpoint("b"));
                    checkpointDone.set(order.incrementAndGet());
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            // until the checkpoint waits for the grace period, or (wrongly) returns without waiting
            Waits.await("the checkpoint to wait for the write or return", () -> checkpointDone.get() != 0
                    || java.util.Arrays.stream(checkpoint.getStackTrace())
                            .anyMatch(f -> f.getClassName().equals(Grace.class.getName()) && f.getMethodName().equals("await")));
            assertThat(checkpointDone.get()).as("checkpoint returned while the write it froze was in flight").isZero();
            release.countDown();
            Waits.join("writer", writer);
            Waits.join("checkpoint", checkpoint);
            assertThat(failed.get()).isNull();
            assertThat(writeDone.get()).as("order of the write's completion and the checkpoint's return")
                    .isLessThan(checkpointDone.get());
            assertThat(d.bitmaps.find(frozen.get()).dirty(5)).isTrue();
            assertThat(d.bitmaps.find("b").dirty(5)).isFalse();
        }
    }
}
