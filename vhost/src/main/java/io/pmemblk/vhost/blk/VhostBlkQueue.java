package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EventFd;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.vhost.memory.GuestMemory;

import java.lang.foreign.MemorySegment;
import java.util.function.Supplier;

/**
 * STUB of contract C5 (owner: virtq), only so that proto's session compiles before virtq's branch is merged:
 * at the merge, virtq's file replaces this one. It serves nothing: {@link #stop} returns the base it started at.
 */
public final class VhostBlkQueue {
    private final int base;

    public VhostBlkQueue(int index, int size, long descAddr, long availAddr, long usedAddr, int baseIndex,
                         long features, EventFd kick, EventFd call, FrontendQueue queue,
                         Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device) {
        this.base = baseIndex;
    }

    public void start() {}

    public int stop() throws InterruptedException {
        return base;
    }

    public void writeCache(boolean enabled) {}

    public boolean broken() {
        return false;
    }
}
