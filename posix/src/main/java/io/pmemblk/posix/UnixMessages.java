package io.pmemblk.posix;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.util.Arrays;

import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * Bytes and file descriptors over a connected unix stream socket: sendmsg/recvmsg with one SCM_RIGHTS control
 * message, as vhost-user passes memory, eventfds and the inflight region (QEMU sends a message's header and payload
 * in one sendmsg with its fds attached, so they arrive with the recvmsg that reads the header's first byte).
 * For the control path: each call allocates its msghdr, iovec and control buffer in an arena of its own.
 *
 * <p>Layouts ({@code include/linux/socket.h}, x86-64 and arm64 LP64; printed against glibc 2.36): msghdr is
 * {@link Sockets#MSGHDR}; {@code struct cmsghdr} is {@code size_t cmsg_len}@0, {@code int cmsg_level}@8,
 * {@code int cmsg_type}@12, data@16; {@code CMSG_ALIGN(n) = (n + 7) & ~7}, {@code CMSG_LEN(n) = 16 + n},
 * {@code CMSG_SPACE(n) = 16 + CMSG_ALIGN(n)}, and the next header follows at {@code CMSG_ALIGN(cmsg_len)}.
 */
public final class UnixMessages {
    private UnixMessages() {}

    /** {@code include/linux/socket.h}. */
    public static final int SCM_RIGHTS = 1, MSG_CTRUNC = 0x8, MSG_CMSG_CLOEXEC = 0x40000000;
    /** {@code include/net/scm.h} SCM_MAX_FD: the most descriptors one message carries on Linux. */
    public static final int SCM_MAX_FD = 253;
    private static final long CMSG_HDR = 16, CMSG_LEVEL = 8, CMSG_TYPE = 12;

    private static final MethodHandle RECVMSG = libc("recvmsg",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);

    private static long cmsgAlign(long n) {
        return (n + 7) & ~7L;
    }

    private static long cmsgSpace(long n) {
        return CMSG_HDR + cmsgAlign(n);
    }

    /**
     * One recvmsg(2) into {@code buf} (EINTR retried), with MSG_CMSG_CLOEXEC. The descriptors that came with it
     * are put into {@code fdsOut} in order, the unused entries set to -1; descriptors beyond its length are
     * closed (pass an array one longer than the most a message may carry to tell "too many" from "enough").
     * @return bytes received, fewer than {@code buf} holds when the peer sent fewer; 0 at end of stream
     * @throws IOException when recvmsg fails, or the kernel cut the control data short (MSG_CTRUNC: descriptors
     *         were dropped; every one that did arrive is closed)
     */
    public static int receive(int fd, MemorySegment buf, int[] fdsOut) throws IOException {
        // room for SCM_MAX_FD: whatever the peer attaches arrives, and what the caller did not ask for is closed
        return receive(fd, buf, fdsOut, SCM_MAX_FD);
    }

    /** {@link #receive} with control room for {@code room} descriptors: more than that is MSG_CTRUNC. */
    static int receive(int fd, MemorySegment buf, int[] fdsOut, int room) throws IOException {
        long controlBytes = cmsgSpace(room * 4L);
        Arrays.fill(fdsOut, -1);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment iov = a.allocate(Sockets.IOVEC);
            iov.set(ADDRESS, 0, buf);
            iov.set(JAVA_LONG, 8, buf.byteSize());
            MemorySegment control = a.allocate(controlBytes, 8);
            MemorySegment msg = a.allocate(Sockets.MSGHDR);
            msg.set(ADDRESS, Sockets.MSGHDR_IOV, iov);
            msg.set(JAVA_LONG, Sockets.MSGHDR_IOVLEN, 1L);
            msg.set(ADDRESS, Sockets.MSGHDR_CONTROL, control);
            msg.set(JAVA_LONG, Sockets.MSGHDR_CONTROLLEN, controlBytes);
            long n;
            while (true) {
                try {
                    n = Libc.call("recvmsg", "fd " + fd + ", " + buf.byteSize() + " bytes",
                            state -> (long) RECVMSG.invokeExact(state, fd, msg, MSG_CMSG_CLOEXEC));
                    break;
                } catch (NativeException e) {
                    if (e.errno() != EINTR) {
                        throw e;
                    }
                }
            }
            int[] extra = collect(control, msg.get(JAVA_LONG, Sockets.MSGHDR_CONTROLLEN), fdsOut);
            boolean truncated = (msg.get(JAVA_INT, Sockets.MSGHDR_FLAGS) & MSG_CTRUNC) != 0;
            closeAll(extra);
            if (truncated) {
                int got = 0;
                for (int f : fdsOut) {
                    got += f >= 0 ? 1 : 0;
                }
                closeAll(fdsOut);
                Arrays.fill(fdsOut, -1);
                throw new IOException("recvmsg(fd " + fd + "): the peer's control data was cut short (MSG_CTRUNC),"
                        + " so some of its descriptors were dropped; the " + (got + extra.length) + " that arrived"
                        + " are closed. Allowed: one SCM_RIGHTS message of at most " + SCM_MAX_FD + " descriptors");
            }
            return (int) n;
        }
    }

    /** The descriptors of every SCM_RIGHTS header in {@code control}: into {@code out}, the rest returned. */
    private static int[] collect(MemorySegment control, long length, int[] out) {
        int got = 0;
        int[] extra = new int[0];
        long off = 0;
        while (off + CMSG_HDR <= length) {
            long len = control.get(JAVA_LONG, off);
            if (len < CMSG_HDR || off + len > length) {
                break; // not a header the kernel wrote
            }
            if (control.get(JAVA_INT, off + CMSG_LEVEL) == Sockets.SOL_SOCKET
                    && control.get(JAVA_INT, off + CMSG_TYPE) == SCM_RIGHTS) {
                for (long p = off + CMSG_HDR; p + 4 <= off + len; p += 4) {
                    int fd = control.get(JAVA_INT, p);
                    if (got < out.length) {
                        out[got++] = fd;
                    } else {
                        extra = Arrays.copyOf(extra, extra.length + 1);
                        extra[extra.length - 1] = fd;
                    }
                }
            }
            off += cmsgAlign(len);
        }
        return extra;
    }

    private static void closeAll(int[] fds) {
        for (int fd : fds) {
            if (fd >= 0) {
                try {
                    Libc.close(fd);
                } catch (NativeException ignored) {
                    // a descriptor the kernel just gave us: EBADF cannot happen, EINTR leaves it closed
                }
            }
        }
    }

    /**
     * Sends all of {@code buf} (sendmsg(2), MSG_NOSIGNAL, waiting for room), {@code fds} attached to its first
     * byte as one SCM_RIGHTS message; the descriptors stay the caller's (the peer gets copies).
     * @throws NativeException when the peer is gone (EPIPE, ECONNRESET) or sendmsg fails otherwise
     */
    public static void send(int fd, MemorySegment buf, int... fds) throws NativeException {
        if (fds.length > SCM_MAX_FD) {
            throw new IllegalArgumentException(fds.length + " descriptors in one message are not allowed; allowed: at most "
                    + SCM_MAX_FD + " (SCM_MAX_FD)");
        }
        if (fds.length > 0 && buf.byteSize() == 0) {
            throw new IllegalArgumentException("descriptors without a byte are not allowed: on a stream socket they"
                    + " travel with the first byte of data");
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment iov = a.allocate(Sockets.IOVEC);
            MemorySegment msg = a.allocate(Sockets.MSGHDR);
            msg.set(ADDRESS, Sockets.MSGHDR_IOV, iov);
            msg.set(JAVA_LONG, Sockets.MSGHDR_IOVLEN, 1L);
            if (fds.length > 0) {
                long space = cmsgSpace(fds.length * 4L);
                MemorySegment control = a.allocate(space, 8);
                control.set(JAVA_LONG, 0, CMSG_HDR + fds.length * 4L); // CMSG_LEN
                control.set(JAVA_INT, CMSG_LEVEL, Sockets.SOL_SOCKET);
                control.set(JAVA_INT, CMSG_TYPE, SCM_RIGHTS);
                for (int i = 0; i < fds.length; i++) {
                    control.set(JAVA_INT, CMSG_HDR + 4L * i, fds[i]);
                }
                msg.set(ADDRESS, Sockets.MSGHDR_CONTROL, control);
                msg.set(JAVA_LONG, Sockets.MSGHDR_CONTROLLEN, space);
            }
            long sent = 0;
            while (sent < buf.byteSize()) {
                MemorySegment rest = buf.asSlice(sent);
                iov.set(ADDRESS, 0, rest);
                iov.set(JAVA_LONG, 8, rest.byteSize());
                long n;
                try {
                    n = Libc.call("sendmsg", "fd " + fd + ", " + rest.byteSize() + " bytes, " + fds.length + " fds",
                            state -> (long) Sockets.SENDMSG.invokeExact(state, fd, msg, Sockets.MSG_NOSIGNAL));
                } catch (NativeException e) {
                    if (e.errno() == EINTR) {
                        continue;
                    }
                    throw e;
                }
                sent += n;
                // the descriptors went with the first bytes: never again
                msg.set(ADDRESS, Sockets.MSGHDR_CONTROL, MemorySegment.NULL);
                msg.set(JAVA_LONG, Sockets.MSGHDR_CONTROLLEN, 0L);
            }
        }
    }
}
