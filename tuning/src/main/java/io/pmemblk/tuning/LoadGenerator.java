package io.pmemblk.tuning;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import org.HdrHistogram.Histogram;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

/**
 * An in-process load generator in the shape of fio: {@code jobs} threads, each bound to hardware queue
 * (job mod queues), each keeping {@code iodepth} requests in flight against the real block layer and driver,
 * with no network protocol in the way. Each job submits what it can as one batch, then reaps completions
 * (which the driver may deliver inline, or later from a DMA completion thread). A job waits for a tag or
 * buffers only while it holds no request at all (the rule of {@link HardwareQueue}): with a pool smaller than
 * jobs x iodepth x bs the jobs take turns instead of each holding part of what the other waits for.
 */
public final class LoadGenerator {
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
                throw new IllegalArgumentException("bs, iodepth, jobs and seconds must be positive");
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

    public Result run(Job job) throws InterruptedException {
        long size = layer.driver().size();
        long span = job.span() == 0 ? size : Math.min(job.span(), size);
        if (job.blockSize() > span) {
            throw new IllegalArgumentException("bs " + job.blockSize() + " is larger than the device span " + span);
        }
        List<Worker> workers = new ArrayList<>();
        CountDownLatch start = new CountDownLatch(1);
        for (int j = 0; j < job.jobs(); j++) {
            workers.add(new Worker(job, layer.queue(j % layer.queueCount()), span, j, start));
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
            ops += w.ops;
            bytes += w.bytes;
            errors += w.errors;
            cpu += w.cpuNanos;
        }
        return new Result(job, ops, bytes, errors, seconds, cpu, all.getValueAtPercentile(50),
                all.getValueAtPercentile(99), all.getValueAtPercentile(99.9), all.getMaxValue());
    }

    private static final class Worker implements Runnable, Request.Completion {
        final Job job;
        final HardwareQueue queue;
        final long blocks;
        final int id;
        final CountDownLatch start;
        final Request[] batch;
        final ArrayBlockingQueue<Request> done;
        final Histogram latency = new Histogram(TimeUnit.SECONDS.toNanos(10), 3);
        final SplittableRandom random;
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        long ops, bytes, errors, cpuNanos;
        long sequential;
        Thread self;
        final Request[] inline;
        int inlineCount;

        Worker(Job job, HardwareQueue queue, long span, int id, CountDownLatch start) {
            this.job = job;
            this.queue = queue;
            this.blocks = span / job.blockSize();
            this.id = id;
            this.start = start;
            this.batch = new Request[job.iodepth()];
            this.done = new ArrayBlockingQueue<>(job.iodepth());
            this.inline = new Request[job.iodepth()];
            this.random = new SplittableRandom(0x9E3779B97F4A7C15L * (id + 1));
            this.sequential = (blocks / job.jobs()) * id;
        }

        @Override
        public void completed(Request r) {
            if (Thread.currentThread() == self) {
                inline[inlineCount++] = r; // completed during our own dispatch (CPU route): no queue, no lock
            } else {
                done.add(r); // capacity = iodepth, never more in flight: cannot fail
            }
        }

        @Override
        public void run() {
            ThreadMXBean mx = ManagementFactory.getThreadMXBean();
            self = Thread.currentThread();
            try {
                start.await();
                long cpu0 = mx.getCurrentThreadCpuTime();
                long end = System.nanoTime() + (long) (job.seconds() * 1e9);
                int inflight = 0;
                boolean first = true;
                while (true) {
                    boolean running = System.nanoTime() < end;
                    int n = 0;
                    while (running && inflight + n < job.iodepth()) {
                        Request r = queue.tryAcquire(job.blockSize());
                        if (r == null) {
                            if (n > 0 || inflight > 0) {
                                // Out of tags or chunks: the ones we would wait for may be our own, in this
                                // batch (never completed before it is dispatched) or completed and not yet
                                // reaped (never freed before we release them). Dispatch and reap first.
                                break;
                            }
                            // Holding nothing: what we wait for is other jobs' requests, which complete.
                            r = queue.acquire(job.blockSize());
                        }
                        prepare(r, first);
                        batch[n++] = r;
                    }
                    first = false;
                    if (n > 0) {
                        inflight += n;
                        queue.dispatch(batch, n);
                    }
                    if (inflight == 0) {
                        break;
                    }
                    if (inlineCount > 0) {
                        for (int i = 0; i < inlineCount; i++) {
                            reap(inline[i]);
                            inline[i] = null;
                        }
                        inflight -= inlineCount;
                        inlineCount = 0;
                        if (inflight == 0 || done.isEmpty()) {
                            continue;
                        }
                    }
                    // reap at least one, then whatever else is ready
                    Request r = done.poll(30, TimeUnit.SECONDS);
                    if (r == null) {
                        throw new IllegalStateException("no completion within 30 s (" + inflight + " in flight)");
                    }
                    do {
                        reap(r);
                        inflight--;
                    } while ((r = done.poll()) != null);
                }
                cpuNanos = mx.getCurrentThreadCpuTime() - cpu0;
            } catch (Throwable t) {
                failure.set(t);
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

        private void reap(Request r) {
            long now = System.nanoTime();
            latency.recordValue(Math.min(now - r.startNanos, latency.getHighestTrackableValue()));
            if (r.status() == Status.OK) {
                ops++;
                bytes += r.length;
            } else {
                errors++;
            }
            r.release();
        }
    }
}
