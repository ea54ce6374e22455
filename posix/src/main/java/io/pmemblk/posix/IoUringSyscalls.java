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
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The three io_uring system calls, through libc's variadic {@code syscall(long number, ...)} because glibc has no
 * wrappers for them (and liburing is not used). The ring logic lives in {@code io.pmemblk.uring}, which needs no
 * native access of its own: everything that touches {@link Linker} or gives a raw address a size is here.
 *
 * <p>Syscall numbers: {@code arch/x86/entry/syscalls/syscall_64.tbl} (Linux 5.1+; unchanged through 6.18).
 * No handle is {@code Linker.Option.critical}: io_uring_enter with GETEVENTS blocks, and setup/register pin
 * pages, so none of them is "always very short".
 */
public final class IoUringSyscalls {
    private IoUringSyscalls() {}

    /** x86-64 syscall numbers, {@code arch/x86/entry/syscalls/syscall_64.tbl}. */
    public static final long SYS_IO_URING_SETUP = 425, SYS_IO_URING_ENTER = 426, SYS_IO_URING_REGISTER = 427;
    /** {@code <asm-generic/errno-base.h>}: the io_uring_enter errors the ring handles itself instead of throwing. */
    public static final int EINTR = 4, EAGAIN = 11, EBUSY = 16;

    private static final Linker LINKER = Linker.nativeLinker();
    private static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO = CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    private static final Linker.Option CAPTURE_ERRNO = Linker.Option.captureCallState("errno");
    private static final Linker.Option VARIADIC_AFTER_NUMBER = Linker.Option.firstVariadicArg(1);
    private static final MemorySegment SYSCALL = LINKER.defaultLookup().find("syscall")
            .orElseThrow(() -> new UnsatisfiedLinkError("libc has no symbol syscall"));

    // Integers are passed as long (the kernel reads full registers; variadic ints would leave the upper half
    // undefined). Pointers are passed as segments, so the linker keeps their memory alive during the call.
    /** io_uring_setup(u32 entries, struct io_uring_params *p) */
    private static final MethodHandle SETUP = LINKER.downcallHandle(SYSCALL,
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS), CAPTURE_ERRNO, VARIADIC_AFTER_NUMBER);
    /** io_uring_enter(unsigned fd, u32 to_submit, u32 min_complete, u32 flags, const void *argp, size_t argsz) */
    private static final MethodHandle ENTER = LINKER.downcallHandle(SYSCALL,
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG),
            CAPTURE_ERRNO, VARIADIC_AFTER_NUMBER);
    /** io_uring_register(unsigned fd, unsigned opcode, void *arg, unsigned nr_args) */
    private static final MethodHandle REGISTER = LINKER.downcallHandle(SYSCALL,
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG),
            CAPTURE_ERRNO, VARIADIC_AFTER_NUMBER);

    /** errno capture buffer per thread: io_uring_enter runs per batch of requests and must allocate nothing. */
    private static final ThreadLocal<MemorySegment> CALL_STATE =
            ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(CAPTURE));

    /**
     * io_uring_setup(2). {@code params} is the 120-byte {@code struct io_uring_params}, filled in by the caller
     * (flags, cq_entries) and by the kernel (offsets, features). Returns the ring's fd.
     */
    public static int setup(int entries, MemorySegment params) throws NativeException {
        MemorySegment state = CALL_STATE.get();
        long rc;
        try {
            rc = (long) SETUP.invokeExact(state, SYS_IO_URING_SETUP, (long) entries, params);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
        if (rc < 0) {
            throw NativeException.of("io_uring_setup", errno(state), "entries " + entries + ", flags 0x"
                    + Integer.toHexString(params.get(java.lang.foreign.ValueLayout.JAVA_INT, 8)));
        }
        return (int) rc;
    }

    /**
     * io_uring_enter(2) without an argument block. Returns the number of SQEs consumed (non-negative), or
     * {@code -EINTR}, {@code -EAGAIN} or {@code -EBUSY}, which the caller handles (retry, or reap and retry);
     * any other failure is a {@link NativeException}. Allocates nothing.
     */
    public static int enter(int ringFd, int toSubmit, int minComplete, int flags) throws NativeException {
        MemorySegment state = CALL_STATE.get();
        long rc;
        try {
            rc = (long) ENTER.invokeExact(state, SYS_IO_URING_ENTER, (long) ringFd,
                    toSubmit & 0xFFFF_FFFFL, minComplete & 0xFFFF_FFFFL, flags & 0xFFFF_FFFFL, 0L, 0L);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
        if (rc >= 0) {
            return (int) rc;
        }
        int errno = errno(state);
        if (errno == EINTR || errno == EAGAIN || errno == EBUSY) {
            return -errno;
        }
        throw NativeException.of("io_uring_enter", errno, "fd " + ringFd + ", to_submit " + toSubmit
                + ", min_complete " + minComplete + ", flags 0x" + Integer.toHexString(flags));
    }

    /** io_uring_register(2); returns the (non-negative) result. */
    public static int register(int ringFd, int opcode, MemorySegment arg, int nrArgs) throws NativeException {
        MemorySegment state = CALL_STATE.get();
        long rc;
        try {
            rc = (long) REGISTER.invokeExact(state, SYS_IO_URING_REGISTER, (long) ringFd, (long) opcode, arg,
                    nrArgs & 0xFFFF_FFFFL);
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new AssertionError(t);
        }
        if (rc < 0) {
            throw NativeException.of("io_uring_register", errno(state),
                    "fd " + ringFd + ", opcode " + opcode + ", nr_args " + nrArgs);
        }
        return (int) rc;
    }

    /**
     * mmap(2)s {@code length} bytes of a ring ({@code MAP_SHARED | MAP_POPULATE}, read-write) at one of the
     * IORING_OFF_* offsets and ties the mapping to {@code owner}: closing the arena unmaps it, and any later access
     * through the returned segment throws IllegalStateException instead of touching unmapped memory.
     */
    public static MemorySegment mapRing(int ringFd, long length, long offset, Arena owner) throws NativeException {
        return Libc.map(ringFd, length, Libc.PROT_READ | Libc.PROT_WRITE, Libc.MAP_SHARED | Libc.MAP_POPULATE, offset, owner);
    }

    private static int errno(MemorySegment state) {
        return (int) ERRNO.get(state, 0L);
    }
}
