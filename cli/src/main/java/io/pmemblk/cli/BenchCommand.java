package io.pmemblk.cli;

import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import io.pmemblk.bench.load.LoadGenerator;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.io.IOException;
import java.util.Locale;
import java.util.concurrent.Callable;

/**
 * {@code pmemblk bench}: drives the real block layer and pmem driver in process (no protocol), fio-style,
 * through the frontend seam, and prints throughput, latency percentiles, CPU time and the copy path measured.
 */
@Command(name = "bench", mixinStandardHelpOptions = true,
        description = "In-process load generator against the block layer and pmem driver (no network protocol):"
                + " every request is copied between buffers and the mapping, the path of a vhost-user request;"
                + " served NBD/ublk CPU requests are copied by the kernel straight to or from the mapping instead.")
final class BenchCommand implements Callable<Integer> {
    @Mixin
    SettingsOptions options;

    @Option(names = "--rw", defaultValue = "randread", description = "read, write, randread, randwrite or randrw (default ${DEFAULT-VALUE})")
    String rw;

    @Option(names = "--bs", defaultValue = "4k", description = "block size, e.g. 4k, 64k, 2m (default ${DEFAULT-VALUE})")
    String bs;

    @Option(names = "--iodepth", defaultValue = "32", description = "requests in flight per job (default ${DEFAULT-VALUE})")
    int iodepth;

    @Option(names = "--jobs", defaultValue = "1", description = "submitting threads; job i uses hardware queue i mod queues (default ${DEFAULT-VALUE})")
    int jobs;

    @Option(names = "--seconds", defaultValue = "5", description = "run time (default ${DEFAULT-VALUE})")
    double seconds;

    @Option(names = "--warmup", defaultValue = "1", description = "seconds run first and not counted, so the JIT has compiled the path (default ${DEFAULT-VALUE})")
    double warmup;

    @Option(names = "--size", description = "bytes of the device to use from offset 0 (default: all)")
    String span;

    @Option(names = "--route", defaultValue = "auto", description = "auto (thresholds), cpu or dma (default ${DEFAULT-VALUE})")
    String route;

    @Option(names = "--json", description = "print one JSON object instead of text")
    boolean json;

    @Override
    public Integer call() throws IOException, InterruptedException, SettingsException {
        Settings s;
        LoadGenerator.Job job;
        {
            s = options.load();
            LoadGenerator.Pattern pattern;
            try {
                pattern = LoadGenerator.Pattern.valueOf(rw.toUpperCase(Locale.ROOT));
            } catch (IllegalArgumentException e) {
                throw new SettingsException("--rw: '" + rw + "' is not allowed; allowed: read, write, randread, randwrite, randrw");
            }
            long blockSize = parseSize("--bs", bs);
            if (blockSize > Keys.MAX_REQUEST_BYTES) {
                throw new SettingsException("--bs: '" + bs + "' is not allowed; allowed: 1 to 32M");
            }
            if (iodepth < 1 || iodepth > s.get(Keys.QUEUE_DEPTH)) {
                throw new SettingsException("--iodepth: '" + iodepth + "' is not allowed; allowed: 1 to queue.depth ("
                        + s.get(Keys.QUEUE_DEPTH) + ")");
            }
            if (jobs < 1 || jobs > 256 || seconds <= 0) {
                throw new SettingsException("--jobs must be 1..256 and --seconds positive");
            }
            if (!route.equals("auto") && !route.equals("cpu") && !route.equals("dma")) {
                throw new SettingsException("--route: '" + route + "' is not allowed; allowed: auto, cpu, dma");
            }
            job = new LoadGenerator.Job(pattern, (int) blockSize, iodepth, jobs, seconds,
                    span == null ? 0 : parseSize("--size", span));
        }
        try (Device device = Device.open(s)) {
            if (!RouteOption.apply(device, route)) {
                return Main.USAGE;
            }
            LoadGenerator gen = new LoadGenerator(device.layer());
            if (warmup > 0) {
                gen.run(new LoadGenerator.Job(job.pattern(), job.blockSize(), job.iodepth(), job.jobs(), warmup, job.span()));
            }
            long engineCpu0 = device.dmaEngineCpuNanos();
            LoadGenerator.Result r = gen.run(job);
            long engineCpu = device.dmaEngineCpuNanos() - engineCpu0;
            if (json) {
                System.out.printf(Locale.ROOT, "{\"rw\":\"%s\",\"bs\":%d,\"iodepth\":%d,\"jobs\":%d,\"route\":\"%s\","
                                + "\"is_pmem\":%b,\"path\":\"buffers<->mapping\",\"seconds\":%.3f,\"ops\":%d,\"bytes\":%d,\"errors\":%d,\"iops\":%.1f,"
                                + "\"mib_per_s\":%.1f,\"lat_ns\":{\"p50\":%d,\"p99\":%d,\"p99.9\":%d,\"max\":%d},"
                                + "\"cpu_ns\":{\"submit\":%d,\"dma_engine\":%d}}%n",
                        rw, job.blockSize(), iodepth, jobs, route, device.region().isPmem(), r.seconds(), r.ops(),
                        r.bytes(), r.errors(), r.iops(), r.mibPerSecond(), r.p50Nanos(), r.p99Nanos(), r.p999Nanos(),
                        r.maxNanos(), r.submitCpuNanos(), engineCpu);
            } else {
                System.out.printf(Locale.ROOT, "pmemblk bench: %s bs=%s iodepth=%d jobs=%d route=%s on %s (is_pmem=%b), %.1f s%n",
                        rw, Sizes.format(job.blockSize()), iodepth, jobs, route, device.region().path(),
                        device.region().isPmem(), r.seconds());
                System.out.println("  path: " + LoadGenerator.PATH);
                int inFlight = gen.inFlightPerJob(job);
                if (inFlight < iodepth) {
                    System.out.printf(Locale.ROOT, "  in flight: %d per job, not %d: a job's fair share of its queue's"
                            + " tags (raise queue.depth for more)%n", inFlight, iodepth);
                }
                System.out.printf(Locale.ROOT, "  %s IOPS, %.1f MiB/s, %d errors%n", iops(r.iops()), r.mibPerSecond(), r.errors());
                System.out.printf(Locale.ROOT, "  latency (usec): p50 %.1f, p99 %.1f, p99.9 %.1f, max %.1f%n",
                        r.p50Nanos() / 1e3, r.p99Nanos() / 1e3, r.p999Nanos() / 1e3, r.maxNanos() / 1e3);
                System.out.printf(Locale.ROOT, "  CPU: submitting threads %.2f s (%.0f%% of one core, %.2f s/GiB); DMA engine threads %.2f s%n",
                        r.submitCpuNanos() / 1e9, 100.0 * r.submitCpuNanos() / 1e9 / r.seconds(), r.submitCpuSecondsPerGiB(),
                        engineCpu / 1e9);
            }
            return r.errors() == 0 ? 0 : 1;
        }
    }

    private static long parseSize(String option, String text) throws SettingsException {
        try {
            long v = Sizes.parse(text);
            if (v <= 0) {
                throw new IllegalArgumentException();
            }
            return v;
        } catch (IllegalArgumentException e) {
            throw new SettingsException(option + ": '" + text + "' is not allowed; allowed: a size like 4k, 64k, 2m");
        }
    }

    private static String iops(double v) {
        return v >= 1e6 ? String.format(Locale.ROOT, "%.2fM", v / 1e6)
                : v >= 1e3 ? String.format(Locale.ROOT, "%.1fk", v / 1e3) : String.format(Locale.ROOT, "%.0f", v);
    }
}
