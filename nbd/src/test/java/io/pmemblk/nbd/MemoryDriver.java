package io.pmemblk.nbd;

import io.pmemblk.block.BlockDriver;
import io.pmemblk.block.Request;
import io.pmemblk.block.Status;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Test double of the device: an off-heap segment. By default completes every request inline, in order. It can
 * also complete each batch in reverse on another thread (out-of-order replies), or hold requests until the test
 * lets them go (to see how many tags a connection can have in flight, or to close the server mid-request).
 */
final class MemoryDriver implements BlockDriver {
    private final Arena arena = Arena.ofShared();
    final MemorySegment memory;
    volatile boolean reverseAsync;
    private final List<Request> held = new ArrayList<>();
    private boolean holding;
    final AtomicLong requests = new AtomicLong();
    final AtomicLong batches = new AtomicLong();
    final AtomicInteger largestBatch = new AtomicInteger();
    final AtomicLong flushes = new AtomicLong();
    /** Largest tags in use and buffer chunks in use seen on any queue when a batch arrives. */
    final AtomicInteger maxInflight = new AtomicInteger();
    final AtomicInteger maxChunksInUse = new AtomicInteger();

    MemoryDriver(long size) {
        this.memory = arena.allocate(size, 4096);
    }

    @Override
    public long size() {
        return memory.byteSize();
    }

    @Override
    public boolean isPmem() {
        return false;
    }

    synchronized void hold() {
        holding = true;
    }

    synchronized int heldCount() {
        return held.size();
    }

    /** The hardware queue of each request held right now. */
    synchronized List<Integer> heldQueues() {
        List<Integer> q = new ArrayList<>();
        for (Request r : held) {
            q.add(r.queue().index());
        }
        return q;
    }

    /** Completes everything held and stops holding. */
    void releaseHeld() {
        List<Request> todo;
        synchronized (this) {
            holding = false;
            todo = new ArrayList<>(held);
            held.clear();
            notifyAll();
        }
        for (Request r : todo) {
            r.complete(execute(r));
        }
    }

    synchronized boolean awaitHeld(int n, long millis) throws InterruptedException {
        long end = System.currentTimeMillis() + millis;
        while (held.size() < n) {
            long left = end - System.currentTimeMillis();
            if (left <= 0) {
                return false;
            }
            wait(left);
        }
        return true;
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        requests.addAndGet(count);
        batches.incrementAndGet();
        largestBatch.accumulateAndGet(count, Math::max);
        if (count > 0) {
            io.pmemblk.block.HardwareQueue q = batch[0].queue();
            maxInflight.accumulateAndGet(q.inflight(), Math::max);
            maxChunksInUse.accumulateAndGet(q.pool().chunks() - q.pool().freeChunks(), Math::max);
        }
        synchronized (this) {
            if (holding) {
                for (int i = 0; i < count; i++) {
                    held.add(batch[i]);
                }
                notifyAll();
                return;
            }
        }
        if (reverseAsync) {
            List<Request> copy = new ArrayList<>(count);
            for (int i = 0; i < count; i++) {
                copy.add(batch[i]);
            }
            Collections.reverse(copy);
            Thread.ofPlatform().start(() -> {
                for (Request r : copy) {
                    r.complete(execute(r));
                }
            });
            return;
        }
        for (int i = 0; i < count; i++) {
            batch[i].complete(execute(batch[i]));
        }
    }

    private int execute(Request r) {
        long len = r.length;
        if (r.offset < 0 || r.offset + len > size()) {
            return r.op == io.pmemblk.block.Op.WRITE ? Status.ENOSPC : Status.EINVAL;
        }
        switch (r.op) {
            case READ -> {
                long off = r.offset;
                for (int i = 0; i < r.segments(); i++) {
                    MemorySegment s = r.segment(i);
                    MemorySegment.copy(memory, off, s, 0, s.byteSize());
                    off += s.byteSize();
                }
            }
            case WRITE -> {
                long off = r.offset;
                for (int i = 0; i < r.segments(); i++) {
                    MemorySegment s = r.segment(i);
                    MemorySegment.copy(s, 0, memory, off, s.byteSize());
                    off += s.byteSize();
                }
            }
            case WRITE_ZEROES, TRIM -> memory.asSlice(r.offset, len).fill((byte) 0);
            case FLUSH -> flushes.incrementAndGet();
            case CACHE -> { }
        }
        return Status.OK;
    }

    @Override
    public void persistAll() {}

    @Override
    public void close() {
        arena.close();
    }
}
