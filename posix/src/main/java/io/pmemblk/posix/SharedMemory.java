package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;

/**
 * Memory shared between processes through a file descriptor: another process's memfd mapped here (QEMU's guest
 * RAM, passed with SET_MEM_TABLE / ADD_MEM_REG), and memfds of our own for the other side to map (the
 * vhost-user inflight region). Constants from {@code <sys/mman.h>} and {@code <linux/memfd.h>},
 * {@code <linux/fcntl.h>} (x86-64, printed by a C program against glibc 2.36, as in the vhost-user note).
 */
public final class SharedMemory {
    private SharedMemory() {}

    /** {@code <sys/mman.h>}: no swap reserved for the mapping (the other process already backs it). */
    public static final int MAP_NORESERVE = 0x4000;
    /** {@code <linux/memfd.h>}. */
    public static final int MFD_CLOEXEC = 0x1, MFD_ALLOW_SEALING = 0x2;
    /** {@code <linux/fcntl.h>}: F_ADD_SEALS = F_LINUX_SPECIFIC_BASE (1024) + 9, and the seals. */
    public static final int F_ADD_SEALS = 1033, F_SEAL_SEAL = 0x1, F_SEAL_SHRINK = 0x2, F_SEAL_GROW = 0x4;
    /** {@code <linux/fcntl.h>}: F_GET_SEALS = F_LINUX_SPECIFIC_BASE (1024) + 10. */
    public static final int F_GET_SEALS = 1034;

    /** int memfd_create(const char *name, unsigned int flags): glibc 2.27. */
    private static final MethodHandle MEMFD_CREATE = libc("memfd_create",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT), ERRNO);

    /**
     * Maps {@code length} bytes of {@code fd} from {@code offset} (a multiple of the page size) read-write,
     * {@code MAP_SHARED | MAP_NORESERVE}, as libvhost-user maps guest memory ({@code vu_set_mem_table_exec}):
     * stores are seen by the other process at once. Unmapped when {@code owner} closes; any access after that
     * throws IllegalStateException instead of touching unmapped memory. The descriptor may be closed right after.
     */
    public static MemorySegment map(int fd, long offset, long length, Arena owner) throws NativeException {
        if (offset < 0 || length <= 0) {
            throw new IllegalArgumentException("mapping fd " + fd + ": offset " + offset + " and length " + length
                    + " are not allowed; allowed: offset >= 0, length > 0");
        }
        MemorySegment mapping = Mman.map(fd, length, Mman.PROT_READ | Mman.PROT_WRITE, Mman.MAP_SHARED | MAP_NORESERVE,
                offset, owner);
        MappedFiles.register(mapping, fd, offset, owner); // a DMA engine in another process maps it by this fd
        return mapping;
    }

    /**
     * {@code size} zero bytes (rounded up to whole pages) of a new memfd called {@code name}, mapped shared and
     * recorded in {@link MappedFiles}: memory another process can be given by descriptor (a vfio-user device's
     * DMA_MAP), where {@code Arena.allocate} gives memory only this process can see. Unmapped when {@code owner}
     * closes; the memfd lives as long as a mapping or a descriptor of it does.
     */
    public static MemorySegment allocate(String name, long size, Arena owner) throws NativeException {
        long page = Libc.pageSize();
        long bytes = (size + page - 1) & -page;
        int fd = memfd(name, bytes);
        try {
            return map(fd, 0, bytes, owner).asSlice(0, size);
        } finally {
            Libc.close(fd);
        }
    }

    /**
     * A new memfd of {@code size} zero bytes, close-on-exec and open to seals ({@link #seal}); {@code name} shows
     * in /proc/PID/fd. The caller owns the descriptor.
     */
    public static int memfd(String name, long size) throws NativeException {
        int fd;
        try (Arena a = Arena.ofConfined()) {
            MemorySegment n = a.allocateFrom(name);
            fd = (int) Libc.call("memfd_create", name,
                    state -> (int) MEMFD_CREATE.invokeExact(state, n, MFD_CLOEXEC | MFD_ALLOW_SEALING));
        }
        try {
            FileCalls.ftruncate(fd, size);
        } catch (NativeException e) {
            try {
                Libc.close(fd);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
        return fd;
    }

    /**
     * Fixes the memfd's size for good (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL), as libvhost-user seals the
     * inflight region it hands out: whoever maps it can never be cut short by a truncate (a SIGBUS).
     */
    public static void seal(int fd) throws NativeException {
        int seals = F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;
        Libc.call("fcntl", "fd " + fd + ", F_ADD_SEALS GROW|SHRINK|SEAL",
                state -> (int) Libc.FCNTL_INT.invokeExact(state, fd, F_ADD_SEALS, seals));
    }

    /**
     * The seals on {@code fd} (F_SEAL_* bits), or -1 when its file cannot carry seals at all (fcntl F_GET_SEALS
     * answers EINVAL for anything but a memfd, shmem or hugetlbfs file). A mapping of a file without
     * F_SEAL_SHRINK faults (SIGBUS) wherever the other side truncates it.
     */
    public static int seals(int fd) throws NativeException {
        try {
            return (int) Libc.call("fcntl", "fd " + fd + ", F_GET_SEALS",
                    state -> (int) Libc.FCNTL_INT.invokeExact(state, fd, F_GET_SEALS, 0));
        } catch (NativeException e) {
            if (e.errno() == Errno.EINVAL) {
                return -1;
            }
            throw e;
        }
    }
}
