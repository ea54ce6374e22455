package io.pmemblk.tuning;

import io.pmemblk.bench.load.LoadGenerator;
import io.pmemblk.queueing.BufferPool;
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
 * repeating every point and keeping the median; then asks {@link Crossover} where DMA starts to win. Then the
 * segment dimension: at one size of several pool chunks, both routes copy it as the request's N chunks and as
 * one segment of the same size, and {@link SegmentThreshold} says whether the count decides apart from the size.
 */
public final class Autotuner {
    /** Runs one forced-route point and reports what it measured. */
    @FunctionalInterface
    public interface Probe {
        Sample measure(Route route, boolean write, int blockSize, int jobs, int depth, double seconds) throws InterruptedException;
    }

    /** Copies {@code size} bytes as {@code segments} equal segments, one request at a time, on one route. */
    @FunctionalInterface
    public interface SegmentProbe {
        Sample measure(Route route, boolean write, int size, int segments, double seconds) throws InterruptedException;
    }

    /** One run: throughput, and CPU time of the submitting threads and of the DMA engine, per wall second. */
    public record Sample(double mibPerSec, double submitCores, double engineCores) {
        double submitSecondsPerGiB() {
            return mibPerSec <= 0 ? Double.POSITIVE_INFINITY : submitCores / (mibPerSec / 1024);
        }
    }

    /** {@code segmentSize}: where the segment dimension is measured (0: not measured), see {@link #segmentSizeOf}. */
    public record Options(long[] sizes, int deepJobs, int deepDepth, int repeats, double seconds,
                          Crossover.Objective objective, long segmentSize) {
        public static final long[] DEFAULT_SIZES = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20};

        public Options(long[] sizes, int deepJobs, int deepDepth, int repeats, double seconds, Crossover.Objective objective) {
            this(sizes, deepJobs, deepDepth, repeats, seconds, objective, segmentSizeOf(sizes));
        }

        /**
         * The largest swept size that is a whole number of two or more pool chunks (0: none): the largest
         * request is where segments add up most, and a whole number of chunks cuts into equal segments.
         */
        public static long segmentSizeOf(long[] sizes) {
            long best = 0;
            for (long s : sizes) {
                if (s >= 2L * BufferPool.CHUNK && s % BufferPool.CHUNK == 0) {
                    best = Math.max(best, s);
                }
            }
            return best;
        }

        /** Segments of the request at {@link #segmentSize}: its pool chunks. */
        int segments() {
            return BufferPool.chunksFor(segmentSize);
        }

        /** Points a sweep runs: sizes x 2 routes x 2 shapes x 2 directions x repeats, + 2 routes x 2 forms x 2 directions x repeats. */
        int runs(boolean segmentsToo) {
            return (sizes.length * 2 * 2 * 2 + (segmentsToo && segmentSize > 0 ? 2 * 2 * 2 : 0)) * repeats;
        }
    }

    /** A row of the printed table: one size, one shape, one direction, both routes' medians. */
    public record Row(long size, int jobs, int depth, boolean write, Sample cpu, Sample dma, double cpuSpread, double dmaSpread) {}

    /** The segment dimension at one size and direction: both routes' medians in N segments and in one. */
    public record SegmentRow(long size, int segments, boolean write, Sample cpuN, Sample dmaN, Sample cpu1, Sample dma1,
                             double spread) {}

    /** {@code segments} null: not measured (no segment probe, or no swept size of two chunks or more). */
    public record Report(List<Row> rows, Crossover.Result result, List<SegmentRow> segmentRows,
                         SegmentThreshold.Result segments) {
        public Report(List<Row> rows, Crossover.Result result) {
            this(rows, result, List.of(), null);
        }
    }

    private final Probe probe;
    private final SegmentProbe segmentProbe;
    private final PrintStream progress;

    public Autotuner(Probe probe, PrintStream progress) {
        this(probe, null, progress);
    }

    /** {@code segmentProbe} null: the segment dimension is not measured. */
    public Autotuner(Probe probe, SegmentProbe segmentProbe, PrintStream progress) {
        this.probe = probe;
        this.segmentProbe = segmentProbe;
        this.progress = progress;
    }

    public Report run(Options o) throws InterruptedException {
        int total = o.runs(segmentProbe != null);
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
        Crossover.Result bySize = Crossover.find(points, o.objective());
        List<SegmentRow> segmentRows = new ArrayList<>();
        SegmentThreshold.Result segments = null;
        if (segmentProbe != null && o.segmentSize() > 0) {
            List<SegmentThreshold.Point> segmentPoints = new ArrayList<>();
            int size = (int) o.segmentSize(), n = o.segments();
            for (boolean write : new boolean[]{false, true}) {
                // [route][form]: form 0 the request's n chunks, 1 one segment of the same size
                Sample[][][] s = new Sample[2][2][o.repeats()];
                for (int rep = 0; rep < o.repeats(); rep++) {
                    for (int form = 0; form < 2; form++) {
                        for (Route route : Route.values()) {
                            int count = form == 0 ? n : 1;
                            bar(done++, total, "%5s in %2d seg %-5s %s", Sizes.format(size), count,
                                    write ? "write" : "read", route.label());
                            s[route.ordinal()][form][rep] = segmentProbe.measure(route, write, size, count, o.seconds());
                        }
                    }
                }
                int cpu = Route.CPU.ordinal(), dma = Route.DMA.ordinal();
                double spread = Math.max(Math.max(spread(s[cpu][0]), spread(s[dma][0])),
                        Math.max(spread(s[cpu][1]), spread(s[dma][1])));
                SegmentRow row = new SegmentRow(size, n, write, median(s[cpu][0]), median(s[dma][0]), median(s[cpu][1]),
                        median(s[dma][1]), spread);
                segmentRows.add(row);
                segmentPoints.add(new SegmentThreshold.Point(write, row.cpuN().mibPerSec(), row.dmaN().mibPerSec(),
                        row.cpu1().mibPerSec(), row.dma1().mibPerSec(), spread));
            }
            segments = SegmentThreshold.decide(size, n, segmentPoints, bySize);
        }
        if (progress != null) {
            progress.print("\r" + " ".repeat(78) + "\r");
            progress.flush();
        }
        return new Report(rows, bySize, segmentRows, segments);
    }

    private void bar(int done, int total, long size, int[] shape, boolean write, Route route) {
        bar(done, total, "%5s %dx%d %-5s %s", Sizes.format(size), shape[0], shape[1], write ? "write" : "read",
                route.label());
    }

    private void bar(int done, int total, String what, Object... args) {
        if (progress == null) {
            return;
        }
        int width = 30;
        int filled = done * width / total;
        progress.printf(Locale.ROOT, "\r[%s%s] %3d%% %s   ", "#".repeat(filled), ".".repeat(width - filled),
                done * 100 / total, String.format(Locale.ROOT, what, args));
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

    /**
     * The table, shaped like the Linux pmem DMA-offload measurements: size, jobs x depth, CPU MB/s and CPU%, DMA
     * MB/s and CPU%; under it the card's 64K against 2M comparison, and the segment dimension. Each part names
     * the path it measured.
     */
    public static void printTable(Report report, PrintStream out) {
        out.println("path: " + LoadGenerator.PATH);
        out.println("measured: " + LoadProbe.MEASURED);
        out.println("size   jobs x depth  dir    CPU MiB/s   CPU%  |  DMA MiB/s   CPU% (+engine%)  DMA/CPU  spread");
        for (Row r : report.rows()) {
            out.printf(Locale.ROOT, "%-6s %5d x %-5d %-5s %10.0f %6.1f  | %10.0f %6.1f (+%5.1f)     %5.2f  %4.0f%%/%-3.0f%%%n",
                    Sizes.format(r.size()), r.jobs(), r.depth(), r.write() ? "write" : "read",
                    r.cpu().mibPerSec(), r.cpu().submitCores() * 100, r.dma().mibPerSec(), r.dma().submitCores() * 100,
                    r.dma().engineCores() * 100, r.dma().mibPerSec() / r.cpu().mibPerSec(),
                    r.cpuSpread() * 100, r.dmaSpread() * 100);
        }
        Double small = report.result().ratios().get(64L << 10), large = report.result().ratios().get(2L << 20);
        if (small != null && large != null) {
            out.printf(Locale.ROOT, "64K vs 2M (the design's comparison): DMA/CPU %.2f at 64K, %.2f at 2M%n", small, large);
        }
        if (!report.segmentRows().isEmpty()) {
            out.println();
            out.println("segments: the same size copied as the request's pool chunks and as one segment, one request at"
                    + " a time, buffer <-> mapping by the driver's own copies (region copy; DMA descriptors)");
            out.println("size   segments  dir    CPU MiB/s  DMA MiB/s  DMA/CPU  |  1 seg: CPU MiB/s  DMA MiB/s  DMA/CPU  spread");
            for (SegmentRow r : report.segmentRows()) {
                out.printf(Locale.ROOT, "%-6s %8d  %-5s %10.0f %10.0f    %5.2f  |  %16.0f %10.0f    %5.2f  %5.0f%%%n",
                        Sizes.format(r.size()), r.segments(), r.write() ? "write" : "read", r.cpuN().mibPerSec(),
                        r.dmaN().mibPerSec(), r.dmaN().mibPerSec() / r.cpuN().mibPerSec(), r.cpu1().mibPerSec(),
                        r.dma1().mibPerSec(), r.dma1().mibPerSec() / r.cpu1().mibPerSec(), r.spread() * 100);
            }
        }
    }
}
