package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.nio.charset.StandardCharsets;

import static io.pmemblk.posix.Errno.EAGAIN;
import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Libc.call;
import static io.pmemblk.posix.Libc.ioctl;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The socket calls, each bound once through {@link Native}, and the layouts they take (struct sockaddr_un, msghdr,
 * iovec, pollfd): unix datagram sockets for systemd's notify protocol, unix stream sockets as plain descriptors
 * for a protocol that passes descriptors ({@link UnixMessages}), and the non-blocking send, bounded wait and
 * shutdown on the stream sockets the JDK opened (an NBD connection).
 */
public final class Sockets {
    private Sockets() {}

    // <sys/socket.h>, <bits/socket_type.h> on x86-64 Linux: the unix datagram socket systemd's notify protocol
    // needs, which java.nio's channels do not offer (they have unix stream sockets only).
    public static final int AF_UNIX = 1, SOCK_STREAM = 1, SOCK_DGRAM = 2, SOCK_CLOEXEC = 02000000;
    public static final int SOL_SOCKET = 1, SO_RCVTIMEO = 20, SO_SNDTIMEO = 21;
    public static final int MSG_DONTWAIT = 0x40, MSG_NOSIGNAL = 0x4000;
    /** {@code <sys/un.h>} struct sockaddr_un: sa_family_t, then 108 bytes of path. */
    public static final StructLayout SOCKADDR_UN = MemoryLayout.structLayout(
            ValueLayout.JAVA_SHORT.withName("sun_family"),
            MemoryLayout.sequenceLayout(108, ValueLayout.JAVA_BYTE).withName("sun_path"));
    private static final long SUN_PATH = SOCKADDR_UN.byteOffset(MemoryLayout.PathElement.groupElement("sun_path"));
    private static final MethodHandle SOCKET = libc("socket",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle BIND = libc("bind",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle SENDTO = libc("sendto",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle RECV = libc("recv",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    private static final MethodHandle SETSOCKOPT = libc("setsockopt",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);

    // Stream sockets the JDK opened (an NBD connection): a send that never blocks, a bounded wait for room, and a
    // descriptor of our own that the JDK's close cannot hand to another socket while we still use it.
    static final MethodHandle SENDMSG = libc("sendmsg",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle POLL = libc("poll",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    private static final MethodHandle SHUTDOWN = libc("shutdown",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);
    // Unix stream sockets as plain descriptors, for a protocol that passes descriptors (UnixMessages): the JDK's
    // channels cannot send or receive SCM_RIGHTS and do not show their descriptor. Blocking and close-on-exec; a
    // thread blocked in accept or a receive is woken by shutdown from another thread.
    private static final MethodHandle LISTEN = libc("listen", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);
    /** int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags): the peer's address not wanted. */
    private static final MethodHandle ACCEPT4 = libc("accept4",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle CONNECT = libc("connect",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    /** int socketpair(int domain, int type, int protocol, int sv[2]) */
    private static final MethodHandle SOCKETPAIR = libc("socketpair",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS), ERRNO);

    /** int getsockopt(int fd, int level, int optname, void *optval, socklen_t *optlen) */
    private static final MethodHandle GETSOCKOPT = libc("getsockopt",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS, ADDRESS), ERRNO);
    /** {@code <asm-generic/socket.h>} SO_PEERCRED; {@code struct ucred} is {pid_t pid, uid_t uid, gid_t gid}, 12 bytes. */
    private static final int SO_PEERCRED = 17;
    /** {@code <bits/socket.h>} struct msghdr on x86-64 / arm64 (LP64). */
    public static final StructLayout MSGHDR = MemoryLayout.structLayout(
            ADDRESS.withName("msg_name"), JAVA_INT.withName("msg_namelen"), MemoryLayout.paddingLayout(4),
            ADDRESS.withName("msg_iov"), JAVA_LONG.withName("msg_iovlen"),
            ADDRESS.withName("msg_control"), JAVA_LONG.withName("msg_controllen"),
            JAVA_INT.withName("msg_flags"), MemoryLayout.paddingLayout(4));
    public static final long MSGHDR_IOV = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_iov"));
    public static final long MSGHDR_IOVLEN = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_iovlen"));
    public static final long MSGHDR_CONTROL = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_control"));
    public static final long MSGHDR_CONTROLLEN = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_controllen"));
    public static final long MSGHDR_FLAGS = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_flags"));
    /** {@code <bits/types/struct_iovec.h>} struct iovec: base, length. */
    public static final StructLayout IOVEC = MemoryLayout.structLayout(ADDRESS.withName("iov_base"),
            JAVA_LONG.withName("iov_len"));
    /** {@code <bits/xopen_lim.h>} IOV_MAX: the most iovecs one sendmsg takes. */
    public static final int IOV_MAX = 1024;
    /** {@code <sys/poll.h>} struct pollfd: fd, events, revents. */
    public static final StructLayout POLLFD = MemoryLayout.structLayout(JAVA_INT.withName("fd"),
            ValueLayout.JAVA_SHORT.withName("events"), ValueLayout.JAVA_SHORT.withName("revents"));
    private static final long POLLFD_REVENTS = POLLFD.byteOffset(MemoryLayout.PathElement.groupElement("revents"));
    public static final short POLLIN = 0x1, POLLOUT = 0x4, POLLERR = 0x8, POLLHUP = 0x10, POLLNVAL = 0x20;
    public static final int SHUT_RDWR = 2;

    /**
     * A {@code struct sockaddr_un} for {@code address} in {@code arena}, sized to exactly the bytes the kernel
     * should read (its {@code byteSize()} is the socklen_t to pass). A leading '@' names a socket in Linux's
     * abstract namespace, as systemd's {@code $NOTIFY_SOCKET} does: the '@' becomes a NUL byte and the name is
     * not NUL-terminated (every byte counts); a path is NUL-terminated.
     * @throws IllegalArgumentException for an empty address, one with a NUL byte, or one longer than sun_path
     */
    public static MemorySegment unixAddress(String address, Arena arena) {
        byte[] name = address.getBytes(StandardCharsets.UTF_8);
        boolean abstractName = name.length > 0 && name[0] == '@';
        int pathBytes = abstractName ? name.length : name.length + 1;
        long max = SOCKADDR_UN.byteSize() - SUN_PATH;
        if (name.length == 0 || address.indexOf('\0') >= 0 || (abstractName && name.length < 2) || pathBytes > max) {
            throw new IllegalArgumentException("unix socket address '" + address + "' is not allowed; allowed: a path,"
                    + " or '@' and a name (abstract namespace), of at most " + (max - 1) + " bytes and without NUL");
        }
        MemorySegment sa = arena.allocate(SOCKADDR_UN).asSlice(0, SUN_PATH + pathBytes);
        sa.set(ValueLayout.JAVA_SHORT, 0, (short) AF_UNIX);
        MemorySegment.copy(name, 0, sa, ValueLayout.JAVA_BYTE, SUN_PATH, name.length);
        if (abstractName) {
            sa.set(ValueLayout.JAVA_BYTE, SUN_PATH, (byte) 0);
        } // else the terminating NUL is already there: allocate() zeroes
        return sa;
    }

    /** socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0). */
    public static int unixDatagramSocket() throws NativeException {
        return (int) call("socket", "AF_UNIX, SOCK_DGRAM", state -> (int) SOCKET.invokeExact(state, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    }

    /** bind(2) of {@code fd} to an address made by {@link #unixAddress}. */
    public static void bind(int fd, MemorySegment address) throws NativeException {
        call("bind", "fd " + fd + ", " + describe(address),
                state -> (int) BIND.invokeExact(state, fd, address, (int) address.byteSize()));
    }

    /**
     * sendto(2) of all of {@code message} as one datagram to {@code address} (made by {@link #unixAddress}), with
     * MSG_NOSIGNAL. Allocates nothing. A datagram is sent whole or not at all.
     */
    public static void sendTo(int fd, MemorySegment message, MemorySegment address) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) SENDTO.invokeExact(state, fd, message, message.byteSize(), MSG_NOSIGNAL, address,
                    (int) address.byteSize());
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            throw NativeException.of("sendto", Native.errno(state), "fd " + fd + ", " + message.byteSize() + " bytes to "
                    + describe(address));
        }
    }

    /**
     * recv(2) of one datagram into {@code buffer}; {@code flags} e.g. {@link #MSG_DONTWAIT}. Allocates nothing.
     * @return the datagram's length (a longer one is cut to the buffer)
     * @throws NativeException with errno EAGAIN when nothing came (MSG_DONTWAIT, or the SO_RCVTIMEO deadline)
     */
    public static int recv(int fd, MemorySegment buffer, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) RECV.invokeExact(state, fd, buffer, buffer.byteSize(), flags);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            throw NativeException.of("recv", Native.errno(state), "fd " + fd + ", " + buffer.byteSize() + " bytes");
        }
        return (int) n;
    }

    /** ioctl FIONREAD (asm-generic/ioctls.h; the same number on x86-64 and arm64). */
    public static final long FIONREAD = 0x541B;

    /**
     * Bytes waiting in {@code fd}'s receive queue (ioctl FIONREAD): whether a read would block, without reading.
     * Allocation-free: {@code out} is the caller's 4-byte segment, reused.
     */
    public static int bytesQueued(int fd, MemorySegment out) throws NativeException {
        ioctl(fd, FIONREAD, out);
        return out.get(ValueLayout.JAVA_INT, 0);
    }

    /** setsockopt(SO_RCVTIMEO): a blocking {@link #recv} on {@code fd} gives up with EAGAIN after {@code millis}. */
    public static void receiveTimeout(int fd, long millis) throws NativeException {
        socketTimeout(fd, SO_RCVTIMEO, "SO_RCVTIMEO", millis);
    }

    /**
     * setsockopt(SO_SNDTIMEO): a blocking send on {@code fd} ({@link #sendWaiting}) returns after {@code millis}
     * with what it sent so far, or EAGAIN (0 there) when nothing.
     */
    public static void sendTimeout(int fd, long millis) throws NativeException {
        socketTimeout(fd, SO_SNDTIMEO, "SO_SNDTIMEO", millis);
    }

    private static void socketTimeout(int fd, int option, String name, long millis) throws NativeException {
        if (millis <= 0) {
            throw new IllegalArgumentException(name + " must be positive, got " + millis + " ms");
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment timeval = a.allocate(JAVA_LONG, 2); // struct timeval { time_t tv_sec; suseconds_t tv_usec; }
            timeval.setAtIndex(JAVA_LONG, 0, millis / 1000);
            timeval.setAtIndex(JAVA_LONG, 1, millis % 1000 * 1000);
            call("setsockopt", "fd " + fd + ", " + name + " " + millis + " ms",
                    state -> (int) SETSOCKOPT.invokeExact(state, fd, SOL_SOCKET, option, timeval, (int) timeval.byteSize()));
        }
    }

    /**
     * sendmsg(2) of {@code msghdr}'s iovecs with MSG_DONTWAIT | MSG_NOSIGNAL: never blocks, even on a blocking
     * socket (the flag is per call, unlike O_NONBLOCK, which the JDK's blocking reads on the same socket share).
     * Allocates nothing.
     * @return bytes the socket took; 0 when its send buffer is full (EAGAIN) or a signal came first (EINTR)
     * @throws NativeException for any other error (EPIPE, ECONNRESET: the peer is gone)
     */
    public static long sendNow(int fd, MemorySegment msghdr) throws NativeException {
        return sendmsg(fd, msghdr, MSG_DONTWAIT | MSG_NOSIGNAL);
    }

    /**
     * sendmsg(2) of {@code msghdr}'s iovecs with MSG_NOSIGNAL on a blocking socket: the kernel waits for room
     * itself (one call, not a poll and a send per wake-up), until everything is sent or the socket's SO_SNDTIMEO
     * ({@link #sendTimeout}) passes. Allocates nothing.
     * @return bytes sent; 0 when the timeout passed with nothing sent (EAGAIN) or a signal came first
     */
    public static long sendWaiting(int fd, MemorySegment msghdr) throws NativeException {
        return sendmsg(fd, msghdr, MSG_NOSIGNAL);
    }

    private static long sendmsg(int fd, MemorySegment msghdr, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) SENDMSG.invokeExact(state, fd, msghdr, flags);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            int errno = Native.errno(state);
            if (errno == EAGAIN || errno == EINTR) {
                return 0;
            }
            throw NativeException.of("sendmsg", errno, "fd " + fd + ", " + msghdr.get(JAVA_LONG, MSGHDR_IOVLEN)
                    + " iovecs");
        }
        return n;
    }

    /**
     * poll(2) of the one {@code struct pollfd} in {@code pollfd} (its fd and events set by the caller), at most
     * {@code millis}. Allocates nothing.
     * @return the revents (POLLERR and POLLHUP included whether asked for or not); 0 on timeout or a signal
     */
    public static int pollOne(MemorySegment pollfd, int millis) throws NativeException {
        return poll(pollfd, 1, millis) == 0 ? 0
                : Short.toUnsignedInt(pollfd.get(ValueLayout.JAVA_SHORT, POLLFD_REVENTS));
    }

    /**
     * poll(2) of the {@code count} {@code struct pollfd}s in {@code pollfds} (fds and events set by the caller; each
     * one's revents at offset 6 afterwards), at most {@code millis}. Allocates nothing.
     * @return how many have revents; 0 on timeout or a signal
     */
    public static int poll(MemorySegment pollfds, int count, int millis) throws NativeException {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) POLL.invokeExact(state, pollfds, (long) count, millis);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            int errno = Native.errno(state);
            if (errno == EINTR) {
                return 0;
            }
            throw NativeException.of("poll", errno, count == 1 ? "fd " + pollfds.get(JAVA_INT, 0)
                    : count + " fds, the first " + pollfds.get(JAVA_INT, 0));
        }
        return rc;
    }

    /** shutdown(2): wakes every thread blocked on the socket, in any process or descriptor, and fails their calls. */
    public static void shutdown(int fd, int how) throws NativeException {
        call("shutdown", "fd " + fd + ", how " + how, state -> (int) SHUTDOWN.invokeExact(state, fd, how));
    }

    /** ioctl SIOCOUTQ (= TIOCOUTQ, asm-generic/ioctls.h): see {@link #bytesUnsent}. */
    public static final long SIOCOUTQ = 0x5411;

    /**
     * Bytes sent on stream socket {@code fd} that the peer has not taken yet (ioctl SIOCOUTQ: on a unix socket
     * what the peer has not read, on TCP what it has not acknowledged). Falling while a writer waits is the
     * peer making progress. Allocation-free: {@code out} is the caller's 4-byte segment.
     */
    public static int bytesUnsent(int fd, MemorySegment out) throws NativeException {
        ioctl(fd, SIOCOUTQ, out);
        return out.get(ValueLayout.JAVA_INT, 0);
    }

    /** An address made by {@link #unixAddress} as it was written ('@' for the abstract namespace), for messages. */
    private static String describe(MemorySegment address) {
        long n = address.byteSize() - SUN_PATH;
        if (n <= 0) {
            return "unix address (unnamed)";
        }
        byte[] b = address.asSlice(SUN_PATH, n).toArray(ValueLayout.JAVA_BYTE);
        if (b[0] == 0) {
            return "unix address '@" + new String(b, 1, b.length - 1, StandardCharsets.UTF_8) + "'";
        }
        int len = 0;
        while (len < b.length && b[len] != 0) {
            len++;
        }
        return "unix address '" + new String(b, 0, len, StandardCharsets.UTF_8) + "'";
    }

    /**
     * The process id of the peer of connected socket {@code fd} as it was at connect(2) time (getsockopt
     * SO_PEERCRED): whether that process still runs tells a peer that died from one that only stopped answering.
     */
    public static int peerPid(int fd) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment ucred = a.allocate(12, 4);
            MemorySegment len = a.allocate(JAVA_INT);
            len.set(JAVA_INT, 0, 12);
            call("getsockopt", "fd " + fd + ", SO_PEERCRED",
                    state -> (int) GETSOCKOPT.invokeExact(state, fd, SOL_SOCKET, SO_PEERCRED, ucred, len));
            return ucred.get(JAVA_INT, 0);
        }
    }

    /** socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0). */
    public static int unixStreamSocket() throws NativeException {
        return (int) call("socket", "AF_UNIX, SOCK_STREAM",
                state -> (int) SOCKET.invokeExact(state, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    }

    /** listen(2) on a bound socket. */
    public static void listen(int fd, int backlog) throws NativeException {
        call("listen", "fd " + fd + ", backlog " + backlog, state -> (int) LISTEN.invokeExact(state, fd, backlog));
    }

    /**
     * bind(2) of {@code fd} to {@code path} (a unix socket path or '@' name, see {@link #unixAddress}), then
     * listen(2) on it: a unix stream socket that takes connections there.
     */
    public static void listen(int fd, String path, int backlog) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            bind(fd, unixAddress(path, a));
        }
        listen(fd, backlog);
    }

    /**
     * The next connection on listening socket {@code fd} (accept4 with SOCK_CLOEXEC), waiting for one; EINTR is
     * retried. A shutdown of {@code fd} from another thread ends the wait with an exception (EINVAL).
     */
    public static int accept(int fd) throws NativeException {
        while (true) {
            try {
                return (int) call("accept4", "fd " + fd, state -> (int) ACCEPT4.invokeExact(state, fd,
                        MemorySegment.NULL, MemorySegment.NULL, SOCK_CLOEXEC));
            } catch (NativeException e) {
                if (e.errno() != EINTR) {
                    throw e;
                }
            }
        }
    }

    /** connect(2) of {@code fd} to {@code path} (a unix socket path or '@' name, see {@link #unixAddress}). */
    public static void connect(int fd, String path) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment address = unixAddress(path, a);
            call("connect", "fd " + fd + ", " + path,
                    state -> (int) CONNECT.invokeExact(state, fd, address, (int) address.byteSize()));
        }
    }

    /** A connected pair of stream sockets (socketpair(2), close-on-exec): both ends are the caller's. */
    public static int[] unixStreamPair() throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment sv = a.allocate(JAVA_INT, 2);
            call("socketpair", "AF_UNIX, SOCK_STREAM", state -> (int) SOCKETPAIR.invokeExact(state,
                    AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
            return new int[]{sv.getAtIndex(JAVA_INT, 0), sv.getAtIndex(JAVA_INT, 1)};
        }
    }
}
