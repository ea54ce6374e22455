package io.pmemblk.queueing;

import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Several submitters on several queues (bound round-robin by {@link BlockLayer#nextQueue()}), batches of writes
 * at random offsets and sizes up to 1 MiB completed out of order on other threads, then random reads: every byte
 * is checked against a reference array.
 */
@Timeout(120)
class BlockLayerStressTest {
    static final long DEVICE = 64L << 20;
    static final int QUEUES = 4;
    static final int THREADS = 8;
    static final int DEPTH = 8;
    static final int MAX = 1 << 20;
    static final long POOL = 4L << 20;
    static final int ROUNDS = 60;
    static final int MAX_BATCH = 4;

    /** One submitter's pipeline: acquires without blocking while it holds a batch, waits only after dispatching. */
    static final class Submitter {
        final HardwareQueue queue;
        final Request[] batch = new Request[MAX_BATCH];
        int batched;
        final ConcurrentLinkedQueue<String> failures;

        Submitter(HardwareQueue queue, ConcurrentLinkedQueue<String> failures) {
            this.queue = queue;
            this.failures = failures;
        }

        Request acquire(int dataBytes) throws InterruptedException {
            Request r = queue.tryAcquire(dataBytes);
            if (r == null) {
                dispatch();
                r = queue.acquire(dataBytes);
            }
            return r;
        }

        void add(Request r) {
            batch[batched++] = r;
        }

        void dispatch() {
            if (batched > 0) {
                queue.dispatch(batch, batched);
                batched = 0;
            }
        }
    }

    @Test
    void concurrentWritesThenReadsMatchTheReferenceByteForByte() throws Exception {
        MemoryBlockDriver driver = new MemoryBlockDriver(DEVICE);
        driver.mode(MemoryBlockDriver.Mode.ASYNC);
        byte[] reference = new byte[(int) DEVICE];
        ConcurrentLinkedQueue<String> failures = new ConcurrentLinkedQueue<>();
        try (BlockLayer layer = new BlockLayer(driver, QUEUES, DEPTH, POOL, MAX)) {
            HardwareQueue[] bound = new HardwareQueue[THREADS];
            for (int t = 0; t < THREADS; t++) {
                bound[t] = layer.nextQueue();
                assertEquals(t % QUEUES, bound[t].index(), "nextQueue() is round-robin");
            }
            long slice = DEVICE / THREADS;
            runAll("writer", t -> writer(new Submitter(bound[t], failures), t * slice, slice, reference, 1000L + t));
            assertTrue(failures.isEmpty(), () -> "write failures: " + failures);
            runAll("reader", t -> reader(new Submitter(bound[t], failures), reference, 2000L + t));
            assertTrue(failures.isEmpty(), () -> "read failures: " + failures);

            // Every byte, once more, in 1 MiB reads on queue 0.
            Submitter s = new Submitter(layer.queue(0), failures);
            for (long off = 0; off < DEVICE; off += MAX) {
                readAndCheck(s, new long[] {off}, new int[] {MAX}, 1, reference);
            }
            assertTrue(failures.isEmpty(), () -> "full read: " + failures);

            assertTrue(layer.awaitIdle(10_000), "every tag back at the end");
            for (int q = 0; q < QUEUES; q++) {
                HardwareQueue hq = layer.queue(q);
                assertTrue(hq.requestsTotal() > 0, "queue " + q + " saw no requests");
                assertEquals(hq.pool().chunks(), hq.pool().freeChunks(), "queue " + q + " leaked chunks");
                assertTrue(hq.latency(Op.WRITE).count() > 0 && hq.latency(Op.READ).count() > 0,
                        "queue " + q + " recorded write and read latencies");
            }
            long poolChunks = (long) QUEUES * (POOL / BufferPool.CHUNK);
            assertTrue(driver.maxChunksInDriver.get() <= poolChunks, "chunks in the driver "
                    + driver.maxChunksInDriver.get() + " exceed the pools' " + poolChunks);
        } finally {
            driver.close();
        }
    }

    interface Body {
        void run(int thread) throws Exception;
    }

    static void runAll(String name, Body body) throws InterruptedException {
        List<Thread> threads = new ArrayList<>();
        ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
        for (int t = 0; t < THREADS; t++) {
            int id = t;
            threads.add(Thread.ofPlatform().name(name + "-" + t).start(() -> {
                try {
                    body.run(id);
                } catch (Throwable e) {
                    errors.add(e);
                }
            }));
        }
        for (Thread t : threads) {
            Waits.join(name + " threads", t);
        }
        if (!errors.isEmpty()) {
            AssertionError e = new AssertionError(name + " threads failed: " + errors);
            errors.forEach(e::addSuppressed);
            throw e;
        }
    }

    /** Rounds of 1..4 writes (sometimes a WRITE_ZEROES) on disjoint ranges of this thread's slice, in one batch. */
    static void writer(Submitter s, long base, long slice, byte[] reference, long seed) throws Exception {
        Random rnd = new Random(seed);
        for (int round = 0; round < ROUNDS; round++) {
            int k = 1 + rnd.nextInt(MAX_BATCH);
            long sub = slice / k;
            CountDownLatch done = new CountDownLatch(k);
            Request.Completion c = r -> {
                if (r.status() != Status.OK) {
                    s.failures.add(r + " status " + r.status());
                }
                r.release();
                done.countDown();
            };
            long[] offs = new long[k];
            int[] lens = new int[k];
            byte[][] data = new byte[k][];
            boolean[] zero = new boolean[k];
            for (int i = 0; i < k; i++) {
                lens[i] = 1 + rnd.nextInt((int) Math.min(MAX, sub));
                offs[i] = base + i * sub + rnd.nextLong(sub - lens[i] + 1);
                zero[i] = rnd.nextInt(8) == 0;
                Request r;
                if (zero[i]) {
                    r = s.acquire(0);
                    r.op = Op.WRITE_ZEROES;
                    r.length = lens[i];
                } else {
                    data[i] = new byte[lens[i]];
                    rnd.nextBytes(data[i]);
                    r = s.acquire(lens[i]);
                    r.op = Op.WRITE;
                    ByteBuffer[] bufs = r.buffers();
                    int pos = 0;
                    for (int seg = 0; seg < r.segments(); seg++) {
                        int n = bufs[seg].remaining();
                        bufs[seg].put(data[i], pos, n);
                        pos += n;
                    }
                    assertEquals(lens[i], pos, "segments cover the request");
                }
                r.offset = offs[i];
                r.completion = c;
                s.add(r);
            }
            s.dispatch();
            assertTrue(done.await(10, TimeUnit.SECONDS), "round " + round + ": " + done.getCount() + " of " + k
                    + " writes not completed");
            for (int i = 0; i < k; i++) {
                if (zero[i]) {
                    java.util.Arrays.fill(reference, (int) offs[i], (int) offs[i] + lens[i], (byte) 0);
                } else {
                    System.arraycopy(data[i], 0, reference, (int) offs[i], lens[i]);
                }
            }
        }
    }

    static void reader(Submitter s, byte[] reference, long seed) throws Exception {
        Random rnd = new Random(seed);
        for (int round = 0; round < ROUNDS; round++) {
            int k = 1 + rnd.nextInt(MAX_BATCH);
            long[] offs = new long[k];
            int[] lens = new int[k];
            for (int i = 0; i < k; i++) {
                lens[i] = 1 + rnd.nextInt(MAX);
                offs[i] = rnd.nextLong(DEVICE - lens[i] + 1);
            }
            readAndCheck(s, offs, lens, k, reference);
        }
    }

    static void readAndCheck(Submitter s, long[] offs, int[] lens, int k, byte[] reference) throws Exception {
        CountDownLatch done = new CountDownLatch(k);
        Request.Completion c = r -> {
            try {
                if (r.status() != Status.OK) {
                    s.failures.add(r + " status " + r.status());
                    return;
                }
                ByteBuffer[] bufs = r.buffers();
                long pos = r.offset;
                for (int seg = 0; seg < r.segments(); seg++) {
                    ByteBuffer b = bufs[seg];
                    while (b.hasRemaining()) {
                        byte got = b.get();
                        byte want = reference[(int) pos];
                        if (got != want) {
                            s.failures.add(r + ": byte at " + pos + " is " + got + ", expected " + want);
                            return;
                        }
                        pos++;
                    }
                }
                if (pos != r.offset + r.length) {
                    s.failures.add(r + ": segments covered " + (pos - r.offset) + " bytes");
                }
            } finally {
                r.release();
                done.countDown();
            }
        };
        for (int i = 0; i < k; i++) {
            Request r = s.acquire(lens[i]);
            r.op = Op.READ;
            r.offset = offs[i];
            r.completion = c;
            s.add(r);
        }
        s.dispatch();
        assertTrue(done.await(10, TimeUnit.SECONDS), done.getCount() + " of " + k + " reads not completed");
    }
}
