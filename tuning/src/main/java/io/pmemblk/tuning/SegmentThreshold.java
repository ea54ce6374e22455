package io.pmemblk.tuning;

import io.pmemblk.settings.Sizes;

import java.util.List;
import java.util.Locale;

/**
 * Whether the segment count of a request, apart from its size, decides its route: pure arithmetic on what
 * {@link Autotuner} measured at one size, copied as a request's N pool chunks and as one segment of the same
 * size. {@code route.dma.min-segments} sends a request to DMA from N segments: worth setting only when, at a
 * size the size threshold leaves on the CPU, DMA wins in N segments and loses in one, so it is the segments
 * that tip it. Otherwise it stays off and the explanation says which case it was.
 */
public final class SegmentThreshold {
    private SegmentThreshold() {}

    /** One direction at the measured size: both routes' medians in N segments and in one, and their spread. */
    public record Point(boolean write, double cpuMibPerSecN, double dmaMibPerSecN, double cpuMibPerSec1,
                        double dmaMibPerSec1, double spread) {}

    /** {@code minSegments} null: off. Ratios are DMA/CPU throughput, geometric means over the directions. */
    public record Result(Integer minSegments, long size, int segments, double ratioN, double ratio1, boolean noisy,
                         String explanation) {
        public boolean off() {
            return minSegments == null;
        }

        /** The setting's value as the properties file takes it. */
        public String value() {
            return off() ? "off" : Integer.toString(minSegments);
        }
    }

    public static Result decide(long size, int segments, List<Point> points, Crossover.Result bySize) {
        if (points.isEmpty()) {
            throw new IllegalArgumentException("no segment measurements at " + Sizes.format(size));
        }
        double logN = 0, log1 = 0, spread = 0;
        for (Point p : points) {
            logN += Math.log(p.dmaMibPerSecN() / p.cpuMibPerSecN());
            log1 += Math.log(p.dmaMibPerSec1() / p.cpuMibPerSec1());
            spread = Math.max(spread, p.spread());
        }
        double rN = Math.exp(logN / points.size()), r1 = Math.exp(log1 / points.size());
        boolean noisy = Math.abs(rN - 1) <= spread || Math.abs(r1 - 1) <= spread;
        String at = "at " + Sizes.format(size) + " DMA/CPU is " + fmt(rN) + " in " + segments + " segments and "
                + fmt(r1) + " in one";
        if (!bySize.off() && bySize.threshold() <= size) {
            return new Result(null, size, segments, rN, r1, noisy, at + "; the size threshold ("
                    + Sizes.format(bySize.threshold()) + ") already sends such requests to DMA: leave"
                    + " route.dma.min-segments=off");
        }
        if (rN >= 1 && r1 < 1) {
            return new Result(segments, size, segments, rN, r1, noisy, at + ": the segments, not the size, make DMA"
                    + " win: route.dma.min-segments=" + segments);
        }
        String why = rN < 1 && r1 < 1 ? "DMA loses either way, so no segment count makes it win"
                : rN < 1 ? "more segments only make DMA worse"
                : "DMA wins either way, so the segment count does not tip it (the size sweep decides)";
        return new Result(null, size, segments, rN, r1, noisy, at + ": " + why + ": leave route.dma.min-segments=off");
    }

    private static String fmt(double d) {
        return String.format(Locale.ROOT, "%.2f", d);
    }
}
