package io.pmemblk.nbd;

import io.pmemblk.block.Request;
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
 * <p>A write that fails marks the connection broken and shuts its input, so the reader stops; from then on
 * requests are released without replies, so the queue still gets every tag back.
 */
final class ReplySender {
    private final SocketChannel channel;
    private final ReplyRing ring;
    private final ReplyEncoder encoder;
    private final CloseState state;
    /** Serialises reply writing between the sender thread and the reader's inline replies: guards the encoder. */
    private final ReentrantLock sendLock = new ReentrantLock();
    /** Drain arrays: the sender thread's, and the reader's for inline replies. */
    private final Request[] done;
    private final Request[] inlineDone;
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
    private boolean bulkSendBuffer;
    /** When the current write began waiting for the socket; 0 = not writing. Read by the stall watchdog. */
    private volatile long sendingSince;

    ReplySender(SocketChannel channel, ReplyRing ring, ReplyEncoder encoder, CloseState state, int depth) {
        this(channel, ring, encoder, state, depth, 0);
    }

    /**
     * @param bulkReplyBytes a batch with a READ reply at least this long is written with a {@link #BULK_SEND_BUFFER}
     *                       socket send buffer, other batches with the socket's own; 0: the buffer is left alone
     *                       (TCP, whose kernel sizes it itself, and TLS)
     */
    ReplySender(SocketChannel channel, ReplyRing ring, ReplyEncoder encoder, CloseState state, int depth,
                int bulkReplyBytes) {
        this.bulkReplyBytes = bulkReplyBytes;
        this.channel = channel;
        this.ring = ring;
        this.encoder = encoder;
        this.state = state;
        this.done = new Request[depth];
        this.inlineDone = new Request[depth];
    }

    long sendingSince() {
        return sendingSince;
    }

    /**
     * The sender thread's loop: until the reader has stopped and every request in flight is back, waits for
     * completions, replies to them and releases them.
     */
    void run() throws InterruptedException {
        int n;
        while ((n = ring.drain(done)) >= 0) {
            sendLock.lock();
            try {
                sendAndRelease(done, n);
            } finally {
                sendLock.unlock();
            }
        }
    }

    /** Reader side, right after a dispatch: replies to what completed already unless the sender is writing. */
    void replyInlineIfIdle() {
        if (sendLock.tryLock()) {
            try {
                int n = ring.drainNow(inlineDone);
                if (n > 0) {
                    sendAndRelease(inlineDone, n);
                }
            } finally {
                sendLock.unlock();
            }
        }
    }

    /** Writes the replies of {@code done[0..n)} (unless the connection is broken) and releases them. Holds sendLock. */
    private void sendAndRelease(Request[] done, int n) {
        if (!state.broken) {
            try {
                int iovs = encoder.encode(done, n);
                if (bulkReplyBytes > 0) {
                    sizeSendBuffer(encoder.largestData() >= bulkReplyBytes);
                }
                write(iovs, encoder.encodedBytes());
            } catch (IOException e) {
                state.fail("write failed: " + e); // else a forced close or the stall watchdog already said why
                try {
                    channel.shutdownInput(); // the reader stops; in-flight requests still drain through here
                } catch (IOException closed) {
                    // already closed
                }
            }
        }
        for (int i = 0; i < n; i++) {
            done[i].release();
            done[i] = null;
        }
        ring.released(n);
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

    /** The socket's send buffer is the bulk one now (tests). */
    boolean bulkSendBuffer() {
        return bulkSendBuffer;
    }

    private void write(int iovs, long total) throws IOException {
        ByteBuffer[] iov = encoder.iov();
        int first = 0;
        try {
            while (total > 0) {
                sendingSince = System.nanoTime(); // progress restarts the stall clock
                long w = channel.write(iov, first, iovs - first);
                sendingSince = 0;
                total -= w;
                while (first < iovs && !iov[first].hasRemaining()) {
                    iov[first++] = null;
                }
            }
        } finally {
            for (int i = first; i < iovs; i++) {
                iov[i] = null; // released requests' buffers must not stay reachable from here
            }
        }
    }
}
