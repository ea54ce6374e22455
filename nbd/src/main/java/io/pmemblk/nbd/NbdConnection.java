package io.pmemblk.nbd;

import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import java.io.EOFException;
import java.io.IOException;
import java.nio.channels.SocketChannel;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One client's life: its threads, over one blocking channel, bound to one hardware queue. The reader thread
 * ({@code nbd-conn-N-rx}) runs the {@link Handshake}, then the {@link RequestReader}; the sender thread
 * ({@code nbd-conn-N-tx}) runs the {@link ReplySender}. Completions land in the {@link ReplyRing} between them.
 * This class starts them, classifies how they ended, and closes: the server's shutdown, handshake timer,
 * stall watchdog and last-resort forced close come in here.
 *
 * <p>Teardown: whatever ends the reader (DISC, EOF, a protocol violation, an I/O error), requests already
 * given to the driver still complete; the sender replies to them unless the socket is broken, releases them,
 * and closes the channel when the last one is back. Requests the driver never saw are released by the reader.
 */
final class NbdConnection {
    private static final System.Logger LOG = System.getLogger(NbdConnection.class.getName());

    private final NbdServer server;
    final int id;
    /** The accepted channel; after a STARTTLS, the TLS channel over it (chosen once, before transmission). */
    private volatile SocketChannel channel;
    final String peer;
    /** The peer as the per-peer handshake limit counts it (NbdServer's peerKey). */
    final Object peerKey;
    /** This connection still counts against its peer's handshakes: until its handshake ends, however. */
    private final AtomicBoolean handshaking = new AtomicBoolean(true);
    private final HardwareQueue queue;
    private final int maxRequestBytes;
    private final long exportSize;
    private final ReplyRing ring;
    private final FrontendQueue frontend;
    private final CloseState state = new CloseState();

    private final Thread reader;
    private Thread sender;
    /** Made when transmission starts (what they need is negotiated first); read by the stall watchdog. */
    private volatile RequestReader requestReader;
    private volatile ReplySender replySender;
    private volatile boolean inTransmission;
    private volatile boolean handshakeTimedOut;
    /**
     * Our descriptor of the socket (see {@link SocketFd}), made at accept, before any thread could close the
     * channel; null when the JDK does not show it.
     */
    private final SocketFd socketFd;
    /** Threads that may still use socketFd: the reader, and the sender once started. */
    private final java.util.concurrent.atomic.AtomicInteger fdUsers = new java.util.concurrent.atomic.AtomicInteger(1);
    /** This connection holds one of the server's maxConnections slots until its client can see it closed. */
    private final AtomicBoolean slotHeld = new AtomicBoolean(true);
    /** The stall check's view of a waiting sender (watchdog thread only): the wait it saw, and the socket's unsent bytes then. */
    private long watchedSince;
    private int watchedUnsent;
    /** The idle check's view (watchdog thread only): requests read when it last saw some, and since when none came. */
    private long idleRequests = -1;
    private long idleSince;
    private final AtomicBoolean handshakeOver = new AtomicBoolean();

    NbdConnection(NbdServer server, int id, SocketChannel channel, String peer, Object peerKey, HardwareQueue queue,
                  int maxRequestBytes, long exportSize) throws IOException {
        this.server = server;
        this.peerKey = peerKey;
        this.socketFd = SocketFd.of(channel);
        this.id = id;
        this.channel = channel;
        this.peer = peer;
        this.queue = queue;
        this.maxRequestBytes = maxRequestBytes;
        this.exportSize = exportSize;
        this.ring = new ReplyRing(queue.depth());
        this.frontend = new FrontendQueue(queue);
        this.reader = server.connectionThreads.newThread(this::readerMain);
        reader.setName("nbd-conn-" + id + "-rx");
    }

    /**
     * Starts the reader. Where the system makes no thread for it (OutOfMemoryError: ulimit -u, a cgroup's pids.max,
     * memory), the connection ends here as its reader would have ended it: slot, handshake count and socket given
     * back, the client sees the close. The error is not passed on: it would end the accept loop, and with it the
     * listener, for every client to come.
     */
    void start() {
        try {
            reader.start();
        } catch (OutOfMemoryError e) {
            state.broken = true;
            state.reason = "no thread could be made for it (" + e.getMessage() + ")";
            ring.readerDone();
            fdUserDone();
            finish();
        }
    }

    boolean inTransmission() {
        return inTransmission;
    }

    /** Server shutdown: stop reading; in-flight requests finish and their replies still go out. */
    void shutdownInput() {
        try {
            channel.shutdownInput();
        } catch (IOException e) {
            // already closed
        }
    }

    /** The handshake took too long: closing the channel fails the reader's blocking read. */
    void handshakeTimedOut() {
        if (handshakeOver.compareAndSet(false, true)) { // else the handshake finished first: leave it be
            handshakeTimedOut = true;
            cut();
        }
    }

    /** Last resort after the bounded wait of a shutdown. */
    void forceClose() {
        state.broken = true;
        cut();
        reader.interrupt();
        Thread s = sender;
        if (s != null) {
            s.interrupt();
        }
    }

    /** Waits for both threads until the deadline (System.nanoTime), not for each in turn. */
    void join(long deadlineNanos) throws InterruptedException {
        reader.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime())));
        Thread s = sender;
        if (s != null) {
            s.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime())));
        }
    }

    /** Called by the server's watchdog: a client stuck mid-payload or not reading replies is cut off. */
    void closeIfStalled(long now, long limitNanos) {
        RequestReader rr = requestReader;
        ReplySender rs = replySender;
        long r = rr == null ? 0 : rr.receivingSince();
        long s = rs == null ? 0 : rs.sendingSince();
        String why = null;
        if (r != 0 && now - r > limitNanos) {
            why = "client stalled in the middle of a WRITE payload for more than "
                    + TimeUnit.NANOSECONDS.toSeconds(limitNanos) + " s";
        } else if (s != 0) {
            // Progress, not age: the client reading some of what waits in the socket restarts the clock.
            SocketFd fd = rs.socketFd();
            int unsent = fd == null ? -1 : fd.unsent();
            if (unsent >= 0 && s == watchedSince && unsent < watchedUnsent) {
                rs.clientProgressed(s, now);
                s = now;
            }
            watchedSince = s;
            watchedUnsent = unsent;
            if (now - s > limitNanos) {
                why = "client stopped reading replies for more than " + TimeUnit.NANOSECONDS.toSeconds(limitNanos)
                        + " s";
            }
        }
        if (why != null && !state.broken) {
            state.reason = why;
            state.broken = true;
            cut(); // the blocked read or write fails; in-flight requests are released as on any error
        }
    }

    /**
     * Called by the server's watchdog when nbd.idle-timeout is on: a connection in transmission with nothing in
     * flight, no payload coming and no new request for longer than {@code limitNanos} is closed.
     */
    void closeIfIdle(long now, long limitNanos) {
        RequestReader rr = requestReader;
        if (rr == null || state.broken) {
            return;
        }
        long seen = rr.requestsSeen();
        if (seen != idleRequests || rr.receivingSince() != 0 || ring.inflight() != 0) {
            idleRequests = seen;
            idleSince = now;
        } else if (now - idleSince > limitNanos) {
            state.reason = "idle for more than " + TimeUnit.NANOSECONDS.toSeconds(limitNanos)
                    + " s (nbd.idle-timeout): no request and nothing in flight";
            state.broken = true;
            cut();
        }
    }

    boolean isAlive() {
        Thread s = sender;
        return reader.isAlive() || (s != null && s.isAlive());
    }

    // ---------------------------------------------------------------- threads

    private void readerMain() {
        boolean senderStarted = false;
        try {
            Handshake.Negotiated n;
            try {
                n = server.handshake(this, channel);
            } finally {
                handshakeEnded();
            }
            if (!handshakeOver.compareAndSet(false, true)) {
                throw new IOException("handshake timed out"); // the timer won the race and closed the channel
            }
            if (n == null) {
                state.reason = "client aborted the handshake";
                return;
            }
            // Busy-polling asks the kernel's socket (FIONREAD): not for TLS, whose channel holds decrypted bytes
            // the socket no longer shows.
            SocketChannel accepted = channel;
            SocketFd fd = n.channel() == accepted ? socketFd : null; // TLS sends through its records
            BusyPoll.Poller poller = fd == null ? null : server.busyPoll().forSocket(fd.fd());
            channel = n.channel();
            inTransmission = true;
            LOG.log(System.Logger.Level.DEBUG, "nbd connection {0} from {1}: transmission (structured replies {2},"
                    + " base:allocation {3}, hardware queue {4})", id, peer, n.structuredReplies(),
                    n.baseAllocation(), queue.index());
            int depth = queue.depth();
            ReplyEncoder encoder = new ReplyEncoder(depth, BufferPool.chunksFor(maxRequestBytes),
                    n.structuredReplies(), exportSize, n.baseAllocation(), n.bitmaps(), server.dirtyBitmaps());
            // a plain unix socket: TCP sizes its buffers itself, and TLS writes records of its own
            boolean plainUnix = n.channel() == accepted
                    && accepted.getLocalAddress() instanceof java.net.UnixDomainSocketAddress;
            ReplySender rs = new ReplySender(channel, fd, ring, encoder, state, depth,
                    plainUnix ? ReplySender.BULK_REPLY_BYTES : 0);
            RequestReader rr = new RequestReader(channel, frontend, ring, rs, encoder, state, n.transmissionFlags(),
                    n.structuredReplies(), n.metaContexts(), exportSize, maxRequestBytes, poller);
            replySender = rs;
            requestReader = rr;
            fdUsers.incrementAndGet(); // the sender's
            Thread tx = server.connectionThreads.newThread(this::senderMain);
            tx.setName("nbd-conn-" + id + "-tx");
            try {
                tx.start();
            } catch (OutOfMemoryError e) { // no thread for it: its share of the socket given back, the connection ends
                fdUserDone();
                state.broken = true;
                state.reason = "no thread could be made for its replies (" + e.getMessage() + ")";
                return;
            }
            sender = tx;
            senderStarted = true;
            rr.run();
        } catch (NbdProtocolException e) {
            state.broken = true;
            state.reason = "protocol violation: " + e.getMessage();
        } catch (EOFException e) {
            if (server.closing() && !state.broken) {
                state.reason = "server shutdown"; // our own shutdownInput: replies still go out
            } else {
                state.fail(e.getMessage()); // a cut (watchdog, forced close) shuts the socket down: its reason stays
            }
        } catch (IOException e) {
            // else an inline reply write failed and already said why
            state.fail(handshakeTimedOut ? "handshake timed out" : "read failed: " + e);
        } catch (InterruptedException e) {
            state.broken = true;
            state.reason = "interrupted (forced shutdown)";
        } catch (RuntimeException | Error e) {
            state.broken = true;
            state.reason = "internal error: " + e;
            LOG.log(System.Logger.Level.ERROR, "nbd connection " + id + " from " + peer + ": internal error", e);
        } finally {
            int n = frontend.releaseUndispatched();
            if (n > 0) {
                ring.released(n);
            }
            ring.readerDone();
            fdUserDone();
            if (!senderStarted) {
                finish();
            } else if (state.broken) {
                // Unblock a sender stuck writing to a peer that went away; it still releases everything.
                try {
                    channel.shutdownOutput();
                } catch (IOException | RuntimeException e) {
                    // nothing to unblock
                }
            }
        }
    }

    private void senderMain() {
        try {
            replySender.run();
        } catch (InterruptedException e) {
            state.reason = "interrupted (forced shutdown)";
        } catch (RuntimeException | Error e) {
            state.reason = "internal error: " + e;
            LOG.log(System.Logger.Level.ERROR, "nbd connection " + id + " from " + peer + ": internal error", e);
        } finally {
            // Whatever is still in flight (a forced close leaves some) is released as it completes, so the
            // queue gets every tag back and a shutdown does not wait for requests nobody will answer.
            ring.abandon();
            fdUserDone();
            finish();
        }
    }

    // ---------------------------------------------------------------- teardown

    /** The handshake ended (or never will): the peer's count of handshakes under way drops. Once. */
    private void handshakeEnded() {
        if (handshaking.compareAndSet(true, false)) {
            server.handshakeOver(this);
        }
    }

    private void finish() {
        handshakeEnded();
        freeSlot();
        closeQuietly();
        RequestReader rr = requestReader;
        LOG.log(state.broken ? System.Logger.Level.WARNING : System.Logger.Level.INFO,
                "nbd connection {0} from {1} closed after {2} requests: {3}",
                id, peer, rr == null ? 0 : rr.requests(), state.reason);
        server.connectionClosed(this);
    }

    /** A thread that may use {@link #socketFd} ended; the last one closes it (no native call can be on it then). */
    private void fdUserDone() {
        if (fdUsers.decrementAndGet() == 0) {
            SocketFd fd = socketFd;
            if (fd != null) {
                freeSlot(); // before the client can see the close: it may reconnect at once
                fd.close();
            }
        }
    }

    private void freeSlot() {
        if (slotHeld.compareAndSet(true, false)) {
            server.slotFreed();
        }
    }

    /**
     * Ends the connection from any thread: every blocked read, send and wait returns and fails. Closing the JDK
     * channel alone would not: our own descriptor ({@link SocketFd}) keeps the socket open.
     */
    private void cut() {
        SocketFd fd = socketFd;
        if (fd != null) {
            fd.shutdown();
        }
        closeQuietly();
    }

    private void closeQuietly() {
        try {
            channel.close();
        } catch (IOException e) {
            // nothing left to do
        }
    }
}
