package io.pmemblk.cli;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import io.pmemblk.nbd.testing.NbdTestClient;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The real {@code serve} with {@code nbd.tls=require}: one client (127.0.0.1) opens more connections than there
 * are slots and leaves each in its TLS handshake (STARTTLS accepted, then no ClientHello), as a client without a
 * certificate, or a hostile one, can. With the default nbd.max-handshakes-per-peer (8) it gets 8 of the 16 slots
 * and the rest are refused with a log line naming the setting; another TCP peer (127.0.0.2) and nbdinfo with a
 * client certificate on the unix socket (another peer: the socket's user) are still served.
 */
class HandshakeLimitIT {
    private static final int SLOTS = 16;

    @TempDir
    Path dir;

    /** Connects from {@code source}; true when the server greeted it (NBDMAGIC), false when it closed at once. */
    private static boolean greeted(NbdTestClient c) throws IOException {
        try {
            return c.in.readLong() == NbdTestClient.NBDMAGIC;
        } catch (EOFException | SocketException refused) {
            return false;
        }
    }

    private static NbdTestClient connect(String source, int port) throws IOException {
        Socket s = new Socket();
        s.setSoTimeout(30_000);
        s.bind(new InetSocketAddress(source, 0));
        s.connect(new InetSocketAddress("127.0.0.1", port));
        return new NbdTestClient(s);
    }

    /** Finishes the greeting, asks for STARTTLS, reads its ACK, then stalls: the server waits for a ClientHello. */
    private static void stallInTls(NbdTestClient c) throws IOException {
        c.in.readLong(); // IHAVEOPT
        c.in.readUnsignedShort(); // handshake flags
        c.out.writeInt(NbdTestClient.FIXED_NEWSTYLE_NO_ZEROES);
        c.option(NbdTestClient.OPT_STARTTLS, new byte[0]);
        NbdTestClient.OptionReply r = c.optionReply();
        assertThat(r.option()).isEqualTo(NbdTestClient.OPT_STARTTLS);
        assertThat(r.type()).as("STARTTLS acknowledged").isEqualTo(NbdTestClient.REP_ACK);
        assertThat(r.data()).isEmpty();
    }

    @Test
    void aClientStallingItsTlsHandshakesCannotTakeEverySlot() throws Exception {
        Path pki = ServerProcess.testPki(dir);
        int port = freeTcpPort();
        Path sock = dir.resolve("nbd.sock");
        List<NbdTestClient> stalled = new ArrayList<>();
        try (ServerProcess server = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=64M",
                "nbd.socket=" + sock, "nbd.port=" + port, "nbd.max-connections=" + SLOTS, "nbd.handshake-timeout=60",
                "nbd.tls=require", "nbd.tls.certificate=" + pki.resolve("server-cert.pem"),
                "nbd.tls.key=" + pki.resolve("server-key.pem"),
                "nbd.tls.verify-clients=" + pki.resolve("ca-cert.pem"))) {
            try {
                int admitted = 0;
                for (int i = 0; i < SLOTS + 4; i++) {
                    NbdTestClient c = connect("127.0.0.1", port);
                    stalled.add(c);
                    if (greeted(c)) {
                        stallInTls(c);
                        admitted++;
                    }
                }
                NbdTestClient other = connect("127.0.0.2", port);
                stalled.add(other);
                assertThat(greeted(other)).as("127.0.0.2 is greeted while 127.0.0.1 holds %d stalled TLS handshakes;"
                        + " stderr:\n%s", admitted, server.stderr()).isTrue();
                ServerProcess.Run info = ServerProcess.run(List.of("nbdinfo", "--size",
                        "nbds+unix:///pmem0?socket=" + sock + "&tls-certificates=" + pki.resolve("client")), 60);
                assertThat(info.exit()).as("nbdinfo with a certificate on the unix socket: %s", info.out()).isZero();
                assertThat(info.out().trim()).isEqualTo(String.valueOf(64L << 20));
                assertThat(admitted).as("connections of 127.0.0.1 admitted while their handshakes stall").isEqualTo(8);
                assertThat(server.stderr()).contains("are still in their handshake (nbd.max-handshakes-per-peer=8)");
            } finally {
                for (NbdTestClient c : stalled) {
                    c.close();
                }
            }
            assertThat(server.terminate()).as("SIGTERM exits 0; stderr:\n%s", server.stderr()).isZero();
        }
    }
}
