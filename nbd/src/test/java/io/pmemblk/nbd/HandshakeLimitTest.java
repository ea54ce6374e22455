package io.pmemblk.nbd;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.Waits;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * One peer that opens connections and never finishes their handshake (a client without a certificate under
 * nbd.tls=require stalls the same way) cannot take every connection slot: past nbd.max-handshakes-per-peer of its
 * handshakes under way, its connections are refused at accept, and another peer is still served. TCP peers are told
 * apart by address (127.0.0.2 is a second loopback source), unix peers by uid.
 */
@Timeout(60)
class HandshakeLimitTest {
    private static final int MAX = 1 << 20;
    private static final int SLOTS = 4;
    private static final int PER_PEER = 2;

    @TempDir
    Path dir;
    private MemoryBlockDriver driver;
    private BlockLayer layer;
    private NbdServer server;
    private int port;
    private final List<NbdTestClient> clients = new ArrayList<>();

    @BeforeEach
    void start() throws IOException {
        port = freeTcpPort();
        driver = new MemoryBlockDriver(16L << 20);
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
        server = new NbdServer(new NbdConfig("pmem0", dir.resolve("nbd.sock"), "127.0.0.1", port, MAX, SLOTS, ""), layer)
                .handshakeTimeout(Duration.ofSeconds(50)) // longer than the test: only the per-peer limit frees them
                .maxHandshakesPerPeer(PER_PEER);
        server.start();
    }

    @AfterEach
    void stop() throws IOException {
        for (NbdTestClient c : clients) {
            c.close();
        }
        server.close();
        layer.close();
        driver.close();
    }

    private NbdTestClient tcpFrom(String source) throws IOException {
        Socket s = new Socket();
        s.bind(new InetSocketAddress(source, 0));
        s.connect(new InetSocketAddress("127.0.0.1", port));
        NbdTestClient c = new NbdTestClient(s);
        clients.add(c);
        return c;
    }

    /** Whether the server greeted the client (NBDMAGIC), or closed the connection at once (refused). */
    private static boolean greeted(NbdTestClient c) throws IOException {
        try {
            c.in.readLong();
            return true;
        } catch (java.io.EOFException | java.net.SocketException refused) {
            return false;
        }
    }

    @Test
    void aPeerStallingInItsHandshakesCannotLockOutAnotherPeer() throws Exception {
        int greetedFromA = 0;
        for (int i = 0; i < 2 * SLOTS; i++) {
            if (greeted(tcpFrom("127.0.0.1"))) { // connects, reads the greeting, then says nothing
                greetedFromA++;
            }
        }
        NbdTestClient b;
        try {
            b = new NbdTestClient(connectFrom("127.0.0.2")).go("pmem0", false, false);
        } catch (IOException e) {
            throw new AssertionError("127.0.0.2 was locked out by 127.0.0.1's " + greetedFromA
                    + " stalled handshakes (" + SLOTS + " slots)", e);
        }
        try (b) {
            assertEquals(0, b.call(0, CMD_FLUSH, 0, 0, null).error(), "127.0.0.2 is served");
            b.disconnect();
            assertTrue(b.closedByServer());
        }
        assertEquals(PER_PEER, greetedFromA, "connections of 127.0.0.1 admitted while its handshakes stall");
    }

    @Test
    void aConnectionPastItsHandshakeNoLongerCountsAgainstItsPeer() throws Exception {
        for (int i = 0; i < PER_PEER; i++) {
            NbdTestClient c = tcpFrom("127.0.0.1");
            c.go("pmem0", false, false); // in transmission: its handshake is over
        }
        NbdTestClient stalled = tcpFrom("127.0.0.1");
        assertTrue(greeted(stalled), "a third connection of the same peer is admitted: the first two finished");
        NbdTestClient again = tcpFrom("127.0.0.1");
        assertTrue(greeted(again), "and a fourth: the limit counts handshakes under way, not connections");
        assertTrue(!greeted(tcpFrom("127.0.0.1")), "a fifth exceeds the slots, and is refused");
        stalled.close();
        Waits.await("the closed handshake to be counted off", () -> server.connectionCount() == SLOTS - 1);
        assertTrue(greeted(tcpFrom("127.0.0.1")), "a handshake that ended frees its place for the peer");
    }

    @Test
    void unixPeersAreNotLimitedTheSocketIsTheServingUsersOwn() throws Exception {
        int greeted = 0;
        for (int i = 0; i < SLOTS; i++) {
            NbdTestClient c = new NbdTestClient(dir.resolve("nbd.sock"));
            clients.add(c);
            if (greeted(c)) {
                greeted++;
            }
        }
        assertEquals(SLOTS, greeted, "unix connections admitted while their handshakes stall (mode 0600: owner, root)");
    }

    /**
     * fio's numjobs or nbd-client -connections open their connections at once: while half the slots are free a
     * burst from one peer is refused nothing, beyond the per-peer limit; then the limit keeps the rest for others.
     */
    @Test
    void aBurstFromOnePeerIsAdmittedWhileHalfTheSlotsAreFree() throws Exception {
        server.maxHandshakesPerPeer(1);
        int greetedFromA = 0;
        for (int i = 0; i < SLOTS; i++) {
            if (greeted(tcpFrom("127.0.0.1"))) {
                greetedFromA++;
            }
        }
        assertEquals(SLOTS / 2, greetedFromA, "a burst of 127.0.0.1 admitted up to half the slots, limit 1");
        assertTrue(greeted(tcpFrom("127.0.0.2")), "another peer still greeted");
    }

    private Socket connectFrom(String source) throws IOException {
        Socket s = new Socket();
        s.bind(new InetSocketAddress(source, 0));
        s.connect(new InetSocketAddress("127.0.0.1", port));
        return s;
    }
}
