package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.CMD_FLUSH;
import static io.pmemblk.queueing.testing.Waits.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.ThreadShortage;
import java.io.IOException;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * A server the system makes no more threads for (ulimit -u, a cgroup's pids.max): each connection it cannot give a
 * thread is closed with its slot, its handshake count and its socket given back, and the listener goes on. Once
 * the OutOfMemoryError of Thread.start ended the accept loop, and the export took no connection again; a sender
 * that could not start left the socket open, the client waiting for replies that never came.
 */
@Timeout(60)
class ThreadShortageTest {
    private static final int MAX = 1 << 20;
    private static final int SLOTS = 2;

    @TempDir
    Path dir;
    private MemoryBlockDriver driver;
    private BlockLayer layer;
    private NbdServer server;
    private Path socket;
    /** Threads the server makes, counted from 1: a connection's reader at accept, its sender after the handshake. */
    private final ThreadShortage threads = new ThreadShortage();

    @BeforeEach
    void start() throws IOException {
        driver = new MemoryBlockDriver(16L << 20);
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
        socket = dir.resolve("nbd.sock");
        server = new NbdServer(new NbdConfig("pmem0", socket, "127.0.0.1", 0, MAX, SLOTS, ""), layer);
        server.connectionThreads = threads;
        server.start();
    }

    @AfterEach
    void stop() throws IOException {
        server.close();
        layer.close();
        driver.close();
    }

    private void assertServesANewClient() throws IOException {
        try (NbdTestClient c = new NbdTestClient(socket).go("pmem0", false, false)) {
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
    }

    @Test
    void aConnectionWithoutAReaderIsClosedAndTheListenerGoesOn() throws Exception {
        threads.refuseFirst(SLOTS + 1); // more than there are slots: a slot kept by each would show
        for (int i = 1; i <= SLOTS + 1; i++) {
            try (NbdTestClient c = new NbdTestClient(socket)) {
                assertTrue(c.closedByServer(), "connection " + i + " without a reader thread must be closed");
            }
        }
        await("the refused connections gone", () -> server.connectionCount() == 0);
        assertServesANewClient();
    }

    @Test
    void aConnectionWithoutASenderIsClosedAfterItsHandshake() throws Exception {
        threads.refuse(2); // the first connection's sender
        try (NbdTestClient c = new NbdTestClient(socket).go("pmem0", false, false)) {
            assertTrue(c.closedByServer(), "a connection without a sender thread must be closed, not left waiting");
        }
        await("the connection gone", () -> server.connectionCount() == 0);
        assertServesANewClient();
    }
}
