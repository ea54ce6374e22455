package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The libc functions pmemblk needs, bound once through FFM. Nothing else in the project touches
 * {@link Linker} for libc. Every failing call becomes a {@link NativeException} carrying errno,
 * its text, and the arguments that were asked for.
 */
public final class Libc {
    private Libc() {}

    // <sys/mman.h> on x86-64 Linux
    public static final int PROT_READ = 0x1;
    public static final int PROT_WRITE = 0x2;
    public static final int MAP_SHARED = 0x01;
    public static final int MAP_PRIVATE = 0x02;
    public static final int MAP_ANONYMOUS = 0x20;
    public static final int MAP_POPULATE = 0x8000;
    public static final int MS_ASYNC = 1;
    public static final int MS_SYNC = 4;
    public static final long MAP_FAILED = -1L;
    // <fcntl.h>
    public static final int O_RDONLY = 0, O_WRONLY = 01, O_RDWR = 02, O_CREAT = 0100, O_CLOEXEC = 02000000;
    /** A final symbolic link fails the open with ELOOP instead of being followed. */
    public static final int O_NOFOLLOW = 0400000, O_NONBLOCK = 04000, O_EXCL = 0200;
    public static final int ELOOP = 40, ENOENT = 2;

    private static final Linker LINKER = Linker.nativeLinker();
    private static final SymbolLookup LIBC = LINKER.defaultLookup();
    private static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO =
            CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    private static final Linker.Option CAPTURE_ERRNO = Linker.Option.captureCallState("errno");

    private static final MethodHandle MMAP = find("mmap",
            FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG), true);
    private static final MethodHandle MUNMAP = find("munmap",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG), true);
    private static final MethodHandle MSYNC = find("msync",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), true);
    private static final MethodHandle IOCTL = find("ioctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS), true);
    private static final MethodHandle OPEN = find("open",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), true);
    private static final MethodHandle CLOSE = find("close",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT), true);
    private static final MethodHandle POSIX_FALLOCATE = find("posix_fallocate",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG), false);
    // memcpy/memset of at most CRITICAL_MAX bytes never block long or call back: critical, no thread-state
    // transition. Longer ones take the plain handle, so a safepoint never waits for them (a page fault inside a
    // critical call holds every other thread at the safepoint). Bound as void: the returned dst is not wanted.
    private static final MethodHandle MEMCPY = LINKER.downcallHandle(LIBC.find("memcpy").orElseThrow(),
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG), Linker.Option.critical(false));
    private static final MethodHandle MEMCPY_LONG = LINKER.downcallHandle(LIBC.find("memcpy").orElseThrow(),
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG));
    private static final MethodHandle MEMSET = LINKER.downcallHandle(LIBC.find("memset").orElseThrow(),
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG), Linker.Option.critical(false));
    private static final MethodHandle MEMSET_LONG = LINKER.downcallHandle(LIBC.find("memset").orElseThrow(),
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG));
    /** Longest range passed to a critical memcpy/memset: at most 16 page faults. */
    public static final long CRITICAL_MAX = 64 << 10;
    /** errno capture buffer per thread, so msync (run per FUA request) allocates nothing. */
    private static final ThreadLocal<MemorySegment> CALL_STATE = ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(CAPTURE));
    private static final MethodHandle STRERROR = find("strerror",
            FunctionDescriptor.of(ADDRESS.withTargetLayout(MemoryLayout.sequenceLayout(256, ValueLayout.JAVA_BYTE)), JAVA_INT), false);
    private static final MethodHandle GETPID = find("getpid", FunctionDescriptor.of(JAVA_INT), false);
    /** int prctl(int option, ...): variadic after the option, every argument passed as an unsigned long. */
    private static final MethodHandle PRCTL = LINKER.downcallHandle(LIBC.find("prctl").orElseThrow(),
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG),
            CAPTURE_ERRNO, Linker.Option.firstVariadicArg(1));
    /** {@code <linux/prctl.h>} PR_SET_IO_FLUSHER (Linux 5.6). */
    public static final int PR_SET_IO_FLUSHER = 57;
    // stat, lstat and fstat are real symbols since glibc 2.33 (before, only __xstat and friends); Debian 12 has 2.36.
    private static final MethodHandle LSTAT = find("lstat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), true);
    private static final MethodHandle STAT = find("stat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), true);
    private static final MethodHandle FSTAT = find("fstat", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS), true);
    private static final MethodHandle GETEUID = find("geteuid", FunctionDescriptor.of(JAVA_INT), false);
    private static final MethodHandle SYSCONF = find("sysconf", FunctionDescriptor.of(JAVA_LONG, JAVA_INT), false);

    private static MethodHandle find(String name, FunctionDescriptor fd, boolean captureErrno) {
        MemorySegment symbol = LIBC.find(name)
                .orElseThrow(() -> new UnsatisfiedLinkError("libc has no symbol " + name));
        return captureErrno ? LINKER.downcallHandle(symbol, fd, CAPTURE_ERRNO) : LINKER.downcallHandle(symbol, fd);
    }

    /**
     * memcpy(3) of all of {@code src} into {@code dst} (same size). glibc picks the widest copy loop this CPU has
     * (AVX-512, ERMS), which beats {@code MemorySegment.copy} on long copies. Segments, not addresses: the
     * linker refuses a closed segment (IllegalStateException) and holds its arena open during the call.
     */
    public static void memcpy(MemorySegment dst, MemorySegment src) {
        long n = dst.byteSize();
        if (src.byteSize() != n) {
            throw new IllegalArgumentException("memcpy of " + src.byteSize() + " bytes into " + n + " bytes");
        }
        try {
            if (n <= CRITICAL_MAX) {
                MEMCPY.invokeExact(dst, src, n);
            } else {
                MEMCPY_LONG.invokeExact(dst, src, n);
            }
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /**
     * memset(3) of all of {@code dst}. Unlike {@code MemorySegment.fill} (one call in the VM state, which a
     * safepoint waits for), a long memset here runs in native and holds no other thread.
     */
    public static void memset(MemorySegment dst, int value) {
        long n = dst.byteSize();
        try {
            if (n <= CRITICAL_MAX) {
                MEMSET.invokeExact(dst, value, n);
            } else {
                MEMSET_LONG.invokeExact(dst, value, n);
            }
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
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
            throw new AssertionError(t);
        }
    }

    /**
     * prctl(PR_SET_IO_FLUSHER, 1) for the calling thread: the kernel then reclaims memory for it without
     * starting I/O (PF_MEMALLOC_NOIO) and does not throttle its writeback, so a thread that serves a block device
     * cannot deadlock waiting for writeback through that very device. Needs CAP_SYS_RESOURCE.
     * @return 0, or -errno (EPERM without the capability, EINVAL before Linux 5.6)
     */
    public static int setIoFlusher() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) PRCTL.invokeExact(state, PR_SET_IO_FLUSHER, 1L, 0L, 0L, 0L);
            return rc == 0 ? 0 : -errno(state);
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** geteuid(2): the user whose files and directories pmemblk trusts besides root's. */
    public static int geteuid() {
        try {
            return (int) GETEUID.invokeExact();
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** lstat(2): the file itself, a symbolic link included (not followed). */
    public static FileStat lstat(String path) throws NativeException {
        return stat("lstat", path, (a, state, buf) -> (int) LSTAT.invokeExact(state, a.allocateFrom(path), buf));
    }

    /** stat(2): symbolic links followed. */
    public static FileStat stat(String path) throws NativeException {
        return stat("stat", path, (a, state, buf) -> (int) STAT.invokeExact(state, a.allocateFrom(path), buf));
    }

    /** fstat(2) of an open descriptor: what was opened, whatever its path names now. */
    public static FileStat fstat(int fd) throws NativeException {
        return stat("fstat", "fd " + fd, (a, state, buf) -> (int) FSTAT.invokeExact(state, fd, buf));
    }

    /** One of the stat calls, into a struct stat of its own arena (not a per-request path: allocation is fine). */
    @FunctionalInterface
    private interface StatCall {
        int call(Arena a, MemorySegment state, MemorySegment buf) throws Throwable;
    }

    private static FileStat stat(String function, String what, StatCall call) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            MemorySegment buf = a.allocate(FileStat.LAYOUT);
            if (call.call(a, state, buf) != 0) {
                throw NativeException.of(function, errno(state), what);
            }
            return FileStat.read(buf);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** sysconf(_SC_PAGESIZE). */
    public static long pageSize() {
        try {
            return (long) SYSCONF.invokeExact(30);
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /**
     * Flushes the pages of [offset, offset+length) of {@code mapping} to the backing file (msync(2) with
     * MS_SYNC). The range is widened down to its page, as msync requires a page-aligned start; the mapping
     * itself must start on a page (every mmap does). Allocates nothing.
     */
    public static void msync(MemorySegment mapping, long offset, long length) throws NativeException {
        if (length == 0) {
            return;
        }
        long skew = (mapping.address() + offset) & (PAGE - 1);
        MemorySegment range = mapping.asSlice(offset - skew, length + skew); // bounds checked here
        MemorySegment state = CALL_STATE.get();
        int rc;
        try {
            rc = (int) MSYNC.invokeExact(state, range, range.byteSize(), MS_SYNC);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
        if (rc != 0) {
            throw NativeException.of("msync", errno(state),
                    "address 0x" + Long.toHexString(range.address()) + ", length " + range.byteSize());
        }
    }

    private static final long PAGE = pageSize();

    /** mmap(2); returns the mapping as a segment of {@code length} bytes, unbounded to any arena (caller owns it). */
    public static MemorySegment mmap(long length, int prot, int flags, int fd, long offset) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            MemorySegment p = (MemorySegment) MMAP.invokeExact(state, MemorySegment.NULL, length, prot, flags, fd, offset);
            if (p.address() == MAP_FAILED) {
                throw NativeException.of("mmap", errno(state),
                        "length " + length + ", prot 0x" + Integer.toHexString(prot) + ", flags 0x"
                                + Integer.toHexString(flags) + ", fd " + fd + ", offset " + offset);
            }
            return p.reinterpret(length);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /**
     * mmap(2) of {@code length} bytes of {@code fd} at {@code offset}, owned by {@code owner}: closing the arena
     * unmaps it, and any later access through the segment throws IllegalStateException instead of touching
     * unmapped memory. For kernel-shared areas (io_uring rings, ublk's descriptor arrays): a mapping that leaked
     * would keep the file open in the kernel (ublk's DEL_DEV waits for it forever), so the mapping is undone if
     * it cannot be tied to the arena.
     */
    public static MemorySegment map(int fd, long length, int prot, int flags, long offset, Arena owner) throws NativeException {
        MemorySegment raw = mmap(length, prot, flags, fd, offset);
        try {
            return raw.reinterpret(length, owner, unused -> {
                try {
                    munmap(raw);
                } catch (NativeException e) {
                    throw new IllegalStateException(e.getMessage(), e); // only with a wrong address: a bug here
                }
            });
        } catch (RuntimeException | Error e) {
            try {
                munmap(raw);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
    }

    public static void munmap(MemorySegment mapping) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) MUNMAP.invokeExact(state, mapping, mapping.byteSize());
            if (rc != 0) {
                throw NativeException.of("munmap", errno(state),
                        "address 0x" + Long.toHexString(mapping.address()) + ", length " + mapping.byteSize());
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** open(2) with O_CLOEXEC added. */
    public static int open(String path, int flags, int mode) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int fd = (int) OPEN.invokeExact(state, a.allocateFrom(path), flags | O_CLOEXEC, mode);
            if (fd < 0) {
                throw NativeException.of("open", errno(state), path);
            }
            return fd;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    public static void close(int fd) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) CLOSE.invokeExact(state, fd);
            if (rc != 0) {
                throw NativeException.of("close", errno(state), "fd " + fd);
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /** ioctl(2) with a pointer argument; returns the (non-negative) result. */
    public static int ioctl(int fd, long request, MemorySegment arg) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = a.allocate(CAPTURE);
            int rc = (int) IOCTL.invokeExact(state, fd, request, arg);
            if (rc < 0) {
                throw NativeException.of("ioctl", errno(state), "fd " + fd + ", request 0x" + Long.toHexString(request));
            }
            return rc;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    /**
     * posix_fallocate(3): reserves the blocks of [offset, offset+length) so that stores through a shared
     * mapping can never hit an unallocated hole (which would raise SIGBUS when the filesystem is full).
     */
    public static void fallocate(int fd, long offset, long length, String what) throws NativeException {
        try {
            int rc = (int) POSIX_FALLOCATE.invokeExact(fd, offset, length);
            if (rc != 0) { // returns the error number itself, not -1/errno
                throw NativeException.of("posix_fallocate", rc, what + ", offset " + offset + ", length " + length);
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
    }

    private static int errno(MemorySegment state) {
        return (int) ERRNO.get(state, 0L);
    }
}
