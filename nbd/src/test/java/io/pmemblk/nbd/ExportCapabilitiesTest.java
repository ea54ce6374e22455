package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.queueing.testing.MemoryBlockDriver.Capability;
import java.io.IOException;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * The export's transmission flags come from the driver's capability queries, and what they do not advertise is
 * refused with the error nbdkit gives: through a real server and a client on its socket.
 */
@Timeout(60)
class ExportCapabilitiesTest {
    static final long SIZE = 1 << 20;
    static final int MAX = 1 << 20;

    @TempDir
    Path dir;
    MemoryBlockDriver driver;
    BlockLayer layer;
    NbdServer server;

    NbdTestClient serve(MemoryBlockDriver d) throws IOException {
        driver = d;
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
        Path socket = dir.resolve("nbd.sock");
        server = new NbdServer(new NbdConfig("pmem0", socket, "127.0.0.1", 0, MAX, 8, ""), layer);
        server.start();
        return new NbdTestClient(socket).go("pmem0", false, false);
    }

    @AfterEach
    void stop() throws Exception {
        Closing.closeAll(server, layer, driver); // the server first, the device last
    }

    @Test
    void everyCapabilityIsAdvertisedAsItsFlag() throws IOException {
        try (NbdTestClient c = serve(new MemoryBlockDriver(SIZE))) {
            assertEquals(TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_SEND_TRIM
                    | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO | TFLAG_SEND_CACHE | TFLAG_CAN_MULTI_CONN,
                    c.transmissionFlags);
        }
    }

    @Test
    void aDriverWithoutTrimAdvertisesNoTrimAndATrimIsRefusedWithEinval() throws IOException {
        try (NbdTestClient c = serve(new MemoryBlockDriver(SIZE).without(Capability.TRIM))) {
            assertEquals(0, c.transmissionFlags & TFLAG_SEND_TRIM, "SEND_TRIM advertised");
            assertEquals(TFLAG_SEND_WRITE_ZEROES, c.transmissionFlags & TFLAG_SEND_WRITE_ZEROES);
            byte[] data = new byte[4096];
            java.util.Arrays.fill(data, (byte) 7);
            assertEquals(0, c.call(0, CMD_WRITE, 0, data.length, data).error());
            assertEquals(Status.EINVAL, c.call(0, CMD_TRIM, 0, 4096, null).error(), "TRIM not advertised");
            assertArrayEquals(data, c.call(0, CMD_READ, 0, data.length, null).data(), "the refused TRIM changed data");
            assertEquals(0, c.call(0, CMD_WRITE_ZEROES, 0, 4096, null).error(), "the connection goes on");
        }
    }

    @Test
    void aReadOnlyDriverAdvertisesReadOnlyAndRefusesWritesWithEperm() throws IOException {
        try (NbdTestClient c = serve(new MemoryBlockDriver(SIZE).without(Capability.WRITE))) {
            assertEquals(TFLAG_READ_ONLY, c.transmissionFlags & TFLAG_READ_ONLY);
            assertEquals(0, c.transmissionFlags & (TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FUA));
            assertEquals(Status.EPERM, c.call(0, CMD_WRITE, 0, 4096, new byte[4096]).error());
            assertEquals(Status.EPERM, c.call(0, CMD_WRITE_ZEROES, 0, 4096, null).error());
            assertEquals(0, c.call(0, CMD_READ, 0, 4096, null).error());
        }
    }
}
