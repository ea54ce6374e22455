package io.pmemblk.cli;

import io.pmemblk.nbd.NbdConfig;
import io.pmemblk.nbd.NbdServer;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import sun.misc.Signal;

import java.io.IOException;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/**
 * {@code pmemblk serve}: opens the device and serves it over NBD until SIGTERM or SIGINT, then stops
 * gracefully: no new connections, in-flight requests finish and are answered, everything is persisted,
 * the mapping is released, and the process exits 0.
 */
@Command(name = "serve", mixinStandardHelpOptions = true,
        description = "Serve the persistent-memory device over NBD (unix socket and TCP). Stops cleanly on SIGTERM/SIGINT.")
final class ServeCommand implements Callable<Integer> {
    private static final System.Logger LOG = System.getLogger("pmemblk");

    @Mixin
    SettingsOptions options;

    @Override
    public Integer call() throws Exception {
        Settings s = options.load();
        CountDownLatch stop = new CountDownLatch(1);
        // Handling the signals ourselves (rather than through shutdown hooks) lets a graceful stop exit 0.
        Signal.handle(new Signal("TERM"), sig -> stop.countDown());
        Signal.handle(new Signal("INT"), sig -> stop.countDown());

        Device device;
        try {
            device = Device.open(s);
        } catch (IOException e) {
            System.err.println("pmemblk: cannot open pmem.path " + s.get(Settings.PMEM_PATH) + ": " + e.getMessage());
            return 1;
        }
        Metrics metrics = null;
        NbdServer server = null;
        try {
            int metricsPort = s.get(Settings.METRICS_PORT);
            if (metricsPort != 0) {
                metrics = Metrics.start(device, metricsPort);
            }
            server = new NbdServer(new NbdConfig(s.get(Settings.NBD_EXPORT), s.get(Settings.NBD_SOCKET),
                    s.get(Settings.NBD_BIND), s.get(Settings.NBD_PORT), Settings.MAX_REQUEST_BYTES,
                    s.get(Settings.NBD_MAX_CONNECTIONS),
                    "pmemblk " + Sizes.format(device.region().size()) + " on " + device.region().path()),
                    device.layer());
            server.stallTimeout(java.time.Duration.ofSeconds(s.get(Settings.NBD_STALL_TIMEOUT)));
            List<java.net.URI> uris = server.start();
            System.err.println("pmemblk: " + device.region() + ", " + s.get(Settings.QUEUES) + " queues x "
                    + s.get(Settings.QUEUE_DEPTH) + " tags, dma.engine=" + s.text(Settings.DMA_ENGINE));
            if (metrics != null) {
                System.out.println("metrics: http://127.0.0.1:" + metrics.port() + "/metrics");
            }
            for (java.net.URI uri : uris) {
                System.out.println("ready: " + uri);
            }
            System.out.flush();
        } catch (IOException | RuntimeException e) {
            System.err.println("pmemblk: cannot start: " + e.getMessage());
            if (server != null) {
                server.close();
            }
            if (metrics != null) {
                metrics.close();
            }
            device.close();
            return 1;
        }

        stop.await();
        System.err.println("pmemblk: stopping: finishing in-flight requests");
        server.close();
        boolean idle = device.close(30_000);
        if (metrics != null) {
            metrics.close();
        }
        System.err.println("pmemblk: stopped" + (idle ? "" : " (some requests were still in flight at the deadline)")
                + "; data persisted");
        return 0;
    }
}
