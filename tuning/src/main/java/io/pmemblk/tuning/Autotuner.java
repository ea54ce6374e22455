package io.pmemblk.tuning;

import io.pmemblk.queueing.Route;
import io.pmemblk.settings.Sizes;

import java.io.PrintStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/**
 * Sweeps request sizes over both routes, forced, through the real block layer in process, at queue depth 1
 * with one job and at a deep queue with several jobs (the shapes of the Linux pmem DMA-offload measurements: 1 job at QD1, 16 at QD16), reads and writes,
 * repeating every point and keeping the median; then asks {@link Crossover} where DMA starts to win.
 */
public final class Autotuner {
    /** Runs one forced-route point and reports what it measured. */
    @FunctionalInterface
    public interface Probe {
        Sample measure(Route route, boolean write, int blockSize, int jobs, int depth, double seconds) throws InterruptedException;
    }

    /** One run: throughput, and CPU time of the submitting threads and of the DMA engine, per wall second. */
    public record Sample(double mibPerSec, double submitCores, double engineCores) {
        double submitSecondsPerGiB() {
            return mibPerSec <= 0 ? Double.POSITIVE_INFINITY : submitCores / (mibPerSec / 1024);
        }
    }

    public record Options(long[] sizes, int deepJobs, int deepDepth, int repeats, double seconds,
                          Crossover.Objective objective) {
        public static final long[] DEFAULT_SIZES = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20};

        /** Points a sweep runs: sizes x 2 routes x 2 shapes x 2 directions x repeats. */
        int runs() {
            return sizes.length * 2 * 2 * 2 * repeats;
        }
    }

    /** A row of the printed table: one size, one shape, one direction, both routes' medians. */
    public record Row(long size, int jobs, int depth, boolean write, Sample cpu, Sample dma, double cpuSpread, double dmaSpread) {}

    public record Report(List<Row> rows, Crossover.Result result) {}

    private final Probe probe;
    private final PrintStream progress;

    public Autotuner(Probe probe, PrintStream progress) {
        this.probe = probe;
        this.progress = progress;
    }

    public Report run(Options o) throws InterruptedException {
        int total = o.runs();
        int done = 0;
        List<Row> rows = new ArrayList<>();
        List<Crossover.Point> points = new ArrayList<>();
        int[][] shapes = {{1, 1}, {o.deepJobs(), o.deepDepth()}};
        for (long size : o.sizes()) {
            for (int[] shape : shapes) {
                for (boolean write : new boolean[]{false, true}) {
                    Sample[] cpu = new Sample[o.repeats()];
                    Sample[] dma = new Sample[o.repeats()];
                    // alternate the routes so drift on a noisy machine hits both alike
                    for (int rep = 0; rep < o.repeats(); rep++) {
                        for (Route route : Route.values()) {
                            bar(done++, total, size, shape, write, route);
                            Sample s = probe.measure(route, write, (int) size, shape[0], shape[1], o.seconds());
                            (route == Route.CPU ? cpu : dma)[rep] = s;
                        }
                    }
                    Sample cm = median(cpu), dm = median(dma);
                    double cs = spread(cpu), ds = spread(dma);
                    rows.add(new Row(size, shape[0], shape[1], write, cm, dm, cs, ds));
                    points.add(new Crossover.Point(size, shape[0], shape[1], write, cm.mibPerSec(), dm.mibPerSec(),
                            cm.submitSecondsPerGiB(), dm.submitSecondsPerGiB(), cs, ds));
                }
            }
        }
        if (progress != null) {
            progress.print("\r" + " ".repeat(78) + "\r");
            progress.flush();
        }
        return new Report(rows, Crossover.find(points, o.objective()));
    }

    private void bar(int done, int total, long size, int[] shape, boolean write, Route route) {
        if (progress == null) {
            return;
        }
        int width = 30;
        int filled = done * width / total;
        progress.printf(Locale.ROOT, "\r[%s%s] %3d%% %5s %dx%d %-5s %s   ", "#".repeat(filled), ".".repeat(width - filled),
                done * 100 / total, Sizes.format(size), shape[0], shape[1], write ? "write" : "read", route.label());
        progress.flush();
    }

    static Sample median(Sample[] s) {
        Sample[] sorted = s.clone();
        Arrays.sort(sorted, (a, b) -> Double.compare(a.mibPerSec(), b.mibPerSec()));
        return sorted[sorted.length / 2];
    }

    /** (max - min) / median of throughput: the relative spread of the repeats. */
    static double spread(Sample[] s) {
        double min = Double.MAX_VALUE, max = 0;
        for (Sample x : s) {
            min = Math.min(min, x.mibPerSec());
            max = Math.max(max, x.mibPerSec());
        }
        double med = median(s).mibPerSec();
        return med <= 0 ? 0 : (max - min) / med;
    }

    /** The table, shaped like the Linux pmem DMA-offload measurements: size, jobs x depth, CPU MB/s and CPU%, DMA MB/s and CPU%. */
    public static void printTable(Report report, PrintStream out) {
        out.println("size   jobs x depth  dir    CPU MiB/s   CPU%  |  DMA MiB/s   CPU% (+engine%)  DMA/CPU  spread");
        for (Row r : report.rows()) {
            out.printf(Locale.ROOT, "%-6s %5d x %-5d %-5s %10.0f %6.1f  | %10.0f %6.1f (+%5.1f)     %5.2f  %4.0f%%/%-3.0f%%%n",
                    Sizes.format(r.size()), r.jobs(), r.depth(), r.write() ? "write" : "read",
                    r.cpu().mibPerSec(), r.cpu().submitCores() * 100, r.dma().mibPerSec(), r.dma().submitCores() * 100,
                    r.dma().engineCores() * 100, r.dma().mibPerSec() / r.cpu().mibPerSec(),
                    r.cpuSpread() * 100, r.dmaSpread() * 100);
        }
    }
}
