package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.block.BlockLayer;
import io.pmemblk.block.testing.MemoryBlockDriver;
import io.pmemblk.block.testing.Waits;
import java.io.IOException;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * A connection's lifecycle: the stall watchdog reaches the reader's and the sender's clocks, and a stalled
 * connection gives every tag back. (The handshake, DISC, EOF, protocol errors and graceful shutdown are
 * covered end to end by {@link NbdServerProtocolTest}.)
 */
@Timeout(60)
class NbdConnectionTest {
    static final long SIZE = 64L << 20;
    static final int DEPTH = 8;
    static final int MAX = 4 << 20;
    static final String EXPORT = "pmem0";

    @TempDir
    Path dir;
    Path socket;
    MemoryBlockDriver driver;
    BlockLayer layer;
    NbdServer server;

    @BeforeEach
    void start() throws IOException {
        socket = dir.resolve("nbd.sock");
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, 1, DEPTH, 2L * MAX, MAX);
        server = new NbdServer(new NbdConfig(EXPORT, socket, "127.0.0.1", 0, MAX, 64, ""), layer)
                .stallTimeout(Duration.ofMillis(300));
        server.start();
    }

    @AfterEach
    void stop() {
        server.close();
        layer.close();
        driver.close();
    }

    @Test
    void theWatchdogClosesAClientStuckInTheMiddleOfAWritePayloadAndItsTagsComeBack() throws Exception {
        try (NbdTestClient c = new NbdTestClient(socket).go(EXPORT, false, false)) {
            c.request(0, CMD_WRITE, 1, 0, 1 << 20, null);
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
            NbdConnection c = new NbdConnection(server, 1, unconnected, "test", layer.queue(0), MAX, SIZE);
            // No reader or sender exists before transmission: nothing is stalled, nothing is closed.
            assertDoesNotThrow(() -> c.closeIfStalled(System.nanoTime() + Duration.ofDays(1).toNanos(), 1));
            assertTrue(unconnected.isOpen());
            assertEquals(false, c.isAlive());
        }
    }
}
