package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.Rig;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.LongStream;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** Properties of the I/OAT driver over the software device; each case is one seed, named on failure. */
class CopyPropertiesTest {
    static final int BUF = 64 * 1024;

    record Copy(int srcOff, int dstOff, int len) {}

    private static final int[] EDGES = {4095, 4096, 4097, 8192, 3 * 4096 + 1};

    static LongStream seeds() {
        return LongStream.range(0, 60).map(i -> 0xC0B1_0000L + i);
    }

    /** A property checked once per seed of {@link #seeds}, each case named by its seed so a failure can be rerun. */
    @Target(ElementType.METHOD)
    @Retention(RetentionPolicy.RUNTIME)
    @ParameterizedTest(name = "seed {0}")
    @MethodSource("io.pmemblk.dma.ioat.CopyPropertiesTest#seeds")
    @interface EachSeed {
    }

    /** Between min and max copies: tiny, medium and page-edge lengths at random offsets. */
    static List<Copy> copies(SplittableRandom rnd, int min, int max) {
        List<Copy> copies = new ArrayList<>();
        for (int n = rnd.nextInt(min, max + 1); n > 0; n--) {
            int l = switch (rnd.nextInt(3)) {
                case 0 -> rnd.nextInt(1, 65);
                case 1 -> rnd.nextInt(1, 9001);
                default -> EDGES[rnd.nextInt(EDGES.length)];
            };
            copies.add(new Copy(rnd.nextInt(BUF - l + 1), rnd.nextInt(BUF - l + 1), l));
        }
        return copies;
    }

    /** Random copies in random batches land exactly as MemorySegment.copy applied in the same order would. */
    @EachSeed
    void randomCopiesMatchAReferenceCopy(long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        List<Copy> copies = copies(rnd, 1, 60);
        int batch = rnd.nextInt(1, 32);
        try (Rig r = new Rig(1, 32, 12, BUF); Arena ref = Arena.ofConfined()) {
            MemorySegment expected = ref.allocate(BUF);
            int placedInBatch = 0;
            for (int i = 0; i < copies.size(); i++) {
                Copy c = copies.get(i);
                r.placeWaiting(r.ch, c.srcOff(), c.dstOff(), c.len(), i);
                MemorySegment.copy(r.src, c.srcOff(), expected, c.dstOff(), c.len());
                if (++placedInBatch >= batch) {
                    r.ch.submit();
                    placedInBatch = 0;
                }
            }
            r.ch.submit();
            r.rec.awaitCount(copies.size());
            assertThat(r.rec.statuses.values()).allMatch(s -> s == 0);
            assertThat(MemorySegment.mismatch(expected, 0, BUF, r.dst, 0, BUF)).isEqualTo(-1);
        }
    }

    /**
     * Whatever descriptor fails, every copy is reported exactly once, copies before the failing one succeed and
     * match the reference, everything from it on carries the error, and the channel works afterwards.
     */
    @EachSeed
    void aFailureAnywhereReportsEveryCopyOnceAndRecovers(long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        List<Copy> copies = copies(rnd, 1, 20);
        int failSeed = rnd.nextInt(1, 1001);
        try (Rig r = new Rig(1, 64, 12, BUF)) {
            r.faults.stall(true);
            int[] lastDescriptor = new int[copies.size()];
            int descriptors = 0;
            for (int i = 0; i < copies.size(); i++) {
                Copy c = copies.get(i);
                assertThat(r.ch.place(r.srcIova + c.srcOff(), r.dstIova + c.dstOff(), c.len(), i)).isTrue();
                descriptors += r.ch.slotsFor(c.len());
                lastDescriptor[i] = descriptors;
            }
            int failAt = 1 + (failSeed - 1) % descriptors;
            int firstFailed = 0;
            while (lastDescriptor[firstFailed] < failAt) {
                firstFailed++;
            }
            r.ch.submit();
            r.faults.failDescriptor(failAt, IoatSpec.CHANERR_READ_DATA);
            r.faults.stall(false);
            r.rec.awaitCount(copies.size());
            for (int i = 0; i < copies.size(); i++) {
                int expectedStatus = i < firstFailed ? 0 : IoatSpec.CHANERR_READ_DATA;
                assertThat(r.rec.status(i)).as("status of copy %d (first failing %d)", i, firstFailed).isEqualTo(expectedStatus);
            }
            assertThat(r.ch.place(r.srcIova, r.dstIova, 10_000, "after")).isTrue();
            r.ch.submit();
            r.rec.awaitCount(copies.size() + 1);
            assertThat(r.rec.status("after")).isZero();
            assertThat(r.mismatch(0, 0, 10_000)).isEqualTo(-1);
            assertThat(r.ch.freeSlots()).isEqualTo(63);
        }
    }
}
