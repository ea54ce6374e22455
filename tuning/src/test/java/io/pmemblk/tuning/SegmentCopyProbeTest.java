package io.pmemblk.tuning;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.Route;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The segment probe on a real region and the soft DMA engine: every form copies, and the segments land in place. */
class SegmentCopyProbeTest {
    private static final int SIZE = 2 << 20, SEGMENTS = 16;

    @TempDir
    Path dir;

    @Test
    void bothRoutesCopyInSegmentsAndInOneAndADmaWriteInSegmentsLandsWhole() throws Exception {
        try (PmemRegion region = PmemRegion.open(dir.resolve("s.img"), 16 << 20, false, PmemRegion.Mapper.AUTO);
             SegmentCopyProbe probe = new SegmentCopyProbe(region, DmaEngine.soft(new IovaSpace(), 1, 64), SIZE)) {
            for (Route route : Route.values()) {
                for (boolean write : new boolean[]{false, true}) {
                    for (int n : new int[]{SEGMENTS, 1}) {
                        Autotuner.Sample s = probe.measure(route, write, SIZE, n, 0.02);
                        assertThat(s.mibPerSec()).as("%s %s in %d", route, write ? "write" : "read", n).isPositive();
                    }
                }
            }
            region.memory().asSlice(0, SIZE).fill((byte) 0);
            probe.measure(Route.DMA, true, SIZE, SEGMENTS, 0.0001); // one copy at least, the first at offset 0
            for (long i = 0; i < SIZE; i++) {
                byte got = region.memory().get(ValueLayout.JAVA_BYTE, i);
                if (got != SegmentCopyProbe.pattern(i)) {
                    throw new AssertionError("byte " + i + " (segment " + i / (SIZE / SEGMENTS) + ") is " + got
                            + ", the buffer's is " + SegmentCopyProbe.pattern(i));
                }
            }
            assertThatThrownBy(() -> probe.measure(Route.CPU, false, SIZE, 3, 0.01))
                    .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("allowed: a size up to");
        }
    }
}
