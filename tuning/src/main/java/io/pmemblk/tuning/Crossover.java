package io.pmemblk.tuning;

import io.pmemblk.settings.Sizes;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Where DMA starts to beat the CPU, from measurements. Pure arithmetic, no clock: the unit tests feed it the
 * published figures of Linux pmem with ioatdma.
 *
 * <p>At each size, the DMA/CPU ratio on the objective (throughput: DMA MB/s over CPU MB/s; cpu: CPU seconds
 * per GiB of the submitting threads, CPU over DMA, so that above 1 always means "DMA is better") is the
 * geometric mean over every configuration and direction measured at that size. The crossover is the smallest
 * size from which the ratio is at least 1 at that size and every larger one, interpolated between the two
 * bracketing sizes on a log scale (log ratio linear in log size). No such size: DMA never wins ("off").
 */
public final class Crossover {
    private Crossover() {}

    public enum Objective { THROUGHPUT, CPU }

    /** One measured point: a size, a configuration, a direction, and both routes' medians and spreads. */
    public record Point(long size, int jobs, int depth, boolean write,
                        double cpuMibPerSec, double dmaMibPerSec,
                        double cpuSecondsPerGiB, double dmaSecondsPerGiB,
                        double cpuSpread, double dmaSpread) {
        /** Above 1: DMA is better on the objective. */
        double ratio(Objective o) {
            return o == Objective.THROUGHPUT ? dmaMibPerSec / cpuMibPerSec : cpuSecondsPerGiB / dmaSecondsPerGiB;
        }
    }

    /**
     * The outcome: {@code threshold} in bytes (rounded up to 4 KiB), or empty when DMA never wins; the ratio per
     * size; and {@code noisy} when the ratio at a size next to the decision is within the measurements' spread of 1.
     */
    public record Result(Long threshold, Map<Long, Double> ratios, boolean noisy, String explanation) {
        public boolean off() {
            return threshold == null;
        }
    }

    public static Result find(List<Point> points, Objective objective) {
        TreeMap<Long, List<Point>> bySize = new TreeMap<>();
        for (Point p : points) {
            bySize.computeIfAbsent(p.size(), k -> new ArrayList<>()).add(p);
        }
        if (bySize.isEmpty()) {
            throw new IllegalArgumentException("no measurements");
        }
        TreeMap<Long, Double> ratios = new TreeMap<>();
        TreeMap<Long, Double> spreads = new TreeMap<>();
        for (var e : bySize.entrySet()) {
            double logSum = 0, spread = 0;
            for (Point p : e.getValue()) {
                logSum += Math.log(p.ratio(objective));
                spread = Math.max(spread, p.cpuSpread() + p.dmaSpread());
            }
            ratios.put(e.getKey(), Math.exp(logSum / e.getValue().size()));
            spreads.put(e.getKey(), spread);
        }
        List<Long> sizes = new ArrayList<>(ratios.keySet());
        int k = sizes.size();
        while (k > 0 && ratios.get(sizes.get(k - 1)) >= 1.0) {
            k--;
        }
        String what = objective == Objective.THROUGHPUT ? "throughput" : "CPU time per GiB of the submitting threads";
        if (k == sizes.size()) {
            boolean noisy = Math.abs(ratios.get(sizes.get(k - 1)) - 1) <= spreads.get(sizes.get(k - 1));
            return new Result(null, ratios, noisy, "DMA never matched the CPU on " + what + " up to "
                    + Sizes.format(sizes.get(k - 1)) + " (best DMA/CPU ratio " + fmt(ratios.get(sizes.get(k - 1)))
                    + "): leave route.dma.min-bytes=off");
        }
        long at = sizes.get(k);
        boolean noisy = Math.abs(ratios.get(at) - 1) <= spreads.get(at);
        if (k == 0) {
            return new Result(round4k(at), ratios, noisy, "DMA was at least as good as the CPU on " + what
                    + " at every size measured, from " + Sizes.format(at) + " up");
        }
        long below = sizes.get(k - 1);
        noisy |= Math.abs(ratios.get(below) - 1) <= spreads.get(below);
        double lr0 = Math.log(ratios.get(below)), lr1 = Math.log(ratios.get(at));
        double ls0 = Math.log(below), ls1 = Math.log(at);
        double x = lr1 == lr0 ? ls1 : ls0 + (ls1 - ls0) * (0 - lr0) / (lr1 - lr0);
        long threshold = round4k((long) Math.ceil(Math.exp(Math.min(ls1, Math.max(ls0, x)))));
        return new Result(threshold, ratios, noisy, "DMA loses at " + Sizes.format(below) + " (DMA/CPU " + fmt(ratios.get(below))
                + ") and wins from " + Sizes.format(at) + " (" + fmt(ratios.get(at)) + ") on " + what
                + "; interpolated crossover " + Sizes.format(threshold));
    }

    private static long round4k(long v) {
        return (v + 4095) / 4096 * 4096;
    }

    private static String fmt(double d) {
        return String.format(java.util.Locale.ROOT, "%.2f", d);
    }
}
