package io.pmemblk.posix;

import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.FileCalls.O_NONBLOCK;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static io.pmemblk.posix.Native.variadicFrom;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The libc calls every binding class shares, each bound once through {@link Native}: {@link #call}, strerror,
 * the process (pid, euid, prctl, sysconf, signal), close, ioctl and fcntl on a descriptor. Memory calls are in
 * {@link Mman}, file calls in {@link FileCalls}, socket calls in {@link Sockets}. Every failing call becomes a
 * {@link NativeException} carrying errno, its text, and the arguments that were asked for.
 */
public final class Libc {
    private Libc() {}

    /**
     * int ioctl(int fd, unsigned long request, ...): variadic after the request, in the two shapes its callers pass:
     * a pointer (a struct, or an int the kernel writes: FIONREAD) and a value (VFIO_CHECK_EXTENSION's int).
     */
    private static final MethodHandle IOCTL = libc("ioctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS), ERRNO, variadicFrom(2));
    private static final MethodHandle IOCTL_VALUE = libc("ioctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG), ERRNO, variadicFrom(2));
    private static final MethodHandle CLOSE = libc("close",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle STRERROR = libc("strerror", FunctionDescriptor.of(Native.pointerTo(256), JAVA_INT));
    private static final MethodHandle GETPID = libc("getpid", FunctionDescriptor.of(JAVA_INT));
    /** int prctl(int option, ...): variadic after the option, every argument passed as an unsigned long. */
    private static final MethodHandle PRCTL = libc("prctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG),
            ERRNO, variadicFrom(1));
    /** {@code <linux/prctl.h>} PR_SET_IO_FLUSHER (Linux 5.6). */
    public static final int PR_SET_IO_FLUSHER = 57;
    private static final MethodHandle GETEUID = libc("geteuid", FunctionDescriptor.of(JAVA_INT));
    private static final MethodHandle SYSCONF = libc("sysconf", FunctionDescriptor.of(JAVA_LONG, JAVA_INT));
    /** sighandler_t signal(int signum, sighandler_t handler): bound only to give a signal its default action back. */
    private static final MethodHandle SIGNAL = libc("signal", FunctionDescriptor.of(ADDRESS, JAVA_INT, ADDRESS), ERRNO);
    /** {@code <bits/signum-arch.h>}: SIGHUP. {@code <bits/signum-generic.h>}: SIG_DFL is 0, SIG_IGN 1, SIG_ERR -1. */
    public static final int SIGHUP = 1;
    private static final long SIG_IGN = 1;
    /** int fcntl(int fd, int cmd, ...): variadic after cmd; F_DUPFD_CLOEXEC takes an int. */
    static final MethodHandle FCNTL_INT = libc("fcntl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), ERRNO, variadicFrom(2));
    private static final int F_DUPFD_CLOEXEC = 1030;
    /** {@code <asm-generic/fcntl.h>}: the open file description's status flags (O_NONBLOCK among them). */
    private static final int F_GETFL = 3, F_SETFL = 4;

    /** A call that fails with a negative result and errno, made through {@link #call}. */
    @FunctionalInterface
    interface Call {
        long invoke(MemorySegment state) throws Throwable;
    }

    /**
     * One call that fails with a negative result (-1, MAP_FAILED) and errno: its result, or a NativeException
     * naming {@code function} and {@code what} was asked. For calls off the per-request paths (the lambda may
     * allocate); those on them are written out, each allocation-free.
     */
    static long call(String function, String what, Call call) throws NativeException {
        MemorySegment state = Native.callState();
        long rc;
        try {
            rc = call.invoke(state);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            throw NativeException.of(function, Native.errno(state), what);
        }
        return rc;
    }

    /** The text of an errno value, as strerror(3) gives it. */
    public static String strerror(int errno) {
        try {
            MemorySegment s = (MemorySegment) STRERROR.invokeExact(errno);
            return s.getString(0);
        } catch (Throwable t) {
            return "errno " + errno;
        }
    }

    public static int getpid() {
        try {
            return (int) GETPID.invokeExact();
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * prctl(PR_SET_IO_FLUSHER, 1) for the calling thread: the kernel then reclaims memory for it without
     * starting I/O (PF_MEMALLOC_NOIO) and does not throttle its writeback, so a thread that serves a block device
     * cannot deadlock waiting for writeback through that very device. Needs CAP_SYS_RESOURCE.
     * @return 0, or -errno (EPERM without the capability, EINVAL before Linux 5.6)
     */
    public static int setIoFlusher() {
        try {
            call("prctl", "PR_SET_IO_FLUSHER", state -> (int) PRCTL.invokeExact(state, PR_SET_IO_FLUSHER, 1L, 0L, 0L, 0L));
            return 0;
        } catch (NativeException e) {
            return -e.errno();
        }
    }

    /** geteuid(2): the user whose files and directories pmemblk trusts besides root's. */
    public static int geteuid() {
        try {
            return (int) GETEUID.invokeExact();
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * signal(2) with SIG_DFL: {@code signal} gets its default action back, whatever this process was started with
     * (a signal ignored at exec stays ignored: nohup, some supervisors). Before anything else handles it: it
     * replaces whatever handler is installed, the JVM's too.
     * @return whether the signal was ignored until now
     */
    public static boolean defaultSignalAction(int signal) throws NativeException {
        long old = call("signal", "signal " + signal + ", SIG_DFL",
                state -> ((MemorySegment) SIGNAL.invokeExact(state, signal, MemorySegment.NULL)).address());
        return old == SIG_IGN;
    }

    /** sysconf(_SC_PAGESIZE). */
    public static long pageSize() {
        try {
            return (long) SYSCONF.invokeExact(30);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    public static void close(int fd) throws NativeException {
        call("close", "fd " + fd, state -> (int) CLOSE.invokeExact(state, fd));
    }

    /**
     * close(2) of a descriptor this process opened, on a clean-up path that has nothing to do with a failure:
     * EBADF cannot happen for it, and Linux releases the number even when close reports EINTR or EIO, so there is
     * nothing to retry. A negative {@code fd} (none was opened) is skipped.
     */
    public static void closeQuietly(int fd) {
        if (fd < 0) {
            return;
        }
        try {
            close(fd);
        } catch (NativeException ignored) {
            // see above: the number is released whatever close answers
        }
    }

    /** ioctl(2) with a pointer argument; returns the (non-negative) result. */
    public static int ioctl(int fd, long request, MemorySegment arg) throws NativeException {
        MemorySegment state = Native.callState(); // allocation-free: FIONREAD runs per socket read (bytesQueued)
        int rc;
        try {
            rc = (int) IOCTL.invokeExact(state, fd, request, arg);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            throw NativeException.of("ioctl", Native.errno(state), "fd " + fd + ", request 0x" + Long.toHexString(request));
        }
        return rc;
    }

    /**
     * ioctl(2) {@code request}, named {@code what} in a failure's message, with a pointer to {@code arg} (a
     * struct the kernel reads or fills); returns the non-negative result.
     */
    public static int ioctl(int fd, long request, MemorySegment arg, String what) throws NativeException {
        return (int) call("ioctl " + what, "fd " + fd, state -> (int) IOCTL.invokeExact(state, fd, request, arg));
    }

    /** ioctl(2) {@code request}, named {@code what}, with its argument by value; returns the non-negative result. */
    public static int ioctl(int fd, long request, long value, String what) throws NativeException {
        return (int) call("ioctl " + what, "fd " + fd + ", 0x" + Long.toHexString(value),
                state -> (int) IOCTL_VALUE.invokeExact(state, fd, request, value));
    }

    /** fcntl(F_DUPFD_CLOEXEC): a second descriptor of the same open socket or file, closed on exec. */
    public static int dupCloexec(int fd) throws NativeException {
        return (int) call("fcntl", "fd " + fd + ", F_DUPFD_CLOEXEC", state -> (int) FCNTL_INT.invokeExact(state, fd, F_DUPFD_CLOEXEC, 0));
    }

    /**
     * fcntl(F_GETFL / F_SETFL): adds O_NONBLOCK to the status flags of {@code fd}'s open file description. The
     * flag belongs to the description, which every process holding a copy of the descriptor shares.
     */
    public static void setNonBlocking(int fd) throws NativeException {
        int flags = (int) call("fcntl", "fd " + fd + ", F_GETFL", state -> (int) FCNTL_INT.invokeExact(state, fd, F_GETFL, 0));
        if ((flags & O_NONBLOCK) == 0) {
            int set = flags | O_NONBLOCK;
            call("fcntl", "fd " + fd + ", F_SETFL O_NONBLOCK", state -> (int) FCNTL_INT.invokeExact(state, fd, F_SETFL, set));
        }
    }
}
