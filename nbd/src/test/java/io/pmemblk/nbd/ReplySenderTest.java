package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Waits;
import java.io.IOException;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The replying half of a connection: its thread, the reader's inline replies, and a peer that goes away. */
@Timeout(60)
class ReplySenderTest extends ConnectionPartsTest {
    /** A request of this connection as the reader leaves it, completed by the driver with {@code status}. */
    Request complete(int command, int dataBytes, long cookie, int status) throws InterruptedException {
        Request r = c.queue.acquire(dataBytes);
        c.ring.acquired();
        c.encoder.remember(r.tag(), command, 0);
        r.cookie = cookie;
        r.completion = c.ring;
        r.complete(status);
        return r;
    }

    /** The next reply in {@code w} is an OK reply to a READ of MAX bytes; its data is skipped. */
    static void fullReadReply(ByteBuffer w, long cookie) {
        simpleReply(w, 0, cookie);
        w.position(w.position() + ConnectionParts.MAX);
    }

    /** Parts whose server end cannot buffer one full READ reply: writing it waits for the client to read. */
    void partsWhoseSocketCannotHoldAFullRead() throws IOException {
        c = new ConnectionParts(dir, false);
        int sndbuf = c.server.getOption(StandardSocketOptions.SO_SNDBUF);
        assertTrue(ConnectionParts.MAX > sndbuf, "the reply must not fit the socket: " + sndbuf);
    }

    Thread senderThread(AtomicReference<Throwable> failed) {
        return ConnectionParts.thread("sender-under-test", failed, c.sender::run);
    }

    /** Once the reader is done and nothing is in flight the sender thread stops, having failed nothing. */
    void readerDoneThenTheSenderStops(Thread sender, AtomicReference<Throwable> failed) throws InterruptedException {
        c.ring.readerDone();
        Waits.join("the sender to stop once the reader is done and nothing is in flight", sender);
        assertEquals(null, failed.get());
        assertEquals(0, c.queue.inflight());
    }

    @Test
    void theSenderThreadRepliesInCompletionOrderReleasesAndStopsWhenTheLastIsBack() throws Exception {
        c = new ConnectionParts(dir, false);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread t = senderThread(failed);
        complete(CMD_WRITE, 0, 3, Status.OK);
        complete(CMD_TRIM, 0, 1, Status.EIO);
        complete(CMD_FLUSH, 0, 2, Status.OK);
        ByteBuffer w = c.receive(3 * 16);
        simpleReply(w, 0, 3);
        simpleReply(w, Status.EIO, 1);
        simpleReply(w, 0, 2);
        assertTrue(t.isAlive(), "the reader has not stopped: more may come");
        readerDoneThenTheSenderStops(t, failed);
    }

    /** Batches with a large READ reply go out with the bulk send buffer; the next small batch gets the old one back. */
    @Test
    void largeReadRepliesWidenTheSendBufferAndSmallOnesRestoreIt() throws Exception {
        c = new ConnectionParts(dir, false);
        int before = c.server.getOption(StandardSocketOptions.SO_SNDBUF);
        ReplySender sender = new ReplySender(c.server, c.fd, c.ring, c.encoder, c.state, c.queue.depth(),
                ConnectionParts.MAX);
        complete(CMD_READ, ConnectionParts.MAX, 1, Status.OK);
        sender.replyInlineIfIdle();
        assertTrue(sender.bulkSendBuffer);
        int bulk = c.server.getOption(StandardSocketOptions.SO_SNDBUF);
        assertTrue(bulk > before, "send buffer " + bulk + " after a large reply, " + before + " before");
        simpleReply(c.receive(16 + ConnectionParts.MAX), 0, 1);
        complete(CMD_READ, 4096, 2, Status.OK);
        sender.replyInlineIfIdle();
        assertFalse(sender.bulkSendBuffer);
        assertEquals(before, c.server.getOption(StandardSocketOptions.SO_SNDBUF), "the socket's own size again");
        simpleReply(c.receive(16 + 4096), 0, 2);
    }

    @Test
    void theReaderRepliesInlineToWhatCompletedWhenTheSenderIsIdle() throws Exception {
        c = new ConnectionParts(dir, false);
        complete(CMD_WRITE, 0, 1, Status.OK);
        complete(CMD_WRITE, 0, 2, Status.ENOSPC);
        c.sender.replyInlineIfIdle();
        assertEquals(0, c.queue.inflight(), "replied and released on the calling thread");
        ByteBuffer w = c.receive(2 * 16);
        simpleReply(w, 0, 1);
        simpleReply(w, Status.ENOSPC, 2);
    }

    @Test
    void theReaderStepsAsideWhileTheSenderIsMidWrite() throws Exception {
        c = new ConnectionParts(dir, false);
        c.server.setOption(StandardSocketOptions.SO_SNDBUF, 4096);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread t = senderThread(failed);
        // 1 MiB of READ data the client does not read yet: the sender blocks in its write, holding the lock.
        for (int i = 0; i < 4; i++) {
            complete(CMD_READ, ConnectionParts.MAX, 10 + i, Status.OK);
        }
        Waits.await("the sender to block writing", () -> c.sender.sendingSince() != 0);
        complete(CMD_FLUSH, 0, 99, Status.OK);
        assertTimeoutPreemptively(Waits.BOUND, c.sender::replyInlineIfIdle, "the reader waited for the sender");
        assertEquals(5, c.queue.inflight(), "the reader left the FLUSH's reply to the sender");
        int dataReplies = 4 * (16 + ConnectionParts.MAX);
        ByteBuffer w = c.receive(dataReplies + 16);
        for (int i = 0; i < 4; i++) {
            fullReadReply(w, 10 + i);
        }
        simpleReply(w, 0, 99);
        readerDoneThenTheSenderStops(t, failed);
        assertEquals(0, c.sender.sendingSince(), "the stall clock stops when the write is done");
    }

    @Test
    void aPeerThatWentAwayBreaksTheConnectionButEveryRequestIsStillReleased() throws Exception {
        c = new ConnectionParts(dir, false);
        // The client stops reading (replies fail with EPIPE) but could still send: only our own shutdown of the
        // input stops the reader then.
        c.client.shutdownInput();
        complete(CMD_READ, 4096, 1, Status.OK);
        complete(CMD_READ, 4096, 2, Status.OK);
        c.sender.replyInlineIfIdle();
        assertTrue(c.state.broken);
        assertTrue(c.state.reason.startsWith("write failed"), c.state.reason);
        assertEquals(0, c.queue.inflight());
        c.server.configureBlocking(false); // 0 = nothing yet, -1 = input shut
        assertEquals(-1, c.server.read(ByteBuffer.allocate(1)), "the input was shut so the reader stops");
        complete(CMD_READ, 4096, 3, Status.OK);
        c.sender.replyInlineIfIdle();
        assertEquals(0, c.queue.inflight(), "once broken, completions are released without a write");
        assertTrue(c.state.reason.startsWith("write failed"), "the first reason stays: " + c.state.reason);
    }

    @Test
    void aConnectionAlreadyBrokenWritesNothing() throws Exception {
        c = new ConnectionParts(dir, false);
        c.state.fail("client stopped reading replies");
        complete(CMD_WRITE, 0, 1, Status.OK);
        c.sender.replyInlineIfIdle();
        assertEquals(0, c.queue.inflight());
        c.server.close();
        c.fd.close(); // the connection's own descriptor keeps the socket open until the connection ends
        assertEquals(-1, c.client.read(ByteBuffer.allocate(16)), "no reply bytes");
        assertFalse(c.state.reason.startsWith("write failed"));
    }

    /**
     * A client blocked sending its next WRITE payload reads no reply until the reader takes that payload
     * (half-duplex): the reader waits for room only while the client sends nothing. Once input waits and no room
     * comes, the rest of the batch goes to the sender thread, which finishes it, in order, once the client reads.
     */
    @Test
    void theReaderHandsTheRestToTheSenderOnceInputWaitsAndNoRoomComes() throws Exception {
        partsWhoseSocketCannotHoldAFullRead();
        complete(CMD_READ, ConnectionParts.MAX, 1, Status.OK);
        complete(CMD_WRITE, 0, 2, Status.OK);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread inline = ConnectionParts.thread("reader", failed, c.sender::replyInlineIfIdle);
        Waits.await("the reader waiting for room, the stall clock running", () -> c.sender.sendingSince() != 0);
        c.client.write(ConnectionParts.request(0, CMD_WRITE, 3, 0, 4096)); // the next request arrives
        Waits.join("the reader, once input waits", inline);
        assertEquals(null, failed.get());
        assertTrue(handedOver(c.sender), "what did not fit is left for the sender thread");
        assertEquals(2, c.queue.inflight(), "nothing released before its reply is written whole");
        Thread t = senderThread(failed);
        ByteBuffer w = c.receive(16 + ConnectionParts.MAX + 16);
        fullReadReply(w, 1);
        simpleReply(w, 0, 2);
        readerDoneThenTheSenderStops(t, failed);
        assertFalse(c.state.broken, c.state.reason);
    }

    /**
     * A client that reads its replies gets a batch larger than the socket's buffer from the reader itself: no
     * hand-off to the sender thread (a futex wake and a context switch per batch, which cost 64 KiB reads at QD16
     * up to a quarter of their rate).
     */
    @Test
    void aClientThatReadsGetsABatchLargerThanTheSocketInlineWithNoHandOff() throws Exception {
        partsWhoseSocketCannotHoldAFullRead();
        complete(CMD_READ, ConnectionParts.MAX, 1, Status.OK);
        complete(CMD_READ, ConnectionParts.MAX, 2, Status.OK);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        AtomicReference<ByteBuffer> got = new AtomicReference<>();
        Thread client = ConnectionParts.thread("client", failed,
                () -> got.set(c.receive(2 * (16 + ConnectionParts.MAX))));
        c.sender.replyInlineIfIdle();
        assertFalse(handedOver(c.sender), "the reader sent the whole batch itself");
        assertEquals(0, c.queue.inflight(), "both requests released by the reader");
        Waits.join("the client", client);
        assertEquals(null, failed.get());
        ByteBuffer w = got.get();
        fullReadReply(w, 1);
        fullReadReply(w, 2);
    }

    /**
     * Replies go out in completion order: while the sender thread holds replies it drained (it has not taken
     * the send lock yet), the reader's inline path sends nothing newer, or a READ that returns an earlier
     * overlapping WRITE's data would overtake that WRITE's reply (nbd-tester-client's integrity test).
     */
    @Test
    void aReplyTheSenderDrainedGoesOutBeforeOneThatCompletedAfterIt() throws Exception {
        c = new ConnectionParts(dir, false);
        Request write = complete(CMD_WRITE, 0, 1, Status.OK);
        Request[] taken = new Request[ConnectionParts.DEPTH];
        assertEquals(1, c.ring.drain(taken), "the sender thread drained the WRITE's reply"); // as its run() does
        complete(CMD_READ, 4096, 2, Status.OK);
        c.sender.replyInlineIfIdle();
        c.client.configureBlocking(false);
        assertEquals(0, c.client.read(ByteBuffer.allocate(16)), "the READ's reply went out before the WRITE's");
        assertEquals(2, c.queue.inflight());
        c.client.configureBlocking(true);
        // the sender's write of the WRITE's reply, as run() would do it, then the READ may go
        ByteBuffer h = ByteBuffer.allocate(16).putInt(SIMPLE_REPLY_MAGIC).putInt(0).putLong(1).flip();
        while (h.hasRemaining()) {
            c.server.write(h);
        }
        write.release();
        taken[0] = null;
        c.ring.senderReleased(1);
        c.sender.replyInlineIfIdle();
        ByteBuffer w = c.receive(16 + 16 + 4096);
        simpleReply(w, 0, 1);
        simpleReply(w, 0, 2);
        assertEquals(0, c.queue.inflight());
    }

    /** Whether an inline batch waits for the sender thread to finish it: its state, read under its lock. */
    private static boolean handedOver(ReplySender sender) {
        sender.sendLock.lock();
        try {
            return sender.pendingCount > 0;
        } finally {
            sender.sendLock.unlock();
        }
    }
}
