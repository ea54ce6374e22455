package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** Connections spread over hardware queues, and one client pipelining far more requests than the queue depth. */
@Timeout(60)
class NbdMultiQueueTest {
    static final String EXPORT = "pmem0";

    @TempDir
    Path dir;
    MemoryBlockDriver driver;
    BlockLayer layer;
    NbdServer server;
    final List<NbdTestClient> clients = new ArrayList<>();

    void start(long size, int queues, int depth, long poolBytes, int maxRequestBytes) throws IOException {
        driver = new MemoryBlockDriver(size);
        layer = new BlockLayer(driver, queues, depth, poolBytes, maxRequestBytes);
        server = new NbdServer(new NbdConfig(EXPORT, dir.resolve("nbd.sock"), "127.0.0.1", 0, maxRequestBytes, 16,
                ""), layer);
        server.start();
    }

    NbdTestClient client() throws IOException {
        NbdTestClient c = new NbdTestClient(dir.resolve("nbd.sock"));
        clients.add(c);
        return c.go(EXPORT, false, false);
    }

    @AfterEach
    void stop() throws Exception {
        for (NbdTestClient c : clients) {
            c.close();
        }
        Closing.closeAll(server, layer, driver);
    }

    @Test
    void fourConnectionsOnTwoQueuesAreAllInFlightAtOnce() throws Exception {
        start(16L << 20, 2, 8, 1L << 20, 256 << 10);
        driver.hold();
        List<NbdTestClient> cs = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            cs.add(client());
        }
        for (int i = 0; i < 4; i++) {
            driver.memory.asSlice(i * 4096L, 4096).fill((byte) (i + 1));
            cs.get(i).request(0, CMD_READ, 100 + i, i * 4096L, 4096, null);
            cs.get(i).flush();
        }
        assertTrue(driver.awaitHeld(4, 10_000), "only " + driver.heldCount() + " of 4 connections' READs reached"
                + " the driver");
        List<Integer> queues = driver.heldQueues();
        assertEquals(2, queues.stream().filter(q -> q == 0).count(), "queue 0 of " + queues);
        assertEquals(2, queues.stream().filter(q -> q == 1).count(), "queue 1 of " + queues);
        assertEquals(2, layer.queue(0).inflight());
        assertEquals(2, layer.queue(1).inflight());

        driver.releaseHeld();
        for (int i = 0; i < 4; i++) {
            NbdTestClient.Reply r = cs.get(i).reply();
            assertEquals(100 + i, r.cookie());
            assertEquals(0, r.error());
            assertEquals(4096, r.data().length);
            for (byte b : r.data()) {
                assertEquals((byte) (i + 1), b, "connection " + i + " read another connection's data");
            }
        }
        assertTrue(layer.queue(0).requestsTotal() >= 2 && layer.queue(1).requestsTotal() >= 2);
    }

    /**
     * 2000 pipelined 64 KiB WRITEs against a queue of depth 4 and a 512 KiB pool: the client sends everything
     * before it waits for the replies (a second thread reads them meanwhile, or the socket buffers would fill
     * both ways). Every request is answered, the server never holds more than its tags and pool, data lands.
     */
    @Test
    void pipelinedRequestsFarBeyondTheDepthAreAllAnsweredWithBoundedMemory() throws Exception {
        int depth = 4;
        int n = 2000;
        int len = 64 << 10;
        long size = (long) n * len;
        long poolBytes = 512 << 10;
        start(size, 1, depth, poolBytes, 256 << 10);
        driver.mode(MemoryBlockDriver.Mode.REVERSE); // completions out of order, on other threads
        NbdTestClient c = client();
        ExecutorService replies = Executors.newSingleThreadExecutor();
        try {
            Future<BitSet> answered = replies.submit(() -> {
                BitSet seen = new BitSet(n);
                for (int i = 0; i < n; i++) {
                    NbdTestClient.Reply r = c.reply();
                    assertEquals(0, r.error(), "reply " + i + " (cookie " + r.cookie() + ")");
                    int cookie = (int) r.cookie();
                    assertFalse(seen.get(cookie), "cookie " + cookie + " answered twice");
                    seen.set(cookie);
                }
                return seen;
            });
            byte[] payload = new byte[len];
            for (int i = 0; i < n; i++) {
                fill(payload, i);
                c.request(0, CMD_WRITE, i, (long) i * len, len, payload);
            }
            c.flush();
            BitSet seen = answered.get(30, TimeUnit.SECONDS);
            assertEquals(n, seen.cardinality(), "every request answered");
        } finally {
            replies.shutdownNow();
        }
        assertEquals(n, layer.queue(0).requestsTotal(), "every WRITE reached the driver");
        assertTrue(driver.maxInflight.get() <= depth, "tags in use " + driver.maxInflight.get());
        int poolChunks = (int) (poolBytes / BufferPool.CHUNK);
        assertTrue(driver.maxChunksInUse.get() <= poolChunks, "chunks in use " + driver.maxChunksInUse.get()
                + " of a pool of " + poolChunks);
        assertTrue(driver.largestBatch.get() <= depth, "a batch of " + driver.largestBatch.get());
        assertTrue(layer.awaitIdle(10_000), "every tag back");
        assertEquals(poolChunks, layer.queue(0).pool().freeChunks(), "every chunk back");
        byte[] expected = new byte[len];
        for (int i = 0; i < n; i++) {
            fill(expected, i);
            long mismatch = MemorySegment.ofArray(expected).mismatch(driver.memory.asSlice((long) i * len, len));
            assertEquals(-1, mismatch, "WRITE " + i + " differs at byte " + mismatch);
        }
    }

    static void fill(byte[] b, int seed) {
        for (int j = 0; j < b.length; j += 4) {
            int v = seed * 0x9E3779B9 + j;
            b[j] = (byte) v;
            b[j + 1] = (byte) (v >>> 8);
            b[j + 2] = (byte) (v >>> 16);
            b[j + 3] = (byte) seed;
        }
    }
}
