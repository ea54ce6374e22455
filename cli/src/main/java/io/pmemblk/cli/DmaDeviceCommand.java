package io.pmemblk.cli;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.soft.SoftIoatDevice;
import io.pmemblk.dma.vfiouser.device.IoatPci;
import io.pmemblk.dma.vfiouser.device.IoatVfioUserDevice;
import io.pmemblk.settings.Groups;
import io.pmemblk.settings.Keys;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import sun.misc.Signal;

import java.lang.System.Logger.Level;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;

/**
 * {@code pmemblk dma-device}: the software I/OAT device as a PCI function of its own, served over vfio-user (a QEMU
 * >= 10.1 guest's {@code vfio-user-pci}, or {@code dma.engine=vfio-user}), until SIGTERM or SIGINT. It reports its
 * own CPU (the engines' and the whole process's) per GiB copied, so a benchmark can put the device's cost beside
 * its client's.
 */
@Command(name = "dma-device", mixinStandardHelpOptions = true,
        description = {"Serve pmemblk's software I/OAT DMA device over vfio-user on a unix socket (PCI 8086:0c50,"
                + " copies, XOR and PQ, one MSI-X vector per channel), for a QEMU >= 10.1 guest (-device vfio-user-pci, Linux's ioatdma"
                + " binds it) or for dma.engine=vfio-user. Needs libvfio-user (docs/operating.md). Runs until"
                + " SIGTERM or SIGINT; logs what the client maps, and the device's CPU per GiB copied."},
        footer = {"Example: pmemblk dma-device --socket /run/pmemblk/ioat.sock --channels 4",
                "  qemu-system-x86_64 ... -object memory-backend-memfd,id=ram,size=1G,share=on"
                        + " -machine memory-backend=ram \\",
                "    -device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"/run/pmemblk/ioat.sock\",\"type\":\"unix\"}}'"})
final class DmaDeviceCommand implements Callable<Integer> {
    private static final System.Logger LOG = System.getLogger(DmaDeviceCommand.class.getName());

    @Option(names = "--socket", required = true, paramLabel = "PATH",
            description = "Unix socket to serve on; created mode 0600 (a stale one of a dead process is replaced)")
    Path socket;

    /**
     * 4: as many as a CBDMA function of the hardware this presents has per socket group in the parts Linux lists,
     * enough for md's stripe copies across CPUs, and each channel's engine is a thread that spins only while it
     * has work, so idle channels cost nothing.
     */
    @Option(names = "--socket-group", paramLabel = "GROUP",
            description = "Give the socket to GROUP and make it 0660 (a QEMU running as another user in GROUP), as vhost.socket-group")
    String socketGroup;

    @Option(names = "--channels", defaultValue = "4", paramLabel = "N",
            description = "DMA channels, each with its engine thread and MSI-X vector (1.." + IoatPci.MAX_CHANNELS
                    + ", default ${DEFAULT-VALUE})")
    int channels;

    @Option(names = "--xfercap", defaultValue = "" + DmaEngine.SOFT_XFERCAP_LOG2, paramLabel = "LOG2",
            description = "Largest descriptor, as a power of two (XFERCAP; default ${DEFAULT-VALUE}, 1 MiB, as on hardware)")
    int xfercapLog2;

    @Option(names = "--metrics-interval", defaultValue = "10s", paramLabel = "DURATION",
            description = "How often a metrics line is logged while the device copies (e.g. 10s, 1m; 0 for only at exit)")
    String metricsInterval;

    @Option(names = "--log-level", defaultValue = "info", paramLabel = "LEVEL",
            description = "error, warning, info, debug or trace (debug adds libvfio-user's own lines)")
    String logLevel;

    @Override
    public Integer call() throws Exception {
        // Usage errors (exit 2, naming the option) before a signal handler or the socket: Enum.valueOf's own
        // message named a Java class, and the device's channel check exited 1.
        Keys.LogLevel level;
        try {
            level = Keys.LogLevel.valueOf(logLevel.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new picocli.CommandLine.ParameterException(new picocli.CommandLine(this), "--log-level " + logLevel
                    + " is not allowed (allowed: error, warning, info, debug or trace)");
        }
        if (channels < 1 || channels > IoatPci.MAX_CHANNELS) {
            throw new picocli.CommandLine.ParameterException(new picocli.CommandLine(this), "--channels " + channels
                    + " is not allowed (allowed: 1.." + IoatPci.MAX_CHANNELS + ", the registers of each must end before"
                    + " the MSI-X table)");
        }
        java.nio.file.attribute.GroupPrincipal group = null;
        if (socketGroup != null && !socketGroup.isBlank()) {
            try {
                group = Groups.byNameOrNumber(socketGroup);
            } catch (IllegalArgumentException e) {
                throw new picocli.CommandLine.ParameterException(new picocli.CommandLine(this),
                        "--socket-group " + socketGroup + ": no such group (allowed: a group in /etc/group)");
            }
        }
        LiveSettings.applyLogLevel(level);
        Duration every = parseDuration(metricsInterval);
        BlockingQueue<String> signals = new LinkedBlockingQueue<>();
        Signal.handle(new Signal("TERM"), s -> signals.add(s.getName()));
        Signal.handle(new Signal("INT"), s -> signals.add(s.getName()));
        long cpuAtStart = processCpuNanos();
        try (IoatVfioUserDevice device = IoatVfioUserDevice.start(socket.toAbsolutePath(), group, channels, xfercapLog2)) {
            long lastBytes = 0;
            String sig = null;
            while (sig == null) {
                sig = every.isZero() ? signals.take() : signals.poll(every.toMillis(), TimeUnit.MILLISECONDS);
                if (device.failure() != null) {
                    LOG.log(Level.ERROR, "dma-device: stopped serving: " + device.failure());
                    return 1;
                }
                long bytes = device.model().bytesCopied();
                if (sig == null && bytes != lastBytes) {
                    LOG.log(Level.INFO, metrics(device.model(), processCpuNanos() - cpuAtStart));
                    lastBytes = bytes;
                }
            }
            LOG.log(Level.INFO, "dma-device: SIG" + sig + ", stopping; " + metrics(device.model(),
                    processCpuNanos() - cpuAtStart));
        }
        return 0;
    }

    /** One line a benchmark can read: copies, bytes, and the device's CPU in total and per GiB. */
    static String metrics(SoftIoatDevice model, long processCpuNanos) {
        long bytes = model.bytesCopied();
        long descriptors = 0;
        for (int i = 0; i < model.channelCount(); i++) {
            descriptors += model.descriptorsCompleted(i);
        }
        long engine = model.engineCpuTimeNanos();
        double gib = bytes / (double) (1L << 30);
        return String.format(java.util.Locale.ROOT, "dma-device metrics: descriptors=%d bytes=%d engine_cpu_ms=%.1f"
                        + " process_cpu_ms=%.1f engine_cpu_ms_per_gib=%s process_cpu_ms_per_gib=%s", descriptors, bytes,
                engine / 1e6, processCpuNanos / 1e6, gib > 0 ? String.format(java.util.Locale.ROOT, "%.1f", engine / 1e6 / gib) : "-",
                gib > 0 ? String.format(java.util.Locale.ROOT, "%.1f", processCpuNanos / 1e6 / gib) : "-");
    }

    private static long processCpuNanos() {
        return ProcessHandle.current().info().totalCpuDuration().map(Duration::toNanos).orElse(0L);
    }

    static Duration parseDuration(String s) {
        String t = s.trim().toLowerCase(java.util.Locale.ROOT);
        try {
            if (t.equals("0")) {
                return Duration.ZERO;
            }
            boolean ms = t.endsWith("ms");
            long n = Long.parseLong(t.substring(0, t.length() - (ms ? 2 : 1)));
            if (n < 0) { // a negative wait for a signal returns at once: the loop would spin a CPU until SIGTERM
                throw new NumberFormatException();
            }
            if (ms) {
                return Duration.ofMillis(n);
            }
            return switch (t.charAt(t.length() - 1)) {
                case 's' -> Duration.ofSeconds(n);
                case 'm' -> Duration.ofMinutes(n);
                default -> throw new NumberFormatException();
            };
        } catch (RuntimeException e) {
            throw new picocli.CommandLine.ParameterException(new picocli.CommandLine(new DmaDeviceCommand()),
                    "--metrics-interval " + s + " is not a duration (allowed: 0, N ms, N s, N m)");
        }
    }
}
