package io.pmemblk.vhost.driver;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import io.pmemblk.posix.UnixMessages;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;

/**
 * The control connection of a vhost-user front end as QEMU 7.2 keeps one (qemu/qemu {@code hw/virtio/vhost-user.c}),
 * over a real unix socket: messages with their fds in one sendmsg, replies checked as {@code vhost_user_read_header}
 * checks them (flags exactly 0x5, the same request id), and the payloads a front end sends. A read gives up after
 * {@link #TIMEOUT_MS} (SO_RCVTIMEO): a back-end that does not answer is an error, never a hang. Nothing here is on
 * the data path.
 */
public class FrontEnd implements AutoCloseable {
    public static final int TIMEOUT_MS = 10_000;
    /** The connected socket. */
    protected final int fd;
    private final Arena arena = Arena.ofConfined();
    /** Room for a payload a little past MAX_PAYLOAD: a test front end sends ones the back-end must refuse. */
    private final MemorySegment buf = arena.allocate(HEADER_SIZE + MAX_PAYLOAD + 64, 8);

    protected FrontEnd(int fd) {
        this.fd = fd;
    }

    public static FrontEnd connect(Path socket) throws NativeException {
        return new FrontEnd(open(socket));
    }

    /** A socket connected to {@code socket}, its reads bounded by {@link #TIMEOUT_MS}. */
    protected static int open(Path socket) throws NativeException {
        int fd = Sockets.unixStreamSocket();
        try {
            Sockets.connect(fd, socket.toString());
            Sockets.receiveTimeout(fd, TIMEOUT_MS);
        } catch (NativeException | RuntimeException e) {
            Libc.close(fd);
            throw e;
        }
        return fd;
    }

    /** A message: header (version 1, {@code flags} added) and {@code payload}, with {@code fds}. */
    public void send(int request, int flags, MemorySegment payload, int... fds) throws NativeException {
        long size = payload.byteSize();
        MemorySegment m = buf.asSlice(0, HEADER_SIZE + size);
        m.set(ValueLayout.JAVA_INT, HDR_REQUEST, request);
        m.set(ValueLayout.JAVA_INT, HDR_FLAGS, VERSION | flags);
        m.set(ValueLayout.JAVA_INT, HDR_SIZE, (int) size);
        MemorySegment.copy(payload, 0, m, HEADER_SIZE, size);
        UnixMessages.send(fd, m, fds);
    }

    /** {@code size} zeroed payload bytes, owned by this connection. */
    public MemorySegment payload(long size) {
        return arena.allocate(size, 8);
    }

    public MemorySegment empty() {
        return payload(0);
    }

    public MemorySegment u64(long v) {
        MemorySegment p = payload(U64_SIZE);
        p.set(ValueLayout.JAVA_LONG, 0, v);
        return p;
    }

    /** {@code struct vhost_vring_state}: vring {@code index}, {@code num}. */
    public MemorySegment state(int index, int num) {
        MemorySegment p = payload(STATE_SIZE);
        p.set(ValueLayout.JAVA_INT, STATE_INDEX, index);
        p.set(ValueLayout.JAVA_INT, STATE_NUM, num);
        return p;
    }

    /** ADD_MEM_REG's or REM_MEM_REG's payload: one region, {@code size} bytes of guest-physical {@code gpa}. */
    public MemorySegment memRegion(long gpa, long size, long user, long mmapOffset) {
        return region(payload(MEM_REG_SIZE), MEM_REG_REGION, gpa, size, user, mmapOffset);
    }

    /** SET_MEM_TABLE's payload with one region: {@code size} bytes of guest-physical {@code gpa}. */
    public MemorySegment memTable(long gpa, long size, long user, long mmapOffset) {
        MemorySegment p = payload(MEMORY_REGIONS + REGION_SIZE);
        p.set(ValueLayout.JAVA_INT, MEMORY_NREGIONS, 1);
        return region(p, MEMORY_REGIONS, gpa, size, user, mmapOffset);
    }

    /** {@code VhostUserMemoryRegion} at byte {@code at} of {@code p}; {@code p}. */
    private static MemorySegment region(MemorySegment p, long at, long gpa, long size, long user, long mmapOffset) {
        p.set(ValueLayout.JAVA_LONG, at + REGION_GPA, gpa);
        p.set(ValueLayout.JAVA_LONG, at + REGION_SIZE_FIELD, size);
        p.set(ValueLayout.JAVA_LONG, at + REGION_UADDR, user);
        p.set(ValueLayout.JAVA_LONG, at + REGION_MMAP_OFFSET, mmapOffset);
        return p;
    }

    /** SET_VRING_ADDR's payload: vring {@code index}'s three areas at these user addresses. */
    public MemorySegment vringAddr(int index, long desc, long avail, long used) {
        MemorySegment p = payload(ADDR_SIZE);
        p.set(ValueLayout.JAVA_INT, ADDR_INDEX, index);
        p.set(ValueLayout.JAVA_LONG, ADDR_DESC, desc);
        p.set(ValueLayout.JAVA_LONG, ADDR_AVAIL, avail);
        p.set(ValueLayout.JAVA_LONG, ADDR_USED, used);
        return p;
    }

    /** A reply: its request id, flags and payload (copied out). */
    public record Reply(int request, int flags, MemorySegment payload) {
        public long u64() throws IOException {
            if (payload.byteSize() != U64_SIZE) {
                throw new IOException(name(request) + " answered " + payload.byteSize() + " bytes, 8 expected");
            }
            return payload.get(ValueLayout.JAVA_LONG_UNALIGNED, 0);
        }
    }

    /** The next message from the back-end, its fds into {@code fdsOut}; null when it closed the connection. */
    public Reply read(int[] fdsOut) throws IOException {
        MemorySegment h = payload(HEADER_SIZE);
        int n = UnixMessages.receive(fd, h, fdsOut);
        if (n == 0) {
            return null;
        }
        receiveRest(h, n);
        int size = h.get(ValueLayout.JAVA_INT, HDR_SIZE);
        int request = h.get(ValueLayout.JAVA_INT, HDR_REQUEST);
        if (size < 0 || size > MAX_PAYLOAD) {
            throw new IOException("a reply of " + name(request) + " claims " + size + " bytes: at most " + MAX_PAYLOAD);
        }
        MemorySegment p = payload(Math.max(size, 1)).asSlice(0, size);
        receiveRest(p, 0);
        return new Reply(request, h.get(ValueLayout.JAVA_INT, HDR_FLAGS), p);
    }

    private void receiveRest(MemorySegment into, long got) throws IOException {
        while (got < into.byteSize()) {
            int more = UnixMessages.receive(fd, into.asSlice(got), new int[0]);
            if (more == 0) {
                throw new IOException("the back-end closed the connection in the middle of a message");
            }
            got += more;
        }
    }

    /** The reply to {@code request}, checked as QEMU 7.2 checks it. */
    public Reply reply(int request, int[] fdsOut) throws IOException {
        Reply r = read(fdsOut);
        if (r == null) {
            throw new IOException("the back-end closed the connection instead of answering " + name(request));
        }
        if (r.request() != request || r.flags() != REPLY_FLAGS) {
            throw new IOException("a reply to " + name(request) + " came as " + name(r.request()) + ", flags 0x"
                    + Integer.toHexString(r.flags()) + " (QEMU accepts exactly 0x" + Integer.toHexString(REPLY_FLAGS)
                    + ")");
        }
        return r;
    }

    public Reply reply(int request) throws IOException {
        return reply(request, new int[0]);
    }

    public long get(int request) throws IOException {
        send(request, 0, empty());
        return reply(request).u64();
    }

    public void set(int request, long value, int... fds) throws NativeException {
        send(request, 0, u64(value), fds);
    }

    /** A message with NEED_REPLY; the REPLY_ACK value (0: done). */
    public long acked(int request, MemorySegment payload, int... fds) throws IOException {
        send(request, FLAG_NEED_REPLY, payload, fds);
        return reply(request).u64();
    }

    @Override
    public void close() throws NativeException {
        Libc.close(fd);
        arena.close();
    }
}
