package io.pmemblk.vhost.virtq;

import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.FileStat;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.SharedMemory;
import io.pmemblk.vhost.memory.PinnedMemory;
import io.pmemblk.vhost.protocol.Refusal;
import io.pmemblk.vhost.protocol.VhostUserChannel;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

/**
 * The inflight region of one connection (vhost-user.rst "Inflight I/O tracking"), split layout: shared memory in
 * which each ring's {@link Inflight} marks the requests it took, so that a back-end started after this one
 * resubmits what was in flight. GET_INFLIGHT_FD makes it (a sealed memfd the front-end keeps across our restarts);
 * SET_INFLIGHT_FD hands it back, checked for its shape, size, offset and seals before it is mapped.
 */
public final class InflightRegion {
    private final VhostUserChannel channel;
    private final int maxQueues;
    private final int maxQueueSize;
    private final PinnedMemory pinned;
    private Mapped mapped;

    /** The region the front-end handed back (SET_INFLIGHT_FD), mapped. */
    private record Mapped(Arena arena, MemorySegment region, int queues, int queueSize) {}

    /**
     * @param channel      the connection whose messages carry the region
     * @param maxQueues    vhost.queues: the most queues the region may be for
     * @param maxQueueSize vhost.queue-size: the largest queue it may be for
     * @param pinned       holds the unmapping back while a ring stopped undrained may still write the region
     */
    public InflightRegion(VhostUserChannel channel, int maxQueues, int maxQueueSize, PinnedMemory pinned) {
        this.channel = channel;
        this.maxQueues = maxQueues;
        this.maxQueueSize = maxQueueSize;
        this.pinned = pinned;
    }

    /** GET_INFLIGHT_FD: a new region of the shape asked for, sealed, sent to the front-end (not mapped here). */
    public void getInflightFd(MemorySegment p, long protocolFeatures) throws IOException, Refusal {
        if ((protocolFeatures & bit(PF_INFLIGHT_SHMFD)) == 0) {
            throw new Refusal("INFLIGHT_SHMFD (protocol bit 12) was not negotiated");
        }
        int queues = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES));
        int queueSize = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE));
        checkInflightShape(queues, queueSize);
        long size = inflightQueueStride(queueSize) * queues;
        int fd = SharedMemory.memfd("pmemblk-vhost-inflight", size);
        try {
            SharedMemory.seal(fd); // the front-end maps it too, and hands it back after our restart
            MemorySegment r = channel.replyPayload();
            r.set(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE, size);
            r.set(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_OFFSET, 0L);
            r.set(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES, (short) queues);
            r.set(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE, (short) queueSize);
            r.set(JAVA_INT_UNALIGNED, INFLIGHT_QUEUE_SIZE + 2, 0);
            channel.reply(GET_INFLIGHT_FD, INFLIGHT_SIZE, fd);
        } finally {
            Libc.close(fd); // QEMU has its copy; it sends it back with SET_INFLIGHT_FD, which maps it
        }
    }

    private void checkInflightShape(int queues, int queueSize) throws Refusal {
        if (queues < 1 || queues > maxQueues) {
            throw new Refusal("inflight num_queues " + queues + "; allowed: 1.." + maxQueues + " (vhost.queues)");
        }
        if (queueSize < 1 || queueSize > maxQueueSize) {
            throw new Refusal("inflight queue_size " + queueSize + "; allowed: 1.." + maxQueueSize
                    + " (vhost.queue-size)");
        }
    }

    /** SET_INFLIGHT_FD: the region handed back, checked and mapped, replacing the one before (no ring may run). */
    public void setInflightFd(MemorySegment p, int runningRings) throws Refusal, NativeException {
        if (channel.fdCount() != 1) {
            throw new Refusal(channel.fdCount() + " file descriptors; allowed: exactly 1, the inflight region's");
        }
        int fd = channel.takeFd(0);
        Arena arena = null;
        try {
            long size = p.get(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_SIZE);
            long offset = p.get(JAVA_LONG_UNALIGNED, INFLIGHT_MMAP_OFFSET);
            int queues = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_NUM_QUEUES));
            int queueSize = Short.toUnsignedInt(p.get(JAVA_SHORT_UNALIGNED, INFLIGHT_QUEUE_SIZE));
            checkInflightShape(queues, queueSize);
            long needed = inflightQueueStride(queueSize) * queues;
            if (size < needed || size > needed + Libc.pageSize()) {
                throw new Refusal("inflight mmap_size " + size + " for " + queues + " queues of " + queueSize
                        + "; allowed: " + needed + " (+ up to a page)");
            }
            if (offset < 0 || (offset & (Libc.pageSize() - 1)) != 0 || offset > Long.MAX_VALUE - size) {
                throw new Refusal("inflight mmap_offset 0x" + Long.toHexString(offset) + "; allowed: a page multiple");
            }
            FileStat st = FileCalls.fstat(fd);
            if (!st.isRegularFile() || st.size() < offset + size) {
                throw new Refusal("the inflight fd holds " + st.size() + " bytes, not the " + (offset + size)
                        + " its mmap_offset and mmap_size need; allowed: the memfd GET_INFLIGHT_FD gave");
            }
            int seals = SharedMemory.seals(fd); // -1: a file that cannot be sealed at all
            if (seals < 0 || (seals & SharedMemory.F_SEAL_SHRINK) == 0) {
                // Ours (GET_INFLIGHT_FD, this server's or the one before it) is a memfd sealed so; one that can
                // shrink would fault the rings' inflight updates once the front end truncated it.
                throw new Refusal("the inflight fd is not a memfd sealed with F_SEAL_SHRINK; allowed: the memfd"
                        + " GET_INFLIGHT_FD gave (sealed)");
            }
            if (runningRings > 0) {
                throw new Refusal("inflight region replaced while " + runningRings + " rings run; allowed: before"
                        + " SET_VRING_KICK");
            }
            arena = Arena.ofShared();
            MemorySegment region = SharedMemory.map(fd, offset, size, arena);
            long stride = inflightQueueStride(queueSize);
            for (int q = 0; q < queues; q++) {
                // each queue's desc_num, as libvhost-user writes it (vu_set_inflight_fd): the queue reads it back
                region.set(JAVA_SHORT_UNALIGNED, q * stride + INFLIGHT_DESC_NUM, (short) queueSize);
            }
            if (mapped != null) {
                release(mapped);
            }
            mapped = new Mapped(arena, region, queues, queueSize);
            arena = null;
        } finally {
            if (arena != null) {
                arena.close();
            }
            Libc.close(fd);
        }
    }

    /**
     * Ring {@code index}'s slice of the region for a ring of {@code num} descriptors, or null when the front-end
     * handed none over (the ring then tracks nothing).
     */
    public MemorySegment slice(int index, int num) throws Refusal {
        if (mapped == null) {
            return null;
        }
        if (index >= mapped.queues() || num > mapped.queueSize()) {
            throw new Refusal("vring " + index + " of size " + num + " has no place in the inflight region ("
                    + mapped.queues() + " queues of " + mapped.queueSize() + "); allowed: index below "
                    + mapped.queues() + ", size at most " + mapped.queueSize());
        }
        long stride = inflightQueueStride(mapped.queueSize());
        return mapped.region().asSlice(stride * index, stride);
    }

    /** The region unmapped (once no ring stopped undrained may write it) and forgotten: the session ends. */
    public void release() {
        if (mapped != null) {
            release(mapped);
        }
        mapped = null;
    }

    /** Unmaps the region, as guest memory is unmapped (a late completion must not find it gone). */
    private void release(Mapped i) {
        pinned.release(() -> i.arena().close());
    }
}
