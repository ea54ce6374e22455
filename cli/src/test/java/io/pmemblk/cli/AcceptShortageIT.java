package io.pmemblk.cli;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.nvme.Pdu;
import io.pmemblk.nvme.testing.RawHost;
import io.pmemblk.queueing.testing.Waits;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The real {@code pmemblk serve} out of file descriptors: clients that connect faster than they go (here, the
 * server's descriptor limit lowered with prlimit(1) to what it holds plus a few, and idle connections opened past
 * it) make accept(2) fail with EMFILE on the NVMe/TCP and NBD listeners. While that lasts each listener logs at
 * most about a line a second (a loop that retried at once wrote thousands), and once the clients have gone both
 * accept again: a new NVMe/TCP host gets its ICResp (the NVMe listener's loop used to end at the first failed
 * accept, so the target never served another host), a new NBD client its greeting.
 */
class AcceptShortageIT {
    private static final int SPARE_FDS = 12;
    /**
     * Clients, half on each listener: far more than the spare descriptors and whatever the server closes after the
     * count (a start's transient files), so that neither listener can take every connection waiting for it. With 48
     * the NVMe listener once took all of its 24, never failed an accept, and the wait for its line timed out (1 full
     * run in 6). Both listen with a backlog of 128, so 80 each wait there without the connect blocking.
     */
    private static final int CLIENTS = 160;
    private static final long SHORTAGE_MILLIS = 2500;

    @TempDir
    Path dir;

    @Test
    void listenersOutOfDescriptorsPauseAndServeNewClientsOnceTheShortagePasses() throws Exception {
        int nvmePort = freeTcpPort();
        int nbdPort = freeTcpPort();
        try (ServerProcess serve = ServerProcess.start(dir, Map.of(), ServerProcess.sets("pmem.path=" + dir.resolve("d.img"),
                "pmem.size=16M", "nbd.socket=", "nbd.bind=127.0.0.1", "nbd.port=" + nbdPort,
                "nvme.listen=127.0.0.1:" + nvmePort), 2)) {
            long pid = serve.process.pid();
            long open;
            try (Stream<Path> fds = Files.list(Path.of("/proc/" + pid + "/fd"))) {
                open = fds.count();
            }
            ServerProcess.Run limit = ServerProcess.run(List.of("prlimit", "--pid", Long.toString(pid),
                    "--nofile=" + (open + SPARE_FDS) + ":" + (open + SPARE_FDS)), 10);
            assertThat(limit.exit()).as("prlimit: " + limit.out()).isZero();

            List<Socket> clients = new ArrayList<>();
            long shortageFrom = System.nanoTime();
            try {
                for (int i = 0; i < CLIENTS; i++) {
                    clients.add(new Socket("127.0.0.1", i % 2 == 0 ? nvmePort : nbdPort));
                }
                try {
                    Waits.await("both listeners failing to accept (EMFILE)", () -> {
                        String log = stderrOf(serve);
                        return log.contains("nvme: TCP listener: accept failed")
                                && log.contains("nbd: TCP listener: accept failed");
                    });
                } catch (AssertionError e) {
                    throw new AssertionError(e.getMessage() + "; the server's log:\n" + stderrOf(serve), e);
                }
                // The shortage's length, not a wait for anything: long enough that a loop retrying at once writes
                // thousands of lines, where a paused one writes a few.
                Thread.sleep(SHORTAGE_MILLIS);
            } finally {
                for (Socket s : clients) {
                    s.close();
                }
            }
            double shortageSeconds = (System.nanoTime() - shortageFrom) / 1e9;

            // Served again: a new NVMe/TCP host's ICReq answered, a new NBD client greeted (bounded by their timeouts).
            Waits.await("a new NVMe/TCP host answered once the clients are gone", () -> {
                try (RawHost host = new RawHost(new InetSocketAddress("127.0.0.1", nvmePort))) {
                    host.icReq(Pdu.DIGEST_HDR, 0);
                    return true;
                } catch (IOException e) {
                    return false; // still short of descriptors: try again
                }
            });
            Waits.await("a new NBD client greeted once the clients are gone", () -> greeted(nbdPort));

            long lines = stderrOf(serve).lines().filter(l -> l.contains("accept failed")).count();
            assertThat(lines).as("accept-failure lines over a %.1f s shortage on two listeners (at most about one a"
                    + " second each)", shortageSeconds).isLessThanOrEqualTo(2 * ((long) shortageSeconds + 3));
            assertThat(serve.terminate()).as("SIGTERM after the shortage").isZero();
        }
    }

    private static String stderrOf(ServerProcess serve) {
        try {
            return serve.stderr();
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    /** Whether an NBD client on {@code port} reads the newstyle greeting's magic within 10 s. */
    private static boolean greeted(int port) {
        try (Socket s = new Socket("127.0.0.1", port)) {
            s.setSoTimeout(10_000);
            byte[] magic = s.getInputStream().readNBytes(8);
            return new String(magic, StandardCharsets.US_ASCII).equals("NBDMAGIC");
        } catch (IOException e) {
            return false;
        }
    }
}
