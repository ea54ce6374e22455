package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * systemd's notify protocol against the real {@code pmemblk serve}: a datagram socket bound by the test, named by
 * {@code $NOTIFY_SOCKET} as systemd does, receives READY=1 with the exports once every listener accepts,
 * RELOADING=1 and READY=1 around a SIGHUP (also one with a bad file, which changes nothing), and STOPPING=1.
 */
class ServeNotifyIT {
    private static final Duration WAIT = Duration.ofSeconds(60);

    @TempDir
    Path dir;

    @Test
    void readyWhenEveryListenerIsUpThenReloadingReadyAroundSighupThenStopping() throws Exception {
        int nbdPort = freeTcpPort(), metricsPort = freeTcpPort();
        Path sock = dir.resolve("nbd.sock");
        Path config = dir.resolve("pmemblk.properties");
        String base = "pmem.path=" + dir.resolve("p.img") + "\nnbd.socket=" + sock + "\nnbd.port=" + nbdPort
                + "\nmetrics.port=" + metricsPort + "\npmem.size=64M\ndma.engine=soft\n";
        Files.writeString(config, base);
        try (NotifyListener systemd = new NotifyListener(dir.resolve("notify").toString());
             // not waiting for its "ready:" lines: READY=1 is what the test waits for, as systemd does
             ServerProcess s = ServerProcess.start(dir, Map.of("NOTIFY_SOCKET", systemd.address),
                     List.of("--config", config.toString()), 0)) {
            String ready = systemd.next(WAIT);
            assertThat(ready).startsWith("READY=1\n");
            // every listener accepts by the time READY=1 is sent: connect to each right away, no retry
            try (SocketChannel unix = SocketChannel.open(StandardProtocolFamily.UNIX);
                 SocketChannel tcp = SocketChannel.open();
                 SocketChannel metrics = SocketChannel.open()) {
                unix.connect(UnixDomainSocketAddress.of(sock));
                tcp.connect(new InetSocketAddress("127.0.0.1", nbdPort));
                metrics.connect(new InetSocketAddress("127.0.0.1", metricsPort));
            }
            String status = NotifyListener.field(ready, "STATUS");
            String unixUri = "nbd+unix:///pmem0?socket=" + sock;
            assertThat(status).contains(unixUri, "nbd://127.0.0.1:" + nbdPort + "/pmem0")
                    .contains("route.dma.min-bytes=256K");

            // a reload: the live key is applied, the one that needs a restart is named and left alone
            Files.writeString(config, base.replace("pmem.size=64M", "pmem.size=128M") + "route.dma.min-bytes=64K\n");
            long before = System.nanoTime() / 1000;
            s.signal("HUP");
            String reloading = systemd.next(WAIT);
            assertThat(reloading).startsWith("RELOADING=1\n");
            // CLOCK_MONOTONIC, the clock of this JVM's nanoTime too: systemd >= 253 compares it with its own
            long usec = Long.parseLong(NotifyListener.field(reloading, "MONOTONIC_USEC"));
            assertThat(usec).isBetween(before, System.nanoTime() / 1000);
            String reloaded = systemd.next(WAIT);
            assertThat(reloaded).startsWith("READY=1\n");
            assertThat(NotifyListener.field(reloaded, "STATUS")).contains("route.dma.min-bytes=64K")
                    .doesNotContain("failed");
            assertThat(s.stderr().lines().filter(l -> l.contains("need a restart")))
                    .singleElement().asString()
                    .contains("applied route.dma.min-bytes=64K (was 256K)")
                    .contains("pmem.size (running 64M, file 128M)");
            assertThat(nbdinfoSize(unixUri)).as("the device keeps its size until a restart").isEqualTo(64L << 20);

            // a bad file: RELOADING/READY still pair up, STATUS says why, nothing changed
            Files.writeString(config, base + "route.dma.min-bytes=12X\n");
            s.signal("HUP");
            assertThat(systemd.next(WAIT)).startsWith("RELOADING=1\n");
            String failed = systemd.next(WAIT);
            assertThat(failed).startsWith("READY=1\n");
            assertThat(NotifyListener.field(failed, "STATUS"))
                    .contains("last reload failed (route.dma.min-bytes: '12X' is not allowed (from " + config + ")")
                    .contains("route.dma.min-bytes=64K");
            assertThat(nbdinfoSize(unixUri)).isEqualTo(64L << 20);

            s.process.destroy(); // SIGTERM
            String stopping = systemd.next(WAIT);
            assertThat(stopping).startsWith("STOPPING=1\n");
            assertThat(s.terminate()).isZero();
            systemd.assertNothingWithin(Duration.ofMillis(300));
        }
    }

    /**
     * A server started with SIGHUP ignored (under nohup here; some supervisors do the same, and a test run started
     * under nohup started every server so) takes SIGHUP back, says so, and reloads on it. Before, HotSpot installed
     * no handler for the ignored signal: the server never reloaded and said nothing.
     */
    @Test
    void aServerStartedWithSighupIgnoredTakesItBackAndReloadsOnIt() throws Exception {
        Path config = dir.resolve("pmemblk.properties");
        String base = "pmem.path=" + dir.resolve("p.img") + "\nnbd.socket=" + dir.resolve("nbd.sock")
                + "\nnbd.port=0\npmem.size=64M\ndma.engine=soft\n";
        Files.writeString(config, base);
        try (NotifyListener systemd = new NotifyListener(dir.resolve("notify").toString());
             ServerProcess s = ServerProcess.start(ServerProcess.hangupIgnored(ServerProcess.command("serve",
                     List.of("--config", config.toString()))), dir, Map.of("NOTIFY_SOCKET", systemd.address), 0)) {
            assertThat(NotifyListener.field(systemd.next(WAIT), "STATUS")).contains("route.dma.min-bytes=256K");

            Files.writeString(config, base + "route.dma.min-bytes=64K\n");
            s.signal("HUP");
            assertThat(systemd.next(WAIT)).as("SIGHUP reloads: " + s.stderr()).startsWith("RELOADING=1\n");
            String reloaded = systemd.next(WAIT);
            assertThat(reloaded).startsWith("READY=1\n");
            assertThat(NotifyListener.field(reloaded, "STATUS")).contains("route.dma.min-bytes=64K")
                    .doesNotContain("failed");
            // nohup did ignore it (the line is said only then), and the server said that it handles it again
            assertThat(s.stderr()).contains("pmemblk: SIGHUP was ignored when serve started (nohup, or a supervisor"
                    + " that ignores it); serve handles it again: SIGHUP reloads --config");
            String status = Files.readString(Path.of("/proc/" + s.process.pid() + "/status"));
            assertThat(signalMask(status, "SigIgn") & 1).as("SIGHUP (bit 0) ignored, /proc status:\n" + status).isZero();
            assertThat(signalMask(status, "SigCgt") & 1).as("SIGHUP (bit 0) caught, /proc status:\n" + status).isOne();

            assertThat(s.terminate()).isZero();
        }
    }

    /** A signal set of /proc/PID/status ("SigIgn", "SigCgt"): bit n-1 is signal n. */
    private static long signalMask(String procStatus, String field) {
        return procStatus.lines().filter(l -> l.startsWith(field + ":")).map(l -> Long.parseUnsignedLong(
                l.substring(field.length() + 1).trim(), 16)).findFirst().orElseThrow();
    }

    /** systemd may name an abstract socket ('@...'); the first message is still READY=1 and the server serves. */
    @Test
    void anAbstractNotifySocketWorks() throws Exception {
        String name = "@pmemblk-it-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
        try (NotifyListener systemd = new NotifyListener(name);
             ServerProcess s = ServerProcess.start(dir, Map.of("NOTIFY_SOCKET", name),
                     List.of("--set", "pmem.path=" + dir.resolve("p.img"), "--set", "pmem.size=16M",
                             "--set", "nbd.socket=" + dir.resolve("s"), "--set", "nbd.port=0"), 1)) {
            assertThat(NotifyListener.field(systemd.next(WAIT), "READY")).isEqualTo("1");
            assertThat(nbdinfoSize(s.unixUri())).isEqualTo(16L << 20);
            assertThat(s.terminate()).isZero();
            assertThat(systemd.next(WAIT)).startsWith("STOPPING=1\n");
        }
    }

    /** A NOTIFY_SOCKET nobody listens on costs one warning, not the service. */
    @Test
    void aNotifySocketNobodyListensOnIsOneWarning() throws Exception {
        Path nobody = dir.resolve("nobody");
        try (ServerProcess s = ServerProcess.start(dir, Map.of("NOTIFY_SOCKET", nobody.toString()),
                List.of("--set", "pmem.path=" + dir.resolve("p.img"), "--set", "pmem.size=16M",
                        "--set", "nbd.socket=" + dir.resolve("s"), "--set", "nbd.port=0"), 1)) {
            assertThat(nbdinfoSize(s.unixUri())).isEqualTo(16L << 20);
            assertThat(s.terminate()).isZero();
            assertThat(s.stderr().lines().filter(l -> l.contains("cannot notify systemd")))
                    .singleElement().asString().contains("READY=1").contains(nobody.toString());
        }
    }

    static long nbdinfoSize(String uri) throws Exception {
        ServerProcess.Run r = ServerProcess.run(List.of("nbdinfo", "--size", uri), 60);
        assertThat(r.exit()).as(r.out()).isZero();
        return Long.parseLong(r.out().trim());
    }
}
