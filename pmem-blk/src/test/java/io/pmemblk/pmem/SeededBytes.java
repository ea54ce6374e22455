package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;

import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.util.Random;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A test's write payload made from a seed, so what landed in the mapping can be checked later against the same
 * seed without keeping the bytes: the bytes are those of {@code new Random(seed).nextInt()}, one per call.
 */
final class SeededBytes {
    private SeededBytes() {
    }

    /** Fills every segment of a WRITE's buffers, in order. */
    static void fill(Request r, int seed) {
        Random rnd = new Random(seed);
        ByteBuffer[] bufs = r.buffers();
        for (int s = 0; s < r.segments(); s++) {
            while (bufs[s].hasRemaining()) bufs[s].put((byte) rnd.nextInt());
        }
    }

    /** A READ's buffers, every segment in order, hold what {@link #fill} wrote from {@code seed}. */
    static void assertBuffersHold(Request r, int seed) {
        Random rnd = new Random(seed);
        ByteBuffer[] bufs = r.buffers();
        for (int s = 0; s < r.segments(); s++) {
            while (bufs[s].hasRemaining()) assertThat(bufs[s].get()).isEqualTo((byte) rnd.nextInt());
        }
    }

    /** The {@code len} bytes at {@code off} of the region are those {@link #fill} wrote from {@code seed}. */
    static void assertRegionHolds(PmemRegion region, long off, int len, int seed, String what) {
        Random rnd = new Random(seed);
        for (int i = 0; i < len; i++) {
            byte expected = (byte) rnd.nextInt();
            byte actual = region.memory().get(ValueLayout.JAVA_BYTE, off + i);
            if (actual != expected) {
                throw new AssertionError(what + " byte " + i + " (at " + (off + i) + "): expected " + expected
                        + " got " + actual);
            }
        }
    }
}
