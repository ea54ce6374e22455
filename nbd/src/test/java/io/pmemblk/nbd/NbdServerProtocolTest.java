package io.pmemblk.nbd;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static io.pmemblk.queueing.testing.Waits.await;
import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.*;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.IOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

@Timeout(60)
class NbdServerProtocolTest extends ServedExportTest {
    List<URI> uris;

    @BeforeEach
    void start() throws IOException {
        uris = serve("run/nbd.sock", 2, "test export", s -> s);
    }

    static NbdConfig config(Path socket) {
        return new NbdConfig(EXPORT, socket, "127.0.0.1", 0, MAX, 64, "");
    }

    NbdTestClient client() throws IOException {
        return new NbdTestClient(socket);
    }

    int inflightTags() {
        int n = 0;
        for (int i = 0; i < layer.queueCount(); i++) {
            n += layer.queue(i).inflight();
        }
        return n;
    }

    static byte[] pattern(int len, int seed) {
        byte[] b = new byte[len];
        new Random(seed).nextBytes(b);
        return b;
    }

    /** The server still serves a fresh connection end to end. */
    void assertServes() throws IOException {
        try (NbdTestClient c = client().go(EXPORT, true, false)) {
            byte[] data = pattern(4096, 99);
            assertEquals(0, c.call(0, CMD_WRITE, 8192, 4096, data).error());
            NbdTestClient.Reply r = c.call(0, CMD_READ, 8192, 4096, null);
            assertArrayEquals(data, r.data());
            c.disconnect();
        }
    }

    // ------------------------------------------------------------------ listeners

    @Test
    void uriAndSocketMode() throws IOException {
        assertEquals(URI.create("nbd+unix:///pmem0?socket=" + socket.toAbsolutePath()), uris.get(0));
        assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(socket)));
        server.close();
        assertFalse(Files.exists(socket), "socket file removed on close");
    }

    @Test
    void refusesLiveSocketAndReplacesStaleOne() throws IOException {
        NbdServer second = new NbdServer(config(socket), layer);
        IOException e = assertThrows(IOException.class, second::start);
        assertTrue(e.getMessage().contains("another server"), e.getMessage());
        second.close();
        assertServes(); // the refused start did not remove the live socket

        // A leftover socket file that nobody listens on is replaced.
        Path stalePath = dir.resolve("stale.sock");
        var ch = java.nio.channels.ServerSocketChannel.open(java.net.StandardProtocolFamily.UNIX);
        ch.bind(java.net.UnixDomainSocketAddress.of(stalePath));
        ch.close(); // the file stays behind
        assertTrue(Files.exists(stalePath));
        try (NbdServer third = new NbdServer(config(stalePath), layer)) {
            third.start();
            try (NbdTestClient c = new NbdTestClient(stalePath)) {
                assertEquals(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, c.greet(CLIENT_FLAG_FIXED_NEWSTYLE));
            }
        }
    }

    @Test
    void refusesToReplaceARegularFile() throws IOException {
        Path file = dir.resolve("not-a-socket");
        Files.writeString(file, "data");
        try (NbdServer s = new NbdServer(config(file), layer)) {
            IOException e = assertThrows(IOException.class, s::start);
            assertTrue(e.getMessage().contains("not a socket"), e.getMessage());
        }
        assertEquals("data", Files.readString(file));
    }

    @Test
    void tcpListenerWithNoDelay() throws IOException {
        int port = freeTcpPort();
        try (NbdServer tcp = new NbdServer(new NbdConfig(EXPORT, null, "127.0.0.1", port, MAX, 4, ""), layer)) {
            List<URI> u = tcp.start();
            assertEquals(URI.create("nbd://127.0.0.1:" + port + "/pmem0"), u.get(0));
            try (NbdTestClient c = new NbdTestClient(new java.net.Socket("127.0.0.1", port))) {
                assertEquals(NBDMAGIC, c.in.readLong());
            }
        }
    }

    // ------------------------------------------------------------------ handshake

    @Test
    void infoReportsExportNameDescriptionAndBlockSizes() throws IOException {
        try (NbdTestClient c = client()) {
            assertEquals(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES, c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES));
            c.option(OPT_INFO, NbdTestClient.infoData(EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE));
            List<NbdTestClient.OptionReply> replies = c.optionReplies();
            boolean export = false, name = false, desc = false, sizes = false;
            for (var r : replies) {
                assertEquals(OPT_INFO, r.option());
                if (r.type() != REP_INFO) {
                    continue;
                }
                ByteBuffer d = ByteBuffer.wrap(r.data());
                switch (d.getShort()) {
                    case INFO_EXPORT -> {
                        assertEquals(12, r.data().length);
                        assertEquals(SIZE, d.getLong());
                        int f = d.getShort() & 0xffff;
                        int expected = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_SEND_TRIM
                                | TFLAG_SEND_WRITE_ZEROES | TFLAG_CAN_MULTI_CONN | TFLAG_SEND_CACHE | TFLAG_SEND_FAST_ZERO;
                        assertEquals(expected, f, "no DF without structured replies");
                        export = true;
                    }
                    case INFO_NAME -> {
                        assertEquals(EXPORT, new String(r.data(), 2, r.data().length - 2, StandardCharsets.UTF_8));
                        name = true;
                    }
                    case INFO_DESCRIPTION -> {
                        assertEquals("test export", new String(r.data(), 2, r.data().length - 2, StandardCharsets.UTF_8));
                        desc = true;
                    }
                    case INFO_BLOCK_SIZE -> {
                        assertEquals(14, r.data().length);
                        assertEquals(1, d.getInt());
                        assertEquals(4096, d.getInt());
                        assertEquals(MAX, d.getInt());
                        sizes = true;
                    }
                    default -> fail("unexpected info " + d.getShort(0));
                }
            }
            assertEquals(REP_ACK, replies.getLast().type());
            assertTrue(export && name && desc && sizes, "all infos: " + export + name + desc + sizes);
            // INFO leaves the client in haggling: GO still works, with the empty (default) name.
            c.option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            c.option(OPT_GO, NbdTestClient.infoData(""));
            List<NbdTestClient.OptionReply> go = c.optionReplies();
            assertEquals(REP_ACK, go.getLast().type());
            ByteBuffer e = ByteBuffer.wrap(go.getFirst().data());
            assertEquals(INFO_EXPORT, e.getShort());
            e.getLong();
            assertEquals(TFLAG_SEND_DF, e.getShort() & TFLAG_SEND_DF, "DF once structured replies are on");
            assertTrue(go.stream().anyMatch(r -> r.type() == REP_INFO && r.data()[1] == INFO_BLOCK_SIZE),
                    "block sizes are sent even when not asked for");
            c.structured = true;
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
    }

    @ParameterizedTest
    @ValueSource(ints = {OPT_EXTENDED_HEADERS, 4, 12, 999, 0}) // STARTTLS: NbdTlsTest
    void unsupportedOptionGetsErrUnsupAndHagglingContinues(int option) throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
            c.option(option, new byte[] {1, 2, 3});
            var r = c.optionReply();
            assertEquals(option, r.option());
            assertEquals(REP_ERR_UNSUP, r.type());
            c.option(OPT_GO, NbdTestClient.infoData(EXPORT));
            assertEquals(REP_ACK, c.optionReplies().getLast().type());
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
        }
    }

    @Test
    void listNamesTheExport() throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE);
            c.option(OPT_LIST, new byte[0]);
            var replies = c.optionReplies();
            assertEquals(2, replies.size());
            ByteBuffer d = ByteBuffer.wrap(replies.get(0).data());
            assertEquals(REP_SERVER, replies.get(0).type());
            int n = d.getInt();
            assertEquals(EXPORT, new String(replies.get(0).data(), 4, n, StandardCharsets.UTF_8));
            assertEquals(REP_ACK, replies.get(1).type());
            c.option(OPT_LIST, new byte[] {0});
            assertEquals(REP_ERR_INVALID, c.optionReply().type());
            c.option(OPT_ABORT, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            assertTrue(c.closedByServer());
        }
    }

    @Test
    void unknownExportName() throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE);
            c.option(OPT_INFO, NbdTestClient.infoData("nope"));
            assertEquals(REP_ERR_UNKNOWN, c.optionReply().type());
            c.option(OPT_GO, NbdTestClient.infoData("nope"));
            assertEquals(REP_ERR_UNKNOWN, c.optionReply().type());
            // EXPORT_NAME cannot return an error: the server hangs up.
            c.option(OPT_EXPORT_NAME, "nope".getBytes(StandardCharsets.UTF_8));
            assertTrue(c.closedByServer());
        }
    }

    @Test
    void exportNameWithAndWithoutZeroes() throws IOException {
        for (boolean noZeroes : new boolean[] {true, false}) {
            try (NbdTestClient c = client()) {
                c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | (noZeroes ? CLIENT_FLAG_NO_ZEROES : 0));
                c.option(OPT_EXPORT_NAME, EXPORT.getBytes(StandardCharsets.UTF_8));
                assertEquals(SIZE, c.in.readLong());
                assertTrue((c.in.readUnsignedShort() & TFLAG_HAS_FLAGS) != 0);
                if (!noZeroes) {
                    byte[] zeroes = new byte[124];
                    c.in.readFully(zeroes);
                    assertArrayEquals(new byte[124], zeroes);
                }
                // The next bytes are the reply to our request: no stray zeroes in between.
                NbdTestClient.Reply r = c.call(0, CMD_READ, 0, 512, null);
                assertTrue(r.simple());
                assertEquals(512, r.data().length);
            }
        }
    }

    @Test
    void metaContexts() throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
            c.option(OPT_LIST_META_CONTEXT, NbdTestClient.metaData(EXPORT));
            assertEquals(REP_ERR_INVALID, c.optionReply().type(), "needs structured replies first");
            c.option(OPT_STRUCTURED_REPLY, new byte[0]);
            assertEquals(REP_ACK, c.optionReply().type());
            c.option(OPT_LIST_META_CONTEXT, NbdTestClient.metaData(EXPORT));
            var list = c.optionReplies();
            assertEquals(REP_META_CONTEXT, list.get(0).type());
            assertEquals(META_BASE_ALLOCATION, new String(list.get(0).data(), 4, list.get(0).data().length - 4,
                    StandardCharsets.UTF_8));
            assertEquals(REP_ACK, list.get(1).type());
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, "x-other:thing"));
            assertEquals(1, c.optionReplies().size(), "unknown context selects nothing: just ACK");
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData("nope", META_BASE_ALLOCATION));
            assertEquals(REP_ERR_UNKNOWN, c.optionReply().type());
            byte[] truncated = NbdTestClient.metaData(EXPORT, META_BASE_ALLOCATION);
            c.option(OPT_SET_META_CONTEXT, java.util.Arrays.copyOf(truncated, truncated.length - 3));
            assertEquals(REP_ERR_INVALID, c.optionReply().type());
            c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, META_BASE_ALLOCATION));
            var set = c.optionReplies();
            assertEquals(REP_META_CONTEXT, set.get(0).type());
            int id = ByteBuffer.wrap(set.get(0).data()).getInt();
            c.option(OPT_GO, NbdTestClient.infoData(EXPORT));
            assertEquals(REP_ACK, c.optionReplies().getLast().type());
            c.structured = true;

            NbdTestClient.Reply bs = c.call(0, CMD_BLOCK_STATUS, 4096, 1 << 20, null);
            assertEquals(REPLY_TYPE_BLOCK_STATUS, bs.type());
            assertTrue(bs.done());
            ByteBuffer p = ByteBuffer.wrap(bs.data());
            assertEquals(12, bs.data().length, "one descriptor");
            assertEquals(id, p.getInt());
            assertEquals(1 << 20, p.getInt());
            assertEquals(0, p.getInt(), "allocated data");
            NbdTestClient.Reply one = c.call(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, SIZE - 512, 512, null);
            assertEquals(12, one.data().length);
            assertEquals(512, ByteBuffer.wrap(one.data()).getInt(4));
            NbdTestClient.Reply past = c.call(0, CMD_BLOCK_STATUS, SIZE - 512, 1024, null);
            assertEquals(REPLY_TYPE_ERROR, past.type());
            assertEquals(Status.EINVAL, past.error());
        }
    }

    /**
     * "NBD_OPT_SET_META_CONTEXT" replaces every context set before, "including when this command fails": a SET of
     * base:allocation, then one that fails, leaves none, so BLOCK_STATUS is refused. It once kept the first one.
     */
    @Test
    void aFailedSetMetaContextLeavesNoneSelected() throws IOException {
        for (byte[] failing : new byte[][] {NbdTestClient.metaData("nope", META_BASE_ALLOCATION),
                java.util.Arrays.copyOf(NbdTestClient.metaData(EXPORT, META_BASE_ALLOCATION), 10)}) {
            try (NbdTestClient c = client()) {
                c.greet(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
                c.option(OPT_STRUCTURED_REPLY, new byte[0]);
                assertEquals(REP_ACK, c.optionReply().type());
                c.option(OPT_SET_META_CONTEXT, NbdTestClient.metaData(EXPORT, META_BASE_ALLOCATION));
                assertEquals(REP_META_CONTEXT, c.optionReplies().get(0).type());
                c.option(OPT_SET_META_CONTEXT, failing);
                assertTrue(c.optionReply().type() < 0, "the second SET fails");
                c.option(OPT_GO, NbdTestClient.infoData(EXPORT));
                assertEquals(REP_ACK, c.optionReplies().getLast().type());
                c.structured = true;
                NbdTestClient.Reply bs = c.call(0, CMD_BLOCK_STATUS, 0, 4096, null);
                assertEquals(REPLY_TYPE_ERROR, bs.type(), "no context selected after the failed SET");
                assertEquals(Status.EINVAL, bs.error());
            }
        }
    }

    @Test
    void oversizedOptionIsRefusedWithoutReadingIt() throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE);
            c.out.writeLong(IHAVEOPT);
            c.out.writeInt(OPT_GO);
            c.out.writeInt(0xfffffff0); // ~4 GiB announced, never sent
            c.out.flush();
            assertEquals(REP_ERR_TOO_BIG, c.optionReply().type());
            assertTrue(c.closedByServer());
        }
        assertServes();
    }

    @Test
    void garbageHandshakeClosesOnlyThatConnection() throws IOException, InterruptedException {
        try (NbdTestClient good = client().go(EXPORT, false, false)) {
            try (NbdTestClient bad = client()) {
                bad.greet(0x7f00); // unknown client flags
                assertTrue(bad.closedByServer());
            }
            try (NbdTestClient bad = client()) {
                bad.greet(CLIENT_FLAG_FIXED_NEWSTYLE);
                bad.out.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n".getBytes(StandardCharsets.US_ASCII));
                bad.out.flush();
                assertTrue(bad.closedByServer());
            }
            assertEquals(512, good.call(0, CMD_READ, 0, 512, null).data().length);
        }
        assertServes();
        await("connections gone", () -> server.connectionCount() == 0);
    }

    @Test
    void idleHandshakeTimesOut() throws IOException {
        server.handshakeTimeout = Duration.ofMillis(200);
        try (NbdTestClient c = client()) {
            c.in.readLong();
            c.in.readLong();
            c.in.readUnsignedShort();
            long t0 = System.nanoTime();
            assertTrue(c.closedByServer(), "idle client is dropped");
            assertTrue(System.nanoTime() - t0 < Duration.ofSeconds(5).toNanos());
        }
        assertServes();
    }

    /**
     * A handshake's deadline is cancelled when the handshake ends, nearly always long before it is due. Left in the
     * timer's queue until then, each one kept its connection (ring, encoder, buffers) reachable for the whole
     * handshake timeout: a client connecting and disconnecting in a loop piled them up.
     */
    @Test
    void aFinishedHandshakeLeavesNoDeadlineInTheTimer() throws IOException {
        for (int i = 0; i < 20; i++) {
            try (NbdTestClient c = client().go(EXPORT, false, false)) {
                c.disconnect();
                assertTrue(c.closedByServer());
            }
        }
        assertEquals(1, server.timer.getQueue().size(), "the stall watchdog's task alone, no cancelled deadlines");
    }

    @Test
    void tooManyOptionsCloses() throws IOException {
        try (NbdTestClient c = client()) {
            c.greet(CLIENT_FLAG_FIXED_NEWSTYLE);
            for (int i = 0; i < Handshake.MAX_OPTIONS; i++) {
                c.option(999, new byte[0]);
                assertEquals(REP_ERR_UNSUP, c.optionReply().type());
            }
            assertTrue(c.closedByServer(), "after " + Handshake.MAX_OPTIONS + " options the server hangs up");
        }
    }

    // ------------------------------------------------------------------ transmission

    @ParameterizedTest
    @ValueSource(booleans = {false, true})
    void readWriteRoundTrip(boolean structured) throws IOException {
        try (NbdTestClient c = client().go(EXPORT, structured, false)) {
            assertEquals(SIZE, c.exportSize);
            byte[] data = pattern(MAX, 1); // one maximum-size request, many buffer chunks
            NbdTestClient.Reply w = c.call(CMD_FLAG_FUA, CMD_WRITE, 1 << 20, data.length, data);
            assertEquals(0, w.error());
            assertTrue(w.simple(), "successful non-READ replies are simple");
            NbdTestClient.Reply r = c.call(0, CMD_READ, 1 << 20, data.length, null);
            assertEquals(!structured, r.simple());
            if (structured) {
                assertEquals(REPLY_TYPE_OFFSET_DATA, r.type());
                assertTrue(r.done());
                assertEquals(1 << 20, r.offset());
            }
            assertArrayEquals(data, r.data());
            byte[] direct = new byte[data.length];
            java.lang.foreign.MemorySegment.copy(driver.memory, java.lang.foreign.ValueLayout.JAVA_BYTE, 1 << 20,
                    direct, 0, direct.length);
            assertArrayEquals(data, direct, "the data reached the device");

            assertEquals(0, c.call(0, CMD_WRITE_ZEROES, 1 << 20, 4096, null).error());
            assertEquals(0, c.call(CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, (1 << 20) + 4096, 4096, null).error());
            assertArrayEquals(new byte[8192], c.call(0, CMD_READ, 1 << 20, 8192, null).data());
            assertEquals(0, c.call(0, CMD_TRIM, 0, 4096, null).error());
            assertEquals(0, c.call(0, CMD_CACHE, 0, 1 << 20, null).error());
            long flushes = driver.flushes.get();
            assertEquals(0, c.call(0, CMD_FLUSH, 0, 0, null).error());
            assertEquals(flushes + 1, driver.flushes.get());
            if (structured) {
                assertEquals(0, c.call(CMD_FLAG_DF, CMD_READ, 0, 65536, null).error());
            }
            c.disconnect();
            assertTrue(c.closedByServer());
        }
    }

    record Case(String name, int flags, int type, long offset, long length, int errno) {}

    static List<Case> errorCases() {
        return List.of(
                new Case("read past end", 0, CMD_READ, SIZE - 512, 1024, Status.EINVAL),
                new Case("read offset past end", 0, CMD_READ, SIZE + 4096, 512, Status.EINVAL),
                new Case("read offset+length overflows", 0, CMD_READ, -4096L, 8192, Status.EINVAL),
                new Case("write past end", 0, CMD_WRITE, SIZE - 512, 1024, Status.ENOSPC),
                new Case("write offset+length overflows", 0, CMD_WRITE, -512L, 1024, Status.ENOSPC),
                new Case("write-zeroes past end", 0, CMD_WRITE_ZEROES, SIZE - 512, 1024, Status.ENOSPC),
                new Case("trim past end", 0, CMD_TRIM, SIZE, 512, Status.EINVAL),
                new Case("cache past end", 0, CMD_CACHE, SIZE - 512, 4096, Status.EINVAL),
                new Case("read length 0", 0, CMD_READ, 0, 0, Status.EINVAL),
                new Case("write length 0", 0, CMD_WRITE, 0, 0, Status.EINVAL),
                new Case("trim length 0", 0, CMD_TRIM, 0, 0, Status.EINVAL),
                new Case("read over max", 0, CMD_READ, 0, MAX + 1L, Status.EINVAL),
                new Case("flush with length", 0, CMD_FLUSH, 0, 512, Status.EINVAL),
                new Case("flush with offset", 0, CMD_FLUSH, 512, 0, Status.EINVAL),
                new Case("DF on write", CMD_FLAG_DF, CMD_WRITE, 0, 512, Status.EINVAL),
                new Case("REQ_ONE on read", CMD_FLAG_REQ_ONE, CMD_READ, 0, 512, Status.EINVAL),
                new Case("NO_HOLE on trim", CMD_FLAG_NO_HOLE, CMD_TRIM, 0, 512, Status.EINVAL),
                new Case("FAST_ZERO on write", CMD_FLAG_FAST_ZERO, CMD_WRITE, 0, 512, Status.EINVAL),
                new Case("unknown flag", 1 << 9, CMD_READ, 0, 512, Status.EINVAL),
                new Case("unknown command", 0, 42, 0, 512, Status.EINVAL),
                new Case("block status without context", 0, CMD_BLOCK_STATUS, 0, 512, Status.EINVAL));
    }

    @ParameterizedTest
    @ValueSource(booleans = {false, true})
    void errorsPerProto(boolean structured) throws IOException, InterruptedException {
        try (NbdTestClient c = client().go(EXPORT, structured, false)) {
            for (Case k : errorCases()) {
                byte[] payload = k.type() == CMD_WRITE ? new byte[(int) k.length()] : null;
                NbdTestClient.Reply r = c.call(k.flags(), k.type(), k.offset(), k.length(), payload);
                assertEquals(k.errno(), r.error(), k.name());
                if (structured) {
                    assertEquals(REPLY_TYPE_ERROR, r.type(), k.name() + ": errors are ERROR chunks");
                    assertTrue(r.done(), k.name());
                } else {
                    assertTrue(r.simple(), k.name());
                    assertEquals(0, r.data().length, k.name() + ": no payload after an error");
                }
            }
            NbdTestClient.Reply df = c.call(CMD_FLAG_DF, CMD_READ, 0, 512, null);
            assertEquals(structured ? 0 : Status.EINVAL, df.error(), "DF is only valid with structured replies");
            // The connection is still in step after all of that (refused WRITE payloads were skipped).
            assertArrayEquals(new byte[512], c.call(0, CMD_READ, 0, 512, null).data());
        }
        await("no tags left behind", () -> inflightTags() == 0);
    }

    @Test
    void oversizedWriteIsAnsweredThenDisconnectedWithoutReadingThePayload() throws IOException, InterruptedException {
        try (NbdTestClient c = client().go(EXPORT, false, false)) {
            c.request(0, CMD_WRITE, 7, 0, 0xffffffffL, null); // 4 GiB announced, nothing follows
            c.flush();
            NbdTestClient.Reply r = c.reply();
            assertEquals(7, r.cookie());
            assertEquals(Status.EINVAL, r.error());
            assertTrue(c.closedByServer());
        }
        assertServes();
        await("no tags left behind", () -> inflightTags() == 0);
    }

    @Test
    void badRequestMagicClosesOnlyThatConnection() throws IOException, InterruptedException {
        try (NbdTestClient good = client().go(EXPORT, true, false); NbdTestClient bad = client().go(EXPORT, true, false)) {
            bad.out.writeInt(0xdeadbeef);
            bad.out.write(new byte[24]);
            bad.out.flush();
            assertTrue(bad.closedByServer());
            assertEquals(0, good.call(0, CMD_FLUSH, 0, 0, null).error());
        }
        assertServes();
    }

    @Test
    void pipelinedRequestsOutOfOrderEachCookieAnsweredOnce() throws Exception {
        driver.mode(MemoryBlockDriver.Mode.REVERSE);
        try (NbdTestClient c = client().go(EXPORT, true, false)) {
            int n = 400;
            Set<Long> expected = new HashSet<>();
            // Writer thread: a client must read while it writes, or both ends can fill their socket buffers.
            ExecutorService ex = Executors.newSingleThreadExecutor();
            Future<?> sent = ex.submit(() -> {
                for (int i = 0; i < n; i++) {
                    c.request(0, CMD_WRITE, 1000 + i, i * 4096L, 4096, pattern(4096, i));
                }
                c.flush();
                return null;
            });
            for (int i = 0; i < n; i++) {
                expected.add(1000L + i);
            }
            Set<Long> seen = new HashSet<>();
            List<Long> order = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                NbdTestClient.Reply r = c.reply();
                assertEquals(0, r.error());
                assertTrue(seen.add(r.cookie()), "cookie " + r.cookie() + " answered twice");
                order.add(r.cookie());
            }
            sent.get();
            assertEquals(expected, seen);
            assertNotEquals(order.stream().sorted().toList(), order, "the driver completed batches in reverse");
            assertTrue(driver.largestBatch.get() > 1, "requests were dispatched in batches, largest "
                    + driver.largestBatch.get());

            Future<?> reads = ex.submit(() -> {
                for (int i = 0; i < n; i++) {
                    c.request(0, CMD_READ, 5000 + i, i * 4096L, 4096, null);
                }
                c.flush();
                return null;
            });
            seen.clear();
            for (int i = 0; i < n; i++) {
                NbdTestClient.Reply r = c.reply();
                int idx = (int) (r.cookie() - 5000);
                assertTrue(seen.add(r.cookie()));
                assertEquals(idx * 4096L, r.offset());
                assertArrayEquals(pattern(4096, idx), r.data(), "read " + idx);
            }
            reads.get();
            ex.shutdown();
        }
    }

    @Test
    void clientVanishingMidWritePayloadLeaksNoTags() throws Exception {
        for (int round = 0; round < 3; round++) {
            NbdTestClient c = client().go(EXPORT, false, false);
            c.request(0, CMD_WRITE, 1, 0, 1 << 20, null);
            c.out.write(new byte[1000]); // then nothing more
            c.flush();
            c.close();
        }
        await("connections gone", () -> server.connectionCount() == 0);
        await("tags back", () -> inflightTags() == 0);
        // A connection's whole fair share usable (half the depth, alone on its queue): the driver holds requests
        // until it has seen that many.
        int share = layer.queue(0).tagShare();
        driver.hold();
        try (NbdTestClient c = client().go(EXPORT, false, false)) {
            for (int i = 0; i < share; i++) {
                c.request(0, CMD_READ, i, 0, 4096, null);
            }
            c.flush();
            assertTrue(driver.awaitHeld(share, 10_000), "only " + driver.heldCount() + " of " + share
                    + " requests reached the driver: tags leaked");
            driver.releaseHeld();
            for (int i = 0; i < share; i++) {
                assertEquals(0, c.reply().error());
            }
        }
    }

    @Test
    void manyConnectionsAtOnce() throws Exception {
        int clients = 24;
        ExecutorService ex = Executors.newFixedThreadPool(clients);
        List<Future<?>> done = new ArrayList<>();
        for (int k = 0; k < clients; k++) {
            int id = k;
            done.add(ex.submit(() -> {
                try (NbdTestClient c = client().go(id % 2 == 0 ? EXPORT : "", id % 3 == 0, false)) {
                    for (int i = 0; i < 20; i++) {
                        long off = (id * 20L + i) * 65536;
                        byte[] d = pattern(65536, id * 1000 + i);
                        assertEquals(0, c.call(0, CMD_WRITE, off, d.length, d).error());
                        assertArrayEquals(d, c.call(0, CMD_READ, off, d.length, null).data());
                    }
                    c.disconnect();
                    assertTrue(c.closedByServer());
                }
                return null;
            }));
        }
        for (Future<?> f : done) {
            f.get();
        }
        ex.shutdown();
        await("all closed", () -> server.connectionCount() == 0);
        assertEquals(0, inflightTags());
    }

    @Test
    void maxConnectionsIsEnforced() throws Exception {
        try (NbdServer small = new NbdServer(new NbdConfig(EXPORT, dir.resolve("small.sock"), "127.0.0.1", 0, MAX, 1, ""),
                layer)) {
            small.start();
            try (NbdTestClient first = new NbdTestClient(dir.resolve("small.sock")).go(EXPORT, false, false)) {
                try (NbdTestClient second = new NbdTestClient(dir.resolve("small.sock"))) {
                    assertTrue(second.closedByServer());
                }
                assertEquals(0, first.call(0, CMD_FLUSH, 0, 0, null).error());
            }
        }
    }

    @Test
    void closeLetsInFlightRequestsFinishAndReply() throws Exception {
        driver.hold();
        try (NbdTestClient c = client().go(EXPORT, true, false)) {
            c.request(0, CMD_READ, 77, 0, 4096, null);
            c.flush();
            assertTrue(driver.awaitHeld(1, 10_000));
            Thread closer = Thread.ofPlatform().start(server::close);
            await("server stopped reading", () -> !Files.exists(socket));
            driver.releaseHeld();
            NbdTestClient.Reply r = c.reply();
            assertEquals(77, r.cookie());
            assertEquals(0, r.error());
            assertEquals(4096, r.data().length);
            assertTrue(c.closedByServer());
            closer.join(10_000);
            assertFalse(closer.isAlive());
        }
        assertEquals(0, server.connectionCount());
    }
}
