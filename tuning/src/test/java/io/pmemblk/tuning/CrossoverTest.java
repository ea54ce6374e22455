package io.pmemblk.tuning;

import io.pmemblk.tuning.Crossover.Objective;
import io.pmemblk.tuning.Crossover.Point;
import org.junit.jupiter.api.Test;

import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

class CrossoverTest {
    private static final long K64 = 64 << 10, M2 = 2 << 20;

    /** Linux pmem with ioatdma on Skylake, pmem emulated in DRAM (fio 2.21, the DMA-offload patch): CPU vs DMA MB/s, CPU% per route. */
    static List<Point> ioatdmaSkylake() {
        return List.of(
                // size, jobs, depth, write, cpu MB/s, dma MB/s, cpu s/GiB, dma s/GiB (from CPU% / MB/s), spreads
                p(K64, 1, 1, false, 7631, 2415, 0.997, 0.54),
                p(K64, 1, 1, true, 3552, 2173, 1.00, 0.54),
                p(K64, 16, 16, false, 36800, 29100, 15.93, 6.07),
                p(K64, 16, 16, true, 20900, 23400, 15.89, 5.85),
                p(M2, 1, 1, false, 6013, 7986, 0.993, 0.593),
                p(M2, 1, 1, true, 3579, 5211, 1.00, 0.583),
                p(M2, 16, 16, false, 18100, 21300, 15.88, 1.809),
                p(M2, 16, 16, true, 14100, 20400, 15.94, 4.469));
    }

    private static Point p(long size, int jobs, int depth, boolean write, double cpuMb, double dmaMb, double cpuCores, double dmaCores) {
        // CPU seconds per GiB = cores busy / (GiB per second)
        double gibCpu = cpuMb * 1e6 / (1L << 30), gibDma = dmaMb * 1e6 / (1L << 30);
        return new Point(size, jobs, depth, write, cpuMb, dmaMb, cpuCores / gibCpu, dmaCores / gibDma, 0.02, 0.02);
    }

    @Test
    void ioatdmaFiguresOnThroughputPutTheThresholdStrictlyBetween64KAnd2M() {
        Crossover.Result r = Crossover.find(ioatdmaSkylake(), Objective.THROUGHPUT);
        assertThat(r.off()).isFalse();
        assertThat(r.threshold()).isGreaterThan(K64).isLessThan(M2);
        assertThat(r.threshold() % 4096).isZero();
        assertThat(r.ratios().get(K64)).isLessThan(1.0);
        assertThat(r.ratios().get(M2)).isGreaterThan(1.0);
        assertThat(r.noisy()).isFalse();
        assertThat(r.explanation()).contains("loses at 64K", "wins from 2M");
    }

    @Test
    void ioatdmaFiguresOnCpuObjectivePreferDmaEverywhere() {
        Crossover.Result r = Crossover.find(ioatdmaSkylake(), Objective.CPU);
        assertThat(r.threshold()).isEqualTo(K64);
    }

    @Test
    void dmaThatNeverWinsGivesOffInPlainWords() {
        List<Point> pts = List.of(new Point(4096, 1, 1, true, 1000, 500, 1, 2, 0.01, 0.01),
                new Point(M2, 1, 1, true, 1000, 900, 1, 1.2, 0.01, 0.01));
        Crossover.Result r = Crossover.find(pts, Objective.THROUGHPUT);
        assertThat(r.off()).isTrue();
        assertThat(r.explanation()).contains("never matched", "route.dma.min-bytes=off");
    }

    @Test
    void aWinThatDoesNotHoldAtLargerSizesDoesNotCount() {
        // wins at 16K by noise, loses at 64K, wins from 256K: the threshold must be above 64K
        List<Point> pts = List.of(new Point(4096, 1, 1, true, 1000, 500, 1, 1, 0, 0),
                new Point(16384, 1, 1, true, 1000, 1100, 1, 1, 0, 0),
                new Point(65536, 1, 1, true, 1000, 800, 1, 1, 0, 0),
                new Point(262144, 1, 1, true, 1000, 1300, 1, 1, 0, 0));
        Crossover.Result r = Crossover.find(pts, Objective.THROUGHPUT);
        assertThat(r.threshold()).isGreaterThan(65536).isLessThanOrEqualTo(262144);
    }

    @Test
    void aRatioWithinTheSpreadIsReportedAsNoisy() {
        List<Point> pts = List.of(new Point(65536, 1, 1, true, 1000, 980, 1, 1, 0.05, 0.05),
                new Point(M2, 1, 1, true, 1000, 1010, 1, 1, 0.05, 0.05));
        assertThat(Crossover.find(pts, Objective.THROUGHPUT).noisy()).isTrue();
    }
}
