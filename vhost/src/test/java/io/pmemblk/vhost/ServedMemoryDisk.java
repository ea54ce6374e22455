package io.pmemblk.vhost;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.vhost.testing.EventFds;
import io.pmemblk.vhost.testing.LogCapture;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The real server on its socket over an in-memory disk, for the tests that speak vhost-user to it as QEMU does: the
 * server's log captured, and guest RAM in a sealed memfd as QEMU's memory-backend-memfd gives it (seal=on, its
 * default: the server requires it), mapped for the test's own view. Started before each test, stopped after it,
 * with whatever the disk still holds released first so that no request outlives the test.
 */
@Timeout(60) // a server that refuses the guest's memory leaves a test waiting on an eventfd: it fails instead
abstract class ServedMemoryDisk {
    @TempDir
    Path dir;
    Path socket;
    MemoryBlockDriver driver;
    BlockLayer layer;
    VhostUserBlkServer server;
    final Arena arena = Arena.ofShared();
    /** The guest RAM's memfd, as the front-end sends it with the memory table. */
    int ramFd;
    /** The test's own mapping of guest RAM. */
    MemorySegment ramView;
    final LogCapture logs = new LogCapture("io.pmemblk.vhost");
    final List<String> log = logs.lines();
    final EventFds eventFds = new EventFds();

    /**
     * What is served: the disk's bytes, the block layer's hardware queues under the server, the server's vrings
     * (vhost.queues) and the longest vring it accepts (vhost.queue-size), and guest RAM's bytes.
     */
    record Sizes(long disk, int hwQueues, int queues, int queueSize, long ram) {}

    private final Sizes sizes;

    ServedMemoryDisk(Sizes sizes) {
        this.sizes = sizes;
    }

    @BeforeEach
    void serve() throws IOException {
        logs.start();
        socket = dir.resolve("vhost.sock");
        driver = new MemoryBlockDriver(sizes.disk());
        layer = new BlockLayer(driver, sizes.hwQueues(), 8, 1L << 18, 1 << 17);
        server = new VhostUserBlkServer(new VhostUserBlkConfig(socket, sizes.queues(), sizes.queueSize()), layer);
        assertThat(server.start()).isEqualTo(socket);
        ramFd = SharedMemory.memfd("guest-ram", sizes.ram());
        SharedMemory.seal(ramFd);
        ramView = SharedMemory.map(ramFd, 0, sizes.ram(), arena);
    }

    @AfterEach
    void stopServing() throws Exception {
        driver.releaseHeld();
        server.close();
        eventFds.close();
        Libc.close(ramFd);
        arena.close();
        layer.close();
        driver.close();
        logs.stop();
    }
}
