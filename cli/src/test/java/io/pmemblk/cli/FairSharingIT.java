package io.pmemblk.cli;

import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static io.pmemblk.nbd.testing.NbdTestClient.READ;
import static io.pmemblk.nbd.testing.NbdTestClient.WRITE;
import static io.pmemblk.nbd.testing.NbdTestClient.concat;
import static io.pmemblk.nbd.testing.NbdTestClient.header;
import static io.pmemblk.nbd.testing.NbdTestClient.pattern;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.nbd.testing.NbdTestClient.Reply;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Fair sharing of a hardware queue against the real {@code serve}: one client that stops reading its replies must not
 * stall another on the same hardware queue (queues=1, the smallest pool, queue.buffer-bytes=32M). An ordering property,
 * not a timing: client B's requests complete while client A is still stalled, its connection open (A then reads every
 * reply it was owed, intact). The stall timeout is 60 s and B's bound 20 s, so the watchdog cutting A off can never be
 * what lets B through (before the fix, that was the only way).
 */
class FairSharingIT {
    static final int MIB = 1 << 20;
    /** Well under the stall timeout (60 s): B must be answered while A is still connected. */
    static final int B_BOUND_SECONDS = 20;

    @TempDir
    Path dir;

    ServerProcess start(int metricsPort) throws Exception {
        return ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=128M",
                "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "queues=1", "queue.buffer-bytes=32M",
                "nbd.stall-timeout=60", "metrics.port=" + metricsPort);
    }

    static double inflight(int port) throws Exception {
        return metric(port, "pmemblk_queue_inflight{queue=\"0\"}");
    }

    /** Waits (bounded) until queue 0 has at least {@code n} tags in use. */
    static void awaitInflight(int port, int n, String what) throws Exception {
        long end = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        double seen;
        while ((seen = inflight(port)) < n) {
            assertThat(System.nanoTime() - end).as("%s: %s tags in use, waited for %d", what, seen, n).isNegative();
            Thread.sleep(20); // polling a condition with a deadline
        }
    }

    /** B: a 4 KiB READ and a 4 KiB WRITE, each answered within the bound. */
    void clientBIsServed(Path sock, long offset) throws Exception {
        try (NbdTestClient b = NbdTestClient.connectGo(sock)) {
            b.send(header(0, READ, 1, offset, 4096));
            Reply r = b.simpleReplyOrNull(B_BOUND_SECONDS);
            assertThat(r).as("B's 4 KiB READ answered within %d s while A stalls", B_BOUND_SECONDS).isNotNull();
            assertThat(r.error()).isZero();
            b.recv(4096, B_BOUND_SECONDS);
            byte[] data = pattern(77, 4096);
            b.send(concat(header(0, WRITE, 2, offset + 4096, data.length), data));
            r = b.simpleReplyOrNull(B_BOUND_SECONDS);
            assertThat(r).as("B's 4 KiB WRITE answered within %d s while A stalls", B_BOUND_SECONDS).isNotNull();
            assertThat(r.error()).isZero();
            b.send(header(0, READ, 3, offset + 4096, 4096));
            assertThat(b.simpleReplyOrNull(B_BOUND_SECONDS)).isNotNull();
            assertThat(b.recv(4096, B_BOUND_SECONDS).array()).isEqualTo(data);
        }
    }

    @Test
    void twoLargeReadsWhoseRepliesNobodyReadsStallNoOtherClient() throws Exception {
        int port = freeTcpPort();
        try (ServerProcess s = start(port); NbdTestClient a = NbdTestClient.connectGo(dir.resolve("s"))) {
            byte[] first = pattern(1, 32 * MIB), second = pattern(2, 32 * MIB);
            a.write(0, first, 0);
            a.write(32L * MIB, second, 0);
            // Two largest READs: each reply is 32 MiB, far more than the socket holds, and A reads none of it.
            // In one write, so the server reads both headers at once: the reader writes a READ's reply itself and
            // blocks on it, and a second header still in the socket would never be read.
            a.send(ByteBuffer.allocate(56).put(header(0, READ, 11, 0, 32 * MIB))
                    .put(header(0, READ, 12, 32L * MIB, 32 * MIB)).flip());
            awaitInflight(port, 2, "both of A's READs taken in");
            assertThat(a.readableWithin(10)).as("A's first reply is on its way").isTrue();

            clientBIsServed(dir.resolve("s"), 100L * MIB);

            // A was stalled, not cut off: every byte it was owed is still there for it.
            Reply r1 = a.simpleReply(30);
            assertThat(r1.cookie()).isEqualTo(11);
            assertThat(r1.error()).isZero();
            assertThat(a.recv(32 * MIB, 60).array()).isEqualTo(first);
            Reply r2 = a.simpleReply(30);
            assertThat(r2.cookie()).isEqualTo(12);
            assertThat(a.recv(32 * MIB, 60).array()).isEqualTo(second);
            assertThat(inflight(port)).isZero();
            assertThat(s.terminate()).isZero();
        }
    }

    /**
     * A floods WRITEs and reads no reply. Its first request is an 8 MiB READ, whose reply cannot fit the socket
     * (4 MiB at most): the sender blocks on it for good, so no later reply goes out and every tag A takes stays
     * taken, whatever the socket buffers hold. The WRITEs are 32 KiB on the DMA route, so the reader leaves the
     * replies to the sender and goes on reading (it writes the replies of in-place WRITEs itself, and would
     * block there after one batch). A reader that blocked there let A take every tag of the queue.
     */
    @Test
    void aFloodOfWritesWhoseRepliesNobodyReadsStallsNoOtherClient() throws Exception {
        int port = freeTcpPort();
        int n = 4_000; // more than the queue's 128 tags; all but those wait in the sockets
        int len = 32 * 1024;
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=128M",
                "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "queues=1", "queue.buffer-bytes=32M",
                "nbd.stall-timeout=60", "metrics.port=" + port, "dma.engine=soft", "route.dma.bounce=true", "route.dma.min-bytes=" + len);
             NbdTestClient a = NbdTestClient.connectGo(dir.resolve("s"))) {
            byte[] big = pattern(4, 8 * MIB);
            a.write(64L * MIB, big, 0);
            AtomicLong sent = new AtomicLong();
            // A virtual thread: blocked on the socket it shows WAITING, which the wait below asks for.
            Thread flood = Thread.ofVirtual().name("client-A-flood").start(() -> {
                byte[] payload = pattern(5, len);
                int perWrite = 16;
                ByteBuffer b = ByteBuffer.allocate(28 + perWrite * (28 + len));
                b.put(header(0, READ, n, 64L * MIB, 8 * MIB)); // in the same write as the first WRITEs
                for (int i = 0; i < n; i += perWrite) {
                    for (int k = i; k < i + perWrite && k < n; k++) {
                        b.put(header(0, WRITE, k, (k % 1024) * (long) len, len)).put(payload);
                    }
                    a.sendIgnoringErrors(java.util.Arrays.copyOf(b.array(), b.position()));
                    sent.set(Math.min(n, i + perWrite));
                    b.clear();
                }
            });
            // A holds as many tags as it may and its reader waits for more: nothing more is read from A's socket.
            long end = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (inflight(port) < 64 || flood.getState() != Thread.State.WAITING) {
                assertThat(System.nanoTime() - end).as("A stalled holding 64 tags or more (%s, %s of %d sent)",
                        inflight(port), sent.get(), n).isNegative();
                Thread.sleep(20); // polling a condition with a deadline
            }
            double stalledAt = inflight(port);

            clientBIsServed(dir.resolve("s"), 100L * MIB);
            assertThat(flood.isAlive()).as("A is still stalled (sent %d of %d) when B is answered", sent.get(), n)
                    .isTrue();
            assertThat(inflight(port)).as("A's tags").isGreaterThanOrEqualTo(stalledAt);

            // A reads its replies at last: it was never cut off, and every request is answered.
            boolean[] answered = new boolean[n + 1];
            for (int i = 0; i <= n; i++) { // completion order: a WRITE's copy may finish before the READ's
                Reply r = a.simpleReply(60);
                assertThat(r.error()).as("reply %d", i).isZero();
                assertThat(answered[(int) r.cookie()]).as("reply for %d twice", r.cookie()).isFalse();
                answered[(int) r.cookie()] = true;
                if (r.cookie() == n) {
                    assertThat(a.recv(8 * MIB, 60).array()).as("the READ's data").isEqualTo(big);
                }
            }
            flood.join(Duration.ofSeconds(60));
            assertThat(flood.isAlive()).isFalse();
            assertThat(inflight(port)).isZero();
            assertThat(s.terminate()).isZero();
        }
    }
}
