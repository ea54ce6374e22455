package io.pmemblk.tuning;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import javax.imageio.ImageIO;
import java.awt.Color;
import java.awt.geom.Rectangle2D;
import java.awt.image.BufferedImage;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/** The tune chart drawn from a sweep whose crossover is known: lines of both routes, and the crossover where it is. */
class CrossoverChartTest {
    @BeforeAll
    static void headless() {
        System.setProperty("java.awt.headless", "true");
    }

    private static final long[] SIZES = Autotuner.Options.DEFAULT_SIZES;

    /** CPU flat; DMA from a quarter of it at 4K to twice it at 2M, so it first wins between 256K and 1M. */
    static Autotuner.Report sweep(boolean dmaEverWins) {
        List<Autotuner.Row> rows = new ArrayList<>();
        List<Crossover.Point> points = new ArrayList<>();
        for (int i = 0; i < SIZES.length; i++) {
            for (int[] shape : new int[][]{{1, 1}, {2, 16}}) {
                for (boolean write : new boolean[]{false, true}) {
                    double cpu = shape[0] == 1 ? 5000 : 9000;
                    double ratio = dmaEverWins ? 0.25 * Math.pow(8, i / (double) (SIZES.length - 1)) : 0.5;
                    Autotuner.Sample c = new Autotuner.Sample(cpu, 1.0, 0);
                    Autotuner.Sample d = new Autotuner.Sample(cpu * ratio, 0.3, 0.5);
                    rows.add(new Autotuner.Row(SIZES[i], shape[0], shape[1], write, c, d, 0.01, 0.01));
                    points.add(new Crossover.Point(SIZES[i], shape[0], shape[1], write, c.mibPerSec(), d.mibPerSec(),
                            c.submitSecondsPerGiB(), d.submitSecondsPerGiB(), 0.01, 0.01));
                }
            }
        }
        return new Autotuner.Report(rows, Crossover.find(points, Crossover.Objective.THROUGHPUT));
    }

    private static boolean near(int rgb, Color c) {
        Color p = new Color(rgb);
        return Math.abs(p.getRed() - c.getRed()) + Math.abs(p.getGreen() - c.getGreen())
                + Math.abs(p.getBlue() - c.getBlue()) < 40;
    }

    private static int count(BufferedImage img, Rectangle2D area, Color c) {
        int n = 0;
        for (int y = (int) area.getMinY() + 1; y < (int) area.getMaxY() - 1; y++) {
            for (int x = (int) area.getMinX() + 1; x < (int) area.getMaxX() - 1; x++) {
                n += near(img.getRGB(x, y), c) ? 1 : 0;
            }
        }
        return n;
    }

    @Test
    void everyPanelHasBothRoutesAndTheCrossoverLineWhereTheThresholdIs() {
        Autotuner.Report report = sweep(true);
        long threshold = report.result().threshold();
        assertThat(threshold).isGreaterThan(256 << 10).isLessThan(1 << 20);
        CrossoverChart.Drawn d = CrossoverChart.draw(report, "test sweep");
        assertThat(d.image().getWidth()).isEqualTo(CrossoverChart.WIDTH);
        assertThat(d.dataAreas()).hasSize(4); // reads and writes, each throughput over CPU per GiB
        for (Rectangle2D area : d.dataAreas()) {
            assertThat(count(d.image(), area, CrossoverChart.CPU)).as("CPU lines in %s", area).isGreaterThan(100);
            assertThat(count(d.image(), area, CrossoverChart.DMA)).as("DMA lines in %s", area).isGreaterThan(100);
            // the crossover is a vertical line at the threshold: nearly every row of the panel has its colour there
            int x = d.crossoverX().get(d.dataAreas().indexOf(area));
            assertThat((double) x).isBetween(area.getMinX(), area.getMaxX());
            int hits = 0, rows = 0;
            for (int y = (int) area.getMinY() + 2; y < (int) area.getMaxY() - 2; y++, rows++) {
                for (int dx = -1; dx <= 1; dx++) {
                    if (near(d.image().getRGB(x + dx, y), CrossoverChart.CROSSOVER)) {
                        hits++;
                        break;
                    }
                }
            }
            assertThat(hits).as("crossover line rows in %s", area).isGreaterThan(rows * 8 / 10);
        }
    }

    @Test
    void whenDmaNeverWinsThereIsNoCrossoverLine() {
        CrossoverChart.Drawn d = CrossoverChart.draw(sweep(false), "test sweep");
        assertThat(d.crossoverX()).containsOnly(-1);
        for (Rectangle2D area : d.dataAreas()) {
            assertThat(count(d.image(), area, CrossoverChart.CROSSOVER)).as("crossover colour in %s", area).isZero();
            assertThat(count(d.image(), area, CrossoverChart.DMA)).isGreaterThan(100);
        }
    }

    @Test
    void theFileIsAPngOfTheChartsSize(@TempDir Path dir) throws Exception {
        Path png = dir.resolve("tune.png");
        CrossoverChart.write(sweep(true), "test sweep", png);
        BufferedImage back = ImageIO.read(png.toFile());
        assertThat(back.getWidth()).isEqualTo(CrossoverChart.WIDTH);
        assertThat(back.getHeight()).isEqualTo(CrossoverChart.HEIGHT);
        try (var files = Files.list(dir)) {
            assertThat(files).containsExactly(png); // no temporary file left beside it
        }
    }
}
