package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Errno.EAGAIN;
import static io.pmemblk.posix.Errno.EBUSY;
import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Libc.call;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static io.pmemblk.posix.Native.variadicFrom;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The three io_uring system calls, through libc's variadic {@code syscall(long number, ...)} because glibc has no
 * wrappers for them (and liburing is not used). The ring logic lives in {@code io.pmemblk.uring}, which needs no
 * native access of its own: everything that binds a call or gives a raw address a size is in this module.
 *
 * <p>Syscall numbers: {@code arch/x86/entry/syscalls/syscall_64.tbl} (Linux 5.1+; unchanged through 6.18).
 * No handle is {@code Linker.Option.critical}: io_uring_enter with GETEVENTS blocks, and setup/register pin
 * pages, so none of them is "always very short".
 */
public final class IoUringSyscalls {
    private IoUringSyscalls() {}

    /** x86-64 syscall numbers, {@code arch/x86/entry/syscalls/syscall_64.tbl}. */
    public static final long SYS_IO_URING_SETUP = 425, SYS_IO_URING_ENTER = 426, SYS_IO_URING_REGISTER = 427;

    // Integers are passed as long (the kernel reads full registers; variadic ints would leave the upper half
    // undefined). Pointers are passed as segments, so the linker keeps their memory alive during the call.
    /** io_uring_setup(u32 entries, struct io_uring_params *p) */
    private static final MethodHandle SETUP = libc("syscall",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS), ERRNO, variadicFrom(1));
    /** io_uring_enter(unsigned fd, u32 to_submit, u32 min_complete, u32 flags, const void *argp, size_t argsz) */
    private static final MethodHandle ENTER = libc("syscall",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG),
            ERRNO, variadicFrom(1));
    /** io_uring_register(unsigned fd, unsigned opcode, void *arg, unsigned nr_args) */
    private static final MethodHandle REGISTER = libc("syscall",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG),
            ERRNO, variadicFrom(1));

    /**
     * io_uring_setup(2). {@code params} is the 120-byte {@code struct io_uring_params}, filled in by the caller
     * (flags, cq_entries) and by the kernel (offsets, features). Returns the ring's fd.
     */
    public static int setup(int entries, MemorySegment params) throws NativeException {
        return (int) call("io_uring_setup", "entries " + entries + ", flags 0x"
                        + Integer.toHexString(params.get(java.lang.foreign.ValueLayout.JAVA_INT, 8)),
                state -> (long) SETUP.invokeExact(state, SYS_IO_URING_SETUP, (long) entries, params));
    }

    /**
     * io_uring_enter(2) without an argument block. Returns the number of SQEs consumed (non-negative), or
     * {@code -EINTR}, {@code -EAGAIN} or {@code -EBUSY}, which the caller handles (retry, or reap and retry);
     * any other failure is a {@link NativeException}. Allocates nothing.
     */
    public static int enter(int ringFd, int toSubmit, int minComplete, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        long rc;
        try {
            rc = (long) ENTER.invokeExact(state, SYS_IO_URING_ENTER, (long) ringFd,
                    toSubmit & 0xFFFF_FFFFL, minComplete & 0xFFFF_FFFFL, flags & 0xFFFF_FFFFL, 0L, 0L);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc >= 0) {
            return (int) rc;
        }
        int errno = Native.errno(state);
        if (errno == EINTR || errno == EAGAIN || errno == EBUSY) {
            return -errno;
        }
        throw NativeException.of("io_uring_enter", errno, "fd " + ringFd + ", to_submit " + toSubmit
                + ", min_complete " + minComplete + ", flags 0x" + Integer.toHexString(flags));
    }

    /** io_uring_register(2); returns the (non-negative) result. */
    public static int register(int ringFd, int opcode, MemorySegment arg, int nrArgs) throws NativeException {
        return (int) call("io_uring_register", "fd " + ringFd + ", opcode " + opcode + ", nr_args " + nrArgs,
                state -> (long) REGISTER.invokeExact(state, SYS_IO_URING_REGISTER, (long) ringFd, (long) opcode, arg,
                        nrArgs & 0xFFFF_FFFFL));
    }

    /**
     * mmap(2)s {@code length} bytes of a ring ({@code MAP_SHARED | MAP_POPULATE}, read-write) at one of the
     * IORING_OFF_* offsets and ties the mapping to {@code owner}: closing the arena unmaps it, and any later access
     * through the returned segment throws IllegalStateException instead of touching unmapped memory.
     */
    public static MemorySegment mapRing(int ringFd, long length, long offset, Arena owner) throws NativeException {
        return Mman.map(ringFd, length, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED | Mman.MAP_POPULATE, offset, owner);
    }
}
