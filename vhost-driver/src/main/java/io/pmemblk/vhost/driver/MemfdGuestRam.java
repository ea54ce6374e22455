package io.pmemblk.vhost.driver;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A front end's guest RAM: one memfd, sealed against shrinking as QEMU's memory-backend-memfd is (the back-end
 * refuses RAM that could shrink under it) unless a hostile test asks otherwise, mapped here; guest-physical address
 * = offset in it, and the front end's own address of it is what SET_MEM_TABLE and SET_VRING_ADDR carry, as QEMU's
 * userspace_addr.
 */
public final class MemfdGuestRam implements GuestPhysical, AutoCloseable {
    private final Arena arena = Arena.ofShared();
    private final int fd;
    private final MemorySegment view;

    /** {@code bytes} of RAM in a memfd named {@code name}, sealed when {@code sealed}. */
    public MemfdGuestRam(String name, long bytes, boolean sealed) throws NativeException {
        fd = SharedMemory.memfd(name, bytes);
        try {
            if (sealed) {
                SharedMemory.seal(fd);
            }
            view = SharedMemory.map(fd, 0, bytes, arena);
        } catch (NativeException | RuntimeException e) {
            Libc.close(fd);
            arena.close();
            throw e;
        }
    }

    /** The memfd (SET_MEM_TABLE's file descriptor). */
    public int fd() {
        return fd;
    }

    public long size() {
        return view.byteSize();
    }

    @Override
    public long user(long gpa) {
        return view.address() + gpa;
    }

    /** The guest's bytes at {@code gpa}: a view, owned by this. */
    @Override
    public MemorySegment at(long gpa, long len) {
        return view.asSlice(gpa, len);
    }

    @Override
    public void close() throws NativeException {
        Libc.close(fd);
        arena.close();
    }
}
