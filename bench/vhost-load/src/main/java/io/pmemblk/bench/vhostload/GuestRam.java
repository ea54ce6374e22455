package io.pmemblk.bench.vhostload;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * The load's guest RAM: one memfd, sealed against shrinking as QEMU's memory-backend-memfd is (the back-end
 * refuses RAM that could shrink under it), mapped here; guest-physical address = offset in it, and the front end's
 * own address of it is what SET_MEM_TABLE and SET_VRING_ADDR carry, as QEMU's userspace_addr.
 */
final class GuestRam implements AutoCloseable {
    private final Arena arena = Arena.ofShared();
    private final int fd;
    private final MemorySegment view;

    GuestRam(long bytes) throws NativeException {
        fd = SharedMemory.memfd("vhost-load-guest-ram", bytes);
        try {
            SharedMemory.seal(fd);
            view = SharedMemory.map(fd, 0, bytes, arena);
        } catch (NativeException | RuntimeException e) {
            Libc.close(fd);
            arena.close();
            throw e;
        }
    }

    int fd() {
        return fd;
    }

    long size() {
        return view.byteSize();
    }

    long userAddress(long gpa) {
        return view.address() + gpa;
    }

    /** The guest's bytes at {@code gpa}: a view, owned by this. */
    MemorySegment at(long gpa, long len) {
        return view.asSlice(gpa, len);
    }

    @Override
    public void close() throws NativeException {
        Libc.close(fd);
        arena.close();
    }
}
