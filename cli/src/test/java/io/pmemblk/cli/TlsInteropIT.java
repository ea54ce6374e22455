package io.pmemblk.cli;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * TLS with the real clients: libnbd's nbdinfo and nbdcopy and QEMU's qemu-io and qemu-img, all on
 * GnuTLS, against {@code serve --set nbd.tls=require}, with certificates made by scripts/lib/test-pki (openssl).
 * Each case is one cell of the interop matrix (client x certificate case -> result); the cells are printed as
 * {@code MATRIX ...} lines. Client directories: {@code client} (certificate from the server's CA), {@code nocert},
 * {@code wrong-ca} (trusts another CA, so the server's certificate does not verify), {@code rogue} (certificate
 * from another CA).
 *
 * <p>What libnbd 1.14 does not do: on a unix socket it does not check the server's certificate at all (no host
 * name; the same against nbdkit), so "wrong CA" is a TCP case for it; qemu checks on both with tls-hostname.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class TlsInteropIT {
    @TempDir
    static Path dir;
    static Path pki;
    static ServerProcess server;
    static int port;
    static Path sock;
    static final List<String> matrix = new ArrayList<>();

    @BeforeAll
    static void start() throws Exception {
        pki = ServerProcess.testPki(dir);
        port = freeTcpPort();
        sock = dir.resolve("nbd.sock");
        server = ServerProcess.start(dir, tlsSettings(dir, "p.img", sock, port, true));
    }

    static String[] tlsSettings(Path dir, String image, Path sock, int port, boolean verifyClients) {
        List<String> s = new ArrayList<>(List.of("pmem.path=" + dir.resolve(image), "pmem.size=64M",
                "nbd.socket=" + sock, "nbd.port=" + port, "queue.buffer-bytes=32M", "nbd.tls=require",
                "nbd.tls.certificate=" + pki.resolve("server-cert.pem"), "nbd.tls.key=" + pki.resolve("server-key.pem")));
        if (verifyClients) {
            s.add("nbd.tls.verify-clients=" + pki.resolve("ca-cert.pem"));
        }
        return s.toArray(String[]::new);
    }

    @AfterAll
    static void stop() throws Exception {
        matrix.forEach(m -> System.out.println("MATRIX " + m));
        if (server != null) {
            try {
                assertThat(server.terminate()).as("SIGTERM after all the refusals exits 0; stderr:\n%s", server.stderr())
                        .isZero();
                String log = server.stderr();
                assertThat(log).doesNotContain("internal error", "ERROR", "Broken pipe");
            } finally {
                server.close();
            }
        }
    }

    static String unixUri(Path sock, String clientDir) {
        return "nbds+unix:///pmem0?socket=" + sock + "&tls-certificates=" + pki.resolve(clientDir);
    }

    static String tcpUri(int port, String clientDir) {
        return "nbds://localhost:" + port + "/pmem0?tls-certificates=" + pki.resolve(clientDir);
    }

    /** qemu-io ARGS, or qemu-img SUBCOMMAND ARGS (its options follow the subcommand), with TLS credentials. */
    static List<String> qemu(String tool, String clientDir, String... args) {
        List<String> cmd = new ArrayList<>(List.of(tool));
        int rest = 0;
        if (tool.equals("qemu-img")) {
            cmd.add(args[0]);
            rest = 1;
        }
        cmd.addAll(List.of("--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + pki.resolve(clientDir)));
        cmd.addAll(List.of(args).subList(rest, args.length));
        return cmd;
    }

    /** qemu's nbd driver over the unix socket; tls-hostname because a unix socket gives qemu no name to check. */
    static String qemuUnix(Path sock) {
        return "driver=nbd,path=" + sock + ",export=pmem0,tls-creds=tls0,tls-hostname=localhost";
    }

    static String qemuTcp(int port) {
        return "driver=nbd,host=localhost,port=" + port + ",export=pmem0,tls-creds=tls0";
    }

    static ServerProcess.Run cell(String client, String certCase, List<String> cmd, boolean expectOk, String expect)
            throws Exception {
        ServerProcess.Run r = ServerProcess.run(cmd, 60);
        String first = r.out().strip().lines().findFirst().orElse("");
        matrix.add(String.format("%-22s | %-34s | %s", client, certCase,
                (r.exit() == 0 ? "served" : "refused") + ": " + first));
        if (expectOk) {
            assertThat(r.exit()).as("%s %s: %s", client, certCase, r.out()).isZero();
        } else {
            assertThat(r.exit()).as("%s %s must be refused: %s", client, certCase, r.out()).isNotZero();
        }
        assertThat(r.out()).as("%s %s", client, certCase).contains(expect);
        return r;
    }

    @Test
    @Order(1)
    void libnbdWithAClientCertificateIsServedOnBothListeners() throws Exception {
        cell("nbdinfo (unix)", "client certificate", List.of("nbdinfo", "--size", unixUri(sock, "client")), true,
                "67108864");
        cell("nbdinfo (tcp)", "client certificate", List.of("nbdinfo", "--size", tcpUri(port, "client")), true,
                "67108864");
        byte[] data = new byte[8 << 20];
        new Random(15).nextBytes(data);
        Path in = Files.write(dir.resolve("in.bin"), data);
        Path out = dir.resolve("out.bin");
        cell("nbdcopy (unix)", "client certificate, 8 MiB in", List.of("nbdcopy", in.toString(),
                unixUri(sock, "client")), true, "");
        cell("nbdcopy (tcp)", "client certificate, 64 MiB out", List.of("nbdcopy", tcpUri(port, "client"),
                out.toString()), true, "");
        byte[] back = Files.readAllBytes(out);
        assertThat(java.util.Arrays.copyOf(back, data.length)).as("what nbdcopy wrote over TLS comes back")
                .isEqualTo(data);
        assertThat(server.stderr()).contains("TLSv1.3").contains("client certificate CN=pmemblk test client");
    }

    @Test
    @Order(2)
    void libnbdWithoutTheRightCertificatesIsRefused() throws Exception {
        cell("nbdinfo (tcp)", "no client certificate", List.of("nbdinfo", "--size", tcpUri(port, "nocert")), false,
                "TLS fatal alert");
        cell("nbdcopy (unix)", "no client certificate", List.of("nbdcopy", unixUri(sock, "nocert"), "null:"), false,
                "TLS fatal alert");
        cell("nbdinfo (tcp)", "wrong CA (server cert unverified)", List.of("nbdinfo", "--size", tcpUri(port, "wrong-ca")),
                false, "certificate verification");
        cell("nbdinfo (unix)", "certificate from another CA", List.of("nbdinfo", "--size", unixUri(sock, "rogue")),
                false, "TLS fatal alert");
        cell("nbdinfo (unix)", "plaintext", List.of("nbdinfo", "--size", "nbd+unix:///pmem0?socket=" + sock), false,
                "server requires TLS");
        cell("nbdinfo (tcp)", "plaintext", List.of("nbdinfo", "--size", "nbd://localhost:" + port + "/pmem0"), false,
                "server requires TLS");
    }

    @Test
    @Order(3)
    void qemuWithAClientCertificateIsServed() throws Exception {
        cell("qemu-io (unix)", "client certificate", qemu("qemu-io", "client", "--image-opts", qemuUnix(sock),
                "-c", "write -P 0x5a 0 1M", "-c", "write -P 0xa5 -f 1M 64k", "-c", "flush"), true, "wrote");
        cell("qemu-io (tcp)", "client certificate", qemu("qemu-io", "client", "--image-opts", qemuTcp(port),
                "-c", "read -P 0x5a 0 1M", "-c", "read -P 0xa5 1M 64k"), true, "read 1048576/1048576");
        cell("qemu-img info (tcp)", "client certificate", qemu("qemu-img", "client", "info", "--image-opts",
                qemuTcp(port)), true, "67108864 bytes");
        byte[] data = new byte[4 << 20];
        new Random(16).nextBytes(data);
        Path img = Files.write(dir.resolve("q.bin"), data);
        String target = "driver=raw,file." + qemuUnix(sock).replace(",", ",file.");
        cell("qemu-img convert (unix)", "client certificate", qemu("qemu-img", "client", "convert", "-n",
                "--image-opts", "driver=raw,file.driver=file,file.filename=" + img, "--target-image-opts", target),
                true, "");
        // the first 4 MiB of the device, read back over TLS, are the image (qemu-io's patterns were overwritten)
        cell("qemu-img compare (unix)", "client certificate", qemu("qemu-img", "client", "compare", "--image-opts",
                "driver=raw,file.driver=file,file.filename=" + img, target.replace("driver=raw,", "driver=raw,size="
                        + data.length + ",")), true, "Images are identical");
    }

    @Test
    @Order(4)
    void qemuWithoutTheRightCertificatesIsRefused() throws Exception {
        cell("qemu-io (unix)", "no client certificate", qemu("qemu-io", "nocert", "--image-opts", qemuUnix(sock),
                "-c", "read 0 4k"), false, "Cannot read from TLS channel");
        cell("qemu-img info (tcp)", "no client certificate", qemu("qemu-img", "nocert", "info", "--image-opts",
                qemuTcp(port)), false, "Cannot read from TLS channel");
        cell("qemu-io (unix)", "wrong CA (server cert unverified)", qemu("qemu-io", "wrong-ca", "--image-opts",
                qemuUnix(sock), "-c", "read 0 4k"), false, "hasn't got a known issuer");
        cell("qemu-io (tcp)", "plaintext", List.of("qemu-io", "-f", "raw", "-c", "read 0 4k",
                "nbd://localhost:" + port + "/pmem0"), false, "TLS negotiation required");
    }

    /** Without nbd.tls.verify-clients any client that completes TLS is served; the client still checks the server. */
    @Test
    @Order(5)
    void withoutVerifyClientsCertificatelessClientsAreServed() throws Exception {
        Path sock2 = dir.resolve("nbd2.sock");
        int port2 = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, tlsSettings(dir, "p2.img", sock2, port2, false))) {
            cell("nbdinfo (unix)", "no client certificate, no verify", List.of("nbdinfo", "--size",
                    unixUri(sock2, "nocert")), true, "67108864");
            cell("qemu-io (tcp)", "no client certificate, no verify", qemu("qemu-io", "nocert", "--image-opts",
                    qemuTcp(port2), "-c", "read 0 4k"), true, "read 4096/4096");
            cell("nbdinfo (tcp)", "wrong CA, no verify", List.of("nbdinfo", "--size", tcpUri(port2, "wrong-ca")), false,
                    "certificate verification");
            assertThat(s.terminate()).isZero();
            assertThat(s.stderr()).contains("no client certificate").doesNotContain("ERROR");
        }
    }
}
