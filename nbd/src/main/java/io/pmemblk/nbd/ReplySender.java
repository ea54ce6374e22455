package io.pmemblk.nbd;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;

import io.pmemblk.queueing.Request;
import java.io.IOException;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Writes a connection's replies and gives their requests back. Two callers: the sender thread, which drains the
 * {@link ReplyRing} whole and writes all those replies with one gathering write ({@link #run}); and the reader,
 * which right after a dispatch writes the replies of whatever completed inline if the sender is not mid-write
 * ({@link #replyInlineIfIdle}): one thread hand-off (a futex wake and a context switch) fewer per batch, which
 * is what small requests on a 2-core machine pay most for.
 *
 * <p>The reader must never wait for a client that waits for it: a client may be blocked sending its next WRITE
 * payload and read replies only after that (half-duplex), so a reader blocked writing to it would never read that
 * payload. So the reader sends inline without blocking (MSG_DONTWAIT through {@link SocketFd}); when the socket is
 * full it lets the kernel wait for room in bounded sends ({@link #HANDOFF_MILLIS} each: one call per wait, where a
 * poll and a send cost two syscalls per wake-up), for as long as the client takes bytes or sends nothing. No byte
 * taken in one of them while input waits is the half-duplex case: the rest of that batch goes to the sender thread, which waits
 * for the client, and the reader goes back to reading. A client that reads its replies (every fio job, every
 * kernel client) frees room within microseconds, so its large READ replies go out inline with no thread hand-off:
 * handing every batch that overflows the socket to the sender cost 64 KiB reads at QD16 15-26% of their rate and
 * 1.4x the CPU per request. With no {@link SocketFd} (TLS, or the JDK does not show the descriptor) every reply
 * goes through the sender thread.
 *
 * <p>The stall watchdog measures progress, not age: {@link #sendingSince} is when the sender began waiting for
 * room with no byte taken since, 0 while nothing waits; a send that moves bytes stops the clock, and so does the
 * watchdog seeing the socket's unsent bytes fall (the client reading) while the sender sleeps. A client reading
 * one 32 MiB reply slowly but steadily is never cut off; one reading nothing is.
 *
 * <p>Replies go out in the order their requests completed: the sender holds what it drained until written
 * ({@link ReplyRing#drainNow} gives the reader nothing meanwhile), so a READ that completed after an overlapping
 * WRITE never overtakes the WRITE's reply. A request that overlaps an unreplied one is not even acquired before
 * that reply is gone ({@link OverlapGuard}): every release here tells the guard first.
 *
 * <p>A write that fails marks the connection broken and shuts its input, so the reader stops; from then on
 * requests are released without replies, so the queue still gets every tag back.
 */
final class ReplySender {
    private static final System.Logger LOG = System.getLogger(ReplySender.class.getName());
    /** Longest wait for room before the sender looks again at the client's progress and the connection's state. */
    static final int WAIT_MILLIS = 100;
    /**
     * With the socket full, how long one blocking send of the reader waits for room; when it took nothing and the
     * client has sent input, the rest of the inline batch goes to the sender thread: a client reading its replies
     * frees room far sooner; one that does not is blocked sending (half-duplex) and waits for the reader.
     */
    static final int HANDOFF_MILLIS = 2;

    private final SocketChannel channel;
    /** Our own descriptor of a plain socket: sends that never block; null: blocking JDK writes, no inline replies. */
    private final SocketFd out;
    private final ReplyRing ring;
    private final ReplyEncoder encoder;
    private final CloseState state;
    /** Serialises reply writing between the sender thread and the reader's inline replies: guards the encoder. */
    final ReentrantLock sendLock = new ReentrantLock();
    /** Drain arrays: the sender thread's, and the reader's for inline replies. */
    private final Request[] done;
    private final Request[] inlineDone;
    /**
     * An inline batch the socket did not take whole: {@code inlineDone[0..pendingCount)} are its requests and
     * the encoder's iov entries {@code [pendingFirst, pendingIovs)} (the first one partly sent) its unsent
     * {@code pendingBytes}. The sender thread writes it before anything else. Guarded by sendLock.
     */
    int pendingCount;
    private int pendingFirst;
    private int pendingIovs;
    private long pendingBytes;
    /**
     * Send-buffer sizing for Unix sockets, which have no autotuning (TCP grows its buffer for bulk flows itself).
     * A unix socket's writer sleeps whenever its send buffer (208 KiB by default) is full and wakes when the
     * client has read some: a 2 MiB reply costs ten sleeps and wake-ups. With 4 MiB a batch of large replies goes
     * out with few (measured: 2 MiB reads at QD1 and QD16 1.12-1.17x). Small replies keep the default: a writer
     * that never blocks comes back for the next requests one at a time instead of in batches (64 KiB reads at QD16
     * measured 0.56-0.72x with 4 MiB throughout). The kernel caps it at net.core.wmem_max.
     */
    static final int BULK_SEND_BUFFER = 4 << 20;
    static final int BULK_REPLY_BYTES = 1 << 20;
    private final int bulkReplyBytes;
    private int defaultSendBuffer = -1;
    boolean bulkSendBuffer;
    /**
     * Since when the sender has waited for the client without seeing it take a byte; 0 = not waiting. Read by
     * the stall watchdog, which also moves it on when it sees the client read ({@link #clientProgressed}).
     */
    private final java.util.concurrent.atomic.AtomicLong sendingSince = new java.util.concurrent.atomic.AtomicLong();

    /**
     * @param out            our descriptor of {@code channel}'s socket, or null (TLS, or unknown)
     * @param bulkReplyBytes a batch with a READ reply at least this long is written with a {@link #BULK_SEND_BUFFER}
     *                       socket send buffer, other batches with the socket's own; 0: the buffer is left alone
     *                       (TCP, whose kernel sizes it itself, and TLS)
     */
    ReplySender(SocketChannel channel, SocketFd out, ReplyRing ring, ReplyEncoder encoder, CloseState state,
                int depth, int bulkReplyBytes) {
        this.bulkReplyBytes = bulkReplyBytes;
        this.channel = channel;
        this.out = out;
        this.ring = ring;
        this.encoder = encoder;
        this.state = state;
        this.done = new Request[depth];
        this.inlineDone = new Request[depth];
    }

    long sendingSince() {
        return sendingSince.get();
    }

    /**
     * The watchdog saw the client take bytes (the socket's unsent bytes fell) while the sender waited since
     * {@code since}: the wait restarts at {@code now}, unless the sender has moved on meanwhile.
     */
    void clientProgressed(long since, long now) {
        sendingSince.compareAndSet(since, now);
    }

    /** Our descriptor of the socket, or null (TLS, or unknown). */
    SocketFd socketFd() {
        return out;
    }

    /**
     * The sender thread's loop: until the reader has stopped and every request in flight is back, waits for
     * completions (or an inline batch handed over), replies to them and releases them.
     */
    void run() throws InterruptedException {
        int n;
        while ((n = ring.drain(done)) >= 0) {
            sendLock.lock();
            try {
                if (pendingCount > 0) {
                    finishPending(); // drained before done[]: its replies go first
                }
                if (n > 0) {
                    sendAndRelease(done, n);
                }
            } finally {
                sendLock.unlock();
            }
        }
    }

    /**
     * Reader side, right after a dispatch: replies to what completed already unless the sender is writing (or
     * holds replies it drained, or the rest of an earlier inline batch), as far as the socket takes them now.
     */
    void replyInlineIfIdle() {
        if (out != null && sendLock.tryLock()) {
            try {
                if (pendingCount == 0) {
                    int n = ring.drainNow(inlineDone);
                    if (n > 0) {
                        sendInline(inlineDone, n);
                    }
                }
            } finally {
                sendLock.unlock();
            }
        }
    }

    /** Sender thread, holding sendLock: writes the replies of {@code done[0..n)} (unless broken) and releases them. */
    private void sendAndRelease(Request[] done, int n) {
        if (!state.broken) {
            try {
                int iovs = encode(done, n);
                writeFully(0, iovs, encoder.encodedBytes());
            } catch (IOException e) {
                failed(e);
            } catch (RuntimeException e) {
                failed(e);
            }
        }
        release(done, n, true);
    }

    /**
     * Reader, holding sendLock: sends the batch while the client takes it or sends nothing; when input waits and
     * no room comes, hands the rest, requests and all, to the sender.
     */
    private void sendInline(Request[] done, int n) {
        if (!state.broken) {
            ByteBuffer[] iov = encoder.iov();
            int iovs = 0;
            int first = 0;
            try {
                iovs = encode(done, n);
                long total = encoder.encodedBytes();
                boolean wait = false; // the buffer was full: the kernel waits for room, HANDOFF_MILLIS at a time
                while (total > 0) {
                    if (wait && state.broken) {
                        throw new IOException(state.reason);
                    }
                    long w = wait ? out.sendWaiting(iov, first, iovs - first, HANDOFF_MILLIS)
                            : out.send(iov, first, iovs - first);
                    if (w > 0) {
                        total -= w;
                        if (sendingSince.get() != 0) {
                            sendingSince.set(0); // the client took bytes: the stall clock stops
                        }
                    }
                    while (first < iovs && !iov[first].hasRemaining()) {
                        iov[first++] = null;
                    }
                    if (total == 0 || !out.sendBufferFull()) {
                        continue;
                    }
                    if (w == 0 && sendingSince.get() == 0) {
                        sendingSince.set(System.nanoTime()); // waiting with nothing taken: the stall clock runs
                    }
                    if (!wait) {
                        wait = true;
                    } else if (w == 0 && inputWaiting()) {
                        // No byte taken in HANDOFF_MILLIS and the client sends: it may be blocked sending, waiting
                        // for this thread to read. The sender thread finishes the batch; the reader reads on.
                        pendingFirst = first;
                        pendingIovs = iovs;
                        pendingBytes = total;
                        pendingCount = n;
                        iovs = first; // the entries left stay for the sender
                        ring.handOff();
                        return;
                    }
                }
            } catch (IOException e) {
                failed(e);
            } catch (RuntimeException e) {
                failed(e);
            } finally {
                sendingSince.set(0);
                for (int i = first; i < iovs; i++) {
                    iov[i] = null; // released requests' buffers must not stay reachable from here
                }
            }
        }
        release(done, n, false);
    }

    /** Whether the client has sent bytes the reader has not read (or the socket failed: the next send says how). */
    private boolean inputWaiting() throws IOException {
        return (out.await(Sockets.POLLIN, 0) & Sockets.POLLIN) != 0;
    }

    /** Sender thread, holding sendLock: the rest of an inline batch the socket did not take at once. */
    private void finishPending() {
        int n = pendingCount;
        pendingCount = 0;
        if (!state.broken) {
            try {
                writeFully(pendingFirst, pendingIovs, pendingBytes);
            } catch (IOException e) {
                failed(e);
            } catch (RuntimeException e) {
                failed(e);
            }
        } else {
            for (int i = pendingFirst; i < pendingIovs; i++) {
                encoder.iov()[i] = null;
            }
        }
        release(inlineDone, n, true);
    }

    private int encode(Request[] done, int n) throws IOException {
        int iovs = encoder.encode(done, n);
        if (bulkReplyBytes > 0) {
            sizeSendBuffer(encoder.largestData() >= bulkReplyBytes);
        }
        return iovs;
    }

    /**
     * A client that hangs up with replies outstanding is its own doing: said as such (as the JDK's "Broken pipe"
     * was before replies went through {@link SocketFd}), not as an exception of ours.
     */
    private static String why(IOException e) {
        if (e instanceof NativeException ne && (ne.errno() == Errno.EPIPE || ne.errno() == Errno.ECONNRESET)) {
            return "the client hung up (" + ne.getMessage() + ")";
        }
        return e.toString();
    }

    private void failed(IOException e) {
        end("write failed: " + why(e));
    }

    /**
     * A reply failed with an exception of ours, not the socket's (a dirty bitmap that cannot be read, say). Left to
     * end the sender thread, it lost the requests it had drained (their tags never came back to the queue) and left
     * the connection open with nobody to answer it. Replies cannot go on in order after it either, so it ends the
     * connection as a failed write does; the caller still releases every request.
     */
    private void failed(RuntimeException e) {
        LOG.log(System.Logger.Level.ERROR, "nbd: a reply could not be built or sent", e);
        end("internal error while replying: " + e);
    }

    private void end(String why) {
        state.fail(why); // else a forced close or the stall watchdog already said why
        try {
            channel.shutdownInput(); // the reader stops; in-flight requests still drain through here
        } catch (IOException closed) {
            // already closed
        }
    }

    private void release(Request[] done, int n, boolean bySender) {
        OverlapGuard guard = ring.guard();
        for (int i = 0; i < n; i++) {
            guard.replied(done[i].tag()); // before the tag goes back; the ring's release below wakes a waiting reader
            done[i].release();
            done[i] = null;
        }
        if (bySender) {
            ring.senderReleased(n);
        } else {
            ring.released(n);
        }
    }

    /** Switches the socket's send buffer between the bulk size and its own, when the batch asks for the other. */
    private void sizeSendBuffer(boolean bulk) throws IOException {
        if (bulk == bulkSendBuffer) {
            return;
        }
        if (defaultSendBuffer < 0) {
            // what the JDK reports is what setting it back restores (checked by ReplySenderTest)
            defaultSendBuffer = channel.getOption(StandardSocketOptions.SO_SNDBUF);
        }
        channel.setOption(StandardSocketOptions.SO_SNDBUF, bulk ? BULK_SEND_BUFFER : defaultSendBuffer);
        bulkSendBuffer = bulk;
    }

    /** Sender thread: writes iov entries {@code [first, iovs)}, {@code total} bytes, waiting for the client as long as it reads. */
    private void writeFully(int first, int iovs, long total) throws IOException {
        ByteBuffer[] iov = encoder.iov();
        try {
            if (out == null) {
                // TLS writes a bounded run of records per call, so each call is progress; a plain channel whose
                // descriptor the JDK does not show writes all in one call (age, not progress: the launcher's
                // --add-exports avoids that)
                while (total > 0) {
                    sendingSince.set(System.nanoTime());
                    long w = channel.write(iov, first, iovs - first);
                    sendingSince.set(0);
                    total -= w;
                    while (first < iovs && !iov[first].hasRemaining()) {
                        iov[first++] = null;
                    }
                }
                return;
            }
            boolean waiting = false;
            while (total > 0) {
                long w = out.send(iov, first, iovs - first);
                if (w > 0) {
                    total -= w;
                    while (first < iovs && !iov[first].hasRemaining()) {
                        iov[first++] = null;
                    }
                    if (waiting) {
                        sendingSince.set(0); // the client took bytes: the stall clock stops
                        waiting = false;
                    }
                    if (total == 0 || !out.sendBufferFull()) {
                        continue;
                    }
                    // a partial send filled the buffer: the next send would only say EAGAIN, so wait at once
                }
                if (state.broken) {
                    throw new IOException(state.reason);
                }
                // The send buffer is full: wait for room, with the stall clock running. A slow reader may take
                // long to free enough room to wake us; the watchdog sees it reading (SIOCOUTQ) meanwhile.
                if (!waiting) {
                    sendingSince.set(System.nanoTime());
                    waiting = true;
                }
                out.awaitWritable(WAIT_MILLIS);
            }
        } finally {
            if (out != null) {
                sendingSince.set(0);
            }
            for (int i = first; i < iovs; i++) {
                iov[i] = null; // released requests' buffers must not stay reachable from here
            }
        }
    }
}
