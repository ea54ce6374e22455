package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import io.pmemblk.posix.Errno;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.util.Random;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Decodes what {@link ReplyEncoder} puts in its iovec and checks every field against NetworkBlockDevice/nbd
 * {@code doc/proto.md}: "Simple reply message" (magic 0x67446698, error u32, cookie u64) and "Structured reply
 * chunk message" (magic 0x668e33ef, flags u16, type u16, cookie u64, length u32, payload).
 */
class ReplyEncoderTest {
    static final long EXPORT = 1L << 20;
    static final int DEPTH = 8;
    static final int MAX = 2 * BufferPool.CHUNK;

    MemoryBlockDriver driver;
    BlockLayer layer;
    HardwareQueue queue;

    @BeforeEach
    void start() {
        driver = new MemoryBlockDriver(EXPORT);
        layer = new BlockLayer(driver, 1, DEPTH, 8L * BufferPool.CHUNK, MAX);
        queue = layer.queue(0);
    }

    @AfterEach
    void stop() {
        layer.close();
        driver.close();
    }

    ReplyEncoder encoder(boolean structured) {
        return new ReplyEncoder(DEPTH, BufferPool.chunksFor(MAX), structured, EXPORT, true, java.util.List.of(),
                DirtyBitmapContexts.NONE);
    }

    /** A request as the driver hands it back: completed with {@code status}, its NBD command remembered. */
    Request completed(ReplyEncoder e, int command, int flags, int dataBytes, long cookie, long offset, long length,
                      int status) throws InterruptedException {
        Request r = queue.acquire(dataBytes);
        e.remember(r.tag(), command, flags);
        r.cookie = cookie;
        r.offset = offset;
        r.length = length;
        r.completion = x -> { };
        r.complete(status);
        return r;
    }

    static byte[] fillData(Request r, long seed) {
        byte[] b = new byte[(int) r.length];
        new Random(seed).nextBytes(b);
        ByteBuffer[] bufs = r.buffers();
        int at = 0;
        for (int i = 0; i < r.segments(); i++) {
            int k = bufs[i].remaining();
            bufs[i].put(b, at, k).flip();
            at += k;
        }
        return b;
    }

    /** What a gathering write of the iovec would send; checks encodedBytes agrees. */
    static ByteBuffer wire(ReplyEncoder e, int iovs) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        long sum = 0;
        for (int i = 0; i < iovs; i++) {
            ByteBuffer d = e.iov()[i].duplicate();
            sum += d.remaining();
            byte[] b = new byte[d.remaining()];
            d.get(b);
            out.writeBytes(b);
        }
        assertEquals(sum, e.encodedBytes(), "encodedBytes is what the iovec holds");
        return ByteBuffer.wrap(out.toByteArray());
    }

    static void simple(ByteBuffer w, int error, long cookie) {
        assertEquals(SIMPLE_REPLY_MAGIC, w.getInt(), "simple reply magic");
        assertEquals(error, w.getInt(), "error");
        assertEquals(cookie, w.getLong(), "cookie");
    }

    /** Checks a chunk header (always the last chunk: we send one per request) and returns its payload length. */
    static int chunk(ByteBuffer w, int type, long cookie) {
        assertEquals(STRUCTURED_REPLY_MAGIC, w.getInt(), "structured reply magic");
        assertEquals(REPLY_FLAG_DONE, Short.toUnsignedInt(w.getShort()), "flags: NBD_REPLY_FLAG_DONE");
        assertEquals(type, Short.toUnsignedInt(w.getShort()), "type");
        assertEquals(cookie, w.getLong(), "cookie");
        return w.getInt();
    }

    static void data(ByteBuffer w, byte[] expected) {
        byte[] got = new byte[expected.length];
        w.get(got);
        assertArrayEquals(expected, got, "READ data follows its header");
    }

    @Test
    void simpleReadIsTheHeaderThenTheData() throws Exception {
        ReplyEncoder e = encoder(false);
        Request r = completed(e, CMD_READ, 0, 4096, 0x1122334455667788L, 8192, 4096, Status.OK);
        byte[] d = fillData(r, 1);
        ByteBuffer w = wire(e, e.encode(new Request[] {r}, 1));
        simple(w, 0, 0x1122334455667788L);
        data(w, d);
        assertFalse(w.hasRemaining());
    }

    @Test
    void structuredReadIsOneOffsetDataChunkWithTheOffsetBeforeTheData() throws Exception {
        ReplyEncoder e = encoder(true);
        Request r = completed(e, CMD_READ, CMD_FLAG_DF, 3000, -2L, 65536, 3000, Status.OK);
        byte[] d = fillData(r, 2);
        ByteBuffer w = wire(e, e.encode(new Request[] {r}, 1));
        assertEquals(8 + 3000, chunk(w, REPLY_TYPE_OFFSET_DATA, -2L), "length: offset u64 + data");
        assertEquals(65536, w.getLong(), "NBD_REPLY_TYPE_OFFSET_DATA offset");
        data(w, d);
        assertFalse(w.hasRemaining());
    }

    @Test
    void structuredErrorIsAnErrorChunkWithoutMessageOrData() throws Exception {
        ReplyEncoder e = encoder(true);
        Request r = completed(e, CMD_READ, 0, 4096, 7, 0, 4096, Status.EIO);
        ByteBuffer w = wire(e, e.encode(new Request[] {r}, 1));
        assertEquals(6, chunk(w, REPLY_TYPE_ERROR, 7), "length: error u32 + message length u16");
        assertEquals(Status.EIO, w.getInt(), "error");
        assertEquals(0, w.getShort(), "message length");
        assertFalse(w.hasRemaining(), "a failed READ sends no data");
    }

    @Test
    void simpleErrorAndSuccessWithoutDataAreSimpleReplies() throws Exception {
        ReplyEncoder e = encoder(false);
        Request a = completed(e, CMD_WRITE, 0, 0, 1, 0, 4096, Status.ENOSPC);
        Request b = completed(e, CMD_FLUSH, 0, 0, 2, 0, 0, Status.OK);
        int iovs = e.encode(new Request[] {a, b}, 2);
        assertEquals(1, iovs, "consecutive headers share one iovec entry");
        ByteBuffer w = wire(e, iovs);
        simple(w, Status.ENOSPC, 1);
        simple(w, 0, 2);
        assertFalse(w.hasRemaining());
    }

    @Test
    void blockStatusIsOneExtentOfAllocatedDataCutAtTheEndOfTheExport() throws Exception {
        ReplyEncoder e = encoder(true);
        Request whole = completed(e, CMD_BLOCK_STATUS, 0, 0, 3, 4096, 65536, Status.OK);
        Request tail = completed(e, CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 4, EXPORT - 4096, 65536, Status.OK);
        ByteBuffer w = wire(e, e.encode(new Request[] {whole, tail}, 2));
        assertEquals(12, chunk(w, REPLY_TYPE_BLOCK_STATUS, 3), "length: context id + one descriptor");
        assertEquals(META_ID_BASE_ALLOCATION, w.getInt(), "metadata context id");
        assertEquals(65536, w.getInt(), "extent length");
        assertEquals(0, w.getInt(), "status flags: allocated data");
        assertEquals(12, chunk(w, REPLY_TYPE_BLOCK_STATUS, 4));
        assertEquals(META_ID_BASE_ALLOCATION, w.getInt());
        assertEquals(4096, w.getInt(), "extent stops at the end of the export");
        assertEquals(0, w.getInt());
        assertFalse(w.hasRemaining());
    }

    @Test
    void driverStatusesReachTheWireAsTheProtocolAllows() throws Exception {
        ReplyEncoder e = encoder(false);
        Request noDf = completed(e, CMD_READ, 0, 4096, 1, 0, 4096, Status.EOVERFLOW);
        Request df = completed(e, CMD_READ, CMD_FLAG_DF, 4096, 2, 0, 4096, Status.EOVERFLOW);
        Request odd = completed(e, CMD_TRIM, 0, 0, 3, 0, 4096, 2 /* ENOENT */);
        ByteBuffer w = wire(e, e.encode(new Request[] {noDf, df, odd}, 3));
        simple(w, Status.EINVAL, 1);
        simple(w, Status.EOVERFLOW, 2);
        simple(w, Status.EIO, 3);
        assertFalse(w.hasRemaining());
    }

    @Test
    void aMixedBatchIsHeaderRunsAndDataInOrderAndTheEncoderIsReusable() throws Exception {
        ReplyEncoder e = encoder(true);
        for (int round = 0; round < 2; round++) {
            Request write = completed(e, CMD_WRITE, CMD_FLAG_FUA, 0, 10, 0, 4096, Status.OK);
            Request read = completed(e, CMD_READ, 0, MAX, 11, 4096, MAX, Status.OK);
            byte[] d = fillData(read, round);
            Request flush = completed(e, CMD_FLUSH, 0, 0, 12, 0, 0, Status.OK);
            Request bad = completed(e, CMD_READ, 0, 4096, 13, 0, 4096, Status.EIO);
            int iovs = e.encode(new Request[] {write, read, flush, bad}, 4);
            assertEquals(1 + read.segments() + 1, iovs, "write+read headers, the read's 2 segments, flush+error");
            ByteBuffer w = wire(e, iovs);
            // "Transmission": with structured replies a server MAY still answer a request without data by a
            // simple reply; only READ (and BLOCK_STATUS) need chunks.
            simple(w, 0, 10);
            assertEquals(8 + MAX, chunk(w, REPLY_TYPE_OFFSET_DATA, 11));
            assertEquals(4096, w.getLong());
            data(w, d);
            simple(w, 0, 12);
            assertEquals(6, chunk(w, REPLY_TYPE_ERROR, 13));
            assertEquals(Status.EIO, w.getInt());
            assertEquals(0, w.getShort());
            assertFalse(w.hasRemaining());
            for (Request r : new Request[] {write, read, flush, bad}) {
                r.release();
            }
        }
    }

    /** driver status, command flags, error on the wire. */
    static Stream<Arguments> statuses() {
        return Stream.of(
                // "Error values": the errors a reply may carry pass through.
                Arguments.of(Status.OK, 0, 0),
                Arguments.of(Status.EPERM, 0, Status.EPERM),
                Arguments.of(Status.EIO, 0, Status.EIO),
                Arguments.of(Status.ENOMEM, 0, Status.ENOMEM),
                Arguments.of(Status.EINVAL, 0, Status.EINVAL),
                Arguments.of(Status.ENOSPC, 0, Status.ENOSPC),
                Arguments.of(Status.ESHUTDOWN, 0, Status.ESHUTDOWN),
                // ENOTSUP "SHOULD" only answer a WRITE_ZEROES with FAST_ZERO; otherwise EINVAL.
                Arguments.of(Status.ENOTSUP, CMD_FLAG_FAST_ZERO, Status.ENOTSUP),
                Arguments.of(Status.ENOTSUP, 0, Status.EINVAL),
                Arguments.of(Status.ENOTSUP, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE, Status.EINVAL),
                // EOVERFLOW only answers a READ with DF.
                Arguments.of(Status.EOVERFLOW, CMD_FLAG_DF, Status.EOVERFLOW),
                Arguments.of(Status.EOVERFLOW, 0, Status.EINVAL),
                // Anything the protocol does not name is EIO.
                Arguments.of(Errno.ENOENT, 0, Status.EIO),
                Arguments.of(Errno.EINTR, 0, Status.EIO),
                Arguments.of(999, 0, Status.EIO),
                Arguments.of(-1, 0, Status.EIO));
    }

    @ParameterizedTest(name = "status {0} flags {1} -> {2}")
    @MethodSource("statuses")
    void nbdError(int status, int flags, int wire) {
        assertEquals(wire, ReplyEncoder.nbdError(status, flags));
    }
}
