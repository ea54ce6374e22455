package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.Rig;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.List;
import net.jqwik.api.Arbitraries;
import net.jqwik.api.Arbitrary;
import net.jqwik.api.Combinators;
import net.jqwik.api.ForAll;
import net.jqwik.api.From;
import net.jqwik.api.Property;
import net.jqwik.api.Provide;
import net.jqwik.api.constraints.IntRange;
import net.jqwik.api.constraints.Size;

class CopyPropertiesTest {
    static final int BUF = 64 * 1024;

    record Copy(int srcOff, int dstOff, int len) {}

    @Provide
    Arbitrary<Copy> copies() {
        Arbitrary<Integer> len = Arbitraries.oneOf(
                Arbitraries.integers().between(1, 64),
                Arbitraries.integers().between(1, 9000),
                Arbitraries.of(4095, 4096, 4097, 8192, 3 * 4096 + 1));
        return len.flatMap(l -> Combinators.combine(
                Arbitraries.integers().between(0, BUF - l),
                Arbitraries.integers().between(0, BUF - l)).as((s, d) -> new Copy(s, d, l)));
    }

    /** Random copies in random batches land exactly as MemorySegment.copy applied in the same order would. */
    @Property(tries = 60)
    void randomCopiesMatchAReferenceCopy(@ForAll @Size(min = 1, max = 60) List<@From("copies") Copy> copies,
                                         @ForAll @IntRange(min = 1, max = 31) int batch) {
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
    @Property(tries = 60)
    void aFailureAnywhereReportsEveryCopyOnceAndRecovers(@ForAll @Size(min = 1, max = 20) List<@From("copies") Copy> copies,
                                                         @ForAll @IntRange(min = 1, max = 1000) int failSeed) {
        try (Rig r = new Rig(1, 64, 12, BUF)) {
            r.device.stall(true);
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
            r.device.failDescriptor(failAt, IoatSpec.CHANERR_READ_DATA);
            r.device.stall(false);
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
