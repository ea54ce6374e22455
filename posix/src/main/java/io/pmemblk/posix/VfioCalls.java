package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * The native calls of the VFIO layer (io.pmemblk.dma.vfio), which has no native access of its own: ioctl(2) in
 * the two shapes VFIO uses, and poll(2) on an interrupt's eventfd. ioctl is variadic: bound with
 * {@code firstVariadicArg(2)}, once with a by-value {@code long} (VFIO_CHECK_EXTENSION, VFIO_SET_IOMMU take an int
 * by value) and once with a pointer (every struct argument), as shared/notes/vfio.md §1.1 describes.
 */
public final class VfioCalls {
    private VfioCalls() {}

    /** {@code <poll.h>}: POLLIN. */
    public static final short POLLIN = 0x1;

    private static final Linker LINKER = Linker.nativeLinker();
    private static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO = CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    private static final MethodHandle IOCTL_VALUE = LINKER.downcallHandle(LINKER.defaultLookup().find("ioctl").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG),
            Linker.Option.firstVariadicArg(2), Linker.Option.captureCallState("errno"));
    private static final MethodHandle IOCTL_POINTER = LINKER.downcallHandle(LINKER.defaultLookup().find("ioctl").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS),
            Linker.Option.firstVariadicArg(2), Linker.Option.captureCallState("errno"));
    /** int poll(struct pollfd *fds, nfds_t nfds, int timeout) */
    private static final MethodHandle POLL = LINKER.downcallHandle(LINKER.defaultLookup().find("poll").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), Linker.Option.captureCallState("errno"));
    /** struct pollfd {int fd; short events; short revents;} from {@code <poll.h>}: 8 bytes. */
    private static final StructLayout POLLFD = MemoryLayout.structLayout(JAVA_INT.withName("fd"),
            JAVA_SHORT.withName("events"), JAVA_SHORT.withName("revents"));
    /** Per thread: a completion thread polls its eventfd once per interrupt and must allocate nothing. */
    private static final ThreadLocal<MemorySegment> POLL_ERRNO = ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(CAPTURE));
    private static final ThreadLocal<MemorySegment> POLL_FD = ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(POLLFD));

    /** ioctl(fd, request, value) with the argument by value; returns the non-negative result. */
    public static int ioctl(int fd, long request, long value, String what) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) IOCTL_VALUE.invokeExact(state, fd, request, value);
            if (rc < 0) {
                throw NativeException.of("ioctl " + what, (int) ERRNO.get(state, 0L), "fd " + fd + ", 0x" + Long.toHexString(value));
            }
            return rc;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** ioctl(fd, request, arg) with a pointer to {@code arg}; returns the non-negative result. */
    public static int ioctl(int fd, long request, MemorySegment arg, String what) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) IOCTL_POINTER.invokeExact(state, fd, request, arg);
            if (rc < 0) {
                throw NativeException.of("ioctl " + what, (int) ERRNO.get(state, 0L), "fd " + fd);
            }
            return rc;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /**
     * poll(2) for POLLIN on one fd, up to {@code timeoutMillis}: true when readable, false on timeout or EINTR
     * (the caller's bounded wait loops anyway). Allocates nothing.
     */
    public static boolean pollIn(int fd, int timeoutMillis) throws NativeException {
        MemorySegment state = POLL_ERRNO.get();
        MemorySegment pfd = POLL_FD.get();
        pfd.set(JAVA_INT, 0, fd);
        pfd.set(JAVA_SHORT, 4, POLLIN);
        pfd.set(JAVA_SHORT, 6, (short) 0);
        int rc;
        try {
            rc = (int) POLL.invokeExact(state, pfd, 1L, timeoutMillis);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
        if (rc < 0) {
            int errno = (int) ERRNO.get(state, 0L);
            if (errno == FileIo.EINTR) {
                return false;
            }
            throw NativeException.of("poll", errno, "fd " + fd);
        }
        return rc > 0 && (pfd.get(JAVA_SHORT, 6) & POLLIN) != 0;
    }
}
