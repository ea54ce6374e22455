package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;

/**
 * Unix stream sockets as plain descriptors, for a protocol that passes descriptors ({@link UnixMessages}): the
 * JDK's channels cannot send or receive SCM_RIGHTS and do not show their descriptor. Blocking and close-on-exec;
 * a thread blocked in {@link #accept} or a receive is woken by {@code Libc.shutdown} from another thread.
 */
public final class UnixStream {
    private UnixStream() {}

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

    /**
     * The process id of the peer of connected socket {@code fd} as it was at connect(2) time (getsockopt
     * SO_PEERCRED): whether that process still runs tells a peer that died from one that only stopped answering.
     */
    public static int peerPid(int fd) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment ucred = a.allocate(12, 4);
            MemorySegment len = a.allocate(JAVA_INT);
            len.set(JAVA_INT, 0, 12);
            Libc.call("getsockopt", "fd " + fd + ", SO_PEERCRED",
                    state -> (int) GETSOCKOPT.invokeExact(state, fd, Libc.SOL_SOCKET, SO_PEERCRED, ucred, len));
            return ucred.get(JAVA_INT, 0);
        }
    }

    /** socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0). */
    public static int socket() throws NativeException {
        return (int) Libc.call("socket", "AF_UNIX, SOCK_STREAM",
                state -> (int) Libc.SOCKET.invokeExact(state, Libc.AF_UNIX, Libc.SOCK_STREAM | Libc.SOCK_CLOEXEC, 0));
    }

    /** listen(2) on a bound socket. */
    public static void listen(int fd, int backlog) throws NativeException {
        Libc.call("listen", "fd " + fd + ", backlog " + backlog, state -> (int) LISTEN.invokeExact(state, fd, backlog));
    }

    /**
     * The next connection on listening socket {@code fd} (accept4 with SOCK_CLOEXEC), waiting for one; EINTR is
     * retried. A shutdown of {@code fd} from another thread ends the wait with an exception (EINVAL).
     */
    public static int accept(int fd) throws NativeException {
        while (true) {
            try {
                return (int) Libc.call("accept4", "fd " + fd, state -> (int) ACCEPT4.invokeExact(state, fd,
                        MemorySegment.NULL, MemorySegment.NULL, Libc.SOCK_CLOEXEC));
            } catch (NativeException e) {
                if (e.errno() != EINTR) {
                    throw e;
                }
            }
        }
    }

    /** connect(2) of {@code fd} to {@code path} (a unix socket path or '@' name, see {@link Libc#unixAddress}). */
    public static void connect(int fd, String path) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment address = Libc.unixAddress(path, a);
            Libc.call("connect", "fd " + fd + ", " + path,
                    state -> (int) CONNECT.invokeExact(state, fd, address, (int) address.byteSize()));
        }
    }

    /** A connected pair of stream sockets (socketpair(2), close-on-exec): both ends are the caller's. */
    public static int[] pair() throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment sv = a.allocate(JAVA_INT, 2);
            Libc.call("socketpair", "AF_UNIX, SOCK_STREAM", state -> (int) SOCKETPAIR.invokeExact(state,
                    Libc.AF_UNIX, Libc.SOCK_STREAM | Libc.SOCK_CLOEXEC, 0, sv));
            return new int[]{sv.getAtIndex(JAVA_INT, 0), sv.getAtIndex(JAVA_INT, 1)};
        }
    }
}
