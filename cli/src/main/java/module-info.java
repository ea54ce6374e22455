/**
 * The {@code pmemblk} command: assembles the device from the settings and serves it; info, bench, tune.
 * Native access is granted to io.pmemblk.posix and io.pmemblk.pmem only, never to this module or its libraries.
 */
module io.pmemblk.cli {
    requires io.pmemblk.nbd;
    requires io.pmemblk.ublk;
    requires io.pmemblk.vhost;
    requires io.pmemblk.nvme;
    requires io.pmemblk.pmem;
    requires io.pmemblk.settings;
    requires io.pmemblk.tuning;
    requires io.pmemblk.posix;  // the unix datagram socket of systemd's notify protocol; TrustedPath (pmem.path, the socket directory)
    requires java.logging;      // log.level sets java.util.logging's levels, System.Logger's backend
    requires info.picocli;
    requires io.prometheus.metrics.core;
    requires io.prometheus.metrics.model;
    requires io.prometheus.metrics.exporter.httpserver;
    requires jdk.httpserver;   // the Prometheus exporter's HTTP server; an automatic module does not pull it in
    requires jdk.unsupported;  // sun.misc.Signal: SIGTERM/SIGINT for a graceful stop, SIGHUP to reload

    exports io.pmemblk.cli;
    opens io.pmemblk.cli to info.picocli; // picocli fills @Option fields reflectively
}
