package io.pmemblk.posix;

import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;

import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * Positioned reads and writes between a file descriptor and native memory, and eventfd: the per-request calls
 * of a frontend's data path (ublk's user copy is a {@code pread}/{@code pwrite} on {@code /dev/ublkcN}). They
 * allocate nothing and do not throw on a failed call: the result is the byte count or {@code -errno}, which the
 * caller turns into a request's status. Buffers are segments, so the linker refuses a closed one and keeps its
 * arena alive during the call. None is {@code Linker.Option.critical}: each may block or page-fault for long.
 */
public final class FileIo {
    private FileIo() {}

    /** {@code <sys/eventfd.h>}: EFD_CLOEXEC = O_CLOEXEC, EFD_NONBLOCK = O_NONBLOCK. */
    public static final int EFD_CLOEXEC = 02000000, EFD_NONBLOCK = 04000;

    /** ssize_t pread(int fd, void *buf, size_t count, off_t offset), and pwrite with the same shape. */
    private static final MethodHandle PREAD = libc("pread64", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_LONG), ERRNO);
    private static final MethodHandle PWRITE = libc("pwrite64", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_LONG), ERRNO);
    /**
     * ssize_t read(int fd, void *buf, size_t count), and write with the same shape; both take (and drop) a
     * position argument too, so that one loop serves all four.
     */
    private static final MethodHandle READ = MethodHandles.dropArguments(
            libc("read", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG), ERRNO), 4, long.class);
    private static final MethodHandle WRITE = MethodHandles.dropArguments(
            libc("write", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG), ERRNO), 4, long.class);
    /** int eventfd(unsigned int initval, int flags) */
    private static final MethodHandle EVENTFD = libc("eventfd", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);

    /**
     * pread(2) of {@code dst.byteSize()} bytes at {@code position} of {@code fd} into {@code dst}, retried on
     * EINTR. Returns the bytes read (fewer at the end of what the file has) or {@code -errno}.
     */
    public static long pread(int fd, MemorySegment dst, long position) {
        return transfer(PREAD, fd, dst, position);
    }

    /** pwrite(2) of all of {@code src} at {@code position} of {@code fd}; as {@link #pread}. */
    public static long pwrite(int fd, MemorySegment src, long position) {
        return transfer(PWRITE, fd, src, position);
    }

    /** read(2) into all of {@code dst} at the file position; bytes read or {@code -errno} (EINTR retried). */
    public static long read(int fd, MemorySegment dst) {
        return transfer(READ, fd, dst, 0);
    }

    /** write(2) of all of {@code src} at the file position; bytes written or {@code -errno} (EINTR retried). */
    public static long write(int fd, MemorySegment src) {
        return transfer(WRITE, fd, src, 0);
    }

    /** One call of {@code call} (a constant once inlined into the four above), retried on EINTR. */
    private static long transfer(MethodHandle call, int fd, MemorySegment buffer, long position) {
        MemorySegment state = Native.callState();
        long rc;
        do {
            try {
                rc = (long) call.invokeExact(state, fd, buffer, buffer.byteSize(), position);
            } catch (Throwable t) {
                throw Native.unexpected(t);
            }
        } while (rc < 0 && Native.errno(state) == EINTR);
        return rc < 0 ? -Native.errno(state) : rc;
    }

    /** eventfd(2) with {@code flags} (EFD_CLOEXEC is always added); returns the fd. */
    public static int eventfd(int initialValue, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        int fd;
        try {
            fd = (int) EVENTFD.invokeExact(state, initialValue, flags | EFD_CLOEXEC);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (fd < 0) {
            throw NativeException.of("eventfd", Native.errno(state), "initval " + initialValue + ", flags 0x" + Integer.toHexString(flags));
        }
        return fd;
    }
}
