package io.pmemblk.pmem;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.LibraryProbe;
import io.pmemblk.posix.Native;
import io.pmemblk.posix.NativeException;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.util.Optional;

import static io.pmemblk.posix.Native.CRITICAL;
import static io.pmemblk.posix.Native.ERRNO;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * PMDK's libpmem (libpmem.so.1, PMDK 1.12), bound once through FFM. {@link #load()} is empty when the
 * library is not installed, so callers fall back to a plain file mapping. Signatures and flags from
 * pmem/pmdk doc/libpmem (pmem_map_file.3, pmem_memmove_persist.3, pmem_is_pmem.3).
 *
 * <p>The one binding class outside io.pmemblk.posix: it loads a library of its own, which is this module's own
 * native access (the launcher grants it by name, and refuses it to the rest). Errno, its capture buffer and the
 * handling of invokeExact's Throwable are {@link Native}'s, as for libc.
 */
public final class Libpmem {
    public static final String SONAME = "libpmem.so.1";

    // pmem_map_file flags
    public static final int PMEM_FILE_CREATE = 1;
    public static final int PMEM_FILE_EXCL = 2;
    // pmem_memcpy / pmem_memset flags
    public static final int PMEM_F_MEM_NODRAIN = 1;
    public static final int PMEM_F_MEM_NONTEMPORAL = 2;

    private static final LibraryProbe<Libpmem> LOADED = new LibraryProbe<>(Libpmem::probe);
    private static volatile String unavailableReason = "not probed";

    /**
     * Longest range passed to a critical downcall. A critical call keeps its thread in the Java state, so a
     * safepoint (every GC, every deoptimisation) waits for it to return, page faults included: a 4 GiB memset
     * in one critical call stalled 4k reads on another connection for 17.6 s (measured, -Xlog:safepoint), and
     * even 1 MiB chunks stalled them for up to 310 ms while the first touch of a tmpfs file faulted its pages in.
     * Longer ranges take a plain handle: the thread is then "in native" and a safepoint does not wait for it.
     * 64 KiB is at most 16 page faults; the transition the plain handle adds (~20 ns) is lost in a 64 KiB copy.
     */
    static final long CRITICAL_MAX = 64 << 10;

    /**
     * The bound functions. Static finals, so the JIT treats each handle as a constant and inlines the downcall
     * into its caller; only then can the slices passed to it stay off the heap (with instance fields they
     * escaped: 120 bytes per FUA write, measured). Initialising this class loads libpmem; {@link #probe()}
     * turns a failure there into an empty {@link #load()}.
     */
    // Restricted calls, each safe as written: libraryLookup opens the one library this module is granted native
    // access for; every downcallHandle's descriptor is the C signature of pmem_map_file.3, pmem_flush.3,
    // pmem_memmove_persist.3, pmem_errormsg.3 and pmem_check_version.3 (a wrong one would corrupt the stack);
    // withTargetLayout bounds the C strings pmem_errormsg and pmem_check_version return to 1024 bytes, which
    // getString reads only up to their NUL.
    @SuppressWarnings("restricted")
    private static final class Bound {
        static final SymbolLookup LIB = SymbolLookup.libraryLookup(SONAME, Arena.global());
        static final Linker LINKER = Linker.nativeLinker();
        static final MethodHandle MAP_FILE = LINKER.downcallHandle(find(LIB, "pmem_map_file"),
                FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, ADDRESS, ADDRESS), ERRNO);
        static final MethodHandle UNMAP = LINKER.downcallHandle(find(LIB, "pmem_unmap"),
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG));
        // Copies, flushes and drains of at most CRITICAL_MAX bytes are short, never block and never call back:
        // critical downcalls skip the thread-state transition that would otherwise cost more than a 4 KiB copy.
        static final MethodHandle FLUSH = LINKER.downcallHandle(find(LIB, "pmem_flush"),
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_LONG), CRITICAL);
        static final MethodHandle FLUSH_LONG = LINKER.downcallHandle(find(LIB, "pmem_flush"),
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_LONG));
        // msync is a system call that can wait for the disk: never critical.
        static final MethodHandle MSYNC = LINKER.downcallHandle(find(LIB, "pmem_msync"),
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG), ERRNO);
        // void *pmem_memcpy(...), void *pmem_memset(...): the returned dst is not wanted, and bound as void no
        // segment is made for it (SysV x86-64 returns it in rax, which the caller may ignore).
        static final MethodHandle MEMCPY = LINKER.downcallHandle(find(LIB, "pmem_memcpy"),
                FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT), CRITICAL);
        static final MethodHandle MEMCPY_LONG = LINKER.downcallHandle(find(LIB, "pmem_memcpy"),
                FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT));
        static final MethodHandle MEMSET = LINKER.downcallHandle(find(LIB, "pmem_memset"),
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG, JAVA_INT), CRITICAL);
        static final MethodHandle MEMSET_LONG = LINKER.downcallHandle(find(LIB, "pmem_memset"),
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG, JAVA_INT));
        static final MethodHandle DRAIN = LINKER.downcallHandle(find(LIB, "pmem_drain"), FunctionDescriptor.ofVoid(), CRITICAL);
        static final MethodHandle ERRORMSG = LINKER.downcallHandle(find(LIB, "pmem_errormsg"),
                FunctionDescriptor.of(ADDRESS.withTargetLayout(MemoryLayout.sequenceLayout(1024, ValueLayout.JAVA_BYTE))));
        static final MethodHandle CHECK_VERSION = LINKER.downcallHandle(find(LIB, "pmem_check_version"),
                FunctionDescriptor.of(ADDRESS.withTargetLayout(MemoryLayout.sequenceLayout(1024, ValueLayout.JAVA_BYTE)), JAVA_INT, JAVA_INT));
    }

    private Libpmem() {}

    private static MemorySegment find(SymbolLookup lib, String name) {
        return lib.find(name).orElseThrow(() -> new UnsatisfiedLinkError(SONAME + " has no symbol " + name));
    }

    /** libpmem if it loads and is compatible (major 1, minor >= 1); empty otherwise, see {@link #unavailableReason()}. */
    public static Optional<Libpmem> load() {
        return LOADED.get();
    }

    private static Optional<Libpmem> probe() {
        try {
            MemorySegment err = (MemorySegment) Bound.CHECK_VERSION.invokeExact(1, 1);
            if (!err.equals(MemorySegment.NULL)) {
                unavailableReason = SONAME + " is incompatible: " + err.getString(0);
                return Optional.empty();
            }
            unavailableReason = null;
            return Optional.of(new Libpmem());
        } catch (ExceptionInInitializerError | UnsatisfiedLinkError | NoClassDefFoundError e) {
            Throwable why = e instanceof ExceptionInInitializerError && e.getCause() != null ? e.getCause() : e;
            if (why instanceof IllegalCallerException) {
                // The JVM refused this module native access (--illegal-native-access=deny without a grant to it):
                // installing the library would not help, the command line would.
                unavailableReason = SONAME + " could not be loaded: this JVM does not grant native access to "
                        + moduleName() + " (" + why.getMessage() + "); add --enable-native-access=" + moduleName()
                        + " to the java command line, as pmemblk's launcher does (pmemblk.args)";
            } else {
                unavailableReason = SONAME + " could not be loaded (" + why.getMessage()
                        + "); install Debian's libpmem1 for the real persistent-memory path";
            }
            return Optional.empty();
        } catch (Throwable t) {
            unavailableReason = SONAME + " failed to initialise: " + t;
            return Optional.empty();
        }
    }

    /** The name --enable-native-access takes for this class's module: io.pmemblk.pmem, or ALL-UNNAMED on the class path. */
    private static String moduleName() {
        Module m = Libpmem.class.getModule();
        return m.isNamed() ? m.getName() : "ALL-UNNAMED";
    }

    /** Why {@link #load()} is empty, or null when libpmem is in use. */
    public static String unavailableReason() {
        load();
        return unavailableReason;
    }

    /** A mapping made by pmem_map_file: its address range and whether stores reach persistence by cache flushes. */
    public record Mapping(MemorySegment segment, boolean isPmem) {}

    /**
     * pmem_map_file(path, len, flags, mode, &mapped_len, &is_pmem). With len 0 and no CREATE it maps the whole
     * file or device-DAX node. The returned segment is unbounded to any arena: {@link #unmap} releases it.
     */
    // reinterpret is restricted: safe here, as the length is the one pmem_map_file reports it mapped (mapped_len).
    @SuppressWarnings("restricted")
    public Mapping mapFile(String path, long length, int flags, int mode) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = Native.callState();
            MemorySegment mapped = a.allocate(JAVA_LONG);
            MemorySegment isPmem = a.allocate(JAVA_INT);
            MemorySegment p;
            try {
                p = (MemorySegment) Bound.MAP_FILE.invokeExact(state, a.allocateFrom(path), length, flags, mode, mapped, isPmem);
            } catch (Throwable t) {
                throw Native.unexpected(t);
            }
            if (p.equals(MemorySegment.NULL)) {
                throw failed("pmem_map_file(" + path + ", length " + length + ", flags " + flags + ")", Native.errno(state));
            }
            long len = mapped.get(JAVA_LONG, 0);
            return new Mapping(p.reinterpret(len), isPmem.get(JAVA_INT, 0) != 0);
        }
    }

    public void unmap(MemorySegment mapping) throws NativeException {
        int rc;
        try {
            rc = (int) Bound.UNMAP.invokeExact(mapping, mapping.byteSize());
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc != 0) {
            throw new NativeException("pmem_unmap(0x" + Long.toHexString(mapping.address()) + ", "
                    + mapping.byteSize() + ") failed: " + errormsg(), 0);
        }
    }

    /*
     * The methods below take segments, not addresses: the linker checks that each segment is alive and keeps
     * its arena from closing for the length of the call, so a copy into a region closed under it is an
     * IllegalStateException for one request instead of a SIGSEGV, and asSlice() has checked the bounds.
     */

    /** Writes back the CPU cache lines of {@code range} (clwb/clflushopt) without waiting: a drain on this thread completes it. */
    public void flush(MemorySegment range) {
        try {
            long n = range.byteSize();
            if (n <= CRITICAL_MAX) {
                Bound.FLUSH.invokeExact(range, n);
            } else {
                Bound.FLUSH_LONG.invokeExact(range, n);
            }
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** msync(MS_SYNC) of the pages under {@code range} through libpmem (which page-aligns it), for mappings that are not real pmem. */
    public void msync(MemorySegment range) throws NativeException {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) Bound.MSYNC.invokeExact(state, range, range.byteSize());
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc != 0) {
            throw failed("pmem_msync(0x" + Long.toHexString(range.address()) + ", " + range.byteSize() + ")",
                    Native.errno(state));
        }
    }

    /**
     * pmem_memcpy of {@code src} into {@code dst} (same size): on real pmem, non-temporal stores (or, below
     * libpmem's 256-byte threshold, stores and flushes), so with {@link #PMEM_F_MEM_NODRAIN} the data is
     * persistent after a drain on this thread.
     */
    public void memcpy(MemorySegment dst, MemorySegment src, int flags) {
        long n = dst.byteSize();
        if (src.byteSize() != n) {
            throw new IllegalArgumentException("pmem_memcpy of " + src.byteSize() + " bytes into " + n + " bytes");
        }
        try {
            if (n <= CRITICAL_MAX) {
                Bound.MEMCPY.invokeExact(dst, src, n, flags);
            } else {
                Bound.MEMCPY_LONG.invokeExact(dst, src, n, flags);
            }
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** pmem_memset of all of {@code dst}; as {@link #memcpy}, persistent after a drain with NODRAIN. */
    public void memset(MemorySegment dst, int value, int flags) {
        long n = dst.byteSize();
        try {
            if (n <= CRITICAL_MAX) {
                Bound.MEMSET.invokeExact(dst, value, n, flags);
            } else {
                Bound.MEMSET_LONG.invokeExact(dst, value, n, flags);
            }
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * Waits until this thread's earlier flushes and non-temporal stores have reached the persistence domain
     * (x86-64: sfence). It orders nothing issued by other threads.
     */
    public void drain() {
        try {
            Bound.DRAIN.invokeExact();
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** A failed call with errno: libpmem's own message (it names the step that failed), then errno's. */
    private NativeException failed(String call, int errno) {
        return new NativeException(call + " failed: " + errormsg() + " (errno " + errno + ", " + Errno.name(errno) + ")", errno);
    }

    private String errormsg() {
        try {
            MemorySegment m = (MemorySegment) Bound.ERRORMSG.invokeExact();
            return m.equals(MemorySegment.NULL) ? "unknown error" : m.getString(0);
        } catch (Throwable t) {
            return "unknown error";
        }
    }
}
