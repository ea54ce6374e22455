package io.pmemblk.cli;

import io.pmemblk.nbd.NbdConfig;
import io.pmemblk.nbd.NbdServer;
import io.pmemblk.nbd.tls.TlsServer;
import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;
import io.pmemblk.posix.UnsafePathException;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import io.pmemblk.ublk.BackingFile;
import io.pmemblk.ublk.UblkConfig;
import io.pmemblk.ublk.UblkDevice;
import io.pmemblk.ublk.UblkException;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.VhostUserBlkServer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Callable;
import java.util.concurrent.LinkedBlockingQueue;

/**
 * {@code pmemblk serve}: opens the device and serves it over NBD until SIGTERM or SIGINT, then stops
 * gracefully: no new connections, in-flight requests finish and are answered, everything is persisted,
 * the mapping is released, and the process exits 0; when persisting fails, or a write-back failed earlier, it says
 * the data was NOT persisted and exits {@value #EXIT_NOT_PERSISTED}. When its ublk device stops being served (a queue
 * failed, another process stopped the device) it stops the same way and exits {@value #EXIT_UBLK_LOST}. SIGHUP re-reads the settings and applies the keys that can
 * change live ({@link LiveSettings}). Under systemd ({@code Type=notify}) it reports READY=1 once every listener
 * is up, RELOADING=1 and READY=1 around a reload, STOPPING=1, and a STATUS line with the exports.
 */
@Command(name = "serve", mixinStandardHelpOptions = true,
        description = "Serve the persistent-memory device over NBD (unix socket and TCP), with ublk.enabled=true as"
                + " /dev/ublkbN, and with vhost.socket=PATH to a QEMU guest as a vhost-user-blk disk. Stops cleanly"
                + " on SIGTERM/SIGINT; SIGHUP re-reads --config and applies the keys that can change live"
                + " (route.dma.min-bytes, route.dma.min-segments, route.dma.bounce, nbd.stall-timeout, log.level)."
                + " Copy offload: dma.engine=soft, vfio (PCI devices bound to vfio-pci), or vfio-user with"
                + " dma.vfio-user.socket=PATH (the I/OAT device of a `pmemblk dma-device --socket PATH` process).")
final class ServeCommand implements Callable<Integer> {
    private static final System.Logger LOG = System.getLogger("pmemblk");
    /**
     * Largest request the kernel sends to /dev/ublkbN (it splits bigger ones): 1 MiB, twice ublksrv's default.
     * Buffers are taken per request from the queue's pool, which bounds the bytes in flight whatever this is.
     */
    static final int UBLK_MAX_IO_BYTES = 1 << 20;

    @Mixin
    SettingsOptions options;

    @Override
    public Integer call() throws Exception {
        // Handled from the start, so a signal that comes during start-up waits for it: handling them ourselves
        // (rather than through shutdown hooks) lets a graceful stop exit 0, and without a handler the JVM's
        // default for SIGHUP is to exit. One thread (this one) acts on them, in the order they came.
        BlockingQueue<String> signals = new LinkedBlockingQueue<>();
        String hangup = ServeSignals.install(signals); // SIGHUP handled even when started ignored (nohup)
        Settings s = options.load();
        if (hangup != null) { // once the settings hold: a wrong one stops start-up with its one line, nothing else
            System.err.println("pmemblk: " + hangup);
        }
        LiveSettings.applyLogLevel(s.get(Keys.LOG_LEVEL));

        boolean ublkEnabled = s.get(Keys.UBLK_ENABLED);
        if (ublkEnabled) {
            // Before the device file is created or a socket bound: a machine without ublk is told so, and nothing
            // is left behind.
            try {
                UblkDevice.checkAvailable();
            } catch (UblkException e) {
                System.err.println("pmemblk: ublk.enabled=true but " + e.getMessage());
                return 1;
            }
        }
        TlsServer tls;
        TrustedDirectory socketDirectory = null;
        TrustedDirectory vhostDirectory = null;
        try {
            // A pmem.path that systemd deletes at stop is refused before anything is created there.
            String privateTmp = PrivateTmp.refusal(s.get(Keys.PMEM_PATH), System.getenv());
            if (privateTmp != null) {
                System.err.println("pmemblk: " + privateTmp);
                return 1;
            }
            tls = s.get(Keys.NBD_TLS) == Keys.TlsMode.OFF ? TlsServer.off()
                    : TlsServer.load(s.get(Keys.NBD_TLS) == Keys.TlsMode.REQUIRE,
                            s.get(Keys.NBD_TLS_CERTIFICATE), s.get(Keys.NBD_TLS_KEY),
                            s.get(Keys.NBD_TLS_VERIFY_CLIENTS));
            // Before the device is opened or created: a wrong socket directory leaves no device file behind. Held
            // open from here to the bind, so the socket lands in the directory checked now, not in whatever its
            // name leads to after the device has opened.
            if (s.get(Keys.NBD_SOCKET) != null) {
                socketDirectory = TrustedPath.ofThisProcess().openParentOf(s.get(Keys.NBD_SOCKET), "nbd.socket");
            }
            vhostDirectory = VhostFrontend.socketDirectory(s);
        } catch (IOException e) {
            if (socketDirectory != null) {
                socketDirectory.close();
            }
            System.err.println("pmemblk: " + e.getMessage());
            return 1;
        }
        warnIfExposed(s);
        Device device;
        try {
            device = Device.open(s);
        } catch (IOException e) {
            if (socketDirectory != null) {
                socketDirectory.close();
            }
            if (vhostDirectory != null) {
                vhostDirectory.close();
            }
            if (e instanceof UnsafePathException) {
                System.err.println("pmemblk: " + e.getMessage());
            } else if (e instanceof io.pmemblk.dma.vfio.VfioException) {
                System.err.println("pmemblk: dma.engine=vfio: " + e.getMessage());
            } else if (e instanceof io.pmemblk.dma.vfiouser.client.VfioUserException) {
                System.err.println("pmemblk: dma.engine=vfio-user: " + e.getMessage());
            } else {
                System.err.println("pmemblk: cannot open pmem.path " + s.get(Keys.PMEM_PATH) + ": " + e.getMessage());
            }
            return 1;
        }
        Metrics metrics = null;
        NbdServer server = null;
        UblkDevice ublk = null;
        VhostUserBlkServer vhost = null;
        io.pmemblk.nvme.NvmeTcpServer nvme = null;
        BitmapControl bitmapControl = null;
        SystemdNotify systemd = SystemdNotify.fromEnvironment();
        List<String> exports = new ArrayList<>();
        try {
            int metricsPort = s.get(Keys.METRICS_PORT);
            if (metricsPort != 0) {
                metrics = Metrics.start(device, metricsPort);
            }
            // NBD only with a listener of its own: vhost.socket alone is a setup too (Settings checks one is left)
            List<java.net.URI> uris = List.of();
            if (s.get(Keys.NBD_SOCKET) != null || s.get(Keys.NBD_PORT) != 0) {
                server = new NbdServer(new NbdConfig(s.get(Keys.NBD_EXPORT), s.get(Keys.NBD_SOCKET),
                        s.get(Keys.NBD_BIND), s.get(Keys.NBD_PORT), Keys.MAX_REQUEST_BYTES,
                        s.get(Keys.NBD_MAX_CONNECTIONS),
                        // no path: the description goes to any client that asks, before TLS too (nbdkit sends none)
                        "pmemblk " + Sizes.format(device.driver().size())),
                        device.layer());
                if (device.bitmaps() != null) {
                    server.dirtyBitmaps(new BitmapContexts(device.bitmaps()));
                }
                if (socketDirectory != null) {
                    server.unixSocketDirectory(socketDirectory); // the server closes it from here on
                    socketDirectory = null;
                }
                server.stallTimeout(java.time.Duration.ofSeconds(s.get(Keys.NBD_STALL_TIMEOUT))).tls(tls)
                        .handshakeTimeout(java.time.Duration.ofSeconds(s.get(Keys.NBD_HANDSHAKE_TIMEOUT)))
                        .maxHandshakesPerPeer(s.get(Keys.NBD_MAX_HANDSHAKES_PER_PEER))
                        .idleTimeout(java.time.Duration.ofSeconds(s.get(Keys.NBD_IDLE_TIMEOUT)))
                        .busyPoll(java.time.Duration.ofNanos(1000L * s.get(Keys.NBD_BUSY_POLL)));
                uris = server.start();
            }
            if (ublkEnabled) {
                // The device records which file it serves (the one mapped), so that recovery resumes it on that file only.
                ublk = UblkDevice.open(device.layer(), new UblkConfig(s.get(Keys.UBLK_ID), s.ublkQueues(),
                        s.ublkDepth(), s.get(Keys.UBLK_BLOCK_SIZE), UBLK_MAX_IO_BYTES, s.get(Keys.UBLK_RECOVERY)),
                        BackingFile.of(device.region().fd(), device.region().path()));
                if (metrics != null) {
                    metrics.addUblk(ublk);
                }
                ublk.lost().thenAccept(why -> signals.add(UBLK_LOST + why));
                System.err.println("pmemblk: ublk " + ublk);
            }
            VhostUserBlkConfig vhostConfig = VhostFrontend.config(s);
            java.nio.file.Path vhostSocket = null;
            if (vhostConfig != null) {
                vhost = VhostFrontend.server(s, vhostConfig, device, vhostDirectory);
                vhostDirectory = null; // the server closes it from here on
                vhostSocket = vhost.start();
                if (metrics != null) {
                    metrics.addVhost(vhost);
                }
            }
            if (device.bitmaps() != null) {
                bitmapControl = BitmapControl.start(device.bitmaps());
                System.err.println("pmemblk: dirty bitmaps in " + device.bitmaps().directory().path() + " ("
                        + String.join(", ", device.bitmaps().names()) + "), `pmemblk bitmap` control socket "
                        + bitmapControl.path());
            }
            nvme = NvmeFrontend.server(s, device);
            java.net.InetSocketAddress nvmeAt = nvme == null ? null : nvme.start();
            System.err.println("pmemblk: " + device.region() + (device.driver().btt() != null ? ", layout " + device.driver().btt()
                    : "") + ", " + s.get(Keys.QUEUES) + " queues x "
                    + s.get(Keys.QUEUE_DEPTH) + " tags, dma.engine=" + s.text(Keys.DMA_ENGINE) + ", "
                    + tls.describe());
            if (metrics != null) {
                System.out.println("metrics: http://127.0.0.1:" + metrics.port() + "/metrics");
            }
            for (java.net.URI uri : uris) {
                exports.add(uri.toString());
            }
            if (ublk != null) {
                exports.add(ublk.blockDevice().toString());
            }
            if (vhostSocket != null) {
                exports.add("vhost-user-blk " + vhostSocket);
            }
            if (nvmeAt != null) {
                exports.add("nvme-tcp " + nvmeAt.getHostString() + ":" + nvmeAt.getPort() + " " + nvme.subsystemNqn());
            }
            for (String export : exports) {
                System.out.println("ready: " + export);
            }
            System.out.flush();
        } catch (IOException | RuntimeException e) {
            System.err.println("pmemblk: cannot start: " + e.getMessage());
            systemd.status("cannot start: " + e.getMessage());
            systemd.close();
            // ublk's own failures undo themselves; a device that started is stopped here
            stopFrontends(ublk, vhost, nvme, server, bitmapControl);
            if (socketDirectory != null) {
                socketDirectory.close();
            }
            if (vhostDirectory != null) {
                vhostDirectory.close();
            }
            if (metrics != null) {
                metrics.close();
            }
            try {
                device.close();
            } catch (IOException ce) {
                System.err.println("pmemblk: data NOT persisted: " + ce.getMessage());
            }
            return 1;
        }

        LiveSettings live = new LiveSettings(options.config, options.overrides, s, device.driver(), server);
        systemd.ready(status(exports, live.applied()));
        String stop;
        while ((stop = signals.take()).equals("HUP")) {
            systemd.reloading("reloading " + (options.config == null ? "(no --config file)" : options.config));
            LiveSettings.Outcome outcome = live.reload();
            System.err.println("pmemblk: " + (options.config == null && outcome.error() == null
                    ? "reload: no --config file to re-read; nothing changed" : outcome.summary()));
            systemd.ready((outcome.error() != null ? "last reload failed (" + outcome.error() + "); " : "")
                    + status(exports, live.applied()));
        }
        String ublkLost = stop.startsWith(UBLK_LOST) ? stop.substring(UBLK_LOST.length()) : null;
        if (ublkLost != null) {
            // As ublksrv's daemon: a device no longer served ends the server, so that a restart serves it again
            // (resumes it, with ublk.recovery) instead of a server that says it serves a device the kernel stopped.
            systemd.stopping("stopping: " + ublkLost);
            System.err.println("pmemblk: " + ublkLost + "; stopping the server (exit " + EXIT_UBLK_LOST + ")");
            try {
                System.err.println("pmemblk: " + ublk.closeLost());
            } catch (UblkException e) {
                System.err.println("pmemblk: stopping " + ublk.blockDevice() + ": " + e.getMessage());
            }
            ublk = null;
        }
        systemd.stopping("stopping: finishing in-flight requests");
        System.err.println("pmemblk: stopping: finishing in-flight requests");
        stopFrontends(ublk, vhost, nvme, server, bitmapControl);
        boolean idle;
        String notPersisted = null;
        try {
            idle = device.close(30_000);
        } catch (IOException e) {
            idle = true;
            notPersisted = e.getMessage();
        }
        if (metrics != null) {
            metrics.close();
        }
        String inFlight = idle ? "" : " (some requests were still in flight at the deadline)";
        if (notPersisted != null) {
            // Never "persisted" after a failed write-back: what the clients were told OK may not be on the storage.
            System.err.println("pmemblk: stopped" + inFlight + "; data NOT persisted: " + notPersisted);
            systemd.close();
            return EXIT_NOT_PERSISTED;
        }
        System.err.println("pmemblk: stopped" + inFlight + "; data persisted");
        systemd.close();
        return ublkLost != null ? EXIT_UBLK_LOST : 0;
    }

    /** Exit code of a stop that could not make the data durable (a write-back failed, now or earlier). */
    static final int EXIT_NOT_PERSISTED = 3;
    /** Exit code of a stop because the ublk device stopped being served (its data persisted). */
    static final int EXIT_UBLK_LOST = 4;
    /** What the ublk device's loss puts in the signal inbox, before what happened. */
    private static final String UBLK_LOST = "UBLK-LOST ";

    /**
     * A TCP listener beyond loopback without required TLS: anyone who reaches the port reads and rewrites the
     * whole device. Allowed (a trusted network, a tunnel), but never silently.
     */
    private static void warnIfExposed(Settings s) {
        if (s.get(Keys.NBD_PORT) == 0 || s.get(Keys.NBD_TLS) == Keys.TlsMode.REQUIRE) {
            return;
        }
        String bind = s.get(Keys.NBD_BIND);
        boolean loopback;
        try {
            loopback = java.net.InetAddress.getByName(bind).isLoopbackAddress();
        } catch (java.net.UnknownHostException e) {
            loopback = false; // the bind fails later and says so
        }
        if (!loopback) {
            System.err.println("pmemblk: warning: nbd.bind=" + bind + " serves the device beyond this machine with"
                    + " nbd.tls=" + s.text(Keys.NBD_TLS) + ": anyone who can reach port " + s.get(Keys.NBD_PORT)
                    + " can " + (s.get(Keys.NBD_TLS) == Keys.TlsMode.ON ? "skip STARTTLS and " : "")
                    + "read and overwrite all of it, and anyone on the path can see and change the data;"
                    + " set nbd.tls=require with nbd.tls.verify-clients, or bind to 127.0.0.1");
        }
    }

    /** systemd's STATUS line: what is served where, and the settings a reload may have changed. */
    static String status(List<String> exports, Settings s) {
        return "serving " + String.join(" ", exports) + "; dma.engine=" + s.text(Keys.DMA_ENGINE)
                + " route.dma.min-bytes=" + s.text(Keys.ROUTE_DMA_MIN_BYTES)
                + " route.dma.min-segments=" + s.text(Keys.ROUTE_DMA_MIN_SEGMENTS)
                + " route.dma.bounce=" + s.get(Keys.ROUTE_DMA_BOUNCE)
                + " nbd.stall-timeout=" + s.text(Keys.NBD_STALL_TIMEOUT) + "s log.level=" + s.text(Keys.LOG_LEVEL);
    }

    /**
     * Stops what serves the device (those not started are null), in the order that drains them: ublk first
     * (STOP_DEV drains the disk through its queues, which need the block layer still open), vhost next (its rings
     * drain through the block layer, and the guest's memory is unmapped before it closes), then NVMe/TCP, NBD and
     * the bitmap control socket. The same on a failed start as on a stop.
     */
    private static void stopFrontends(UblkDevice ublk, VhostUserBlkServer vhost, io.pmemblk.nvme.NvmeTcpServer nvme,
                                      NbdServer server, BitmapControl bitmapControl) {
        closeUblk(ublk);
        if (vhost != null) {
            vhost.close();
        }
        if (nvme != null) {
            nvme.close();
        }
        if (server != null) {
            server.close();
        }
        if (bitmapControl != null) {
            bitmapControl.close();
        }
    }

    private static void closeUblk(UblkDevice ublk) {
        if (ublk == null) {
            return;
        }
        try {
            ublk.close();
            System.err.println("pmemblk: " + ublk.blockDevice() + " stopped and deleted");
        } catch (UblkException e) {
            System.err.println("pmemblk: stopping " + ublk.blockDevice() + ": " + e.getMessage());
        }
    }
}
