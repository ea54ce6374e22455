package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Libc.call;
import static io.pmemblk.posix.Libc.pageSize;
import static io.pmemblk.posix.Native.CRITICAL;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The memory calls of {@code <sys/mman.h>} and {@code <string.h>}: mmap, munmap, msync, memcpy and memset, each
 * bound once through {@link Native}, and the native round trip that surfaces a fault of a mapped access.
 */
public final class Mman {
    private Mman() {}

    // <sys/mman.h> on x86-64 Linux
    public static final int PROT_READ = 0x1, PROT_WRITE = 0x2;
    public static final int MAP_SHARED = 0x01, MAP_PRIVATE = 0x02, MAP_ANONYMOUS = 0x20, MAP_POPULATE = 0x8000;
    public static final int MS_ASYNC = 1, MS_SYNC = 4;
    public static final long MAP_FAILED = -1L;
    private static final MethodHandle MMAP = libc("mmap",
            FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG), ERRNO);
    private static final MethodHandle MUNMAP = libc("munmap",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG), ERRNO);
    private static final MethodHandle MSYNC = libc("msync",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    // abs(3): pure computation, no system call. Bound without the critical option on purpose: see nativeRoundTrip.
    private static final MethodHandle ABS = libc("abs", FunctionDescriptor.of(JAVA_INT, JAVA_INT));
    // memcpy/memset of at most CRITICAL_MAX bytes never block long or call back: critical, no thread-state
    // transition. Longer ones take the plain handle, so a safepoint never waits for them (a page fault inside a
    // critical call holds every other thread at the safepoint). Bound as void: the returned dst is not wanted.
    private static final MethodHandle MEMCPY = libc("memcpy",
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG), CRITICAL);
    private static final MethodHandle MEMCPY_LONG = libc("memcpy",
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG));
    private static final MethodHandle MEMSET = libc("memset",
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG), CRITICAL);
    private static final MethodHandle MEMSET_LONG = libc("memset",
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG));
    /** Longest range passed to a critical memcpy/memset: at most 16 page faults. */
    public static final long CRITICAL_MAX = 64 << 10;

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
        } catch (Throwable t) {
            throw Native.unexpected(t);
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
        } catch (Throwable t) {
            throw Native.unexpected(t);
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
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) MSYNC.invokeExact(state, range, range.byteSize(), MS_SYNC);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc != 0) {
            throw NativeException.of("msync", Native.errno(state),
                    "address 0x" + Long.toHexString(range.address()) + ", length " + range.byteSize());
        }
    }

    private static final long PAGE = pageSize();

    /** mmap(2); returns the mapping as a segment of {@code length} bytes, unbounded to any arena (caller owns it). */
    public static MemorySegment mmap(long length, int prot, int flags, int fd, long offset) throws NativeException {
        // MAP_FAILED is (void *) -1: negative as a long, as call() wants a failure
        long address = call("mmap", "length " + length + ", prot 0x" + Integer.toHexString(prot) + ", flags 0x"
                        + Integer.toHexString(flags) + ", fd " + fd + ", offset " + offset,
                state -> ((MemorySegment) MMAP.invokeExact(state, MemorySegment.NULL, length, prot, flags, fd, offset)).address());
        return Native.sized(MemorySegment.ofAddress(address), length);
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
            return Native.owned(raw, length, owner, unused -> {
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
        call("munmap", "address 0x" + Long.toHexString(mapping.address()) + ", length " + mapping.byteSize(),
                state -> (int) MUNMAP.invokeExact(state, mapping, mapping.byteSize()));
    }

    /**
     * One call into native code and back, doing nothing there (~10 ns). Its worth is the way back: a thread
     * returning from native code takes the exceptions that were posted to it asynchronously. HotSpot answers a
     * SIGBUS inside an Unsafe access (a {@code MemorySegment} copy, fill or get on a mapping whose file was
     * truncated, or a poisoned pmem line) by skipping the access and posting {@code InternalError} to the
     * thread, which throws it at its next safepoint poll, possibly several calls later. Calling this right
     * after such an access makes it throw here, inside the caller's try, before the caller reports success.
     * {@code value} goes through abs(3) and back: a load made only for its fault, fed in here, cannot be dropped.
     */
    public static int nativeRoundTrip(int value) {
        try {
            return (int) ABS.invokeExact(value);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }
}
