package io.pmemblk.vhost;

import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import io.pmemblk.vhost.driver.FrontEnd;
import io.pmemblk.vhost.testing.GuestDriver;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The front end the tests drive the back-end with: QEMU 7.2's control connection ({@link FrontEnd}), and what a
 * test needs beyond it: a header with no payload behind it, QEMU's start of a ring over a test guest's ring, and
 * whether the back-end closed the connection or stays silent.
 */
final class TestFrontEnd extends FrontEnd {
    private TestFrontEnd(int fd) {
        super(fd);
    }

    public static TestFrontEnd connect(Path socket) throws NativeException {
        return new TestFrontEnd(open(socket));
    }

    /** A header claiming {@code size} bytes, and nothing after it (a size the back-end must refuse unread). */
    void sendHeader(int request, int flags, int size) throws NativeException {
        MemorySegment m = payload(HEADER_SIZE);
        m.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        m.set(ValueLayout.JAVA_INT, HDR_FLAGS, flags);
        m.set(ValueLayout.JAVA_INT, HDR_SIZE, size);
        UnixMessages.send(fd, m);
    }

    /**
     * Starts vring 0 over {@code ring} as QEMU does: NUM (the ring's size), BASE {@code base}, ADDR (the ring's
     * areas), CALL and KICK with these eventfds, then ENABLE(1) when {@code enable}.
     */
    void startVring(GuestDriver ring, int base, int callFd, int kickFd, boolean enable) throws NativeException {
        send(SET_VRING_NUM, 0, state(0, ring.size));
        send(SET_VRING_BASE, 0, state(0, base));
        send(SET_VRING_ADDR, 0, vringAddr(0, ring.descUser(), ring.availUser(), ring.usedUser()));
        set(SET_VRING_CALL, 0, callFd);
        set(SET_VRING_KICK, 0, kickFd);
        if (enable) {
            send(SET_VRING_ENABLE, 0, state(0, 1));
        }
    }

    /**
     * Whether the back-end closed the connection (end of stream) within {@link #TIMEOUT_MS}; false when it answered
     * instead, or kept the connection open and silent that long.
     */
    boolean closedByBackEnd() throws IOException {
        try {
            return read(new int[MAX_FDS]) == null;
        } catch (NativeException e) {
            if (e.errno() == io.pmemblk.posix.Errno.ECONNRESET) {
                return true;
            }
            if (e.errno() == io.pmemblk.posix.Errno.EAGAIN) {
                return false; // SO_RCVTIMEO passed: still open, saying nothing
            }
            throw e;
        }
    }

    /**
     * Fails unless the back-end stays silent (no reply, connection open) for {@code millis}: a back-end that must
     * not answer yet, e.g. GET_VRING_BASE while a request of the ring is in flight.
     */
    void assertSilentFor(int millis, String what) throws IOException {
        Sockets.receiveTimeout(fd, millis);
        try {
            Reply r = read(new int[MAX_FDS]);
            assertThat(r).as(what + ": the back-end closed the connection within " + millis + " ms").isNotNull();
            throw new AssertionError(what + ": the back-end answered within " + millis + " ms: " + name(r.request())
                    + (r.payload().byteSize() == STATE_SIZE ? " num " + r.payload().get(ValueLayout.JAVA_INT_UNALIGNED,
                    STATE_NUM) : ""));
        } catch (NativeException e) {
            if (e.errno() != io.pmemblk.posix.Errno.EAGAIN) {
                throw e;
            }
        } finally {
            Sockets.receiveTimeout(fd, TIMEOUT_MS);
        }
    }
}
