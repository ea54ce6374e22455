package io.pmemblk.nbd;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import io.pmemblk.nbd.tls.TlsServer;
import java.io.IOException;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.TrustManagerFactory;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * NBD_OPT_STARTTLS as proto.md's "TLS support" has it, on the real server over TCP, against the JDK's own client
 * TLS ({@code SSLSocket}, independent of the server's {@code SSLEngine} code). Certificates are made by
 * scripts/lib/test-pki (Debian's openssl). Real peers (libnbd, qemu) are in the cli module's TlsInteropIT.
 */
class NbdTlsTest {
    static final long SIZE = 64L << 20;
    static final int MAX = 4 << 20;

    @TempDir
    static Path pkiDir;
    static Path pki;

    MemoryBlockDriver driver;
    BlockLayer layer;
    NbdServer server;
    int port;

    @BeforeAll
    static void makePki() throws Exception {
        pki = pkiDir.resolve("pki");
        Process p = new ProcessBuilder("bash", Path.of("..", "scripts", "lib", "test-pki").toString(), pki.toString())
                .redirectErrorStream(true).start();
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), "test-pki did not finish within 60 s");
        assertEquals(0, p.exitValue(), new String(p.getInputStream().readAllBytes()));
    }

    void start(boolean required, boolean verifyClients) throws IOException {
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
        port = freeTcpPort();
        server = new NbdServer(new NbdConfig("pmem0", null, "127.0.0.1", port, MAX, 16, ""), layer)
                .tls(TlsServer.load(required, pki.resolve("server-cert.pem"), pki.resolve("server-key.pem"),
                        verifyClients ? pki.resolve("ca-cert.pem") : null));
        server.start();
    }

    @AfterEach
    void stop() {
        if (server != null) {
            server.close();
            layer.close();
            driver.close();
        }
    }

    NbdTestClient client() throws IOException {
        NbdTestClient c = new NbdTestClient(new Socket("127.0.0.1", port));
        c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        return c;
    }

    /** STARTTLS acknowledged, then the JDK's client handshake trusting {@code caDir}/ca-cert.pem. */
    static void startTls(NbdTestClient c, String clientDir) throws Exception {
        c.option(OPT_STARTTLS, new byte[0]);
        var ack = c.optionReply();
        assertEquals(REP_ACK, ack.type(), ack.text());
        c.startTls(clientContext(clientDir));
    }

    @Test
    void offRefusesStartTlsWithPolicyAndServesInPlaintext() throws Exception {
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
        port = freeTcpPort();
        server = new NbdServer(new NbdConfig("pmem0", null, "127.0.0.1", port, MAX, 16, ""), layer);
        server.start();
        try (NbdTestClient c = client()) {
            c.option(OPT_STARTTLS, new byte[0]);
            var r = c.optionReply();
            assertEquals(REP_ERR_POLICY, r.type());
            assertTrue(r.text().contains("nbd.tls=off"), r.text());
            c.option(OPT_GO, NbdTestClient.infoData("pmem0"));
            assertEquals(REP_ACK, c.optionReplies().getLast().type());
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
    }

    @Test
    void requireRefusesEveryOptionBeforeStartTlsThenServesInsideTls() throws Exception {
        start(true, false);
        try (NbdTestClient c = client()) {
            for (int option : new int[] {OPT_INFO, OPT_GO, OPT_LIST, OPT_STRUCTURED_REPLY, OPT_SET_META_CONTEXT, 999}) {
                c.option(option, option == OPT_INFO || option == OPT_GO ? NbdTestClient.infoData("pmem0") : new byte[0]);
                var r = c.optionReply();
                assertEquals(REP_ERR_TLS_REQD, r.type(), "option " + option + ": " + r.text());
                assertTrue(r.text().contains("send NBD_OPT_STARTTLS first"), r.text());
            }
            c.option(OPT_STARTTLS, new byte[] {1});
            assertEquals(REP_ERR_INVALID, c.optionReply().type(), "STARTTLS with data");
            startTls(c, "nocert");
            c.option(OPT_STARTTLS, new byte[0]);
            var again = c.optionReply();
            assertEquals(REP_ERR_INVALID, again.type(), "STARTTLS inside TLS");
            assertTrue(again.text().contains("already running"), again.text());
            c.negotiate("pmem0", true, true);
            roundTrips(c);
            c.disconnect();
            assertTrue(c.closedByServer(), "DISC: the server ends the TLS session and closes");
        }
    }

    @Test
    void requireEndsASessionThatPicksAnExportInPlaintext() throws Exception {
        start(true, false);
        try (NbdTestClient c = client()) {
            c.option(OPT_EXPORT_NAME, "pmem0".getBytes());
            assertTrue(c.closedByServer(), "EXPORT_NAME cannot be refused: the session ends, nothing is sent");
        }
        try (NbdTestClient c = client()) { // and the server goes on
            startTls(c, "nocert");
            c.negotiate("pmem0", false, false);
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
    }

    /**
     * nbd.handshake-timeout bounds the whole negotiation, the TLS handshake included: a client that acknowledges
     * STARTTLS and then sends half a ClientHello, or one that keeps haggling, is cut at the limit, and the slot
     * it held serves the next client.
     */
    @Test
    void theHandshakeTimeoutCutsAStalledTlsHandshakeAndEndlessHaggling() throws Exception {
        start(true, false);
        server.handshakeTimeout(java.time.Duration.ofMillis(500));
        try (NbdTestClient c = client()) {
            c.option(OPT_STARTTLS, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            c.out.write(new byte[] {0x16, 0x03, 0x01, 0x02, 0x00, 0x01}); // a TLS record header, then nothing
            c.flush();
            long t0 = System.nanoTime();
            assertTrue(c.closedByServer(), "a stalled TLS handshake is cut");
            assertTrue(System.nanoTime() - t0 < java.time.Duration.ofSeconds(5).toNanos(), "cut at the limit, not later");
        }
        try (NbdTestClient c = client()) {
            long t0 = System.nanoTime();
            boolean cut = false;
            while (!cut && System.nanoTime() - t0 < java.time.Duration.ofSeconds(10).toNanos()) {
                try {
                    c.option(OPT_LIST, new byte[0]); // refused (TLS first) but answered: haggling, not idle
                    c.flush();
                    c.optionReply();
                    java.util.concurrent.locks.LockSupport.parkNanos(100_000_000);
                } catch (java.io.IOException e) {
                    cut = true;
                }
            }
            assertTrue(cut, "a client still haggling after the handshake timeout is cut");
        }
        Waits.await("the slots to be free", () -> server.connectionCount() == 0);
        server.handshakeTimeout(java.time.Duration.ofSeconds(10));
        try (NbdTestClient c = client()) {
            startTls(c, "nocert");
            c.negotiate("pmem0", false, false);
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error(), "served after the cuts");
        }
    }

    /** After STARTTLS haggling restarts: structured replies agreed in plaintext (maybe by a MitM) are forgotten. */
    @Test
    void onLetsTheClientChooseAndForgetsWhatWasNegotiatedInPlaintext() throws Exception {
        start(false, false);
        try (NbdTestClient c = client()) {
            c.option(OPT_GO, NbdTestClient.infoData("pmem0"));
            assertEquals(REP_ACK, c.optionReplies().getLast().type(), "on: plaintext is allowed");
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
        try (NbdTestClient c = client()) {
            c.option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            startTls(c, "nocert");
            c.option(OPT_GO, NbdTestClient.infoData("pmem0"));
            int flags = -1;
            for (var r : c.optionReplies()) {
                if (r.type() == REP_INFO && r.data()[1] == INFO_EXPORT) {
                    flags = java.nio.ByteBuffer.wrap(r.data(), 10, 2).getShort();
                }
            }
            assertEquals(0, flags & TFLAG_SEND_DF, "no DF: structured replies were not negotiated inside TLS");
            byte[] data = new byte[4096];
            new Random(1).nextBytes(data);
            assertEquals(0, c.call(0, CMD_WRITE, 0, data.length, data).error());
            var read = c.call(0, CMD_READ, 0, data.length, null);
            assertTrue(read.simple(), "a simple reply: structured replies are off");
            assertArrayEquals(data, read.data());
        }
    }

    @Test
    void verifyClientsRefusesAClientWithoutACertificateAndServesOneWithIt() throws Exception {
        start(true, true);
        try (NbdTestClient c = client()) {
            c.option(OPT_STARTTLS, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            SSLContext noCert = clientContext("nocert");
            // TLS 1.3: the client's handshake ends before the server has judged its (missing) certificate, so
            // the refusal (alert certificate_required) arrives at the first read.
            assertThrows(SSLException.class, () -> {
                c.startTls(noCert);
                c.negotiate("pmem0", false, false);
            });
        }
        try (NbdTestClient c = client()) {
            startTls(c, "rogue"); // a certificate from another CA: refused the same way
            assertThrows(SSLException.class, () -> c.negotiate("pmem0", false, false));
        } catch (SSLException refusedInHandshake) {
            // also a refusal
        }
        try (NbdTestClient c = client()) {
            startTls(c, "client");
            c.negotiate("pmem0", true, false);
            roundTrips(c);
        }
    }

    /**
     * Pipelined 1 MiB and 4 KiB writes and reads through TLS: the server decrypts large payloads straight into
     * the request's buffers and small reads through its staging buffer, and batches records on the way out.
     */
    static void roundTrips(NbdTestClient c) throws IOException {
        Random rnd = new Random(7);
        List<byte[]> blocks = new ArrayList<>();
        int[] sizes = {1 << 20, 4096, 3 << 20, 512, 65536};
        long off = 0;
        for (int i = 0; i < sizes.length; i++) {
            byte[] b = new byte[sizes[i]];
            rnd.nextBytes(b);
            blocks.add(b);
            c.request(i % 2 == 0 ? CMD_FLAG_FUA : 0, CMD_WRITE, i, off, b.length, b);
            off += b.length;
        }
        c.flush();
        for (int i = 0; i < sizes.length; i++) {
            assertEquals(0, c.reply().error(), "write " + i);
        }
        off = 0;
        for (int i = 0; i < sizes.length; i++) {
            c.request(0, CMD_READ, 100 + i, off, sizes[i], null);
            off += sizes[i];
        }
        c.flush();
        byte[][] got = new byte[sizes.length][];
        for (int i = 0; i < sizes.length; ) {
            var r = c.reply();
            assertEquals(0, r.error());
            int k = (int) (r.cookie() - 100);
            if (got[k] == null) {
                got[k] = new byte[sizes[k]];
            }
            long base = 0;
            for (int j = 0; j < k; j++) {
                base += sizes[j];
            }
            System.arraycopy(r.data(), 0, got[k], r.simple() ? 0 : (int) (r.offset() - base), r.data().length);
            if (r.done()) {
                i++;
            }
        }
        for (int i = 0; i < sizes.length; i++) {
            assertArrayEquals(blocks.get(i), got[i], "read " + i + " returns what write " + i + " wrote");
        }
    }

    /** The JDK's client TLS with a GnuTLS-style directory: ca-cert.pem, and client-cert.pem/client-key.pem if there. */
    static SSLContext clientContext(String dirName) throws Exception {
        Path dir = pki.resolve(dirName);
        CertificateFactory cf = CertificateFactory.getInstance("X.509");
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        try (var in = Files.newInputStream(dir.resolve("ca-cert.pem"))) {
            trust.setCertificateEntry("ca", cf.generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
        tmf.init(trust);
        KeyManagerFactory kmf = null;
        if (Files.exists(dir.resolve("client-cert.pem"))) {
            Certificate cert;
            try (var in = Files.newInputStream(dir.resolve("client-cert.pem"))) {
                cert = cf.generateCertificate(in);
            }
            String pem = Files.readString(dir.resolve("client-key.pem"));
            byte[] der = Base64.getMimeDecoder().decode(pem.replaceAll("-----[A-Z ]+-----", ""));
            var key = KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(der));
            KeyStore ks = KeyStore.getInstance("PKCS12");
            ks.load(null, null);
            ks.setKeyEntry("client", key, new char[0], new Certificate[] {cert});
            kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, new char[0]);
        }
        SSLContext ctx = SSLContext.getInstance("TLSv1.3");
        ctx.init(kmf == null ? null : kmf.getKeyManagers(), tmf.getTrustManagers(), null);
        return ctx;
    }
}
