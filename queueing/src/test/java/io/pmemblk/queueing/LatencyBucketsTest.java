package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class LatencyBucketsTest {

    /** Every bucket bound, its neighbours, and random values up to 2^40 ns (seeded, so a failure replays). */
    @Test
    void everyLatencyFallsInTheFirstBucketWhoseBoundHoldsIt() {
        for (int shift = 0; shift <= 41; shift++) {
            long bound = 1L << shift;
            bucketHolds(bound - 1);
            bucketHolds(bound);
            bucketHolds(bound + 1);
        }
        SplittableRandom rnd = new SplittableRandom(0x1A7E_0C75L);
        for (int i = 0; i < 10_000; i++) {
            bucketHolds(rnd.nextLong(0, (1L << 40) + 1) >>> rnd.nextInt(41)); // spread over every magnitude
        }
    }

    private static void bucketHolds(long nanos) {
        int b = LatencyBuckets.bucketOf(nanos);
        assertTrue(b >= 0 && b < LatencyBuckets.BUCKETS);
        if (b < LatencyBuckets.BUCKETS - 1) {
            assertTrue(nanos <= 1L << (LatencyBuckets.MIN_SHIFT + b), nanos + " ns above bucket " + b);
        } else {
            assertTrue(nanos > 1L << LatencyBuckets.MAX_SHIFT, nanos + " ns in +Inf but fits a finite bucket");
        }
        if (b > 0) {
            assertTrue(nanos > 1L << (LatencyBuckets.MIN_SHIFT + b - 1), nanos + " ns belongs below bucket " + b);
        }
    }

    @Test
    void boundsAreAscendingSecondsEndingInInfinity() {
        double[] b = LatencyBuckets.upperBoundsSeconds();
        assertEquals(LatencyBuckets.BUCKETS, b.length);
        assertEquals(1.024e-6, b[0], 1e-12);
        for (int i = 1; i < b.length; i++) {
            assertTrue(b[i] > b[i - 1]);
        }
        assertEquals(Double.POSITIVE_INFINITY, b[b.length - 1]);
        b[0] = 42; // a copy: the histogram's bounds do not change
        assertEquals(1.024e-6, LatencyBuckets.upperBoundSeconds(0), 1e-12);
    }

    @Test
    void snapshotIsCumulativeWithCountAndSum() {
        LatencyBuckets l = new LatencyBuckets();
        l.record(500);            // bucket 0
        l.record(1_500);          // <= 2.048 us
        l.record(1_500);
        l.record(-7);             // clock went backwards: counted as 0
        l.record(1L << 40);       // +Inf
        LatencyBuckets.Snapshot s = l.snapshot();
        assertEquals(5, s.count());
        assertEquals(5, l.count());
        assertEquals(2, s.cumulativeCounts()[0]);
        assertEquals(4, s.cumulativeCounts()[1]);
        assertEquals(4, s.cumulativeCounts()[LatencyBuckets.BUCKETS - 2]);
        assertArrayEquals(new long[] {2, 2, 0}, java.util.Arrays.copyOf(s.bucketCounts(), 3));
        assertEquals(1, s.bucketCounts()[LatencyBuckets.BUCKETS - 1]);
        assertEquals((500 + 3_000 + (1L << 40)) / 1e9, s.sumSeconds(), 1e-9);
    }

    @Test
    void completionRecordsLatencyPerOperationOfItsQueue() throws Exception {
        MemoryBlockDriver driver = new MemoryBlockDriver(1 << 20);
        try (BlockLayer layer = new BlockLayer(driver, 2, 4, 4L * BufferPool.CHUNK, BufferPool.CHUNK)) {
            HardwareQueue q = layer.queue(1);
            Request r = q.acquire(4096);
            r.op = Op.WRITE;
            r.completion = Request::release;
            r.startNanos = System.nanoTime() - 3_000_000; // a 3 ms old request
            q.dispatch(new Request[] {r}, 1);
            LatencyBuckets.Snapshot s = q.latency(Op.WRITE).snapshot();
            assertEquals(1, s.count(), "one WRITE completed");
            for (int i = 0; i < LatencyBuckets.BUCKETS; i++) {
                if (s.upperBoundsSeconds()[i] < 0.003) {
                    assertEquals(0, s.cumulativeCounts()[i], "a 3 ms request counted under le=" + s.upperBoundsSeconds()[i]);
                }
            }
            assertTrue(s.sumSeconds() >= 0.003, "sum " + s.sumSeconds());
            for (Op op : Op.values()) {
                if (op != Op.WRITE) {
                    assertEquals(0, q.latency(op).count(), op + " recorded nothing");
                }
                assertEquals(0, layer.queue(0).latency(op).count(), "queue 0 recorded nothing for " + op);
            }
            Request noOp = q.acquire(0); // answered by the frontend itself: no op, no latency
            noOp.completion = Request::release;
            noOp.complete(Status.EINVAL);
            assertEquals(1, q.latency(Op.WRITE).count());
        } finally {
            driver.close();
        }
    }
}
