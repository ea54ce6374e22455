package io.pmemblk.cli;

import static io.pmemblk.nbd.testing.NbdTestClient.*;
import static io.pmemblk.queueing.testing.Digests.sha256;
import static io.pmemblk.posix.Errno.EINVAL;
import static io.pmemblk.posix.Errno.ENOSPC;
import static io.pmemblk.posix.Errno.ENOTSUP;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.nbd.testing.NbdTestClient.OptionReply;
import io.pmemblk.nbd.testing.NbdTestClient.Reply;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.io.TempDir;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.fail;

/**
 * Hostile and sloppy NBD clients against one real {@code pmemblk serve} process (raw sockets plus the real
 * peers): the server must survive each, keep serving well-behaved clients, never change data outside the
 * requests, and still stop cleanly on SIGTERM.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class AdversarialClientsIT {
    static final long SIZE = 64L << 20;
    static final int DEPTH = 8;
    static final int QUEUES = 2;

    @TempDir
    static Path dir;
    static ServerProcess server;
    static Path sock;
    static final ExecutorService EXEC = Executors.newVirtualThreadPerTaskExecutor();

    @BeforeAll
    static void start() throws Exception {
        sock = dir.resolve("nbd.sock");
        server = ServerProcess.start(dir, "pmem.path=" + dir.resolve("pmem.img"), "pmem.size=64M",
                "nbd.socket=" + sock, "nbd.port=0", "queue.buffer-bytes=32M", "queue.depth=" + DEPTH,
                "queues=" + QUEUES, "nbd.stall-timeout=3");
    }

    @AfterAll
    static void stop() throws Exception {
        if (server != null) {
            server.close();
        }
        // EXEC is not shut down: what is still running in it ends now, its server gone: every read and write on
        // its sockets fails.
    }

    // ================================================================ 1. garbage and broken requests

    @Test
    @Order(10)
    void garbageRightAfterConnectIsDroppedAndTheServerKeepsServing() throws Exception {
        try (NbdTestClient c = connect()) {
            c.greeting();
            byte[] junk = new byte[4096];
            new Random(1).nextBytes(junk);
            junk[0] = (byte) 0xff; // client flags with unknown bits
            c.send(ByteBuffer.wrap(junk));
            assertThat(c.eofWithin(10)).as("server hangs up on garbage client flags").isTrue();
        }
        try (NbdTestClient c = connect()) { // garbage without even reading the greeting
            byte[] junk = new byte[100_000];
            new Random(2).nextBytes(junk);
            c.sendIgnoringErrors(junk);
            assertThat(c.eofWithin(10)).isTrue();
        }
        assertWellBehavedClientWorks(1 << 20);
    }

    @Test
    @Order(11)
    void validHandshakeThenGarbageOrBadMagicIsDropped() throws Exception {
        try (NbdTestClient c = connectGo()) {
            byte[] junk = new byte[10_000];
            new Random(3).nextBytes(junk);
            c.sendIgnoringErrors(junk);
            assertThat(c.eofWithin(10)).as("garbage in transmission ends the connection").isTrue();
        }
        try (NbdTestClient c = connectGo()) {
            ByteBuffer h = header(FUA, READ, 7, 0, 4096);
            h.putInt(0, 0x25609514); // bad magic
            c.send(h);
            assertThat(c.eofWithin(10)).isTrue();
        }
        try (NbdTestClient c = connectGo()) { // a good request, then a bad magic: the good one may still be answered
            c.send(header(0, READ, 8, 0, 4096));
            ByteBuffer h = header(0, READ, 9, 0, 4096);
            h.putInt(0, 0xdeadbeef);
            c.send(h);
            c.drainToEof(10);
        }
        assertWellBehavedClientWorks(2 << 20);
        assertThat(server.stderr()).contains("request magic 0x25609514");
    }

    @Test
    @Order(12)
    void truncatedHeaderAndHugeWriteHeaderThenClose() throws Exception {
        try (NbdTestClient c = connectGo()) {
            ByteBuffer h = header(0, WRITE, 1, 0, 4096);
            h.limit(13);
            c.send(h);
        } // close mid-header
        try (NbdTestClient c = connectGo()) {
            c.send(header(0, WRITE, 2, 0, 0xFFFF_FFFFL)); // a 4 GiB WRITE announced
            Reply r = c.simpleReply(10);
            assertThat(r.cookie()).isEqualTo(2);
            assertThat(r.error()).isEqualTo(EINVAL);
            assertThat(c.eofWithin(10)).as("server hangs up rather than reading 4 GiB").isTrue();
        }
        try (NbdTestClient c = connectGo()) { // announced and closed at once, without reading anything
            c.send(header(0, WRITE, 3, 4096, 0xFFFF_FFFFL));
        }
        assertWellBehavedClientWorks(3 << 20);
    }

    @Test
    @Order(13)
    void writePayloadStoppingHalfwayThenCloseOrIdle() throws Exception {
        long a = 5L << 20, b = 6L << 20;
        assertWellBehavedClientWorks(a); // known content at both offsets
        assertWellBehavedClientWorks(b);
        try (NbdTestClient c = connectGo()) {
            c.send(header(0, WRITE, 1, a, 65536));
            c.send(ByteBuffer.wrap(fill(32768, (byte) 0x77)));
        } // closed with half the payload
        NbdTestClient idle = connectGo();
        try {
            idle.send(header(0, WRITE, 2, b, 1 << 20));
            idle.send(ByteBuffer.wrap(fill(512 << 10, (byte) 0x66)));
            // while that connection sits idle mid-payload, other clients (on both queues) are served
            for (int i = 0; i < 2 * QUEUES; i++) {
                assertWellBehavedClientWorks((8L + i) << 20);
            }
            // and the half-received WRITE was not acknowledged: no reply is readable (bounded wait)
            assertThat(idle.readableWithin(1)).as("no reply for an unfinished WRITE").isFalse();
        } finally {
            idle.close();
        }
        // both offsets are still usable
        assertWellBehavedClientWorks(a);
        assertWellBehavedClientWorks(b);
    }

    /**
     * Tags are shared by every connection bound to a hardware queue. Each client stuck mid-WRITE-payload holds
     * one tag forever (no transmission timeout), so depth x queues of them starve every other client.
     */
    @Test
    @Order(14)
    void stalledWritersMustNotStarveOtherClients() throws Exception {
        List<NbdTestClient> stalled = new ArrayList<>();
        try {
            for (int i = 0; i < DEPTH * QUEUES; i++) {
                NbdTestClient c = connectGo();
                stalled.add(c);
                c.send(header(0, WRITE, i, (20L << 20) + i * 65536L, 65536));
                c.send(ByteBuffer.wrap(fill(100, (byte) 1)));
            }
            NbdTestClient good = connectGo();
            try {
                good.send(header(0, READ, 42, 0, 4096));
                Reply r = good.simpleReplyOrNull(10);
                assertThat(r).as("a well-behaved client is answered while %d clients stall mid-WRITE",
                        stalled.size()).isNotNull();
                assertThat(r.error()).isZero();
            } finally {
                good.close();
            }
        } finally {
            for (NbdTestClient c : stalled) {
                c.close();
            }
        }
    }

    @Test
    @Order(15)
    void optionHaggling() throws Exception {
        // huge option length: TOO_BIG, then a hang-up (the server does not read 4 GiB)
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            c.send(ByteBuffer.allocate(16).putLong(IHAVEOPT).putInt(6).putInt(0xFFFF_FFF0).flip());
            OptionReply r = c.optReply(10);
            assertThat(r.type()).isEqualTo(0x80000009);
            assertThat(c.eofWithin(10)).isTrue();
        }
        // huge length on a known option with the data never sent: same
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            c.send(ByteBuffer.allocate(16).putLong(IHAVEOPT).putInt(7).putInt(65537).flip());
            assertThat(c.optReply(10).type()).isEqualTo(0x80000009);
            assertThat(c.eofWithin(10)).isTrue();
        }
        // many options: each unknown one answered UNSUP, the server gives up after its limit
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            int n = 3000;
            Future<Integer> replies = EXEC.submit(() -> {
                int k = 0;
                try {
                    while (true) {
                        OptionReply r = c.optReply(15);
                        assertThat(r.type()).isEqualTo(0x80000001);
                        k++;
                    }
                } catch (EOFException e) {
                    return k;
                }
            });
            ByteBuffer opts = ByteBuffer.allocate(16 * n);
            for (int i = 0; i < n; i++) {
                opts.putLong(IHAVEOPT).putInt(1000 + i).putInt(0);
            }
            c.sendIgnoringErrors(opts.array());
            int k = replies.get(20, TimeUnit.SECONDS);
            assertThat(k).as("options answered before the hang-up").isBetween(1, n - 1);
        }
        // GO for unknown export names: UNKNOWN, and haggling goes on; then GO for the real one works
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            for (String name : List.of("nope", "pmem0/", "x".repeat(60_000), "pmem0\u0000")) {
                c.sendGo(name);
                OptionReply r = c.optReply(10);
                assertThat(r.type()).as("GO '%s'", name.length() > 20 ? name.length() + " chars" : name)
                        .isEqualTo(0x80000006);
            }
            // INFO whose name length overruns the option
            c.send(ByteBuffer.allocate(16 + 6).putLong(IHAVEOPT).putInt(6).putInt(6).putInt(0x7FFFFFFF)
                    .putShort((short) 0).flip());
            assertThat(c.optReply(10).type()).isEqualTo(0x80000003);
            c.sendGo("");
            c.goReplies(10);
            c.roundTrip(4 << 20);
        }
        // EXPORT_NAME with a 5000-byte name: a hard disconnect, no export data
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            byte[] name = "n".repeat(5000).getBytes(StandardCharsets.UTF_8);
            c.send(ByteBuffer.allocate(16 + name.length).putLong(IHAVEOPT).putInt(1).putInt(name.length).put(name).flip());
            assertThat(c.eofWithin(10)).as("EXPORT_NAME for an unknown export disconnects").isTrue();
        }
        // EXPORT_NAME with the empty (default) name still works
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            c.send(ByteBuffer.allocate(16).putLong(IHAVEOPT).putInt(1).putInt(0).flip());
            ByteBuffer r = c.recv(10, 10);
            assertThat(r.getLong()).isEqualTo(SIZE);
            c.roundTrip(4 << 20);
        }
        assertWellBehavedClientWorks(4 << 20);
    }

    /**
     * The export name of an EXPORT_NAME option is client data: written to the log raw, a client can forge log
     * lines (newlines) and write up to 64 KiB per connection into it.
     */
    @Test
    @Order(16)
    void clientExportNamesCannotForgeLogLines() throws Exception {
        String forged = "2026-01-01 00:00:00 SEVERE io.pmemblk.nbd.NbdServer: FORGED-BY-CLIENT";
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            byte[] name = ("x\n" + forged + "\n").getBytes(StandardCharsets.UTF_8);
            c.send(ByteBuffer.allocate(16 + name.length).putLong(IHAVEOPT).putInt(1).putInt(name.length).put(name).flip());
            assertThat(c.eofWithin(10)).isTrue();
        }
        // the line is written when the connection closes: wait (bounded) for its close line
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        String log;
        do {
            log = server.stderr();
        } while (!log.contains("NBD_OPT_EXPORT_NAME for unknown export 'x") && System.nanoTime() < deadline
                && !Thread.interrupted());
        assertThat(log).contains("NBD_OPT_EXPORT_NAME for unknown export 'x");
        assertThat(log.lines().filter(l -> l.startsWith(forged)).toList())
                .as("a log line that the client wrote").isEmpty();
    }

    // ================================================================ 2. many connections at once

    @Test
    @Order(20)
    void twoHundredConnectionsAtOnce() throws Exception {
        int n = 200;
        // all 200 connect first (the server sends each its greeting and waits), then all talk at once:
        // exactly max-connections (128) are taken, the rest refused
        List<NbdTestClient> sockets = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            try {
                sockets.add(connect());
            } catch (IOException e) {
                sockets.add(null);
            }
        }
        // every one of them gets its greeting or a hang-up before any goes on (no slot frees up meanwhile)
        List<Future<Boolean>> greeted = new ArrayList<>();
        for (NbdTestClient c : sockets) {
            greeted.add(EXEC.submit(() -> {
                if (c == null) {
                    return false;
                }
                try {
                    c.greeting();
                    return true;
                } catch (EOFException e) {
                    return false;
                }
            }));
        }
        List<Boolean> accepted = new ArrayList<>();
        for (Future<Boolean> f : greeted) {
            accepted.add(f.get(20, TimeUnit.SECONDS));
        }
        assertThat(accepted.stream().filter(b -> b).count()).as("greeted while all of them are connected")
                .isEqualTo(128);
        List<Future<String>> results = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            int id = i;
            NbdTestClient pre = sockets.get(i);
            results.add(EXEC.submit(() -> {
                NbdTestClient c = pre;
                if (c == null) {
                    return "refused-connect";
                }
                if (c == null) {
                    return "refused-connect";
                }
                try {
                    if (!accepted.get(id)) {
                        return "refused";
                    }
                    c.send(ByteBuffer.allocate(4).putInt(0, 3));
                    c.sendGo("");
                    c.goReplies(15);
                    long off = (32L << 20) + id * 4096L;
                    byte[] data = fill(4096, (byte) (id + 1));
                    c.send(header(0, WRITE, id, off, 4096));
                    c.send(ByteBuffer.wrap(data));
                    Reply w = c.simpleReply(15);
                    if (w.error() != 0 || w.cookie() != id) return "write error " + w.error();
                    c.send(header(0, READ, id + 1000, off, 4096));
                    Reply r = c.simpleReply(15);
                    byte[] got = new byte[4096];
                    c.recv(4096, 15).get(got);
                    if (r.error() != 0 || !Arrays.equals(got, data)) return "read mismatch";
                    if (id % 2 == 0) {
                        c.send(header(0, DISC, 0, 0, 0));
                    }
                    return "ok";
                } catch (Exception e) {
                    return "failed mid-session: " + e;
                } finally {
                    c.close(); // half of them without DISC
                }
            }));
        }
        Map<String, Integer> counts = new HashMap<>();
        for (Future<String> f : results) {
            String s = f.get(30, TimeUnit.SECONDS);
            counts.merge(s.startsWith("refused") ? "refused" : s, 1, Integer::sum);
        }
        assertThat(counts.keySet()).as("outcomes %s", counts).containsAnyOf("ok").isSubsetOf("ok", "refused");
        String lg = server.stderr();
        String diag = "refusals logged " + lg.lines().filter(l -> l.contains("refusing")).count() + ", first: "
                + lg.lines().filter(l -> l.contains("refusing")).findFirst().orElse("-") + ", connections opened "
                + lg.lines().filter(l -> l.endsWith("opened")).count();
        assertThat(counts.get("ok")).as("outcomes %s; %s", counts, diag).isEqualTo(128);
        assertThat(counts.get("refused")).as("outcomes %s", counts).isEqualTo(n - 128);
        assertThat(server.stderr()).contains("128 connections already (maxConnections)");
        // the data every successful client wrote is there
        try (NbdTestClient c = connectGo()) {
            for (int id = 0; id < n; id += 37) {
                byte[] got = c.read((32L << 20) + id * 4096L, 4096);
                // a refused client wrote nothing: either its pattern or what was there before
                if (got[0] == (byte) (id + 1)) {
                    assertThat(got).isEqualTo(fill(4096, (byte) (id + 1)));
                }
            }
        }
        assertWellBehavedClientWorks(5 << 20);
    }

    // ================================================================ 3. a client that never reads replies

    @Test
    @Order(30)
    void pipelinedReadsNeverReadThenDisconnectLeakNothing() throws Exception {
        try (NbdTestClient c = connectGo()) {
            Future<?> sent = pipelineReads(c, 500);
            try {
                sent.get(3, TimeUnit.SECONDS);
            } catch (TimeoutException expected) {
                // back-pressure: the server does not read requests it cannot answer
            }
        } // disconnect without reading a single reply
        assertFullDepthOnEveryQueue();
    }

    /**
     * A client that pipelines reads and never reads the replies, but stays connected: its sender blocks on a
     * full socket while its reader takes every tag of the hardware queue it shares with other connections.
     */
    @Test
    @Order(31)
    void aClientThatNeverReadsRepliesMustNotStarveOthersOnItsQueue() throws Exception {
        List<NbdTestClient> hogs = new ArrayList<>();
        try {
            for (int q = 0; q < QUEUES; q++) {
                NbdTestClient c = connectGo();
                hogs.add(c);
                pipelineReads(c, 200);
            }
            NbdTestClient good = connectGo();
            try {
                good.send(header(0, READ, 42, 0, 4096));
                Reply r = good.simpleReplyOrNull(10);
                assertThat(r).as("a well-behaved client is answered while a client on every queue"
                        + " ignores its replies").isNotNull();
            } finally {
                good.close();
            }
        } finally {
            for (NbdTestClient c : hogs) {
                c.close();
            }
        }
        assertFullDepthOnEveryQueue();
    }

    /**
     * A half-duplex client must not stall its own connection: [READ 4 MiB, WRITE 4 MiB] x 4 all sent before it reads a
     * reply (x 4: the DEPTH tags of this server; a client with more unanswered requests than tags waits for a tag
     * whatever the server does, as on any server that bounds what is in flight). The reader must keep reading the WRITE
     * payloads while replies wait (it replies inline only what the socket takes at once); before, it blocked writing a
     * READ reply that did not fit, the client blocked writing the next payload, and the stall watchdog cut the
     * connection (EPIPE here).
     */
    @Test
    @Order(32)
    void aHalfDuplexClientThatSendsEverythingBeforeReadingIsServed() throws Exception {
        // A lone connection holds at most its fair share of the tags (half of queue.depth): with more requests
        // unanswered than that, a half-duplex client waits for a tag whatever the reader does.
        int len = 4 << 20, pairs = DEPTH / 4;
        long writes = 32L << 20;
        try (NbdTestClient c = connectGo()) {
            for (int i = 0; i < pairs; i++) {
                c.write(i * (long) len, pattern(i, len), 0); // what the READs will return
            }
            try {
                for (int i = 0; i < pairs; i++) {
                    c.send(header(0, READ, i, i * (long) len, len));
                    c.send(concat(header(0, WRITE, 100 + i, writes + i * (long) len, len), pattern(100 + i, len)));
                }
            } catch (IOException e) {
                fail("the server stopped reading while its replies waited (half-duplex client): " + e);
            }
            for (int i = 0; i < 2 * pairs; i++) {
                Reply r = c.simpleReply(30);
                assertThat(r.error()).as("reply to %d", r.cookie()).isZero();
                if (r.cookie() < 100) {
                    byte[] got = new byte[len];
                    c.recv(len, 30).get(got);
                    assertThat(got).as("READ %d", r.cookie()).isEqualTo(pattern((int) r.cookie(), len));
                }
            }
            for (int i = 0; i < pairs; i++) {
                assertThat(c.read(writes + i * (long) len, len)).as("WRITE %d", i).isEqualTo(pattern(100 + i, len));
            }
        }
    }

    /** The export list and info go to any client, before TLS too: they must not name the backing file's path. */
    @Test
    @Order(33)
    void theExportDescriptionDoesNotLeakTheBackingPath() throws Exception {
        try (NbdTestClient c = connect()) {
            c.greetAsFixedNewstyleClient();
            c.send(ByteBuffer.allocate(16).putLong(IHAVEOPT).putInt(3).putInt(0).flip()); // NBD_OPT_LIST
            OptionReply server = c.optReply(10);
            assertThat(server.type()).as("NBD_REP_SERVER").isEqualTo(2);
            String text = new String(server.data(), StandardCharsets.UTF_8);
            assertThat(text).as("export list entry").contains("pmemblk").doesNotContain(dir.toString())
                    .doesNotContain("pmem.img");
            assertThat(c.optReply(10).type()).as("NBD_REP_ACK").isEqualTo(1);
        }
    }

    /** New clients (one per queue, round-robin) each get DEPTH requests in flight at once answered. */
    private static void assertFullDepthOnEveryQueue() throws Exception {
        List<NbdTestClient> clients = new ArrayList<>();
        try {
            for (int q = 0; q < QUEUES; q++) {
                clients.add(connectGo());
            }
            for (NbdTestClient c : clients) {
                for (int i = 0; i < DEPTH; i++) {
                    c.send(header(0, READ, 100 + i, i * 65536L, 65536));
                }
            }
            for (NbdTestClient c : clients) {
                boolean[] seen = new boolean[DEPTH];
                for (int i = 0; i < DEPTH; i++) {
                    Reply r = c.simpleReplyOrNull(15);
                    assertThat(r).as("reply %d of %d in flight (tags leaked?)", i, DEPTH).isNotNull();
                    assertThat(r.error()).isZero();
                    c.recv(65536, 15);
                    seen[(int) r.cookie() - 100] = true;
                }
                assertThat(seen).containsOnly(true);
            }
        } finally {
            for (NbdTestClient c : clients) {
                c.close();
            }
        }
    }

    // ================================================================ 4. command abuse vs data integrity

    @Test
    @Order(40)
    void abusiveCommandsGetTheRightErrorsAndTouchNothingElse() throws Exception {
        int chunk = 1 << 20;
        byte[][] expected = new byte[(int) (SIZE / chunk)][];
        try (NbdTestClient c = connectGo()) {
            for (int i = 0; i < expected.length; i++) {
                expected[i] = pattern(i, chunk);
                c.write((long) i * chunk, expected[i], 0);
            }
            for (int i = 0; i < expected.length; i += 9) {
                assertThat(c.read((long) i * chunk, chunk)).isEqualTo(expected[i]);
            }
        }
        long trimOff = 10L << 20, trimLen = 1 << 20; // contents unspecified afterwards
        long zeroOff = (12L << 20) + 4096, zeroLen = 65536 + 512; // must read as zeros
        long fastZeroOff = 14L << 20; // zeros, or ENOTSUP and unchanged
        long fuaOff = (16L << 20) + 100;
        byte[] fuaData = fill(8192, (byte) 0xE1);

        Map<Long, Integer> want = new HashMap<>(); // cookie -> expected error
        int fast;
        try (NbdTestClient c = connectGo()) {
            long k = 1;
            List<ByteBuffer> reqs = new ArrayList<>();
            // FLUSH: with FUA fine, with offset/length EINVAL
            reqs.add(header(FUA, FLUSH, k, 0, 0)); want.put(k++, 0);
            reqs.add(header(0, FLUSH, k, 4096, 0)); want.put(k++, EINVAL);
            reqs.add(header(0, FLUSH, k, 0, 4096)); want.put(k++, EINVAL);
            // TRIM
            reqs.add(header(FUA, TRIM, k, trimOff, trimLen)); want.put(k++, 0);
            reqs.add(header(0, TRIM, k, SIZE - 4096, 8192)); want.put(k++, EINVAL);
            reqs.add(header(0, TRIM, k, SIZE, 1)); want.put(k++, EINVAL);
            reqs.add(header(0, TRIM, k, 4096, 0)); want.put(k++, EINVAL);
            reqs.add(header(0, TRIM, k, Long.MIN_VALUE, 4096)); want.put(k++, EINVAL);
            reqs.add(header(NO_HOLE, TRIM, k, 0, 4096)); want.put(k++, EINVAL); // flag not for TRIM
            // WRITE_ZEROES
            reqs.add(header(FUA | NO_HOLE, ZEROES, k, zeroOff, zeroLen)); want.put(k++, 0);
            reqs.add(header(0, ZEROES, k, SIZE - 512, 1024)); want.put(k++, ENOSPC);
            reqs.add(header(0, ZEROES, k, 0, 0xFFFF_FFFFL)); want.put(k++, ENOSPC);
            reqs.add(header(0, ZEROES, k, -4096L, 8192)); want.put(k++, ENOSPC);
            reqs.add(header(DF, ZEROES, k, 0, 4096)); want.put(k++, EINVAL);
            long fastCookie = k;
            reqs.add(header(FAST_ZERO, ZEROES, k, fastZeroOff, 65536)); want.put(k++, -1); // 0 or ENOTSUP
            // CACHE
            reqs.add(header(FUA, CACHE, k, 0, 1 << 20)); want.put(k++, 0);
            reqs.add(header(0, CACHE, k, SIZE - 1, 2)); want.put(k++, EINVAL);
            // BLOCK_STATUS without a negotiated context
            reqs.add(header(REQ_ONE, BSTATUS, k, 0, 4096)); want.put(k++, EINVAL);
            // READ: out of range, empty, DF without structured replies, more than the maximum
            reqs.add(header(0, READ, k, SIZE - 4096, 8192)); want.put(k++, EINVAL);
            reqs.add(header(0, READ, k, 0, 0)); want.put(k++, EINVAL);
            reqs.add(header(DF, READ, k, 0, 4096)); want.put(k++, EINVAL);
            reqs.add(header(0, READ, k, 0, (32 << 20) + 1)); want.put(k++, EINVAL);
            // unknown command
            reqs.add(header(0, 99, k, 0, 4096)); want.put(k++, EINVAL);
            // WRITEs with payloads that must be skipped, not parsed as headers
            byte[] evil = new byte[8192];
            for (int i = 0; i + 28 <= evil.length; i += 28) { // payload that looks like DISC requests
                header(0, DISC, 0, 0, 0).get(evil, i, 28);
            }
            reqs.add(concat(header(0, WRITE, k, SIZE - 4096, 8192), evil)); want.put(k++, ENOSPC);
            reqs.add(concat(header(0x4000, WRITE, k, 0, 8192), evil)); want.put(k++, EINVAL);
            reqs.add(concat(header(0, WRITE, k, Long.MIN_VALUE + 1, 8192), evil)); want.put(k++, ENOSPC);
            // a FUA write in the middle of it all
            reqs.add(concat(header(FUA, WRITE, k, fuaOff, fuaData.length), fuaData)); want.put(k++, 0);
            reqs.add(header(0, FLUSH, k, 0, 0)); want.put(k++, 0);
            for (ByteBuffer r : reqs) {
                c.send(r);
            }
            Map<Long, Integer> got = new HashMap<>();
            for (int i = 0; i < reqs.size(); i++) {
                Reply r = c.simpleReply(15);
                assertThat(got.put(r.cookie(), r.error())).as("one reply per cookie %d", r.cookie()).isNull();
            }
            fast = got.remove(fastCookie);
            want.remove(fastCookie);
            assertThat(fast).as("FAST_ZERO").isIn(0, ENOTSUP);
            assertThat(got).isEqualTo(want);
            assertThat(c.readableWithin(1)).as("no stray replies").isFalse();

            // the same session goes on working
            assertThat(c.read(zeroOff, (int) zeroLen)).isEqualTo(new byte[(int) zeroLen]);
            assertThat(c.read(fuaOff, fuaData.length)).isEqualTo(fuaData);
            if (fast == 0) {
                assertThat(c.read(fastZeroOff, 65536)).isEqualTo(new byte[65536]);
            } else {
                assertThat(c.read(fastZeroOff, 65536)).isEqualTo(Arrays.copyOfRange(expected[14], 0, 65536));
            }
        }

        // BLOCK_STATUS with structured replies and base:allocation
        try (NbdTestClient c = connectStructured()) {
            c.send(header(REQ_ONE, BSTATUS, 1, 4096, 8192));
            c.send(header(0, BSTATUS, 2, SIZE - 4096, 8192));
            c.send(header(0x40, BSTATUS, 3, 0, 4096));
            c.send(header(0, BSTATUS, 4, SIZE - 4096, 4096));
            Map<Long, int[]> got = new HashMap<>();
            for (int i = 0; i < 4; i++) {
                ByteBuffer h = c.recv(20, 10);
                assertThat(h.getInt()).isEqualTo(STRUCT_MAGIC);
                int flags = Short.toUnsignedInt(h.getShort());
                int type = Short.toUnsignedInt(h.getShort());
                long cookie = h.getLong();
                int len = h.getInt();
                ByteBuffer p = c.recv(len, 10);
                assertThat(flags & 1).as("single chunk, DONE").isEqualTo(1);
                got.put(cookie, new int[]{type, type == 0x8001 ? p.getInt() : p.getInt(4)});
            }
            assertThat(got.get(1L)).containsExactly(5, 8192);
            assertThat(got.get(2L)).containsExactly(0x8001, EINVAL);
            assertThat(got.get(3L)).containsExactly(0x8001, EINVAL);
            assertThat(got.get(4L)).containsExactly(5, 4096);
        }

        // everything outside the ranges touched on purpose is what was written
        try (NbdTestClient c = connectGo()) {
            for (int i = 0; i < expected.length; i++) {
                long base = (long) i * chunk;
                byte[] now = c.read(base, chunk);
                byte[] exp = expected[i].clone();
                now = maskOut(now, exp, base, trimOff, trimLen);
                exp = maskOut(exp, exp, base, trimOff, trimLen);
                overlay(exp, base, zeroOff, new byte[(int) zeroLen]);
                overlay(exp, base, fuaOff, fuaData);
                if (fast == 0) {
                    overlay(exp, base, fastZeroOff, new byte[65536]);
                }
                assertThat(sha256(now)).as("MiB %d", i).isEqualTo(sha256(exp));
            }
        }
    }

    @Test
    @Order(41)
    void discWithRequestsInFlightStillAnswersThemAll() throws Exception {
        try (NbdTestClient c = connectGo()) {
            ByteBuffer all = ByteBuffer.allocate(21 * 28 + 3 * 4096);
            for (int i = 0; i < 20; i++) {
                if (i % 7 == 3) {
                    all.put(header(FUA, WRITE, 500 + i, (44L << 20) + i * 4096L, 4096)).put(fill(4096, (byte) i));
                } else {
                    all.put(header(0, READ, 500 + i, i * 65536L, 65536));
                }
            }
            all.put(header(0, DISC, 999, 0, 0)).flip();
            c.send(all);
            boolean[] seen = new boolean[20];
            for (int i = 0; i < 20; i++) {
                Reply r = c.simpleReply(10);
                assertThat(r.error()).isZero();
                int k = (int) r.cookie() - 500;
                assertThat(seen[k]).as("one reply per cookie").isFalse();
                seen[k] = true;
                if (k % 7 != 3) {
                    c.recv(65536, 10);
                }
            }
            assertThat(c.eofWithin(10)).as("closed after the last reply").isTrue();
        }
        try (NbdTestClient c = connectGo()) {
            for (int i : new int[]{3, 10, 17}) {
                assertThat(c.read((44L << 20) + i * 4096L, 4096)).isEqualTo(fill(4096, (byte) i));
            }
        }
    }

    @Test
    @Order(42)
    void structuredRepliesForReadsAndErrors() throws Exception {
        try (NbdTestClient c = connectStructured()) {
            c.send(header(DF, READ, 1, 44L << 20, 4096));
            c.send(header(0, READ, 2, SIZE - 512, 1024));
            c.send(concat(header(0, WRITE, 3, SIZE, 512), new byte[512]));
            c.send(header(DF | FUA, READ, 4, SIZE - 4096, 4096));
            Map<Long, Integer> types = new HashMap<>();
            for (int i = 0; i < 4; i++) {
                int magic = c.recv(4, 10).getInt();
                if (magic == SIMPLE_MAGIC) { // a simple reply is allowed for non-READ commands
                    ByteBuffer sr = c.recv(12, 10);
                    int err = sr.getInt();
                    types.put(sr.getLong(), -err);
                    continue;
                }
                ByteBuffer h = c.recv(16, 10);
                assertThat(magic).isEqualTo(STRUCT_MAGIC);
                int flags = Short.toUnsignedInt(h.getShort());
                int type = Short.toUnsignedInt(h.getShort());
                long cookie = h.getLong();
                int len = h.getInt();
                ByteBuffer p = c.recv(len, 10);
                assertThat(flags & 1).isEqualTo(1);
                if (type == 1) {
                    assertThat(p.getLong()).as("OFFSET_DATA offset").isEqualTo(cookie == 1 ? 44L << 20 : SIZE - 4096);
                    assertThat(len).isEqualTo(8 + 4096);
                    types.put(cookie, 1);
                } else {
                    assertThat(type).isEqualTo(0x8001);
                    types.put(cookie, p.getInt());
                }
            }
            assertThat(types.get(1L)).isEqualTo(1);
            assertThat(types.get(2L)).isEqualTo(EINVAL);
            assertThat(types.get(3L)).isIn(ENOSPC, -ENOSPC);
            assertThat(types.get(4L)).isEqualTo(1);
        }
    }

    @Test
    @Order(43)
    void maximumSizeRequestsPipelined() throws Exception {
        int max = 32 << 20;
        byte[] big = pattern(77, max);
        try (NbdTestClient c = connectGo()) {
            // two maximum WRITEs back to back (the second overlapping the first), then 4 maximum READs pipelined
            ByteBuffer w = ByteBuffer.allocate(2 * (28 + max));
            w.put(header(0, WRITE, 1, 0, max)).put(big).put(header(FUA, WRITE, 2, 16L << 20, max)).put(big).flip();
            Future<?> sending = EXEC.submit(() -> {
                c.send(w);
                return null;
            });
            for (int i = 0; i < 2; i++) {
                assertThat(c.simpleReply(20).error()).isZero();
            }
            sending.get(10, TimeUnit.SECONDS);
            for (int i = 0; i < 4; i++) {
                c.send(header(0, READ, 10 + i, (i % 2) * (16L << 20), max));
            }
            for (int i = 0; i < 4; i++) {
                Reply r = c.simpleReply(20);
                assertThat(r.error()).isZero();
                byte[] got = new byte[max];
                c.recv(max, 20).get(got);
                byte[] exp = new byte[max];
                if (r.cookie() % 2 == 0) { // offset 0: first 16 MiB of big, then the second write's first 16 MiB
                    System.arraycopy(big, 0, exp, 0, 16 << 20);
                    System.arraycopy(big, 0, exp, 16 << 20, 16 << 20);
                } else {
                    exp = big;
                }
                assertThat(sha256(got)).as("READ %d", r.cookie()).isEqualTo(sha256(exp));
            }
        }
    }

    // ================================================================ 5. real peers, logs and a clean stop

    @Test
    @Order(50)
    void realPeersStillWorkTheLogIsCleanAndSigtermExitsZero() throws Exception {
        ServerProcess.Run info = ServerProcess.run(List.of("nbdinfo", "--size", server.unixUri()), 30);
        assertThat(info.out().trim()).as(info.out()).isEqualTo(Long.toString(SIZE));
        ServerProcess.Run w = ServerProcess.run(List.of("qemu-io", "-f", "raw", "-c", "write -P 0x3c 40M 1M",
                "-c", "write -P 0xc3 -f 42M 64k", "-c", "flush", "-c", "read -P 0x3c 40M 1M",
                "-c", "read -P 0xc3 42M 64k", server.unixUri()), 30);
        assertThat(w.exit()).as(w.out()).isZero();
        assertThat(w.out()).doesNotContain("Pattern verification failed", "failed", "error")
                .contains("read 65536/65536 bytes at offset 44040192");
        ServerProcess.Run sh = ServerProcess.run(List.of("/usr/bin/python3", "-m", "nbd", "-u", server.unixUri(),
                "-c", "print(h.pread(4, 40 << 20).hex(), h.can_multi_conn())"), 30);
        assertThat(sh.out().trim()).as(sh.out()).isEqualTo("3c3c3c3c True");
        assertLogClean(server.stderr());
        long t0 = System.nanoTime();
        int exit = server.terminate();
        assertThat(exit).as("SIGTERM exit code; stderr:\n%s", server.stderr()).isZero();
        assertThat(System.nanoTime() - t0).as("stop time").isLessThan(TimeUnit.SECONDS.toNanos(30));
        assertLogClean(server.stderr());
    }

    /**
     * No internal errors and no exceptions, except the one a peer causes by hanging up while its replies are
     * being written ("write failed: java.io.IOException: Broken pipe" / "Connection reset by peer"): that is
     * the client's doing and the server reports it as such.
     */
    static void assertLogClean(String log) {
        assertThat(log).as("server log").doesNotContain("internal error");
        List<String> bad = log.lines().filter(l -> l.contains("Exception"))
                // a client that hangs up (or resets) with requests outstanding: its own doing, reported as such
                .filter(l -> !l.matches(".*closed after \\d+ requests: write failed: java\\.io\\.IOException: "
                        + "(Broken pipe|Connection reset by peer)$"))
                .filter(l -> !l.matches(".*closed after \\d+ requests: read failed: java\\.net\\.SocketException: "
                        + "Connection reset$"))
                .toList();
        assertThat(bad).as("log lines with exceptions; whole log:%n%s", log).isEmpty();
    }

    /**
     * SIGTERM while one client is stuck mid-WRITE payload and another ignores its replies (its sender blocked
     * on a full socket, its reader waiting for a tag): the server must still exit 0 within 30 s, cleanly.
     */
    @Test
    @Order(60)
    void sigtermWithHostileClientsConnectedStillExitsZero(@TempDir Path own) throws Exception {
        String log = sigtermWithHostileClients(own);
        assertLogClean(log);
        assertThat(log).doesNotContain("still in flight at the deadline");
    }

    /** Returns the server's stderr after a SIGTERM that exited 0 within 30 s. */
    private static String sigtermWithHostileClients(Path own) throws Exception {
        Path ownSock = own.resolve("s.sock");
        try (ServerProcess s = ServerProcess.start(own, "pmem.path=" + own.resolve("pmem.img"), "pmem.size=64M",
                "nbd.socket=" + ownSock, "nbd.port=0", "queue.buffer-bytes=32M", "queue.depth=" + DEPTH,
                "queues=1")) {
            Path saved = sock;
            sock = ownSock;
            List<NbdTestClient> open = new ArrayList<>();
            try {
                NbdTestClient writer = connectGo();
                open.add(writer);
                writer.send(header(0, WRITE, 1, 0, 1 << 20));
                writer.send(ByteBuffer.wrap(fill(4096, (byte) 9)));
                NbdTestClient hog = connectGo();
                open.add(hog);
                pipelineReads(hog, 300);
                NbdTestClient handshaking = connect(); // greeting never answered
                open.add(handshaking);
                // a probe with a request in flight too (whether the hog has wedged the queue by now is a race;
                // what is asserted is the shutdown below)
                NbdTestClient probe = connectGo();
                open.add(probe);
                probe.send(header(0, READ, 7, 0, 4096));
                long t0 = System.nanoTime();
                int exit = s.terminate();
                long secs = TimeUnit.NANOSECONDS.toSeconds(System.nanoTime() - t0);
                assertThat(exit).as("exit code; stderr:\n%s", s.stderr()).isZero();
                assertThat(secs).as("seconds to stop; stderr:%n%s", s.stderr()).isLessThan(30);
                return s.stderr();
            } finally {
                sock = saved;
                for (NbdTestClient c : open) {
                    c.close();
                }
            }
        }
    }

    // ================================================================ helpers

    static void assertWellBehavedClientWorks(long offset) throws Exception {
        try (NbdTestClient c = connectGo()) {
            c.roundTrip(offset);
        }
    }

    /**
     * Sends {@code n} pipelined 64 KiB READs (cookie i at offset i * 64 KiB) from another thread: a client that
     * does not read the replies is not read either once its replies are stuck, so the send may never finish.
     */
    static Future<?> pipelineReads(NbdTestClient c, int n) {
        ByteBuffer all = ByteBuffer.allocate(n * 28);
        for (int i = 0; i < n; i++) {
            all.put(header(0, READ, i, i * 65536L, 65536));
        }
        return EXEC.submit(() -> {
            c.sendIgnoringErrors(all.array());
            return null;
        });
    }

    static byte[] maskOut(byte[] data, byte[] ignored, long base, long off, long len) {
        byte[] d = data.clone();
        long s = Math.max(base, off), e = Math.min(base + d.length, off + len);
        for (long p = s; p < e; p++) {
            d[(int) (p - base)] = 0;
        }
        return d;
    }

    static void overlay(byte[] chunk, long base, long off, byte[] data) {
        for (int i = 0; i < data.length; i++) {
            long p = off + i;
            if (p >= base && p < base + chunk.length) {
                chunk[(int) (p - base)] = data[i];
            }
        }
    }

    static NbdTestClient connect() throws IOException {
        return NbdTestClient.connect(sock);
    }

    static NbdTestClient connectGo() throws Exception {
        return NbdTestClient.connectGo(sock);
    }

    static NbdTestClient connectStructured() throws Exception {
        return NbdTestClient.connectStructured(sock);
    }
}
