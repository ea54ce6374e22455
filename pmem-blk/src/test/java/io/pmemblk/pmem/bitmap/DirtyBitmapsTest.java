package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.Op;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class DirtyBitmapsTest {
    private static final long SIZE = 16 << 20;
    private static final long G = 64 << 10;

    @TempDir
    Path dir;

    private static List<Long> dirty(BitmapFile f) {
        List<Long> l = new ArrayList<>();
        for (long b = 0; b < f.blocks(); b++) {
            if (f.dirty(b)) l.add(b);
        }
        return l;
    }

    @Test
    void writesZeroesAndTrimsMarkEveryBlockTheyTouchReadsAndFlushesNone() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.batch(0, new Op[] {Op.WRITE, Op.READ, Op.WRITE_ZEROES, Op.TRIM, Op.FLUSH},
                    new long[] {G - 512, 5 * G, 9 * G, 20 * G + 4096, 0}, 1024, (byte) 1);
            // a write across a block boundary marks both blocks; the read at 5 and the flush at 0 mark nothing
            assertThat(dirty(d.bitmaps.find("b"))).containsExactly(0L, 1L, 9L, 20L);
        }
    }

    @Test
    void bitmapsSurviveARestartAndAHeaderOfAnotherDeviceIsRefusedByName() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.write(3 * G, 4096);
        }
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of(), 1)) {
            assertThat(dirty(d.bitmaps.find("b"))).containsExactly(3L);
        }
        try (BitmapDirectory other = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir",
                io.pmemblk.pmem.PmemRegion.Mapper.JAVA)) {
            assertThatThrownBy(() -> DirtyBitmaps.open(other, SIZE * 2, G, List.of(), 1))
                    .isInstanceOf(IOException.class)
                    .hasMessageContaining("bitmap 'b'")
                    .hasMessageContaining("was made for a device of " + SIZE + " bytes; this one has " + SIZE * 2);
        }
    }

    @Test
    void aDamagedHeaderIsRefusedNotReinterpreted() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.write(0, 4096);
        }
        Path f = dir.resolve("d.img.bitmaps/b.pbm");
        byte[] bytes = Files.readAllBytes(f);
        bytes[24] ^= 1; // the granularity's low byte: the checksum no longer matches
        Files.write(f, bytes);
        assertThatThrownBy(() -> TrackedDevice.open(dir, SIZE, G, List.of(), 1))
                .hasMessageContaining("b.pbm: header checksum")
                .hasMessageContaining("the header is damaged");
    }

    @Test
    void badNamesAndGranularitiesAreRefusedSayingWhatIsAllowed() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of(), 1)) {
            assertThatThrownBy(() -> d.bitmaps.add("../x", G)).hasMessage(
                    "bitmap name '../x'; allowed: 1 to 64 of A-Z a-z 0-9 _ -");
            assertThatThrownBy(() -> d.bitmaps.add("b", 3000)).hasMessageContaining(
                    "granularity 3000; allowed: a power of two from 512 to 1073741824 bytes");
            d.bitmaps.add("b", G);
            assertThatThrownBy(() -> d.bitmaps.add("b", G)).hasMessage("bitmap 'b' exists already");
            assertThatThrownBy(() -> d.bitmaps.checkpoint("nope")).hasMessage("no bitmap named 'nope'; there are b");
        }
        assertThatThrownBy(() -> TrackedDevice.open(dir, SIZE, 4096, List.of("b"), 1))
                .hasMessageContaining("bitmap 'b'").hasMessageContaining("has a granularity of 65536 bytes,"
                        + " bitmap.granularity is 4096");
    }

    @Test
    void aCheckpointFreezesTheBitsAndItsSuccessorTakesTheWritesAfterIt() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.write(1 * G, 4096);
            assertThat(d.bitmaps.checkpoint("b")).isEqualTo("b@1");
            d.write(2 * G, 4096);
            assertThat(dirty(d.bitmaps.find("b@1"))).containsExactly(1L);
            assertThat(dirty(d.bitmaps.find("b"))).containsExactly(2L);
            assertThat(d.bitmaps.find("b").header().generation()).isEqualTo(2);
            assertThatThrownBy(() -> d.bitmaps.checkpoint("b@1")).hasMessageContaining("is frozen");
            d.bitmaps.clear("b");
            assertThat(dirty(d.bitmaps.find("b"))).isEmpty();
            d.bitmaps.remove("b");
            d.bitmaps.add("b", G);
            assertThat(d.bitmaps.checkpoint("b")).as("a new b never freezes over the kept b@1").isEqualTo("b@2");
            assertThat(dirty(d.bitmaps.find("b@1"))).containsExactly(1L);
            d.bitmaps.remove("b@1");
            d.bitmaps.remove("b@2");
            assertThat(d.bitmaps.names()).containsExactly("b");
        }
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of(), 1)) {
            assertThat(d.bitmaps.list()).extracting(DirtyBitmaps.Info::name).containsExactly("b");
        }
    }

    @Test
    void aCheckpointInterruptedBeforeTheFreezeIsUndoneWithNoBitLost() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.write(1 * G, 4096);
        }
        // as a crash after the successor was created and written, before the first rename
        try (BitmapDirectory files = BitmapDirectory.open(dir.resolve("d.img.bitmaps"), "bitmap.dir",
                io.pmemblk.pmem.PmemRegion.Mapper.JAVA);
             BitmapFile next = files.create("b" + DirtyBitmaps.NEXT, new BitmapHeader(SIZE, G, 2))) {
            next.set(7 * G, 1);
            next.persist(7 * G, 7 * G + 1);
        }
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of(), 1)) {
            assertThat(d.bitmaps.names()).containsExactly("b");
            assertThat(dirty(d.bitmaps.find("b"))).containsExactly(1L, 7L);
            assertThat(d.bitmaps.find("b").header().generation()).isEqualTo(1);
        }
        assertThat(dir.resolve("d.img.bitmaps/b.next")).doesNotExist();
    }

    @Test
    void aCheckpointInterruptedAfterTheFreezeIsFinished() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of("b"), 1)) {
            d.write(1 * G, 4096);
        }
        Path files = dir.resolve("d.img.bitmaps");
        Files.move(files.resolve("b.pbm"), files.resolve("b@1.pbm"));
        try (BitmapDirectory held = BitmapDirectory.open(files, "bitmap.dir", io.pmemblk.pmem.PmemRegion.Mapper.JAVA);
             BitmapFile next = held.create("b" + DirtyBitmaps.NEXT, new BitmapHeader(SIZE, G, 2))) {
            next.set(7 * G, 1);
            next.persist(7 * G, 7 * G + 1);
        }
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, G, List.of(), 1)) {
            assertThat(d.bitmaps.names()).containsExactly("b", "b@1");
            assertThat(dirty(d.bitmaps.find("b@1"))).containsExactly(1L);
            assertThat(dirty(d.bitmaps.find("b"))).containsExactly(7L);
        }
    }

    @Test
    void runsOfBlocksAreFoundWordByWord() throws Exception {
        try (TrackedDevice d = TrackedDevice.open(dir, SIZE, 4096, List.of("b"), 1)) {
            d.write(60 * 4096, 10 * 4096); // blocks 60..69, across a word
            BitmapFile f = d.bitmaps.find("b");
            assertThat(f.run(0, f.blocks())).as("clean to 60").isEqualTo(60);
            assertThat(f.run(60, f.blocks())).as("dirty to 70").isEqualTo(-70);
            assertThat(f.run(65, 66)).isEqualTo(-66);
            assertThat(f.run(70, f.blocks())).isEqualTo(f.blocks());
            assertThat(f.runAt(0, 100 * 4096)).isEqualTo(60 * 4096);
            assertThat(f.runAt(61 * 4096 + 7, 100 * 4096)).isEqualTo(-70 * 4096);
        }
    }

    /**
     * A run asked for while a write marks its first block: clean up to the next dirty block, or dirty to the end of
     * the dirty blocks after it, and never clean over blocks that were dirty before (an incremental backup reading
     * the bitmap over NBD would skip them), nor of no length. The state and the run were read apart once: a mark
     * between the two reads gave exactly that. Each group is a word: block 0 clean, 1..32 dirty before it starts;
     * a writer marks block 0 of group after group while a reader asks for the run at that block.
     */
    @Test
    void aRunAskedForWhileAWriteMarksItIsOneStateFromOneRead() throws Exception {
        long size = 1L << 30; // 262144 blocks of 4 KiB: 4096 groups of 64
        try (TrackedDevice d = TrackedDevice.open(dir, size, 4096, List.of("b"), 1)) {
            BitmapFile f = d.bitmaps.find("b");
            int groups = (int) (f.blocks() / 64);
            for (int g = 0; g < groups; g++) {
                f.set((64L * g + 1) * 4096, 32 * 4096);
            }
            java.util.concurrent.atomic.AtomicInteger marking = new java.util.concurrent.atomic.AtomicInteger(-1);
            java.util.concurrent.atomic.AtomicReference<String> wrong = new java.util.concurrent.atomic.AtomicReference<>();
            Thread reader = Thread.ofPlatform().start(() -> {
                for (int g = 0; g < groups && wrong.get() == null; ) {
                    int now = marking.get();
                    if (now < g) {
                        Thread.onSpinWait();
                        continue;
                    }
                    long base = 64L * g;
                    long run = f.run(base, base + 64);
                    long want = BitmapFile.isDirtyRun(run) ? base + 33 : base + 1;
                    if (BitmapFile.runEnd(run) != want) {
                        wrong.compareAndSet(null, "group " + g + ": run " + run + ", want " + (BitmapFile.isDirtyRun(run)
                                ? "dirty" : "clean") + " to " + want);
                    }
                    if (now > g || BitmapFile.isDirtyRun(run)) {
                        g++;
                    }
                }
            });
            for (int g = 0; g < groups; g++) {
                marking.set(g);
                for (int spin = 0; spin < 200; spin++) {
                    Thread.onSpinWait(); // the reader asks meanwhile
                }
                f.set(64L * g * 4096, 4096);
            }
            marking.set(groups);
            reader.join(60_000);
            assertThat(reader.isAlive()).as("the reader finished").isFalse();
            assertThat(wrong.get()).as("every run one state, from one read").isNull();
        }
    }
}
