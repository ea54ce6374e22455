package io.pmemblk.queueing;

import java.util.concurrent.atomic.LongAdder;

/**
 * Request latency of one operation on one hardware queue: fixed log2 buckets of nanoseconds, recorded lock-free
 * and allocation-free on completion (one {@link LongAdder} per bucket, one for the sum), read by a metrics scrape
 * as a Prometheus classic histogram ({@link #snapshot()}).
 *
 * <p>Bucket {@code i < BUCKETS - 1} counts latencies in (2^(9+i), 2^(10+i)] ns (bucket 0 also holds everything up
 * to 1.024 us); its upper bound is 2^(10+i) ns: 1.024 us, 2.048 us, ... 17.18 s. The last bucket is +Inf.
 * Counts and sum are read one adder at a time, so a snapshot taken while requests complete may be off by the
 * requests completing meanwhile; each bucket is exact once traffic stops.
 */
public final class LatencyBuckets {
    static final int MIN_SHIFT = 10;
    static final int MAX_SHIFT = 34;
    /** Number of buckets, the last one +Inf. */
    public static final int BUCKETS = MAX_SHIFT - MIN_SHIFT + 2;

    private static final double[] UPPER_BOUNDS_SECONDS = new double[BUCKETS];

    static {
        for (int i = 0; i < BUCKETS - 1; i++) {
            UPPER_BOUNDS_SECONDS[i] = (1L << (MIN_SHIFT + i)) / 1e9;
        }
        UPPER_BOUNDS_SECONDS[BUCKETS - 1] = Double.POSITIVE_INFINITY;
    }

    private final LongAdder[] counts = new LongAdder[BUCKETS];
    private final LongAdder sumNanos = new LongAdder();

    LatencyBuckets() {
        for (int i = 0; i < BUCKETS; i++) {
            counts[i] = new LongAdder();
        }
    }

    /** Upper bound of bucket {@code i} in seconds ({@code le} of the Prometheus bucket); the last is +Inf. */
    public static double upperBoundSeconds(int i) {
        return UPPER_BOUNDS_SECONDS[i];
    }

    /** A copy of every bucket's upper bound in seconds, ascending, the last +Inf. */
    public static double[] upperBoundsSeconds() {
        return UPPER_BOUNDS_SECONDS.clone();
    }

    static int bucketOf(long nanos) {
        if (nanos <= 1L << MIN_SHIFT) {
            return 0;
        }
        int ceilLog2 = 64 - Long.numberOfLeadingZeros(nanos - 1);
        return Math.min(ceilLog2 - MIN_SHIFT, BUCKETS - 1);
    }

    /** Hot path: one completed request that took {@code nanos} (a negative clock difference counts as 0). */
    public void record(long nanos) {
        long n = Math.max(0, nanos);
        counts[bucketOf(n)].increment();
        sumNanos.add(n);
    }

    /** Requests recorded so far. */
    public long count() {
        long c = 0;
        for (LongAdder a : counts) {
            c += a.sum();
        }
        return c;
    }

    public double sumSeconds() {
        return sumNanos.sum() / 1e9;
    }

    /** For a scrape (allocates): cumulative counts per bucket, as Prometheus {@code _bucket{le}} wants them. */
    public Snapshot snapshot() {
        long[] cumulative = new long[BUCKETS];
        long c = 0;
        for (int i = 0; i < BUCKETS; i++) {
            c += counts[i].sum();
            cumulative[i] = c;
        }
        return new Snapshot(upperBoundsSeconds(), cumulative, sumSeconds());
    }

    /**
     * One reading of the histogram.
     *
     * @param upperBoundsSeconds {@code le} of each bucket, ascending, the last +Inf
     * @param cumulativeCounts   requests that took at most {@code upperBoundsSeconds[i]}; the last is the count
     * @param sumSeconds         total latency of all requests recorded
     */
    public record Snapshot(double[] upperBoundsSeconds, long[] cumulativeCounts, double sumSeconds) {
        public long count() {
            return cumulativeCounts[cumulativeCounts.length - 1];
        }

        /** Per-bucket (non-cumulative) counts, e.g. for {@code ClassicHistogramBuckets.of(bounds, counts)}. */
        public long[] bucketCounts() {
            long[] b = new long[cumulativeCounts.length];
            long prev = 0;
            for (int i = 0; i < b.length; i++) {
                b[i] = cumulativeCounts[i] - prev;
                prev = cumulativeCounts[i];
            }
            return b;
        }
    }
}
