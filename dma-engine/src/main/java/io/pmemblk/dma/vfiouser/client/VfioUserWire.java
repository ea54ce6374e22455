package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import io.pmemblk.dma.vfiouser.client.VfioUserConnection.DmaTarget;
import io.pmemblk.posix.Errno;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.time.Duration;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The socket of one vfio-user connection and its framing: one request out at a time, its reply matched by message
 * id and command within a bounded wait, the server's DMA_READ/DMA_WRITE answered when they come in between, and
 * the connection's loss (see {@link VfioUserConnection} for the rules). The typed requests fill {@link #out}'s
 * payload and read {@link #in}'s while they hold {@link #lock}.
 */
final class VfioUserWire {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfiouser");
    /** The most descriptors we accept in one message from the server (a region's mmap fd, a twin socket). */
    static final int MAX_FDS_IN = 8;
    /** What we take in one DMA_READ/DMA_WRITE from the server: the spec's default. */
    static final int MAX_XFER = DEFAULT_MAX_DATA_XFER;
    /** Socket receive/send timeout slice: how often a blocked reader checks its deadline and the lost flag. */
    static final int SLICE_MILLIS = 100;

    final int fd;
    final String path;
    final long timeoutNanos;
    private final DmaTarget target;
    /** Whoever holds it reads the socket and owns {@link #out} and {@link #in}. */
    final ReentrantLock lock = new ReentrantLock();
    final Arena arena = Arena.ofShared();
    /** Outgoing message: header, then our largest payload (a DMA_READ reply of {@link #MAX_XFER}). */
    final MemorySegment out;
    /** Incoming message: header, then the largest payload we accept (a DMA_WRITE of {@link #MAX_XFER}). */
    final MemorySegment in;
    private final MemorySegment inHeader;
    /** in[16, 16 + n) for the short payloads of the register path, made once. */
    private final MemorySegment[] inPayload = new MemorySegment[40];
    private final MemorySegment iov;
    private final MemorySegment msghdr;
    /** The descriptors that came with the last reply read with {@code replyFds}; -1 where none. */
    final int[] fdsIn = new int[MAX_FDS_IN + 1];
    private int nextId = 1;
    private volatile String lostReason;
    /** Whether the loss came from the peer's side (end of stream, reset, broken pipe) rather than ours (a timeout, a protocol error). */
    private volatile boolean peerClosed;
    private volatile boolean closed;
    private boolean freed;
    private final Held held = new Held();
    private long serverCommands;

    VfioUserWire(int fd, String path, Duration timeout, DmaTarget target) throws NativeException {
        this.fd = fd;
        this.path = path;
        this.timeoutNanos = timeout.toNanos();
        this.target = target;
        this.out = arena.allocate(HEADER + DMA_DATA + MAX_XFER, 8);
        this.in = arena.allocate(HEADER + DMA_DATA + MAX_XFER, 8);
        this.inHeader = in.asSlice(0, HEADER);
        for (int n = 1; n < inPayload.length; n++) {
            inPayload[n] = in.asSlice(HEADER, n);
        }
        this.iov = arena.allocate(Sockets.IOVEC);
        this.msghdr = arena.allocate(Sockets.MSGHDR);
        msghdr.set(ValueLayout.ADDRESS, Sockets.MSGHDR_IOV, iov);
        msghdr.set(ValueLayout.JAVA_LONG, Sockets.MSGHDR_IOVLEN, 1L);
        Sockets.receiveTimeout(fd, SLICE_MILLIS);
        Sockets.sendTimeout(fd, SLICE_MILLIS);
    }

    /** Why the connection is gone, or null while it works (or once merely closed). */
    String lostReason() {
        return lostReason;
    }

    /** Whether the loss came from the peer's side (end of stream, reset, broken pipe). */
    boolean lostByPeer() {
        return peerClosed;
    }

    /** Whether {@link #shutdownForClose} ran. */
    boolean closed() {
        return closed;
    }

    /** DMA_READ/DMA_WRITE commands the server sent so far. */
    long serverCommands() {
        return serverCommands;
    }

    /**
     * Takes {@link #lock} for one request and fails fast, unlocked again, once lost or closed (before a buffer is
     * touched); closing what it returns unlocks. The guard is made once, so a request allocates nothing for it.
     */
    Held request() throws VfioUserException {
        lock.lock();
        try {
            ensureOpen();
        } catch (VfioUserException e) {
            lock.unlock();
            throw e;
        }
        return held;
    }

    /** {@link #lock} held for one request (as Jetty's AutoLock): for try-with-resources, which unlocks. */
    final class Held implements AutoCloseable {
        @Override
        public void close() {
            lock.unlock();
        }
    }

    // ---- the exchange ------------------------------------------------------------------------------------------

    /**
     * Sends the command whose payload ({@code length} bytes) is in {@link #out} after the header, with {@code fds},
     * and, unless {@code posted}, reads until its reply (answering server commands meanwhile). Returns the reply's
     * payload length, the payload in {@link #in}; descriptors that came with it in {@link #fdsIn} when
     * {@code replyFds}. Caller holds {@link #lock}.
     * @throws VfioUserException the server's error reply (the connection stays), or the connection lost
     */
    int exchange(int command, int length, int[] fds, boolean posted, boolean replyFds) throws VfioUserException {
        ensureOpen();
        int id = nextId++ & 0xffff;
        int size = HEADER + length;
        out.set(JAVA_SHORT_UNALIGNED, H_MSG_ID, (short) id);
        out.set(JAVA_SHORT_UNALIGNED, H_COMMAND, (short) command);
        out.set(JAVA_INT_UNALIGNED, H_SIZE, size);
        out.set(JAVA_INT_UNALIGNED, H_FLAGS, TYPE_COMMAND | (posted ? FLAG_NO_REPLY : 0));
        out.set(JAVA_INT_UNALIGNED, H_ERROR, 0);
        long deadline = System.nanoTime() + timeoutNanos;
        send(size, fds, deadline, commandName(command));
        if (posted) {
            return 0;
        }
        for (int served = 0; ; ) {
            int payload = receive(deadline, replyFds, commandName(command));
            int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
            int type = flags & FLAG_TYPE_MASK;
            int gotCommand = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND));
            int gotId = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_MSG_ID));
            if (type == TYPE_COMMAND) {
                closeReceivedFds();
                serve(gotId, gotCommand, payload, deadline);
                served++;
                // Each pass may be quick, so no receive ever idles into the timeout: a device that sends
                // commands and never the reply would hold the lock, and every other channel, for ever.
                if (System.nanoTime() - deadline > 0) {
                    throw lose("no reply to " + commandName(command) + " within " + TimeUnit.NANOSECONDS.toMillis(timeoutNanos)
                            + " ms (the device sent " + served + " commands of its own meanwhile, the last "
                            + commandName(gotCommand) + ")");
                }
                continue;
            }
            if (type != TYPE_REPLY || gotId != id || gotCommand != command) {
                closeReceivedFds();
                throw lose("while waiting for the reply to " + commandName(command) + " (msg_id " + id + ") the device sent "
                        + (type == TYPE_REPLY ? "a reply" : "a message of type " + type) + " to " + commandName(gotCommand)
                        + " (msg_id " + gotId + ")");
            }
            if ((flags & FLAG_ERROR) != 0) {
                closeReceivedFds();
                int errno = in.get(JAVA_INT_UNALIGNED, H_ERROR);
                throw new VfioUserException("vfio-user device at " + path + " refused " + commandName(command) + ": "
                        + (errno != 0 ? Libc.strerror(errno) + " (errno " + errno + ", " + Errno.name(errno) + ")" : "no errno given"),
                        errno, false);
            }
            return payload;
        }
    }

    /** Sends out[0, size) with {@code fds}; waits for socket room until the deadline. */
    private void send(int size, int[] fds, long deadline, String what) throws VfioUserException {
        try {
            if (fds != null && fds.length > 0) {
                UnixMessages.send(fd, out.asSlice(0, size), fds); // control path: allocates its msghdr
                return;
            }
            long sent = 0;
            while (sent < size) {
                iov.set(ValueLayout.JAVA_LONG, 0, out.address() + sent);
                iov.set(ValueLayout.JAVA_LONG, 8, size - sent);
                long n = Sockets.sendWaiting(fd, msghdr);
                sent += n;
                // checked after a partial send too: a device that takes a few bytes per send slice would
                // otherwise keep us sending (and holding the lock) long past the deadline
                if (sent < size && System.nanoTime() - deadline > 0) {
                    throw lose(what + ": the device took " + (sent == 0 ? "no data" : "only " + sent + " of " + size + " bytes")
                            + " for " + TimeUnit.NANOSECONDS.toMillis(timeoutNanos) + " ms (its socket is full: the device is"
                            + (sent == 0 ? " not reading)" : " reading too slowly)"));
                }
                if (n == 0 && (lostReason != null || closed)) {
                    throw lose(what + ": connection closed while sending");
                }
            }
        } catch (NativeException e) {
            markPeerClosed(e.errno());
            throw lose(what + ": sending failed: " + e.getMessage());
        }
    }

    /**
     * Reads one whole message into {@link #in} by the deadline; returns its payload length. {@code withFds}: the
     * descriptors that came with it go to {@link #fdsIn} (beyond {@link #MAX_FDS_IN}: closed).
     */
    int receive(long deadline, boolean withFds, String what) throws VfioUserException {
        Arrays.fill(fdsIn, -1);
        readFully(0, HEADER, deadline, withFds, what);
        int size = in.get(JAVA_INT_UNALIGNED, H_SIZE);
        if (size < HEADER || size > in.byteSize()) {
            throw lose("the device sent a message of size " + Integer.toUnsignedString(size) + " (command "
                    + Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND)) + "); allowed: " + HEADER + " to "
                    + in.byteSize() + " bytes");
        }
        if (size > HEADER) {
            readFully(HEADER, size - HEADER, deadline, false, what);
        }
        return size - HEADER;
    }

    private void readFully(int from, int length, long deadline, boolean withFds, String what) throws VfioUserException {
        int got = 0;
        while (got < length) {
            MemorySegment into = got == 0 && from == 0 && length == HEADER ? inHeader
                    : got == 0 && from == HEADER && length < inPayload.length ? inPayload[length]
                    : in.asSlice(from + got, length - got); // a partial read: rare
            int n;
            try {
                if (withFds && got == 0) {
                    n = UnixMessages.receive(fd, into, fdsIn); // descriptors travel with the first byte
                } else {
                    n = Sockets.recv(fd, into, MSG_WAITALL);
                }
            } catch (NativeException e) {
                if (e.errno() == Errno.EAGAIN || e.errno() == Errno.EINTR) {
                    checkWait(deadline, what, from + got);
                    continue;
                }
                markPeerClosed(e.errno());
                throw lose(what + ": receiving failed: " + e.getMessage());
            } catch (java.io.IOException e) {
                throw lose(what + ": receiving failed: " + e.getMessage());
            }
            if (n == 0) {
                if (lostReason == null && !closed) {
                    peerClosed = true;
                }
                throw lose("the device closed the connection" + (from + got > 0 ? " in the middle of a message ("
                        + (from + got) + " bytes of it read)" : "") + " (while waiting for " + what + ")");
            }
            got += n;
            if (got < length) {
                // A partial read: the receive slice ended with some bytes in (MSG_WAITALL returns them rather than
                // EAGAIN), so a device that trickles a message would never reach the EAGAIN check above.
                checkWait(deadline, what, from + got);
            }
        }
    }

    private void checkWait(long deadline, String what, int bytesIn) throws VfioUserException {
        if (lostReason != null || closed) {
            throw lose(what + ": connection closed while waiting");
        }
        if (System.nanoTime() - deadline > 0) {
            throw lose("no " + (bytesIn > 0 ? "rest of the " : "") + "reply to " + what + " within "
                    + TimeUnit.NANOSECONDS.toMillis(timeoutNanos) + " ms" + (bytesIn > 0 ? " (" + bytesIn + " bytes came)" : ""));
        }
    }

    /** {@code <sys/socket.h>} MSG_WAITALL: recv waits for the whole buffer (or the timeout slice, or an error). */
    private static final int MSG_WAITALL = 0x100;

    /** Answers a command the server sent (DMA_READ/DMA_WRITE); others get EINVAL. Caller holds the lock. */
    void serve(int id, int command, int payload, long deadline) throws VfioUserException {
        serverCommands++;
        int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
        boolean noReply = (flags & FLAG_NO_REPLY) != 0;
        int replyLength = 0;
        int errno = 0;
        if ((command == DMA_READ || command == DMA_WRITE) && payload >= DMA_DATA) {
            long address = in.get(JAVA_LONG_UNALIGNED, HEADER + DMA_ADDRESS);
            long count = in.get(JAVA_LONG_UNALIGNED, HEADER + DMA_COUNT);
            if (count < 0 || count > MAX_XFER || (command == DMA_WRITE && payload != DMA_DATA + count)) {
                errno = Errno.EINVAL;
            } else {
                try {
                    if (target == null) {
                        throw new IllegalStateException("no DMA memory");
                    }
                    MemorySegment mem = target.translate(address, count);
                    if (command == DMA_READ) {
                        MemorySegment.copy(mem, 0, out, HEADER + DMA_DATA, count);
                        replyLength = DMA_DATA + (int) count;
                    } else {
                        MemorySegment.copy(in, HEADER + DMA_DATA, mem, 0, count);
                        replyLength = DMA_WRITE_REPLY_BYTES;
                    }
                    out.set(JAVA_LONG_UNALIGNED, HEADER + DMA_ADDRESS, address);
                    if (command == DMA_READ) {
                        out.set(JAVA_LONG_UNALIGNED, HEADER + DMA_COUNT, count);
                    } else {
                        out.set(JAVA_INT_UNALIGNED, HEADER + DMA_COUNT, (int) count);
                    }
                } catch (RuntimeException e) { // IovaFault, or memory released under us
                    errno = Errno.EFAULT;
                    LOG.log(System.Logger.Level.WARNING, "vfio-user " + path + ": the device's " + commandName(command)
                            + " of " + count + " bytes at DMA address 0x" + Long.toHexString(address)
                            + " refused (EFAULT): " + e.getMessage());
                }
            }
        } else {
            errno = Errno.EINVAL;
            LOG.log(System.Logger.Level.WARNING, "vfio-user " + path + ": the device sent " + commandName(command)
                    + " (" + payload + " bytes), which a client does not serve; answered EINVAL");
        }
        if (noReply) {
            return;
        }
        int size = HEADER + (errno != 0 ? 0 : replyLength);
        out.set(JAVA_SHORT_UNALIGNED, H_MSG_ID, (short) id);
        out.set(JAVA_SHORT_UNALIGNED, H_COMMAND, (short) command);
        out.set(JAVA_INT_UNALIGNED, H_SIZE, size);
        out.set(JAVA_INT_UNALIGNED, H_FLAGS, TYPE_REPLY | (errno != 0 ? FLAG_ERROR : 0));
        out.set(JAVA_INT_UNALIGNED, H_ERROR, errno);
        send(size, null, deadline, "the reply to the device's " + commandName(command));
    }

    // ---- loss and close ----------------------------------------------------------------------------------------

    /** A reset or broken pipe is the peer's doing (it died, or closed), when nothing was lost before. */
    private void markPeerClosed(int errno) {
        if ((errno == Errno.ECONNRESET || errno == Errno.EPIPE) && lostReason == null && !closed) {
            peerClosed = true;
        }
    }

    /** Fails fast once lost or closed, before a buffer is touched (a closed connection has freed them). */
    void ensureOpen() throws VfioUserException {
        if (lostReason != null || closed) {
            throw new VfioUserException("vfio-user device at " + path + " is gone: "
                    + (lostReason != null ? lostReason : "closed"), 0, true);
        }
    }

    /** Marks the connection lost (first reason kept), shuts the socket so every waiter wakes; returns the error. */
    VfioUserException lose(String why) {
        String reason;
        synchronized (this) {
            if (lostReason == null && !closed) {
                lostReason = why;
                try {
                    Sockets.shutdown(fd, Sockets.SHUT_RDWR);
                } catch (NativeException ignored) {
                    // the socket is broken already
                }
            }
            reason = lostReason != null ? lostReason : "closed";
        }
        return new VfioUserException("vfio-user device at " + path + " is gone: " + reason, 0, true);
    }



    void closeReceivedFds() {
        for (int i = 0; i < fdsIn.length; i++) {
            Libc.closeQuietly(fdsIn[i]); // just received: cannot be bad; -1 (none) is skipped
            fdsIn[i] = -1;
        }
    }

    /** Marks the connection closed and shuts the socket so every waiter wakes; false when it was closed before. */
    boolean shutdownForClose() {
        synchronized (this) {
            if (closed) {
                return false;
            }
            closed = true;
            try {
                Sockets.shutdown(fd, Sockets.SHUT_RDWR);
            } catch (NativeException ignored) {
                // not connected any more
            }
        }
        return true;
    }

    /** Closes the socket once no requester is inside (they fail at once now that closed is set). */
    void closeSocket() {
        lock.lock();
        try {
            Libc.close(fd);
        } catch (NativeException ignored) {
            // shut down already
        } finally {
            lock.unlock();
        }
    }

    void freeBuffers() {
        lock.lock();
        try {
            if (!freed) {
                freed = true;
                arena.close();
            }
        } finally {
            lock.unlock();
        }
    }
}
