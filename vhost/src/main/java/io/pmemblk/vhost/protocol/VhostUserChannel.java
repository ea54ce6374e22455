package io.pmemblk.vhost.protocol;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import io.pmemblk.vhost.spec.VhostUserSpec;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

import static io.pmemblk.vhost.spec.VhostUserSpec.HEADER_SIZE;
import static io.pmemblk.vhost.spec.VhostUserSpec.HDR_FLAGS;
import static io.pmemblk.vhost.spec.VhostUserSpec.HDR_REQUEST;
import static io.pmemblk.vhost.spec.VhostUserSpec.HDR_SIZE;
import static io.pmemblk.vhost.spec.VhostUserSpec.MAX_FDS;
import static io.pmemblk.vhost.spec.VhostUserSpec.MAX_PAYLOAD;

/**
 * The back-end's end of one vhost-user connection: reads the front-end's messages (12-byte header, payload,
 * descriptors) and writes replies. One message at a time, on the session's thread: {@link #read} fills this object,
 * the session handles the message, takes the descriptors it keeps ({@link #takeFd}) and calls {@link #read} again,
 * which closes whatever it left.
 *
 * <p>What {@link #read} refuses, closing the connection ({@link VhostUserProtocolException}): a header cut short,
 * a version other than 1, a payload over {@value VhostUserSpec#MAX_PAYLOAD} bytes (libvhost-user's bound), a
 * payload of another size than its request's ({@link VhostUserSpec#expectedSize}), more descriptors than its
 * request carries ({@link VhostUserSpec#maxFds}), descriptors anywhere but with the header. The descriptors of a
 * refused message are closed.
 */
public final class VhostUserChannel implements AutoCloseable {
    private final int fd;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment in = arena.allocate(HEADER_SIZE + MAX_PAYLOAD, 8);
    private final MemorySegment out = arena.allocate(HEADER_SIZE + MAX_PAYLOAD, 8);
    private final MemorySegment poll = arena.allocate(Sockets.POLLFD);
    /** One more than any message may carry, so "too many" is seen rather than dropped unnoticed. */
    private final int[] fds = new int[MAX_FDS + 1];
    private final int[] stray = new int[1];
    private int request, flags, size, fdCount;
    private boolean closed;

    /** Takes over {@code fd}, a connected stream socket: {@link #close} closes it. */
    public VhostUserChannel(int fd) {
        this.fd = fd;
        java.util.Arrays.fill(fds, -1);
    }

    public int fd() {
        return fd;
    }

    /**
     * The next message, waiting for it.
     * @return false at the end of the stream between messages (the front-end closed)
     * @throws VhostUserProtocolException for a malformed message (see the class comment); the connection must close
     * @throws IOException when the socket fails
     */
    public boolean read() throws IOException {
        closeFds();
        int n = UnixMessages.receive(fd, in.asSlice(0, HEADER_SIZE), fds);
        fdCount = count(fds);
        if (n == 0) {
            if (fdCount > 0) {
                closeFds();
            }
            return false;
        }
        readFully(n, HEADER_SIZE, "header");
        request = in.get(ValueLayout.JAVA_INT, HDR_REQUEST);
        flags = in.get(ValueLayout.JAVA_INT, HDR_FLAGS);
        size = in.get(ValueLayout.JAVA_INT, HDR_SIZE);
        String what = VhostUserSpec.name(request);
        if ((flags & VhostUserSpec.VERSION_MASK) != VhostUserSpec.VERSION) {
            throw refuse(what + ": flags 0x" + Integer.toHexString(flags) + " carry version "
                    + (flags & VhostUserSpec.VERSION_MASK) + "; allowed: version 1");
        }
        if (size < 0 || size > MAX_PAYLOAD) {
            throw refuse(what + ": payload of " + Integer.toUnsignedString(size) + " bytes; allowed: at most "
                    + MAX_PAYLOAD);
        }
        int expected = VhostUserSpec.expectedSize(request);
        if (expected >= 0 && size != expected) {
            throw refuse(what + ": payload of " + size + " bytes; allowed: exactly " + expected);
        }
        int maxFds = VhostUserSpec.maxFds(request);
        if (fdCount > maxFds) {
            throw refuse(what + ": " + (fdCount > MAX_FDS ? "more than " + MAX_FDS : String.valueOf(fdCount))
                    + " file descriptors; allowed: at most " + maxFds);
        }
        readFully(HEADER_SIZE, HEADER_SIZE + size, "payload");
        return true;
    }

    /** Reads {@code in[from, to)}: the rest of a header or payload, which carries no descriptors. */
    private void readFully(int from, int to, String part) throws IOException {
        while (from < to) {
            int n = UnixMessages.receive(fd, in.asSlice(from, to - from), stray);
            if (stray[0] >= 0) {
                Libc.close(stray[0]);
                throw refuse(VhostUserSpec.name(request) + ": a file descriptor came after the header's first bytes;"
                        + " allowed: descriptors only with the message's first byte");
            }
            if (n == 0) {
                throw refuse("the front-end closed the connection " + (from < HEADER_SIZE ? "inside a header" : "inside the "
                        + part + " of " + VhostUserSpec.name(request)) + " (" + from + " of " + to + " bytes)");
            }
            from += n;
        }
    }

    private VhostUserProtocolException refuse(String message) {
        closeFds();
        return new VhostUserProtocolException(message);
    }

    private static int count(int[] fds) {
        int c = 0;
        for (int f : fds) {
            c += f >= 0 ? 1 : 0;
        }
        return c;
    }

    public int request() {
        return request;
    }

    public int flags() {
        return flags;
    }

    /** The front-end asks for an answer to a message that has none of its own (REPLY_ACK). */
    public boolean needsReply() {
        return (flags & VhostUserSpec.FLAG_NEED_REPLY) != 0;
    }

    public int size() {
        return size;
    }

    /** The payload of the message last read (its {@link #size} bytes); valid until the next {@link #read}. */
    public MemorySegment payload() {
        return in.asSlice(HEADER_SIZE, size);
    }

    public int fdCount() {
        return fdCount;
    }

    /**
     * The {@code i}th descriptor of the message, to look at (fstat, seals) before deciding to take it: still the
     * channel's, closed by the next {@link #read} unless {@link #takeFd taken}.
     */
    public int peekFd(int i) {
        if (i < 0 || i >= fdCount || fds[i] < 0) {
            throw new IllegalStateException("descriptor " + i + " of " + VhostUserSpec.name(request) + " is not there"
                    + " (the message carries " + fdCount + ")");
        }
        return fds[i];
    }

    /** The {@code i}th descriptor of the message, now the caller's: it is not closed by the next {@link #read}. */
    public int takeFd(int i) {
        if (i < 0 || i >= fdCount || fds[i] < 0) {
            throw new IllegalStateException("descriptor " + i + " of " + VhostUserSpec.name(request) + " is not there"
                    + " (the message carries " + fdCount + ")");
        }
        int f = fds[i];
        fds[i] = -1;
        return f;
    }

    /** Closes the descriptors of the last message that nobody took. */
    public void closeFds() {
        for (int i = 0; i < fds.length; i++) {
            if (fds[i] >= 0) {
                try {
                    Libc.close(fds[i]);
                } catch (NativeException ignored) {
                    // received from the kernel a moment ago: closing cannot fail in a way that leaves it open
                }
                fds[i] = -1;
            }
        }
    }

    /** The payload area of the next reply, to fill before {@link #reply}. */
    public MemorySegment replyPayload() {
        return out.asSlice(HEADER_SIZE, MAX_PAYLOAD);
    }

    /**
     * Sends a reply to {@code request} with the first {@code payloadSize} bytes of {@link #replyPayload()} and
     * {@code replyFds} attached; flags exactly 0x5 (version 1 | REPLY), as QEMU 7.2 demands.
     */
    public void reply(int request, int payloadSize, int... replyFds) throws NativeException {
        out.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        out.set(ValueLayout.JAVA_INT, HDR_FLAGS, VhostUserSpec.REPLY_FLAGS);
        out.set(ValueLayout.JAVA_INT, HDR_SIZE, payloadSize);
        UnixMessages.send(fd, out.asSlice(0, HEADER_SIZE + payloadSize), replyFds);
    }

    /** A u64 reply (GET_FEATURES, GET_QUEUE_NUM, a REPLY_ACK: 0 = success). */
    public void replyU64(int request, long value) throws NativeException {
        out.set(ValueLayout.JAVA_LONG_UNALIGNED, HEADER_SIZE, value);
        reply(request, VhostUserSpec.U64_SIZE);
    }

    /**
     * Whether the front-end is gone or {@link #shutdown} was called, without reading: a unix stream socket polls
     * POLLHUP once both directions are shut, by the peer's close or by our shutdown(2). For a session that waits
     * before it answers (GET_VRING_BASE while requests are in flight): nobody is left to answer. Reading thread only.
     */
    public boolean hungUp() {
        poll.set(ValueLayout.JAVA_INT, 0, fd);
        poll.set(ValueLayout.JAVA_SHORT, 4, (short) 0); // POLLHUP and POLLERR are reported unasked
        poll.set(ValueLayout.JAVA_SHORT, 6, (short) 0);
        try {
            return (Sockets.pollOne(poll, 0) & (Sockets.POLLHUP | Sockets.POLLERR | Sockets.POLLNVAL)) != 0;
        } catch (NativeException e) {
            return true; // the socket itself is broken
        }
    }

    /** Wakes a thread blocked in {@link #read} (it sees the end of the stream); any thread, any time. */
    public void shutdown() {
        try {
            Sockets.shutdown(fd, Sockets.SHUT_RDWR);
        } catch (NativeException ignored) {
            // not connected any more: nothing to wake
        }
    }

    /** Closes the socket and any descriptors not taken. Idempotent; after the reading thread has stopped. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        closeFds();
        try {
            Libc.close(fd);
        } catch (NativeException ignored) {
            // the number is released either way
        }
        arena.close();
    }
}
