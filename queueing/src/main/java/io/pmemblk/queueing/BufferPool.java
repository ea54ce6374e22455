package io.pmemblk.queueing;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;

/**
 * The registered data buffers of one hardware queue (registered once with the DMA engine, never mapped per request: per-request mapping costs what registered buffers save).
 * One page-aligned off-heap region, allocated at start-up and cut into fixed chunks; a request's data is a
 * list of chunks (its segments, like a bio's bvecs). A DMA engine registers {@link #memory()} once in its
 * IOVA space; a chunk's IOVA is then base + {@link #chunkOffset(int)}.
 *
 * <p>Allocation is a stack of free chunk indices under this pool's monitor; callers that find too few free
 * chunks wait, which is what stops a frontend reading more requests (back-pressure with bounded memory).
 * A take is all or nothing: a waiter never holds part of what it asked for. Waiters are served in arrival
 * order and a non-waiting {@link #tryTake} never overtakes one, so a 32 MiB request is not starved by a
 * stream of small ones taking every chunk as it frees up.
 */
public final class BufferPool implements AutoCloseable {
    public static final int CHUNK = 128 * 1024;

    private final Arena arena;
    private final MemorySegment memory;
    private final ByteBuffer[] views;
    private final int[] free;
    private int freeCount;
    private boolean closed;
    /** Threads waiting in {@link #take}, first come first served. */
    private final ArrayDeque<Thread> waiting = new ArrayDeque<>();

    public BufferPool(long bytes) {
        this(bytes, arena -> arena.allocate(bytes, 4096));
    }

    /**
     * A pool whose memory {@code allocate} makes in the pool's arena (a DMA engine's kind of memory:
     * {@link BlockDriver#allocateBuffers}); it must give {@code bytes} bytes, page-aligned.
     */
    public BufferPool(long bytes, java.util.function.Function<Arena, MemorySegment> allocate) {
        if (bytes < CHUNK || bytes % CHUNK != 0) {
            throw new IllegalArgumentException("buffer pool size " + bytes + " must be a positive multiple of " + CHUNK);
        }
        int chunks = Math.toIntExact(bytes / CHUNK);
        this.arena = Arena.ofShared();
        try {
            MemorySegment m = allocate.apply(arena);
            if (m.byteSize() != bytes || (m.address() & 4095) != 0) {
                throw new IllegalStateException("buffer pool memory of " + m.byteSize() + " bytes at 0x"
                        + Long.toHexString(m.address()) + "; allowed: " + bytes + " bytes, page-aligned");
            }
            this.memory = m;
        } catch (RuntimeException e) {
            arena.close();
            throw e;
        }
        this.views = new ByteBuffer[chunks];
        this.free = new int[chunks];
        for (int i = 0; i < chunks; i++) {
            views[i] = memory.asSlice((long) i * CHUNK, CHUNK).asByteBuffer();
            free[i] = chunks - 1 - i;
        }
        this.freeCount = chunks;
    }

    public MemorySegment memory() {
        return memory;
    }

    public int chunks() {
        return views.length;
    }

    public long chunkOffset(int chunk) {
        return (long) chunk * CHUNK;
    }

    /** The chunk's reusable NIO view; its position and limit belong to whoever holds the chunk. */
    ByteBuffer view(int chunk) {
        return views[chunk];
    }

    public static int chunksFor(long length) {
        return (int) ((length + CHUNK - 1) / CHUNK);
    }

    /**
     * Takes {@code n} chunks into {@code into[0..n)}, waiting until they are free and every earlier waiter
     * has been served.
     * @throws InterruptedException when interrupted while waiting (nothing is taken)
     * @throws IllegalStateException when the pool is closed
     */
    synchronized void take(int n, int[] into) throws InterruptedException {
        checkCount(n);
        if (waiting.isEmpty() && freeCount >= n && !closed) {
            pop(n, into);
            return;
        }
        Thread me = Thread.currentThread();
        waiting.addLast(me);
        try {
            while (!closed && (waiting.peekFirst() != me || freeCount < n)) {
                wait();
            }
            if (closed) {
                throw new IllegalStateException("buffer pool closed while waiting for " + n + " chunks");
            }
            pop(n, into);
        } finally {
            waiting.remove(me);
            notifyAll(); // the next waiter may be able to go now
        }
    }

    /**
     * Takes {@code n} chunks if they are free now and nobody is waiting for chunks; else takes nothing.
     * @throws IllegalStateException when the pool is closed
     */
    synchronized boolean tryTake(int n, int[] into) {
        checkCount(n);
        if (closed) {
            throw new IllegalStateException("buffer pool closed");
        }
        if (!waiting.isEmpty() || freeCount < n) {
            return false;
        }
        pop(n, into);
        return true;
    }

    private void checkCount(int n) {
        if (n > views.length) {
            throw new IllegalArgumentException(n + " chunks asked of a pool of " + views.length);
        }
    }

    private void pop(int n, int[] into) {
        for (int i = 0; i < n; i++) {
            into[i] = free[--freeCount];
        }
    }

    synchronized void give(int n, int[] chunks) {
        for (int i = 0; i < n; i++) {
            free[freeCount++] = chunks[i];
        }
        if (!waiting.isEmpty()) { // every waiter of take() is in the queue: no one to wake otherwise
            notifyAll();
        }
    }

    public synchronized int freeChunks() {
        return freeCount;
    }

    @Override
    public void close() {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            notifyAll();
        }
        arena.close();
    }
}
