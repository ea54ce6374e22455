package io.pmemblk.nbd;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;

/**
 * A plain connection's own descriptor of its socket (a dup of the JDK channel's), for what a blocking JDK channel
 * cannot do: a send that never blocks ({@link #send}, MSG_DONTWAIT), so the reader can reply inline without ever
 * waiting for a client that is itself blocked sending; a bounded wait for room ({@link #awaitWritable}) with the
 * peer's reading visible ({@link #unsent}, SIOCOUTQ), so the stall watchdog measures progress, not age; and the
 * busy-poller's FIONREAD.
 *
 * <p>A descriptor of our own because the JDK closes its one when it decides to (a thread interrupted in a read, a
 * close from another thread), and a number closed under a native call may by then name the next client's
 * socket: replies sent there would leak one client's data to another. This one is closed once ({@link #close}),
 * after the connection's threads have stopped using it; {@link #shutdown} is safe from any thread at any time.
 * It also means closing the JDK channel no longer ends the connection: whoever cuts one calls {@link #shutdown}.
 *
 * <p>{@link #send} and {@link #awaitWritable} use buffers of this object: one thread at a time (the connection's
 * send lock).
 */
final class SocketFd {
    private final int fd;
    private boolean closed; // guarded by this
    private final MemorySegment msghdr;
    private final MemorySegment iovecs;
    private final MemorySegment pollfd;
    private final MemorySegment queued; // guarded by this
    /** The last {@link #send} took less than it was given: the send buffer is full now. */
    private boolean full;

    private SocketFd(int fd) {
        this.fd = fd;
        Arena arena = Arena.ofAuto();
        msghdr = arena.allocate(Sockets.MSGHDR);
        iovecs = arena.allocate(Sockets.IOVEC, Sockets.IOV_MAX);
        msghdr.set(ValueLayout.ADDRESS, Sockets.MSGHDR_IOV, iovecs);
        pollfd = arena.allocate(Sockets.POLLFD);
        pollfd.set(ValueLayout.JAVA_INT, 0, fd);
        queued = arena.allocate(ValueLayout.JAVA_INT);
    }

    /** A descriptor of {@code channel}'s socket, or null when the JDK does not let us know it (see {@link ChannelFd}). */
    static SocketFd of(SocketChannel channel) throws IOException {
        int jdkFd = ChannelFd.of(channel);
        if (jdkFd < 0) {
            return null;
        }
        return new SocketFd(Libc.dupCloexec(jdkFd));
    }

    int fd() {
        return fd;
    }

    /**
     * Sends what {@code bufs[first, first+count)} hold (direct buffers), as much as the socket takes now without
     * waiting, and advances their positions past what went. Allocates nothing.
     * @return bytes sent; 0 when the socket's send buffer is full
     * @throws IOException when the peer is gone (EPIPE, ECONNRESET) or the socket was shut down
     */
    long send(ByteBuffer[] bufs, int first, int count) throws IOException {
        return send(bufs, first, count, false);
    }

    /**
     * As {@link #send}, but the kernel waits for room, at most {@code millis} ms (the socket's SO_SNDTIMEO, set
     * on first use): one call per wait where a poll and a non-blocking send cost two. The socket's other writer,
     * the JDK channel, writes only during the handshake, before the first call.
     * @return bytes sent; 0 when no room came within {@code millis}
     */
    long sendWaiting(ByteBuffer[] bufs, int first, int count, int millis) throws IOException {
        if (sendTimeout != millis) {
            Sockets.sendTimeout(fd, millis);
            sendTimeout = millis;
        }
        return send(bufs, first, count, true);
    }

    /** SO_SNDTIMEO as last set by {@link #sendWaiting}, 0 while unset. */
    private int sendTimeout;

    private long send(ByteBuffer[] bufs, int first, int count, boolean waiting) throws IOException {
        int n = Math.min(count, Sockets.IOV_MAX);
        long asked = 0;
        for (int i = 0; i < n; i++) {
            ByteBuffer b = bufs[first + i];
            if (!b.isDirect()) {
                // a heap segment's address() is an offset into its array: never hand that to the kernel
                throw new IllegalArgumentException("reply buffer " + (first + i) + " is a heap buffer; replies are"
                        + " built from direct buffers only (the pool's, the device's, the encoder's)");
            }
            int len = b.remaining();
            long at = i * Sockets.IOVEC.byteSize();
            // The segment starts at the buffer's position, and it does not escape (C2 can scalar-replace it).
            // Not DirectBuffer.address(): the JDK refuses that for buffers of shared arenas (the buffer pool's).
            iovecs.set(ValueLayout.JAVA_LONG, at, MemorySegment.ofBuffer(b).address());
            iovecs.set(ValueLayout.JAVA_LONG, at + 8, len);
            asked += len;
        }
        msghdr.set(ValueLayout.JAVA_LONG, Sockets.MSGHDR_IOVLEN, n);
        long sent = waiting ? Sockets.sendWaiting(fd, msghdr) : Sockets.sendNow(fd, msghdr);
        long left = sent;
        for (int i = first; left > 0; i++) {
            ByteBuffer b = bufs[i];
            int k = (int) Math.min(left, b.remaining());
            b.position(b.position() + k);
            left -= k;
        }
        full = sent < asked;
        return sent;
    }

    /** Whether the last {@link #send} filled the socket's send buffer (took less than it was given). */
    boolean sendBufferFull() {
        return full;
    }

    /**
     * Waits until the socket has room to send, it failed or was shut down, or {@code millis} passed.
     * @return false when the socket can never send again (error or hang-up)
     */
    boolean awaitWritable(int millis) throws NativeException {
        int revents = await(Sockets.POLLOUT, millis);
        return (revents & (Sockets.POLLERR | Sockets.POLLHUP)) == 0;
    }

    /**
     * Waits until one of {@code events} (POLLOUT, POLLIN) holds on the socket, it failed or hung up, or
     * {@code millis} passed.
     * @return the revents: POLLERR and POLLHUP whether asked for or not; 0 on timeout
     */
    int await(short events, int millis) throws NativeException {
        pollfd.set(ValueLayout.JAVA_SHORT, 4, events);
        return Sockets.pollOne(pollfd, millis);
    }

    /**
     * Bytes sent that the peer has not taken yet (SIOCOUTQ); -1 when the socket cannot tell or is closed. Any
     * thread (the stall watchdog): under the lock that {@link #close} takes, so never on a number reused.
     */
    synchronized int unsent() {
        if (closed) {
            return -1;
        }
        try {
            return Sockets.bytesUnsent(fd, queued);
        } catch (NativeException e) {
            return -1;
        }
    }

    /** Ends the connection both ways: every blocked read, send and wait on the socket returns. Any thread. */
    synchronized void shutdown() {
        if (!closed) {
            try {
                Sockets.shutdown(fd, Sockets.SHUT_RDWR);
            } catch (NativeException e) {
                // not connected any more: nothing to wake
            }
        }
    }

    /** Once every thread that sends, waits or polls on it is done. Idempotent. */
    synchronized void close() {
        if (!closed) {
            closed = true;
            try {
                Libc.close(fd);
            } catch (NativeException e) {
                // EBADF cannot happen (ours, closed once); EINTR/EIO on a socket: the number is released anyway
            }
        }
    }
}
