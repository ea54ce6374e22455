package io.pmemblk.block;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Test double of the device: an off-heap segment. Completes inline (default), asynchronously on other threads
 * in shuffled order, or holds requests until the test lets them go. Tracks how many buffer chunks requests
 * hold inside the driver, so tests can see memory stay bounded.
 */
final class TestDriver implements BlockDriver {
    enum Mode { INLINE, ASYNC, HOLD }

    private final Arena arena = Arena.ofShared();
    final MemorySegment memory;
    private volatile Mode mode = Mode.INLINE;
    private final List<Request> held = new ArrayList<>();
    private final ExecutorService completer = Executors.newFixedThreadPool(2,
            r -> Thread.ofPlatform().daemon().name("test-driver-completer").unstarted(r));
    final AtomicLong requests = new AtomicLong();
    final AtomicInteger chunksInDriver = new AtomicInteger();
    final AtomicInteger maxChunksInDriver = new AtomicInteger();
    final List<HardwareQueue> attached = new ArrayList<>();

    TestDriver(long size) {
        this.memory = arena.allocate(size, 4096);
    }

    void mode(Mode m) {
        mode = m;
    }

    @Override
    public long size() {
        return memory.byteSize();
    }

    @Override
    public boolean isPmem() {
        return false;
    }

    @Override
    public synchronized void attachQueue(HardwareQueue queue) {
        attached.add(queue);
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        requests.addAndGet(count);
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (r.queue().index() != hwq) {
                throw new AssertionError(r + " dispatched on queue " + hwq);
            }
            int c = chunksInDriver.addAndGet(r.segments());
            maxChunksInDriver.accumulateAndGet(c, Math::max);
        }
        switch (mode) {
            case HOLD -> {
                synchronized (this) {
                    for (int i = 0; i < count; i++) {
                        held.add(batch[i]);
                    }
                    notifyAll();
                }
            }
            case ASYNC -> {
                List<Request> copy = new ArrayList<>(count);
                for (int i = 0; i < count; i++) {
                    copy.add(batch[i]);
                }
                java.util.Collections.shuffle(copy, ThreadLocalRandom.current());
                completer.execute(() -> copy.forEach(this::finish));
            }
            case INLINE -> {
                for (int i = 0; i < count; i++) {
                    finish(batch[i]);
                }
            }
        }
    }

    private void finish(Request r) {
        int status = execute(r);
        chunksInDriver.addAndGet(-r.segments());
        r.complete(status);
    }

    synchronized int heldCount() {
        return held.size();
    }

    synchronized List<Request> held() {
        return new ArrayList<>(held);
    }

    /** Waits (bounded) until at least {@code n} requests are held. */
    synchronized boolean awaitHeld(int n, long millis) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        while (held.size() < n) {
            long left = end - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            TimeUnit.NANOSECONDS.timedWait(this, left);
        }
        return true;
    }

    /** Switches to {@code next} and completes everything held so far. */
    void releaseHeld(Mode next) {
        List<Request> todo;
        synchronized (this) {
            mode = next;
            todo = new ArrayList<>(held);
            held.clear();
        }
        todo.forEach(this::finish);
    }

    private int execute(Request r) {
        long len = r.length;
        if (r.offset < 0 || len < 0 || r.offset > size() || len > size() - r.offset) {
            return r.op == Op.WRITE || r.op == Op.WRITE_ZEROES ? Status.ENOSPC : Status.EINVAL;
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
            case FLUSH, CACHE -> { }
        }
        return Status.OK;
    }

    @Override
    public void persistAll() {}

    @Override
    public void close() {
        completer.shutdownNow();
        arena.close();
    }
}
