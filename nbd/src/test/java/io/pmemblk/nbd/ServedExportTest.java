package io.pmemblk.nbd;

import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Path;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.io.TempDir;

/**
 * What the tests against one running server ({@link NbdServerProtocolTest}, {@link NbdConnectionTest}) share: the
 * export {@link #EXPORT} of a {@link MemoryBlockDriver}, served on a Unix socket in {@link #dir} and stopped, with
 * its layer and driver, after each test.
 */
abstract class ServedExportTest {
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

    /**
     * Starts the server on {@code dir/socketName} over {@code queues} hardware queues; {@code configure} sets what
     * a test needs on the server before it starts. Returns the URIs the server announces.
     */
    List<URI> serve(String socketName, int queues, String description, UnaryOperator<NbdServer> configure)
            throws IOException {
        socket = dir.resolve(socketName);
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, queues, DEPTH, 2L * MAX, MAX);
        server = configure.apply(new NbdServer(new NbdConfig(EXPORT, socket, "127.0.0.1", 0, MAX, 64, description),
                layer));
        return server.start();
    }

    @AfterEach
    void stop() {
        server.close();
        layer.close();
        driver.close();
    }
}
