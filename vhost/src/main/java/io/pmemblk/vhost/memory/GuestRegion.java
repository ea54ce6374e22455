package io.pmemblk.vhost.memory;

import java.lang.foreign.MemorySegment;

/**
 * STUB of contract C4 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one. One guest memory region: where the guest sees it, where QEMU
 * has it, our mapping of it, and its iova (or -1).
 */
public record GuestRegion(long guestPhys, long size, long userAddr, MemorySegment mapping, long iova) {}
