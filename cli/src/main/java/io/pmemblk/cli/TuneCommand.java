package io.pmemblk.cli;

import io.pmemblk.bench.load.LoadGenerator;
import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.Route;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import io.pmemblk.tuning.Autotuner;
import io.pmemblk.tuning.Crossover;
import io.pmemblk.tuning.CrossoverChart;
import io.pmemblk.tuning.LoadProbe;
import io.pmemblk.tuning.PropertiesEditor;
import io.pmemblk.tuning.SegmentCopyProbe;
import io.pmemblk.tuning.SegmentThreshold;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.Callable;

/**
 * {@code pmemblk tune}: measures where DMA starts to beat the CPU on this machine, by size and by segments, and,
 * with {@code --write}, puts both thresholds into the properties file. It measures on a scratch file beside
 * {@code pmem.path} (same filesystem, so the same mapping kind and is_pmem), never on the device's own data,
 * through the load generator on the frontend seam: buffers to and from the mapping, the vhost-user path.
 */
@Command(name = "tune", mixinStandardHelpOptions = true,
        description = "Measure the CPU/DMA crossover on this machine, by request size and by segment count, and (with"
                + " --write) set route.dma.min-bytes and route.dma.min-segments in the config file, which a running"
                + " server applies on reload (SIGHUP); --chart draws what was measured. It measures copies between"
                + " buffers and the mapping in process (the path of a vhost-user request), not the kernel's copies of"
                + " served NBD/ublk requests, which stay on the CPU unless route.dma.bounce=true.")
final class TuneCommand implements Callable<Integer> {
    /** --config is also the file --write updates. */
    @Mixin
    SettingsOptions settingsOptions;

    @Option(names = "--write", description = "Write the measured route.dma.min-bytes and route.dma.min-segments into"
            + " --config FILE (other lines kept).")
    boolean write;

    @Option(names = "--objective", defaultValue = "throughput", description = "throughput or cpu (default ${DEFAULT-VALUE})")
    String objective;

    @Option(names = "--seconds", defaultValue = "60", description = "Measurement budget in seconds (default ${DEFAULT-VALUE})")
    double seconds;

    @Option(names = "--repeats", defaultValue = "3", description = "Runs per point; the median is kept (default ${DEFAULT-VALUE})")
    int repeats;

    @Option(names = "--jobs", defaultValue = "2", description = "Jobs of the deep-queue shape (default ${DEFAULT-VALUE})")
    int jobs;

    @Option(names = "--depth", defaultValue = "16", description = "Queue depth of the deep-queue shape (default ${DEFAULT-VALUE})")
    int depth;

    @Option(names = "--scratch-size", defaultValue = "256M", description = "Scratch file size (default ${DEFAULT-VALUE})")
    String scratchSize;

    @Option(names = "--sizes", paramLabel = "SIZE,...", split = ",",
            description = "Request sizes to sweep (default 4K,16K,64K,256K,1M,2M); two or more, 4K..32M.")
    List<String> sizeTexts;

    @Option(names = "--chart", paramLabel = "FILE.png",
            description = "Also draw throughput and CPU per GiB against request size, both routes, both queue shapes,"
                    + " with the crossover marked, as a PNG.")
    Path chart;

    @Override
    public Integer call() throws IOException, InterruptedException, SettingsException {
        Settings s;
        Crossover.Objective obj;
        long scratch;
        long[] sizes;
        {
            if (write && settingsOptions.config == null) {
                throw new SettingsException("--write needs --config FILE: the file to put route.dma.min-bytes and"
                        + " route.dma.min-segments in");
            }
            try {
                obj = Crossover.Objective.valueOf(objective.toUpperCase(Locale.ROOT));
            } catch (IllegalArgumentException e) {
                throw new SettingsException("--objective: '" + objective + "' is not allowed; allowed: throughput, cpu");
            }
            if (seconds <= 0 || repeats < 1 || jobs < 1 || depth < 1) {
                throw new SettingsException("--seconds, --repeats, --jobs and --depth must be positive");
            }
            try {
                scratch = Sizes.parse(scratchSize);
            } catch (IllegalArgumentException e) {
                throw new SettingsException("--scratch-size: '" + scratchSize + "' is not allowed; allowed: a size like 256M");
            }
            if (chart != null) {
                checkChartPath(chart);
            }
            sizes = sizes(sizeTexts);
            s = settingsOptions.load();
            if (s.get(Keys.DMA_ENGINE) == Keys.DmaEngineKind.NONE) {
                throw new SettingsException("dma.engine: 'none' leaves nothing to tune (every copy goes by CPU);"
                        + " allowed: soft (set dma.engine=soft in the file or with --set)");
            }
        }
        Path dir = s.get(Keys.PMEM_PATH).toAbsolutePath().getParent();
        Files.createDirectories(dir);
        Path scratchFile = Files.createTempFile(dir, ".pmemblk-tune", ".img");
        Files.delete(scratchFile);
        List<String> scratchSettings = new ArrayList<>(settingsOptions.overrides);
        scratchSettings.add("pmem.path=" + scratchFile);
        scratchSettings.add("pmem.size=" + scratch);
        // The seam gives each job a fair share of its queue (ceil(depth / (users + 1)) tags and chunks): deep enough
        // that every job of the deep shape keeps --depth requests of the largest size in flight, even all on one queue.
        scratchSettings.add("queue.depth=" + Math.min(4096, depth * (jobs + 1)));
        long pool = (long) (jobs + 1) * depth * sizes[sizes.length - 1];
        if (pool > s.get(Keys.QUEUE_BUFFER_BYTES)) {
            scratchSettings.add("queue.buffer-bytes=" + Math.min(4L << 30, (pool + BufferPool.CHUNK - 1) / BufferPool.CHUNK * BufferPool.CHUNK));
        }
        double perPoint = Math.max(0.05, seconds / (sizes.length * 8.0 * repeats + 8.0 * repeats));
        Autotuner.Options options = new Autotuner.Options(sizes, jobs, depth, repeats, perPoint, obj);
        Autotuner.Report report;
        boolean pmem;
        String segmentsNotMeasured = options.segmentSize() == 0 ? "no swept size is two pool chunks (256K) or more"
                : s.get(Keys.DMA_ENGINE) != Keys.DmaEngineKind.SOFT ? "the " + s.text(Keys.DMA_ENGINE)
                        + " engine's channels belong to the device's driver; measured on the soft engine only" : null;
        try (Device device = Device.open(Settings.load(settingsOptions.config, scratchSettings));
             SegmentCopyProbe segments = segmentsNotMeasured != null ? null : new SegmentCopyProbe(device.region(),
                     DmaEngine.soft(new IovaSpace(), 1, s.get(Keys.DMA_RING_SIZE)), (int) options.segmentSize())) {
            pmem = device.region().isPmem();
            System.err.printf(Locale.ROOT, "pmemblk tune: %s engine, scratch %s (is_pmem=%b), %d sizes x 2 routes x (1x1, %dx%d) x read/write x %d repeats,"
                            + " then %s in %d segments and in one, %.2f s each%n",
                    s.text(Keys.DMA_ENGINE), scratchFile, device.region().isPmem(), options.sizes().length, jobs, depth,
                    repeats, Sizes.format(options.segmentSize()), BufferPool.chunksFor(options.segmentSize()), perPoint);
            Autotuner.Probe probe = new LoadProbe(device.layer(), device.driver());
            // warm the JIT on both routes before anything is recorded
            for (Route route : Route.values()) {
                probe.measure(route, true, 65536, 1, depth, 0.3);
                probe.measure(route, false, 65536, 1, depth, 0.3);
            }
            report = new Autotuner(probe, segments, System.err).run(options);
        } finally {
            Files.deleteIfExists(scratchFile);
        }
        Autotuner.printTable(report, System.out);
        Crossover.Result r = report.result();
        String value = r.off() ? "off" : Sizes.format(r.threshold());
        System.out.println();
        System.out.println(r.explanation() + ".");
        if (s.text(Keys.DMA_ENGINE).equals("soft")) {
            System.out.println("Note: the soft DMA engine's copies run on this machine's own cores (its CPU% is shown as +engine%).");
        }
        if (r.noisy()) {
            System.out.println("Warning: the machine was too noisy to decide firmly: the DMA/CPU ratio next to the decision is"
                    + " within the spread of the repeats. Run again with more --seconds or on a quieter machine.");
        }
        SegmentThreshold.Result seg = report.segments();
        if (seg != null) {
            System.out.println(seg.explanation() + ".");
            if (seg.noisy()) {
                System.out.println("Warning: the segment comparison was within the spread of the repeats: run again with"
                        + " more --seconds or on a quieter machine.");
            }
        } else {
            System.out.println("Segments not measured: " + segmentsNotMeasured + "; route.dma.min-segments is left as it is.");
        }
        System.out.println("route.dma.min-bytes=" + value);
        if (seg != null) {
            System.out.println("route.dma.min-segments=" + seg.value());
        }
        if (write) {
            String how = Instant.now().truncatedTo(ChronoUnit.SECONDS) + " (objective " + obj.name().toLowerCase(Locale.ROOT)
                    + ", " + s.text(Keys.DMA_ENGINE) + " engine, sizes " + Sizes.format(sizes[0]) + ".."
                    + Sizes.format(sizes[sizes.length - 1]) + ", 1x1 and " + jobs + "x" + depth
                    + ", median of " + repeats + (r.noisy() ? ", noisy" : "") + "; measured " + LoadProbe.MEASURED + ")";
            PropertiesEditor.set(settingsOptions.config, Keys.ROUTE_DMA_MIN_BYTES.name(), value, how);
            System.out.println("wrote route.dma.min-bytes=" + value + " to " + settingsOptions.config);
            if (seg != null) {
                PropertiesEditor.set(settingsOptions.config, Keys.ROUTE_DMA_MIN_SEGMENTS.name(), seg.value(), how + ", "
                        + Sizes.format(seg.size()) + " in " + seg.segments() + " segments and in one");
                System.out.println("wrote route.dma.min-segments=" + seg.value() + " to " + settingsOptions.config);
            }
            System.out.println(reloadHint(settingsOptions.config));
        }
        if (chart != null) {
            String about = String.format(Locale.ROOT, "%s engine, scratch is_pmem=%b, objective %s, median of %d, %s",
                    s.text(Keys.DMA_ENGINE), pmem, obj.name().toLowerCase(Locale.ROOT), repeats,
                    Instant.now().truncatedTo(ChronoUnit.SECONDS));
            CrossoverChart.write(report, about, chart);
            System.out.println("chart: " + chart);
        }
        return 0;
    }

    /**
     * route.dma.min-bytes is applied by a running server on reload: say how, for the unit that reads this file
     * (pmemblk@NAME reads /etc/pmemblk/NAME.properties) or for any server started with --config FILE.
     */
    static String reloadHint(Path config) {
        Path abs = config.toAbsolutePath().normalize();
        String file = abs.getFileName().toString();
        if (abs.getParent() != null && abs.getParent().equals(Path.of("/etc/pmemblk")) && file.endsWith(".properties")) {
            String name = file.substring(0, file.length() - ".properties".length());
            return "No restart needed: a running pmemblk@" + name + " applies it on reload: systemctl reload pmemblk@"
                    + name;
        }
        return "No restart needed: a running 'pmemblk serve --config " + config + "' applies it on reload: kill -HUP"
                + " <its pid> (or systemctl reload, for a unit)";
    }

    /** --sizes, sorted; the default sweep without it. */
    static long[] sizes(List<String> texts) throws SettingsException {
        if (texts == null) {
            return Autotuner.Options.DEFAULT_SIZES;
        }
        java.util.TreeSet<Long> out = new java.util.TreeSet<>();
        for (String t : texts) {
            long v;
            try {
                v = Sizes.parse(t.trim());
            } catch (IllegalArgumentException e) {
                v = -1;
            }
            if (v < 4096 || v > Keys.MAX_REQUEST_BYTES || v % 4096 != 0) {
                throw new SettingsException("--sizes: '" + t + "' is not allowed; allowed: sizes from 4K to 32M,"
                        + " multiples of 4K, separated by commas (e.g. 64K,1M)");
            }
            out.add(v);
        }
        if (out.size() < 2) {
            throw new SettingsException("--sizes: " + String.join(",", texts) + " is one size; allowed: two or more,"
                    + " to find where DMA starts to win between them");
        }
        return out.stream().mapToLong(Long::longValue).toArray();
    }

    /** Before the minutes of measuring: a chart that could not be written is said now. */
    static void checkChartPath(Path chart) throws SettingsException {
        Path dir = chart.toAbsolutePath().getParent();
        if (!chart.getFileName().toString().toLowerCase(Locale.ROOT).endsWith(".png")) {
            throw new SettingsException("--chart " + chart + ": not allowed; allowed: a file name ending in .png");
        }
        if (Files.isDirectory(chart)) {
            throw new SettingsException("--chart " + chart + ": is a directory; allowed: a file name ending in .png");
        }
        if (dir == null || !Files.isDirectory(dir) || !Files.isWritable(dir)) {
            throw new SettingsException("--chart " + chart + ": directory " + dir
                    + " does not exist or is not writable; allowed: a .png file in a writable directory");
        }
    }
}
