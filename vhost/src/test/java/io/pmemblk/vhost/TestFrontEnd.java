package io.pmemblk.vhost;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;
import io.pmemblk.vhost.testing.GuestDriver;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static io.pmemblk.vhost.protocol.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A vhost-user front-end as QEMU 7.2 is one, over a real unix socket: messages with their fds in one sendmsg,
 * replies checked as {@code vhost_user_read_header} checks them (flags exactly 0x5, the same request id). Reads
 * give up after {@link #TIMEOUT_MS} (SO_RCVTIMEO): a back-end that does not answer fails the test, never hangs it.
 */
final class TestFrontEnd implements AutoCloseable {
    static final int TIMEOUT_MS = 10_000;
    private final int fd;
    private final Arena arena = Arena.ofConfined();
    private final MemorySegment buf = arena.allocate(HEADER_SIZE + MAX_PAYLOAD + 64, 8);

    private TestFrontEnd(int fd) {
        this.fd = fd;
    }

    static TestFrontEnd connect(Path socket) throws NativeException {
        int fd = Sockets.unixStreamSocket();
        try {
            Sockets.connect(fd, socket.toString());
            Sockets.receiveTimeout(fd, TIMEOUT_MS);
        } catch (NativeException | RuntimeException e) {
            Libc.close(fd);
            throw e;
        }
        return new TestFrontEnd(fd);
    }

    /** A message: header (version 1, {@code flags} added) and {@code payload}, with {@code fds}. */
    void send(int request, int flags, MemorySegment payload, int... fds) throws NativeException {
        long size = payload.byteSize();
        MemorySegment m = buf.asSlice(0, HEADER_SIZE + size);
        m.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        m.set(ValueLayout.JAVA_INT, HDR_FLAGS, VERSION | flags);
        m.set(ValueLayout.JAVA_INT, HDR_SIZE, (int) size);
        MemorySegment.copy(payload, 0, m, HEADER_SIZE, size);
        UnixMessages.send(fd, m, fds);
    }

    /** A header claiming {@code size} bytes, and nothing after it (a size the back-end must refuse unread). */
    void sendHeader(int request, int flags, int size) throws NativeException {
        MemorySegment m = buf.asSlice(0, HEADER_SIZE);
        m.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        m.set(ValueLayout.JAVA_INT, HDR_FLAGS, flags);
        m.set(ValueLayout.JAVA_INT, HDR_SIZE, size);
        UnixMessages.send(fd, m);
    }

    MemorySegment payload(long size) {
        return arena.allocate(size, 8);
    }

    MemorySegment u64(long v) {
        MemorySegment p = payload(8);
        p.set(ValueLayout.JAVA_LONG, 0, v);
        return p;
    }

    MemorySegment state(int index, int num) {
        MemorySegment p = payload(STATE_SIZE);
        p.set(ValueLayout.JAVA_INT, STATE_INDEX, index);
        p.set(ValueLayout.JAVA_INT, STATE_NUM, num);
        return p;
    }

    MemorySegment empty() {
        return payload(0);
    }

    /** ADD_MEM_REG's or REM_MEM_REG's payload: one region, {@code size} bytes of guest-physical {@code gpa}. */
    MemorySegment memRegion(long gpa, long size, long user, long mmapOffset) {
        MemorySegment p = payload(MEM_REG_SIZE);
        p.set(ValueLayout.JAVA_LONG, MEM_REG_REGION + REGION_GPA, gpa);
        p.set(ValueLayout.JAVA_LONG, MEM_REG_REGION + REGION_SIZE_FIELD, size);
        p.set(ValueLayout.JAVA_LONG, MEM_REG_REGION + REGION_UADDR, user);
        p.set(ValueLayout.JAVA_LONG, MEM_REG_REGION + REGION_MMAP_OFFSET, mmapOffset);
        return p;
    }

    /** SET_VRING_ADDR's payload: vring {@code index}'s three areas at these user addresses. */
    MemorySegment vringAddr(int index, long desc, long avail, long used) {
        MemorySegment p = payload(ADDR_SIZE);
        p.set(ValueLayout.JAVA_INT, ADDR_INDEX, index);
        p.set(ValueLayout.JAVA_LONG, ADDR_DESC, desc);
        p.set(ValueLayout.JAVA_LONG, ADDR_AVAIL, avail);
        p.set(ValueLayout.JAVA_LONG, ADDR_USED, used);
        return p;
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

    /** A reply: its request id, flags and payload (copied out); null when the back-end closed the connection. */
    record Reply(int request, int flags, MemorySegment payload) {
        long u64() {
            assertThat(payload.byteSize()).as("u64 reply size").isEqualTo(8);
            return payload.get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
        }
    }

    Reply read(int[] fdsOut) throws IOException {
        MemorySegment h = arena.allocate(HEADER_SIZE, 8);
        int n = UnixMessages.receive(fd, h, fdsOut);
        if (n == 0) {
            return null;
        }
        while (n < HEADER_SIZE) {
            int more = UnixMessages.receive(fd, h.asSlice(n), new int[0]);
            assertThat(more).as("rest of a reply header").isPositive();
            n += more;
        }
        int size = h.get(ValueLayout.JAVA_INT, HDR_SIZE);
        assertThat(size).as("reply size").isBetween(0, MAX_PAYLOAD);
        MemorySegment p = arena.allocate(Math.max(size, 1), 8).asSlice(0, size);
        int got = 0;
        while (got < size) {
            int more = UnixMessages.receive(fd, p.asSlice(got), new int[0]);
            assertThat(more).as("rest of a reply payload").isPositive();
            got += more;
        }
        return new Reply(h.get(ValueLayout.JAVA_INT, HDR_REQUEST), h.get(ValueLayout.JAVA_INT, HDR_FLAGS), p);
    }

    /** The reply to {@code request}, checked as QEMU 7.2 checks it. */
    Reply reply(int request, int[] fdsOut) throws IOException {
        Reply r = read(fdsOut);
        assertThat(r).as("a reply to " + name(request) + " (the back-end closed instead)").isNotNull();
        assertThat(r.request()).as("reply request id").isEqualTo(request);
        assertThat(r.flags()).as("reply flags (QEMU accepts exactly 0x5)").isEqualTo(REPLY_FLAGS);
        return r;
    }

    Reply reply(int request) throws IOException {
        return reply(request, new int[0]);
    }

    long get(int request) throws IOException {
        send(request, 0, empty());
        return reply(request).u64();
    }

    void set(int request, long value, int... fds) throws NativeException {
        send(request, 0, u64(value), fds);
    }

    /** A message with NEED_REPLY; the REPLY_ACK value (0: done). */
    long acked(int request, MemorySegment payload, int... fds) throws IOException {
        send(request, FLAG_NEED_REPLY, payload, fds);
        return reply(request).u64();
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

    @Override
    public void close() throws NativeException {
        Libc.close(fd);
        arena.close();
    }
}
