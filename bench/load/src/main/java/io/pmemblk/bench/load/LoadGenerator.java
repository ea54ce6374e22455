package io.pmemblk.bench.load;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.HdrHistogram.Histogram;
import org.HdrHistogram.Recorder;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;

/**
 * An in-process load generator in the shape of fio: {@code jobs} threads, each a frontend of hardware queue
 * (job mod queues) through {@link FrontendQueue}, the seam NBD and ublk use, each keeping {@code iodepth}
 * requests in flight against the real block layer and driver, with no network protocol in the way. Each job
 * acquires, fills and batches what it can, dispatches the batch in one call, and waits only for a completion.
 *
 * <p>What it measures ({@link #PATH}): every request's data is copied between the queue's pool buffers and the
 * mapping, on both routes: the path of a vhost-user request (guest RAM to and from pmem) and of in-process
 * users. Served NBD and ublk requests on the CPU route take another: the kernel copies the payload straight
 * into or out of the mapping ({@link FrontendQueue#acquireWrite}, {@link FrontendQueue#acquireRead}).
 *
 * <p>A completion (inline during the dispatch, or on a DMA completion thread) records its latency and releases
 * the request itself, as a frontend's reply does: the tags and chunks a job waits for in
 * {@link FrontendQueue#acquire} are then never held by its own completed requests, and the seam's own rule
 * (dispatch the batch, then wait) is all it takes to never deadlock, with a pool far smaller than
 * jobs x iodepth x bs.
 */
public final class LoadGenerator {
    /** The copy path every request takes, for the reports of {@code bench} and {@code tune}. */
    public static final String PATH = "buffers <-> mapping on both routes (the vhost-user and in-process path;"
            + " served NBD/ublk CPU requests are copied by the kernel straight to or from the mapping instead)";

    /** No completion for this long while requests are in flight: the driver lost one. */
    static final long COMPLETION_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(30);

    public enum Pattern {
        READ(false, false), WRITE(true, false), RANDREAD(false, true), RANDWRITE(true, true), RANDRW(true, true);

        final boolean writes;
        final boolean random;

        Pattern(boolean writes, boolean random) {
            this.writes = writes;
            this.random = random;
        }
    }

    /** What to run. {@code span} bytes of the device from offset 0 are used (0 = all of it). */
    public record Job(Pattern pattern, int blockSize, int iodepth, int jobs, double seconds, long span) {
        public Job {
            if (blockSize <= 0 || iodepth <= 0 || jobs <= 0 || seconds <= 0) {
                throw new IllegalArgumentException("bs " + blockSize + ", iodepth " + iodepth + ", jobs " + jobs
                        + " and seconds " + seconds + ": allowed only positive values");
            }
        }
    }

    /** What a run measured. CPU times are of the submitting (job) threads. */
    public record Result(Job job, long ops, long bytes, long errors, double seconds, long submitCpuNanos,
                         long p50Nanos, long p99Nanos, long p999Nanos, long maxNanos) {
        public double mibPerSecond() {
            return bytes / seconds / (1 << 20);
        }

        public double iops() {
            return ops / seconds;
        }

        /** CPU seconds of the submitting threads per GiB moved. */
        public double submitCpuSecondsPerGiB() {
            return bytes == 0 ? 0 : submitCpuNanos / 1e9 / (bytes / (double) (1L << 30));
        }
    }

    private final BlockLayer layer;

    public LoadGenerator(BlockLayer layer) {
        this.layer = layer;
    }

    /**
     * The requests a job of {@code job} can keep in flight: its iodepth, or less where the seam's fair share of
     * the queue's tags is smaller (a frontend holds at most {@code ceil(depth / (users + 1))}, at least
     * {@link HardwareQueue#MIN_SHARE}, with the jobs of one queue as its users).
     */
    public int inFlightPerJob(Job job) {
        int perQueue = (job.jobs() + layer.queueCount() - 1) / layer.queueCount();
        int depth = layer.queue(0).sharedDepth();
        int share = Math.max(HardwareQueue.MIN_SHARE, (depth + perQueue) / (perQueue + 1));
        return Math.min(job.iodepth(), Math.min(share, depth));
    }

    public Result run(Job job) throws InterruptedException {
        long size = layer.driver().size();
        long span = job.span() == 0 ? size : Math.min(job.span(), size);
        if (job.blockSize() > span) {
            throw new IllegalArgumentException("bs " + job.blockSize() + " is larger than the device span " + span);
        }
        List<Worker> workers = new ArrayList<>();
        CountDownLatch start = new CountDownLatch(1);
        for (int j = 0; j < job.jobs(); j++) {
            workers.add(new Worker(job, new FrontendQueue(layer.queue(j % layer.queueCount())), span, j, start));
        }
        List<Thread> threads = new ArrayList<>();
        for (Worker w : workers) {
            threads.add(Thread.ofPlatform().name("bench-job-" + w.id).start(w));
        }
        long t0 = System.nanoTime();
        start.countDown();
        for (Thread t : threads) {
            t.join();
        }
        double seconds = (System.nanoTime() - t0) / 1e9;
        Histogram all = new Histogram(3);
        long ops = 0, bytes = 0, errors = 0, cpu = 0;
        for (Worker w : workers) {
            if (w.failure.get() != null) {
                throw new IllegalStateException("bench job " + w.id + " failed", w.failure.get());
            }
            all.add(w.latency);
            all.add(w.latencyElsewhere.getIntervalHistogram());
            ops += w.ops + w.opsElsewhere.get();
            bytes += w.bytes + w.bytesElsewhere.get();
            errors += w.errors + w.errorsElsewhere.get();
            cpu += w.cpuNanos;
        }
        return new Result(job, ops, bytes, errors, seconds, cpu, all.getValueAtPercentile(50),
                all.getValueAtPercentile(99), all.getValueAtPercentile(99.9), all.getMaxValue());
    }

    private static final class Worker implements Runnable, Request.Completion {
        private static final long MAX_LATENCY = TimeUnit.SECONDS.toNanos(10);

        final Job job;
        final FrontendQueue frontend;
        final long blocks;
        final int id;
        final CountDownLatch start;
        /**
         * Completions on this job's own thread (inline, during its dispatch: the CPU route) count in plain fields,
         * as cheap as the copy they follow; those on another thread (a DMA completion thread) in atomics and a
         * wait-free recorder. Nothing is allocated per value.
         */
        final Histogram latency = new Histogram(MAX_LATENCY, 3);
        long ops, bytes, errors, completedHere;
        final Recorder latencyElsewhere = new Recorder(MAX_LATENCY, 3);
        final AtomicLong opsElsewhere = new AtomicLong(), bytesElsewhere = new AtomicLong(),
                errorsElsewhere = new AtomicLong(), completedElsewhere = new AtomicLong();
        final SplittableRandom random;
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        long cpuNanos;
        long sequential;
        Thread self;
        volatile Thread parked;

        Worker(Job job, FrontendQueue frontend, long span, int id, CountDownLatch start) {
            this.job = job;
            this.frontend = frontend;
            this.blocks = span / job.blockSize();
            this.id = id;
            this.start = start;
            this.random = new SplittableRandom(0x9E3779B97F4A7C15L * (id + 1));
            this.sequential = (blocks / job.jobs()) * id;
        }

        @Override
        public void completed(Request r) {
            long latencyNanos = Math.min(System.nanoTime() - r.startNanos, MAX_LATENCY);
            boolean ok = r.status() == Status.OK;
            long length = r.length;
            r.release(); // before counting it: the job may acquire its tag the moment it sees the count
            if (Thread.currentThread() == self) {
                latency.recordValue(latencyNanos);
                if (ok) {
                    ops++;
                    bytes += length;
                } else {
                    errors++;
                }
                completedHere++;
                return;
            }
            latencyElsewhere.recordValue(latencyNanos);
            if (ok) {
                opsElsewhere.incrementAndGet();
                bytesElsewhere.addAndGet(length);
            } else {
                errorsElsewhere.incrementAndGet();
            }
            completedElsewhere.incrementAndGet();
            Thread t = parked;
            if (t != null) {
                LockSupport.unpark(t);
            }
        }

        private long completed() {
            return completedHere + completedElsewhere.get();
        }

        @Override
        public void run() {
            ThreadMXBean mx = ManagementFactory.getThreadMXBean();
            self = Thread.currentThread();
            try {
                start.await();
                long cpu0 = mx.getCurrentThreadCpuTime();
                long end = System.nanoTime() + (long) (job.seconds() * 1e9);
                long issued = 0; // acquired and added: the seam may dispatch the batch itself, inside acquire
                boolean first = true;
                while (System.nanoTime() < end) {
                    // A round tops up to iodepth in flight, at most iodepth requests: acquire may dispatch the
                    // batch itself before it waits, and inline completions then free room as fast as it fills.
                    for (int n = 0; n < job.iodepth() && issued - completed() < job.iodepth() && !frontend.full(); n++) {
                        Request r = frontend.acquire(job.blockSize());
                        prepare(r, first);
                        frontend.add(r);
                        issued++;
                    }
                    first = false;
                    frontend.dispatch();
                    awaitCompletedAtLeast(issued - job.iodepth() + 1, issued);
                }
                awaitCompletedAtLeast(issued, issued);
                cpuNanos = mx.getCurrentThreadCpuTime() - cpu0;
            } catch (Throwable t) {
                frontend.releaseUndispatched();
                failure.set(t);
            }
        }

        /** Waits (bounded) until {@code count} requests have completed, of {@code issued}. */
        private void awaitCompletedAtLeast(long count, long issued) {
            if (completed() >= count) {
                return;
            }
            long deadline = System.nanoTime() + COMPLETION_TIMEOUT_NANOS;
            parked = Thread.currentThread();
            try {
                while (completed() < count) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0) {
                        throw new IllegalStateException("bench job " + id + ": no completion within "
                                + TimeUnit.NANOSECONDS.toSeconds(COMPLETION_TIMEOUT_NANOS) + " s with "
                                + (issued - completed()) + " requests in flight");
                    }
                    LockSupport.parkNanos(this, left);
                }
            } finally {
                parked = null;
            }
        }

        private void prepare(Request r, boolean fillData) {
            boolean write = switch (job.pattern()) {
                case WRITE, RANDWRITE -> true;
                case READ, RANDREAD -> false;
                case RANDRW -> random.nextBoolean();
            };
            long block = job.pattern().random ? random.nextLong(blocks) : (sequential++ % blocks);
            r.op = write ? Op.WRITE : Op.READ;
            r.offset = block * job.blockSize();
            r.completion = this;
            if (write && fillData) {
                // Written content is not checked here; fill once so pmem is not written with stale pool bytes
                // that happen to be zero (some devices treat zero pages specially; ours does not, but fio fills too).
                for (int i = 0; i < r.segments(); i++) {
                    ByteBuffer b = r.buffers()[i];
                    while (b.hasRemaining()) {
                        b.put((byte) random.nextInt());
                    }
                }
            }
        }
    }
}
