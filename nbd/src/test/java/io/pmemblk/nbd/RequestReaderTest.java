package io.pmemblk.nbd;

import static io.pmemblk.nbd.ConnectionParts.request;
import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Waits;
import java.io.EOFException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.util.Random;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The receiving half of a connection, without a server or handshake: the test writes raw requests into one end
 * of a socket pair and runs {@link RequestReader} on the other, then drains the replies as the connection does.
 */
@Timeout(60)
class RequestReaderTest extends ConnectionPartsTest {
    static byte[] pattern(int n, int seed) {
        byte[] b = new byte[n];
        new Random(seed).nextBytes(b);
        return b;
    }

    /** Runs the reader on its own thread, as the connection does; what it throws lands in {@code failed}. */
    Thread readerThread(AtomicReference<Throwable> failed) {
        return ConnectionParts.thread("reader-under-test", failed, c.reader::run);
    }

    @Test
    void requestsThatArriveTogetherReachTheDriverAsOneBatch() throws Exception {
        c = new ConnectionParts(dir, false);
        byte[] old = pattern(4096, 1);
        MemorySegment.copy(old, 0, c.driver.memory, ValueLayout.JAVA_BYTE, 65536, old.length);
        byte[] payload = pattern(4096, 2);
        c.send(request(0, CMD_READ, 1, 65536, 4096),
                request(CMD_FLAG_FUA, CMD_WRITE, 2, 0, 4096), ByteBuffer.wrap(payload),
                request(0, CMD_FLUSH, 3, 0, 0),
                request(0, CMD_TRIM, 4, 8192, 4096),
                request(0, CMD_DISC, 5, 0, 0));
        c.reader.run();
        assertEquals("client disconnected (NBD_CMD_DISC)", c.state.reason);
        assertEquals(5, c.reader.requests());
        assertEquals(1, c.driver.batches.get(), "everything already received went to the driver in one call");
        assertEquals(4, c.driver.largestBatch.get());
        assertEquals(-1, MemorySegment.ofArray(payload).mismatch(c.driver.memory.asSlice(0, 4096)),
                "the WRITE payload reached the device");
        c.finishAsTheConnectionDoes();
        ByteBuffer w = c.receive(16 + 4096 + 3 * 16);
        simpleReply(w, 0, 1);
        byte[] got = new byte[4096];
        w.get(got);
        assertArrayEquals(old, got, "READ data");
        simpleReply(w, 0, 2);
        simpleReply(w, 0, 3);
        simpleReply(w, 0, 4);
        assertEquals(0, c.queue.inflight(), "every tag came back");
    }

    @Test
    void refusedRequestsAreAnsweredWithoutTheDriverAndARefusedWritesPayloadIsSkipped() throws Exception {
        c = new ConnectionParts(dir, false);
        byte[] refused = pattern(8192, 3);
        byte[] payload = pattern(4096, 4);
        c.send(request(0, CMD_READ, 1, ConnectionParts.EXPORT, 4096),       // past the end
                request(CMD_FLAG_DF, CMD_WRITE, 2, 0, 8192), ByteBuffer.wrap(refused), // DF on a WRITE
                request(0, CMD_WRITE, 3, 4096, 4096), ByteBuffer.wrap(payload),
                request(0, 99, 4, 0, 4096),                                    // unknown command
                request(0, CMD_DISC, 5, 0, 0));
        c.reader.run();
        assertEquals(1, c.driver.requests.get(), "only the valid WRITE reached the driver");
        assertEquals(-1, MemorySegment.ofArray(payload).mismatch(c.driver.memory.asSlice(4096, 4096)),
                "the request after the skipped payload was parsed where it starts");
        c.finishAsTheConnectionDoes();
        ByteBuffer w = c.receive(4 * 16);
        simpleReply(w, Status.EINVAL, 1);
        simpleReply(w, Status.EINVAL, 2);
        // Refusals complete at once; the valid WRITE waits in the batch until DISC dispatches it.
        simpleReply(w, Status.EINVAL, 4);
        simpleReply(w, 0, 3);
        assertEquals(0, c.queue.inflight());
    }

    @Test
    void aWriteAboveTheMaximumIsRefusedUnreadAndEndsTheConnection() throws Exception {
        c = new ConnectionParts(dir, false);
        c.send(request(0, CMD_WRITE, 7, 0, ConnectionParts.MAX + 1L));
        c.reader.run();
        assertTrue(c.state.reason.contains("exceeds the maximum"), c.state.reason);
        assertEquals(0, c.driver.requests.get());
        c.finishAsTheConnectionDoes();
        simpleReply(c.receive(16), Status.EINVAL, 7);
    }

    @Test
    void aBadMagicIsAProtocolViolation() throws Exception {
        c = new ConnectionParts(dir, false);
        c.send(ByteBuffer.allocate(REQUEST_HEADER_BYTES).putInt(0x12345678).position(REQUEST_HEADER_BYTES).flip());
        NbdProtocolException e = assertThrows(NbdProtocolException.class, c.reader::run);
        assertTrue(e.getMessage().contains("0x12345678"), e.getMessage());
    }

    @Test
    void aClientVanishingMidPayloadLeavesTheWriteForTeardownToRelease() throws Exception {
        c = new ConnectionParts(dir, false);
        c.send(request(0, CMD_READ, 1, 0, 4096), request(0, CMD_WRITE, 2, 0, 8192),
                ByteBuffer.wrap(pattern(1000, 5)));
        c.client.shutdownOutput();
        EOFException e = assertThrows(EOFException.class, c.reader::run);
        assertTrue(e.getMessage().contains("WRITE payload"), e.getMessage());
        assertEquals(1, c.driver.requests.get(), "the READ was dispatched before the reader blocked");
        assertEquals(1, c.queue.inflight(), "the READ completed inline and was answered; the half-received WRITE"
                + " is still held");
        simpleReply(c.receive(16), 0, 1);
        c.finishAsTheConnectionDoes();
        assertEquals(0, c.queue.inflight(), "teardown gave back the WRITE");
    }

    @Test
    void aWriteIsReceivedInPlaceWhenTheDriverOffersIt() throws Exception {
        c = new ConnectionParts(dir, true);
        c.driver.receiveInPlace(true);
        byte[] payload = pattern(12288, 6);
        c.send(request(0, CMD_WRITE, 1, 1 << 20, payload.length), ByteBuffer.wrap(payload),
                request(0, CMD_DISC, 2, 0, 0));
        c.reader.run();
        assertEquals(1, c.driver.inPlaceWrites.get());
        assertEquals(-1, MemorySegment.ofArray(payload).mismatch(c.driver.memory.asSlice(1 << 20, payload.length)));
        c.finishAsTheConnectionDoes();
        simpleReply(c.receive(16), 0, 1);
    }

    /**
     * A large WRITE received in place costs nothing at dispatch, so the reader answers it itself before waiting for
     * the next request: no sender thread runs here, and the reply must still arrive.
     */
    @Test
    void aLargeWriteReceivedInPlaceIsAnsweredByTheReaderItself() throws Exception {
        c = new ConnectionParts(dir, false);
        c.driver.receiveInPlace(true);
        byte[] payload = pattern(RequestReader.LARGE_WRITE * 2, 8);
        c.send(request(0, CMD_WRITE, 1, 0, payload.length), ByteBuffer.wrap(payload));
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread t = readerThread(failed);
        ByteBuffer reply = ByteBuffer.allocate(16);
        c.client.configureBlocking(false);
        Waits.await("the reader to answer the WRITE while it waits for the next request", () -> {
            try {
                return c.client.read(reply) >= 0 && !reply.hasRemaining();
            } catch (java.io.IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        });
        c.client.configureBlocking(true);
        simpleReply(reply.flip(), 0, 1);
        assertEquals(1, c.driver.inPlaceWrites.get());
        c.send(request(0, CMD_DISC, 2, 0, 0));
        Waits.join("the reader to see DISC", t);
        assertEquals(null, failed.get());
        c.finishAsTheConnectionDoes();
    }

    /**
     * Large WRITEs that are already in the socket together are dispatched together (at most
     * {@link RequestReader#DEFERRED_BATCH}), so their replies go out in one write: the reader asks the socket
     * (FIONREAD) whether its next read would block before it dispatches.
     */
    @Test
    void largeWritesAlreadyWaitingInTheSocketAreDispatchedTogether() throws Exception {
        c = new ConnectionParts(dir, false, new BusyPoll(java.time.Duration.ofMillis(1), 1));
        c.driver.receiveInPlace(true);
        int n = RequestReader.DEFERRED_BATCH + 1;
        int len = RequestReader.LARGE_WRITE + 4096;
        ByteBuffer[] all = new ByteBuffer[2 * n + 1];
        for (int i = 0; i < n; i++) {
            all[2 * i] = request(0, CMD_WRITE, i + 1, (long) i * len, len);
            all[2 * i + 1] = ByteBuffer.wrap(pattern(len, 20 + i));
        }
        all[2 * n] = request(0, CMD_DISC, 99, 0, 0);
        c.send(all);
        c.reader.run();
        assertEquals(n, c.driver.inPlaceWrites.get());
        assertEquals(RequestReader.DEFERRED_BATCH, c.driver.largestBatch.get(),
                "the WRITEs after the first read go to the driver together, up to the bound");
        assertEquals(2, c.driver.batches.get(), "the bound, then the rest with DISC");
        for (int i = 0; i < n; i++) {
            assertEquals(-1, MemorySegment.ofArray(pattern(len, 20 + i))
                    .mismatch(c.driver.memory.asSlice((long) i * len, len)), "payload " + i);
        }
        c.finishAsTheConnectionDoes();
        ByteBuffer w = c.receive(16 * n);
        for (int i = 0; i < n; i++) {
            simpleReply(w, 0, i + 1);
        }
    }

    @Test
    void theStallClockRunsOnlyWhileAPayloadIsAwaited() throws Exception {
        c = new ConnectionParts(dir, false);
        byte[] payload = pattern(65536, 7);
        c.send(request(0, CMD_WRITE, 1, 0, payload.length), ByteBuffer.wrap(payload, 0, 100));
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread t = readerThread(failed);
        Waits.await("the reader to wait for the rest of the payload", () -> c.reader.receivingSince() != 0);
        c.send(ByteBuffer.wrap(payload, 100, payload.length - 100), request(0, CMD_DISC, 2, 0, 0));
        Waits.join("the reader to see DISC", t);
        assertEquals(null, failed.get());
        assertEquals(0, c.reader.receivingSince(), "the clock stops once the payload is in");
        assertFalse(c.state.broken);
        c.finishAsTheConnectionDoes();
        simpleReply(c.receive(16), 0, 1);
    }
}
