package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.testing.Waits;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
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
}
