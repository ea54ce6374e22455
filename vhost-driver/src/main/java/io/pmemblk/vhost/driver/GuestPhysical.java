package io.pmemblk.vhost.driver;

import java.lang.foreign.MemorySegment;

/**
 * A guest's RAM as its driver and its vhost-user front end address it: guest-physical addresses to bytes, and to
 * the front end's own addresses of them (QEMU's userspace_addr, what SET_MEM_TABLE and SET_VRING_ADDR carry).
 */
public interface GuestPhysical {
    /** The guest's {@code len} bytes at {@code gpa}: a view, owned by the RAM. */
    MemorySegment at(long gpa, long len);

    /** The front end's own address of guest-physical {@code gpa}. */
    long user(long gpa);
}
