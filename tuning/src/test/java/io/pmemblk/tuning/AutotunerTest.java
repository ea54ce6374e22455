package io.pmemblk.tuning;

import io.pmemblk.queueing.Route;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The sweep from measurements to the decisions: the figures are the input (as CrossoverTest feeds published
 * ones), so each case is exact. The segment dimension must reach route.dma.min-segments on its own: with the
 * size sweep saying DMA never wins, only the comparison of N segments against one can set it.
 */
class AutotunerTest {
    private static final long[] SIZES = {64 << 10, 256 << 10, 2 << 20};
    private static final Crossover.Objective THROUGHPUT = Crossover.Objective.THROUGHPUT;

    /** DMA at {@code ratio} of the CPU's 1000 MiB/s at every size and shape. */
    private static Autotuner.Probe sizes(double ratio) {
        return (route, write, bs, jobs, depth, secs) -> new Autotuner.Sample(route == Route.CPU ? 1000 : 1000 * ratio, 0.5, 0);
    }

    /** DMA/CPU {@code ratioN} in more than one segment, {@code ratio1} in one. */
    private static Autotuner.SegmentProbe segments(double ratioN, double ratio1, List<String> asked) {
        return (route, write, size, n, secs) -> {
            asked.add(route.label() + " " + size + "/" + n);
            return new Autotuner.Sample(route == Route.CPU ? 1000 : 1000 * (n > 1 ? ratioN : ratio1), 0.5, 0);
        };
    }

    private static Autotuner.Report run(Autotuner.Probe p, Autotuner.SegmentProbe s) throws InterruptedException {
        return new Autotuner(p, s, null).run(new Autotuner.Options(SIZES, 2, 16, 1, 0.01, THROUGHPUT));
    }

    @Test
    void segmentsThatMakeDmaWinWhereTheSizeDoesNotSetMinSegments() throws Exception {
        List<String> asked = new ArrayList<>();
        Autotuner.Report r = run(sizes(0.5), segments(1.3, 0.8, asked));
        assertThat(r.result().off()).as("by size DMA never wins").isTrue();
        assertThat(asked).as("the largest swept size, in its 16 pool chunks and in one, both routes")
                .containsOnly("cpu 2097152/16", "dma 2097152/16", "cpu 2097152/1", "dma 2097152/1");
        SegmentThreshold.Result s = r.segments();
        assertThat(s.minSegments()).isEqualTo(16);
        assertThat(s.value()).isEqualTo("16");
        assertThat(s.ratioN()).isEqualTo(1.3, org.assertj.core.data.Offset.offset(1e-9));
        assertThat(s.ratio1()).isEqualTo(0.8, org.assertj.core.data.Offset.offset(1e-9));
        assertThat(s.explanation()).contains("2M", "16 segments", "route.dma.min-segments=16");
        assertThat(table(r)).contains("64K vs 2M (the design's comparison): DMA/CPU 0.50 at 64K, 0.50 at 2M")
                .contains("path: buffers <-> mapping").containsPattern("(?m)^2M +16 +read +1000 +1300 +1\\.30 +\\| +1000 +800 +0\\.80");
    }

    @Test
    void segmentsThatLeaveDmaLosingKeepItOffAndSayWhy() throws Exception {
        SegmentThreshold.Result s = run(sizes(0.5), segments(0.7, 0.6, new ArrayList<>())).segments();
        assertThat(s.off()).isTrue();
        assertThat(s.value()).isEqualTo("off");
        assertThat(s.explanation()).contains("DMA loses either way", "route.dma.min-segments=off");
    }

    @Test
    void whereTheSizeThresholdAlreadySendsItToDmaSegmentsAddNothing() throws Exception {
        SegmentThreshold.Result s = run(sizes(1.5), segments(1.3, 0.8, new ArrayList<>())).segments();
        assertThat(s.off()).isTrue();
        assertThat(s.explanation()).contains("the size threshold (64K) already sends");
    }

    @Test
    void withoutASegmentProbeOrASizeOfTwoChunksNothingIsMeasured() throws Exception {
        assertThat(new Autotuner(sizes(0.5), null).run(new Autotuner.Options(SIZES, 2, 16, 1, 0.01, THROUGHPUT))
                .segments()).isNull();
        assertThat(Autotuner.Options.segmentSizeOf(new long[]{4 << 10, 64 << 10, 128 << 10})).isZero();
        assertThat(Autotuner.Options.segmentSizeOf(new long[]{4 << 10, 256 << 10, 1 << 20})).isEqualTo(1 << 20);
    }

    private static String table(Autotuner.Report r) {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        Autotuner.printTable(r, new PrintStream(bytes, true, StandardCharsets.UTF_8));
        return bytes.toString(StandardCharsets.UTF_8);
    }
}
