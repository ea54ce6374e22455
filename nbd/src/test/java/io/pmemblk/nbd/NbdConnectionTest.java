package io.pmemblk.nbd;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.testing.Waits;
import java.io.IOException;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Timeout;

/**
 * A connection's lifecycle: the stall watchdog reaches the reader's and the sender's clocks, and a stalled
 * connection gives every tag back. (The handshake, DISC, EOF, protocol errors and graceful shutdown are
 * covered end to end by {@link NbdServerProtocolTest}.)
 */
@Timeout(60)
class NbdConnectionTest extends ServedExportTest {
    @BeforeEach
    void start() throws IOException {
        serve("nbd.sock", 1, "", s -> s.stallTimeout(Duration.ofMillis(300)));
    }

    /**
     * Also when the WRITE is refused (past the end of the export) and its payload is being skipped: that once ran
     * off the watchdog's clock, so a client could hold its connection (and a place of nbd.max-connections) there.
     */
    @ParameterizedTest(name = "offset {0}")
    @ValueSource(longs = {0, SIZE})
    void theWatchdogClosesAClientStuckInTheMiddleOfAWritePayloadAndItsTagsComeBack(long offset) throws Exception {
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            c.request(0, CMD_WRITE, 1, offset, 1 << 20, null);
            c.out.write(new byte[1000]); // then nothing: the reader waits for the rest
            c.flush();
            assertTrue(c.closedByServer(), "the stalled connection was closed");
        }
        Waits.await("the connection to go", () -> server.connectionCount() == 0);
        Waits.await("its tags to come back", () -> layer.queue(0).inflight() == 0);
    }

    @Test
    void theWatchdogClosesAClientThatStopsReadingRepliesAndItsTagsComeBack() throws Exception {
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            for (int i = 0; i < DEPTH; i++) {
                c.request(0, CMD_READ, i, 0, 1 << 20, null); // 8 MiB of replies nobody reads
            }
            c.flush();
            Waits.await("the connection to be closed", () -> server.connectionCount() == 0);
            Waits.await("its tags to come back", () -> layer.queue(0).inflight() == 0);
        }
    }

    @Test
    void theWatchdogMayLookAtAConnectionStillInItsHandshake() throws Exception {
        try (SocketChannel unconnected = SocketChannel.open()) {
            NbdConnection c = new NbdConnection(server, 1, unconnected, "test", "test", layer.queue(0), MAX, SIZE);
            // No reader or sender exists before transmission: nothing is stalled, nothing is closed.
            assertDoesNotThrow(() -> c.closeIfStalled(System.nanoTime() + Duration.ofDays(1).toNanos(), 1));
            assertTrue(unconnected.isOpen());
            assertEquals(false, c.isAlive());
        }
    }

    interface Opener {
        NbdTestClient open() throws IOException;
    }

    static NbdTestClient startThen(NbdServer s, Opener opener) throws IOException {
        s.start();
        return opener.open();
    }

    void store(long offset, byte[] data) {
        java.lang.foreign.MemorySegment.copy(data, 0, driver.memory, java.lang.foreign.ValueLayout.JAVA_BYTE, offset,
                data.length);
    }

    static byte[] pattern(int n, int seed) {
        byte[] b = new byte[n];
        new java.util.Random(seed).nextBytes(b);
        return b;
    }

    /**
     * Progress, not age: 16 MiB of READ replies read steadily at ~3 MiB/s keep the sender waiting on a full
     * socket for seconds, far past a 1 s stall timeout, but the client takes bytes all along and is served to
     * the end. (The client's pace is the scenario, not a synchronisation: nothing waits on it. 1 s rather than
     * the class's 300 ms, so a client thread descheduled on a loaded machine is not what gets measured.)
     */
    @Test
    void aSlowButSteadyReaderOfLargeRepliesIsNeverCutOff() throws Exception {
        int reads = 4;
        for (int i = 0; i < reads; i++) {
            store(i * (long) MAX, pattern(MAX, i));
        }
        Path slowSocket = dir.resolve("slow.sock");
        try (NbdServer slow = new NbdServer(new NbdConfig(EXPORT, slowSocket, "127.0.0.1", 0, MAX, 64, ""), layer)
                .stallTimeout(Duration.ofSeconds(1));
             NbdTestClient c = startThen(slow, () -> new NbdTestClient(slowSocket).go(EXPORT, false, false))) {
            for (int i = 0; i < reads; i++) {
                c.request(0, CMD_READ, i, i * (long) MAX, MAX, null);
            }
            c.flush();
            byte[] data = new byte[MAX];
            for (int i = 0; i < reads; i++) {
                assertEquals(SIMPLE_REPLY_MAGIC, c.in.readInt());
                assertEquals(0, c.in.readInt());
                long cookie = c.in.readLong();
                for (int at = 0; at < MAX; at += 64 << 10) {
                    try {
                        c.in.readFully(data, at, 64 << 10);
                    } catch (java.io.EOFException e) {
                        throw new AssertionError("cut off while reading steadily, " + (i * MAX + at) + " bytes in", e);
                    }
                    java.util.concurrent.locks.LockSupport.parkNanos(20_000_000); // ~3 MiB/s
                }
                org.junit.jupiter.api.Assertions.assertArrayEquals(pattern(MAX, (int) cookie), data, "READ " + cookie);
            }
            c.readLengths.clear();
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error(), "still served");
        }
    }

    /**
     * A half-duplex client sends everything before it reads a reply: [READ, WRITE] pairs, each READ's reply larger
     * than the socket holds. The reader must keep reading the WRITE payloads while the client reads nothing (it
     * replies inline only what fits); before, it blocked writing the first READ's reply, the client blocked
     * writing the next payload, and the watchdog cut the connection.
     */
    @Test
    void aClientThatSendsEverythingBeforeReadingAnyReplyIsServed() throws Exception {
        int len = 512 << 10; // under ReplySender.BULK_REPLY_BYTES: the socket keeps its own 208 KiB buffer
        // A lone connection holds at most its fair share of the tags (half the queue): with more requests unanswered
        // than that, a half-duplex client waits for a tag whatever the reader does.
        int pairs = layer.queue(0).tagShare() / 2;
        long writes = 32L << 20;
        // Payloads received straight into the device (as pmem's are) cost nothing at dispatch, so the reader
        // replies inline rather than leaving the replies to the sender: the path that blocked.
        driver.receiveInPlace(true);
        for (int i = 0; i < pairs; i++) {
            store(i * (long) len, pattern(len, i));
        }
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            try {
                for (int i = 0; i < pairs; i++) {
                    c.request(0, CMD_READ, i, i * (long) len, len, null);
                    c.request(0, CMD_WRITE, 100 + i, writes + i * (long) len, len, pattern(len, 100 + i));
                }
                c.flush();
            } catch (IOException e) {
                throw new AssertionError("the server stopped reading while a reply did not fit the socket", e);
            }
            for (int i = 0; i < 2 * pairs; i++) {
                NbdTestClient.Reply r = c.reply();
                assertEquals(0, r.error(), "reply " + r.cookie());
                if (r.cookie() < 100) {
                    org.junit.jupiter.api.Assertions.assertArrayEquals(pattern(len, (int) r.cookie()), r.data());
                }
            }
            for (int i = 0; i < pairs; i++) {
                org.junit.jupiter.api.Assertions.assertArrayEquals(pattern(len, 100 + i),
                        c.call(0, CMD_READ, writes + i * (long) len, len, null).data(), "WRITE " + i);
            }
        }
    }

    /** nbd.idle-timeout: a connection with nothing in flight and no request for that long is closed; a busy one is not. */
    @Test
    void anIdleConnectionIsClosedAfterTheIdleTimeoutAndABusyOneStays() throws Exception {
        server.idleTimeout(Duration.ofMillis(500));
        try (NbdTestClient idle = new NbdTestClient(socket).go(EXPORT, false, false);
             NbdTestClient busy = new NbdTestClient(socket).go(EXPORT, false, false)) {
            long deadline = System.nanoTime() + Waits.BOUND.toNanos();
            while (server.connectionCount() == 2) {
                assertTrue(System.nanoTime() < deadline, "the idle connection is still open after " + Waits.BOUND);
                assertEquals(0, busy.call(0, CMD_FLUSH, 0, 0, null).error());
                java.util.concurrent.locks.LockSupport.parkNanos(50_000_000); // a request every 50 ms: busy
            }
            assertTrue(idle.closedByServer(), "the idle one was closed");
            assertEquals(0, busy.call(0, CMD_FLUSH, 0, 0, null).error(), "the busy one is still served");
        }
    }

    /**
     * The slot limit holds exactly while the unix and the TCP acceptor admit at the same time, and a slot is free
     * again before its client sees the close: one that reconnects at once is served.
     */
    @Test
    void theConnectionLimitHoldsExactlyAcrossListenersAndASlotIsFreeWhenItsClientSeesTheClose() throws Exception {
        int port = freeTcpPort();
        int max = 4;
        Path sock = dir.resolve("limit.sock");
        try (NbdServer limited = new NbdServer(new NbdConfig(EXPORT, sock, "127.0.0.1", port, MAX, max, ""), layer)) {
            limited.start();
            for (int round = 0; round < 20; round++) {
                java.util.List<java.util.concurrent.Callable<Object>> connects = new java.util.ArrayList<>();
                for (int i = 0; i < 2 * max; i++) {
                    boolean tcp = i % 2 == 0;
                    connects.add(() -> tcp ? new NbdTestClient(new java.net.Socket("127.0.0.1", port))
                            : new NbdTestClient(sock));
                }
                java.util.List<NbdTestClient> clients = new java.util.ArrayList<>();
                try (var ex = java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor()) {
                    for (var f : ex.invokeAll(connects)) {
                        clients.add((NbdTestClient) f.get());
                    }
                }
                int greeted = 0;
                for (NbdTestClient c : clients) {
                    try {
                        c.in.readLong(); // NBDMAGIC, or EOF when refused
                        greeted++;
                    } catch (java.io.EOFException | java.net.SocketException refused) {
                        // over the limit
                    }
                }
                assertEquals(max, greeted, "round " + round + ": connections served of " + clients.size());
                for (NbdTestClient c : clients) {
                    c.close();
                }
                Waits.await("the slots to be free", () -> limited.connectionCount() == 0);
            }
            java.util.List<NbdTestClient> held = new java.util.ArrayList<>();
            try {
                for (int i = 1; i < max; i++) {
                    held.add(new NbdTestClient(sock).go(EXPORT, false, false)); // the limit, less the one that comes back
                }
                for (int i = 0; i < 20; i++) {
                    try (NbdTestClient again = new NbdTestClient(sock).go(EXPORT, false, false)) {
                        again.disconnect();
                        assertTrue(again.closedByServer());
                    } catch (IOException | AssertionError e) {
                        throw new AssertionError("reconnect " + i + " right after the close was refused", e);
                    }
                }
            } finally {
                for (NbdTestClient c : held) {
                    c.close();
                }
            }
        }
    }
}
