package io.pmemblk.vhost.memory;

import java.lang.foreign.MemorySegment;

/**
 * One region of guest RAM as a vhost-user memory table entry describes it (VhostUserMemoryRegion,
 * docs/interop/vhost-user.rst "Memory region description"), once mapped: {@code size} bytes at guest-physical
 * {@code guestPhys}, at {@code userAddr} in QEMU's address space, here as {@code mapping} (the region's byte 0 at
 * the mapping's byte 0: mmap base plus mmap_offset). {@code iova}: where the DMA engine reaches byte 0
 * ({@code BlockDriver.registerMemory}), or {@code Request.NO_IOVA}.
 *
 * <p>The addresses are u64 from the wire, compared unsigned; a region that would wrap past 2^64 in either address
 * space, or that its mapping does not cover, is refused here, so lookups need no overflow checks of their own.
 * The record owns nothing: whoever mapped {@code mapping} unmaps it.
 */
public record GuestRegion(long guestPhys, long size, long userAddr, MemorySegment mapping, long iova) {
    public GuestRegion {
        if (size <= 0) {
            throw new IllegalArgumentException("guest memory region at gpa 0x" + Long.toHexString(guestPhys)
                    + " of " + Long.toUnsignedString(size) + " bytes: allowed 1..2^63-1 bytes");
        }
        // Unsigned: an end below the start wrapped (ending exactly at 2^64 counts as wrapping: no RAM is there).
        if (Long.compareUnsigned(guestPhys + size, guestPhys) < 0 || Long.compareUnsigned(userAddr + size, userAddr) < 0) {
            throw new IllegalArgumentException("guest memory region gpa 0x" + Long.toHexString(guestPhys) + " uaddr 0x"
                    + Long.toHexString(userAddr) + " size 0x" + Long.toHexString(size)
                    + " wraps past the end of the 64-bit address space");
        }
        if (mapping.byteSize() < size) {
            throw new IllegalArgumentException("guest memory region gpa 0x" + Long.toHexString(guestPhys) + " size 0x"
                    + Long.toHexString(size) + " has a mapping of only " + mapping.byteSize() + " bytes");
        }
        if (iova < 0 && iova != -1) {
            throw new IllegalArgumentException("guest memory region gpa 0x" + Long.toHexString(guestPhys) + " iova 0x"
                    + Long.toHexString(iova) + ": allowed an engine address or Request.NO_IOVA (-1)");
        }
    }

    /** The guest-physical address one past the end (above guestPhys, unsigned). */
    public long guestEnd() {
        return guestPhys + size;
    }

    public long userEnd() {
        return userAddr + size;
    }

    /** The engine address of the byte at {@code offset} in this region, or NO_IOVA. */
    public long iovaAt(long offset) {
        return iova == -1 ? -1 : iova + offset;
    }

    @Override
    public String toString() {
        return "GuestRegion[gpa 0x" + Long.toHexString(guestPhys) + "..0x" + Long.toHexString(guestEnd()) + " uaddr 0x"
                + Long.toHexString(userAddr) + " size 0x" + Long.toHexString(size)
                + (iova == -1 ? " no-iova" : " iova 0x" + Long.toHexString(iova)) + "]";
    }
}
