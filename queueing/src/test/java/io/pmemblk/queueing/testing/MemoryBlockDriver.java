package io.pmemblk.queueing.testing;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The one in-memory device the tests of every module drive the block layer with: an off-heap segment.
 * How it completes is the test's choice ({@link Mode}): inline in order (the CPU route), on other threads in
 * shuffled or reversed order (out-of-order completions), or not until the test lets them go (to count the tags
 * a frontend can have in flight, or to close something mid-request). It counts what tests assert bounds on:
 * requests, batches, the largest batch, flushes, and the tags and buffer chunks in use when batches arrive.
 *
 * <p>Caller-memory requests ({@code FrontendQueue.acquireIov}) are copied between their pieces and the device, as
 * the pmem driver's CPU route does; pieces that do not add up to the length answer EINVAL.
 *
 * <p>With {@link #receiveInPlace(boolean)} it also offers the in-place WRITE route the pmem driver has
 * ({@link BlockDriver#receivesInPlace}): the payload lands straight in {@link #memory}; with
 * {@link #sendInPlace(boolean)} the READ counterpart ({@link BlockDriver#sendsInPlace}).
 *
 * <p>It lives in its own package, not {@code io.pmemblk.queueing}: it ships in block's test-jar to the tests of
 * other modules, and a test-jar sharing a package with the main jar would be a split package once the modules
 * have module descriptors.
 */
public final class MemoryBlockDriver implements BlockDriver {
    public enum Mode {
        /** Each request completes inside {@code queueRequests}, in batch order. */
        INLINE,
        /** Each batch completes on a completer thread, shuffled. */
        ASYNC,
        /** Each batch completes on a completer thread, last request first. */
        REVERSE,
        /** Requests wait in {@link #held()} until {@link #releaseHeld} completes them. */
        HOLD
    }

    private final Arena arena = Arena.ofShared();
    /** The device's bytes: tests write expectations here and check what requests did to it. */
    public final MemorySegment memory;
    private volatile Mode mode = Mode.INLINE;
    private volatile boolean inPlace;
    private volatile boolean sendInPlace;
    private final List<Request> held = new ArrayList<>();
    private final List<HardwareQueue> attached = new ArrayList<>();
    private final ExecutorService completer = Executors.newFixedThreadPool(2,
            r -> Thread.ofPlatform().daemon().name("memory-driver-completer").unstarted(r));

    public final AtomicLong requests = new AtomicLong();
    public final AtomicLong batches = new AtomicLong();
    public final AtomicInteger largestBatch = new AtomicInteger();
    public final AtomicLong flushes = new AtomicLong();
    /** WRITEs whose payload was received straight into {@link #memory}. */
    public final AtomicLong inPlaceWrites = new AtomicLong();
    /** Largest count of tags in use on the dispatching queue when a batch arrives. */
    public final AtomicInteger maxInflight = new AtomicInteger();
    /** Largest count of buffer chunks taken from the dispatching queue's pool when a batch arrives. */
    public final AtomicInteger maxChunksInUse = new AtomicInteger();
    /** Buffer chunks held by requests inside this driver right now, and the most seen. */
    public final AtomicInteger chunksInDriver = new AtomicInteger();
    public final AtomicInteger maxChunksInDriver = new AtomicInteger();

    /** What the capability queries answer yes to; every one by default, as the pmem driver. */
    public enum Capability { WRITE, FLUSH, FUA, TRIM, ZERO, FAST_ZERO, CACHE, MULTI_CONN }

    private final java.util.EnumSet<Capability> capabilities = java.util.EnumSet.allOf(Capability.class);

    public MemoryBlockDriver(long size) {
        this.memory = arena.allocate(size, 4096);
    }

    /** Answers no for {@code missing} from now on (WRITE: a read-only device); set before a frontend asks. */
    public MemoryBlockDriver without(Capability... missing) {
        capabilities.removeAll(List.of(missing));
        return this;
    }

    @Override public boolean isReadOnly() { return !capabilities.contains(Capability.WRITE); }
    @Override public boolean canFlush() { return capabilities.contains(Capability.FLUSH); }
    @Override public boolean canFua() { return capabilities.contains(Capability.FUA); }
    @Override public boolean canTrim() { return capabilities.contains(Capability.TRIM); }
    @Override public boolean canZero() { return capabilities.contains(Capability.ZERO); }
    @Override public boolean canFastZero() { return capabilities.contains(Capability.FAST_ZERO); }
    @Override public boolean canCache() { return capabilities.contains(Capability.CACHE); }
    @Override public boolean canMultiConn() { return capabilities.contains(Capability.MULTI_CONN); }

    public void mode(Mode m) {
        mode = m;
    }

    public Mode mode() {
        return mode;
    }

    /** Same as {@code mode(Mode.HOLD)}. */
    public void hold() {
        mode = Mode.HOLD;
    }

    /** Whether WRITEs in bounds are offered the in-place route. Off by default. */
    public void receiveInPlace(boolean on) {
        inPlace = on;
    }

    /** Whether READs in bounds are sent straight out of {@link #memory} (no buffers), as the pmem driver's CPU route. Off by default. */
    public void sendInPlace(boolean on) {
        sendInPlace = on;
    }

    /** The queues the block layer attached, in attach order. */
    public synchronized List<HardwareQueue> attached() {
        return new ArrayList<>(attached);
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
    public boolean receivesInPlace(long offset, long length) {
        return inPlace && offset >= 0 && length > 0 && offset <= size() && length <= size() - offset
                && length <= Integer.MAX_VALUE;
    }

    @Override
    public boolean sendsInPlace(long offset, long length) {
        return sendInPlace && offset >= 0 && length > 0 && offset <= size() && length <= size() - offset
                && length <= Integer.MAX_VALUE;
    }

    @Override
    public void receiveInPlace(Request r) {
        if (r.segments() != 0) {
            throw new AssertionError(r + " was acquired with buffers; receiving in place needs acquire(0)");
        }
        r.dataFromDevice(memory.asSlice(r.offset, r.length).asByteBuffer(), null);
        r.dataInPlace = true;
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        requests.addAndGet(count);
        batches.incrementAndGet();
        largestBatch.accumulateAndGet(count, Math::max);
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (r.queue().index() != hwq) {
                throw new AssertionError(r + " dispatched on queue " + hwq);
            }
            int c = chunksInDriver.addAndGet(r.segments());
            maxChunksInDriver.accumulateAndGet(c, Math::max);
        }
        if (count > 0) {
            HardwareQueue q = batch[0].queue();
            maxInflight.accumulateAndGet(q.inflight(), Math::max);
            maxChunksInUse.accumulateAndGet(q.pool().chunks() - q.pool().freeChunks(), Math::max);
        }
        Mode m = mode;
        if (m == Mode.HOLD) {
            synchronized (this) {
                if (mode == Mode.HOLD) { // releaseHeld may have switched modes meanwhile: then run now
                    for (int i = 0; i < count; i++) {
                        held.add(batch[i]);
                    }
                    notifyAll();
                    return;
                }
                m = mode;
            }
        }
        switch (m) {
            case ASYNC, REVERSE -> {
                List<Request> copy = new ArrayList<>(count);
                for (int i = 0; i < count; i++) {
                    copy.add(batch[i]);
                }
                if (m == Mode.ASYNC) {
                    Collections.shuffle(copy, ThreadLocalRandom.current());
                } else {
                    Collections.reverse(copy);
                }
                completer.execute(() -> copy.forEach(this::finish));
            }
            default -> {
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

    public synchronized int heldCount() {
        return held.size();
    }

    public synchronized List<Request> held() {
        return new ArrayList<>(held);
    }

    /** The hardware queue of each request held right now. */
    public synchronized List<Integer> heldQueues() {
        List<Integer> q = new ArrayList<>();
        for (Request r : held) {
            q.add(r.queue().index());
        }
        return q;
    }

    /** Waits (bounded) until at least {@code n} requests are held; false on timeout. */
    public synchronized boolean awaitHeld(int n, long millis) throws InterruptedException {
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

    /** Completes everything held, inline from here on. */
    public void releaseHeld() {
        releaseHeld(Mode.INLINE);
    }

    /** Switches to {@code next} and completes everything held so far (on this thread). */
    public void releaseHeld(Mode next) {
        List<Request> todo;
        synchronized (this) {
            mode = next;
            todo = new ArrayList<>(held);
            held.clear();
            notifyAll();
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
                if (r.sinkReadsDevice && r.segments() == 0) {
                    r.dataFromDevice(memory.asSlice(r.offset, len).asByteBuffer(), null);
                    break;
                }
                if (r.callerMemory()) {
                    if (r.iovBytes() != len) {
                        return Status.EINVAL;
                    }
                    for (int i = 0; i < r.iovCount(); i++) {
                        MemorySegment.copy(memory, r.offset + r.iovOffset(i), r.iovMapping(i), r.iovStart(i), r.iovLength(i));
                    }
                    break;
                }
                long off = r.offset;
                for (int i = 0; i < r.segments(); i++) {
                    MemorySegment s = r.segment(i);
                    MemorySegment.copy(memory, off, s, 0, s.byteSize());
                    off += s.byteSize();
                }
            }
            case WRITE -> {
                if (r.dataInPlace) {
                    inPlaceWrites.incrementAndGet(); // the payload is already in memory
                } else if (r.callerMemory()) {
                    if (r.iovBytes() != len) {
                        return Status.EINVAL;
                    }
                    for (int i = 0; i < r.iovCount(); i++) {
                        MemorySegment.copy(r.iovMapping(i), r.iovStart(i), memory, r.offset + r.iovOffset(i), r.iovLength(i));
                    }
                } else {
                    long off = r.offset;
                    for (int i = 0; i < r.segments(); i++) {
                        MemorySegment s = r.segment(i);
                        MemorySegment.copy(s, 0, memory, off, s.byteSize());
                        off += s.byteSize();
                    }
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
        completer.shutdownNow();
        arena.close();
    }
}
