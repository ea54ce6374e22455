package io.pmemblk.posix;

import java.lang.foreign.AddressLayout;
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
import java.util.function.Consumer;

/**
 * How this module calls native code, written once (Lucene's {@code PosixNativeAccess.findFunction}): symbol lookup,
 * the linker, errno captured one way, variadic and critical functions declared as such, and the restricted methods
 * of the FFM API, whose warnings are suppressed here and nowhere else. Every libc binding class of this module
 * ({@link Libc}, {@link Mman}, {@link FileCalls}, {@link Sockets}, {@link FileIo}, {@link IoUringSyscalls},
 * {@link EdgeWait}, ...) declares its functions as {@code static final} handles made by {@link #libc}, so the JIT treats each as a constant and inlines the downcall
 * into its caller.
 *
 * <p>Binding stays package-private on purpose: this module has native access, and a public "bind any symbol"
 * would hand it to every module the launcher refuses it to. What other binding classes may share (libpmem's,
 * which loads its own library with its own grant) is public: the errno option, the per-thread capture buffer,
 * errno's value, and what to do with a Throwable from {@code invokeExact}.
 */
@SuppressWarnings("restricted")
public final class Native {
    private Native() {}

    private static final Linker LINKER = Linker.nativeLinker();
    /** libc (and whatever else the JVM itself loaded). */
    private static final SymbolLookup LIBC = LINKER.defaultLookup();
    private static final StructLayout CALL_STATE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO_VALUE = CALL_STATE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    /**
     * One capture buffer per thread: the per-request calls (pread/pwrite, msync per FUA request, io_uring_enter per
     * batch, sendmsg, FIONREAD per socket read) allocate nothing. A thread makes one call at a time and reads errno
     * before its next one, so one buffer serves all of a thread's calls.
     */
    private static final ThreadLocal<MemorySegment> THREAD_STATE =
            ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(CALL_STATE));

    /**
     * Capture errno: the handle then takes the capture buffer ({@link #callState()}) as its first argument, and a
     * failed call's errno is read back with {@link #errno}. Without it errno is lost to the JVM's own calls.
     */
    public static final Linker.Option ERRNO = Linker.Option.captureCallState("errno");
    /**
     * No thread-state transition (~20 ns less per call): only for calls that are always short, never block and
     * never call back, as a safepoint waits for a critical call to return, page faults included.
     */
    public static final Linker.Option CRITICAL = Linker.Option.critical(false);

    /**
     * A variadic C function ({@code int ioctl(int, unsigned long, ...)}): its arguments from {@code index} on are
     * passed as C passes variadic ones (on x86-64, %al says how many are in vector registers).
     */
    static Linker.Option variadicFrom(int index) {
        return Linker.Option.firstVariadicArg(index);
    }

    /**
     * A downcall handle for libc's {@code name} with {@code descriptor}; invoke it with {@code invokeExact} from a
     * {@code static final} field.
     * @throws UnsatisfiedLinkError when libc has no such symbol (class initialisation of the binding class fails)
     */
    static MethodHandle libc(String name, FunctionDescriptor descriptor, Linker.Option... options) {
        MemorySegment symbol = LIBC.find(name)
                .orElseThrow(() -> new UnsatisfiedLinkError("libc has no symbol " + name));
        return LINKER.downcallHandle(symbol, descriptor, options);
    }

    /** A pointer to at most {@code bytes} bytes, for a function that returns one (a C string, strerror's). */
    static AddressLayout pointerTo(long bytes) {
        return ValueLayout.ADDRESS.withTargetLayout(MemoryLayout.sequenceLayout(bytes, ValueLayout.JAVA_BYTE));
    }

    /** What the kernel mapped at {@code address}, {@code length} bytes of it, owned by no arena. */
    static MemorySegment sized(MemorySegment address, long length) {
        return address.reinterpret(length);
    }

    /** {@code address} as {@code length} bytes owned by {@code owner}, {@code cleanup} run when it closes. */
    static MemorySegment owned(MemorySegment address, long length, Arena owner, Consumer<MemorySegment> cleanup) {
        return address.reinterpret(length, owner, cleanup);
    }

    /** This thread's errno capture buffer, the first argument of every handle bound with {@link #ERRNO}. */
    public static MemorySegment callState() {
        return THREAD_STATE.get();
    }

    /** The errno the last call with {@code state} left. */
    public static int errno(MemorySegment state) {
        return (int) ERRNO_VALUE.get(state, 0L);
    }

    /**
     * What to throw for a Throwable out of {@code invokeExact}: {@code catch (Throwable t) { throw unexpected(t); }}.
     * A downcall throws only unchecked exceptions (a closed segment's IllegalStateException, a pending async
     * exception's InternalError); they go on as they are. Anything else is a bug in a binding: AssertionError.
     */
    public static RuntimeException unexpected(Throwable t) {
        if (t instanceof RuntimeException e) {
            throw e;
        }
        if (t instanceof Error e) {
            throw e;
        }
        throw new AssertionError("a downcall threw a checked exception", t);
    }
}
