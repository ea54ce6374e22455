package io.pmemblk.pmem;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * Keeps a mapping from being unmapped while a thread makes a run of native calls on it, for one atomic
 * operation a run instead of two a call.
 *
 * <p>Why: the linker keeps a shared arena alive through each downcall that is given one of its segments, with a
 * compare-and-set on the arena's acquire count before the call and another after it. On x86 a locked instruction
 * waits for every earlier cache-line write-back (clwb, clflushopt) of its thread to complete (SDM vol. 2, CLWB and
 * CLFLUSHOPT: "ordered with respect to ... locked read-modify-write instructions"), so a BTT group's ~100
 * write-backs, one pmem_flush call each, ran one after another instead of overlapping until their drain: 57% of a
 * group's time was the acquire and the release (async-profiler, 4k randwrite QD32 in process) and a block cost
 * 1.5 us against raw's 0.9. Two threads' calls also bounce the one acquire count between their cores.
 *
 * <p>How: {@link #enter} adds one to the caller's stripe (a padded counter, getAndAdd: a full fence) and then
 * reads whether the owner is closing; the owner's {@link #close} sets closing, fences, then finds every stripe at
 * zero (Dekker's pattern: either the closer sees the hold or the holder sees the close). Between enter and exit
 * the caller uses {@link #enter}'s view, which has the mapping's bounds (asSlice still throws out of range) but
 * the global scope, so the linker acquires nothing for it. A hold is meant to be short (a BTT group, a request's
 * pieces: microseconds, a map lock another holder releases at most): a close waits for it, up to its timeout.
 */
public final class MappingHold {
    private static final VarHandle COUNT = MethodHandles.arrayElementVarHandle(int[].class);
    /** Ints a stripe: one 64-byte line each, so two threads' holds do not share a line. */
    private static final int PAD = 16;

    private final MemorySegment view;
    private final int[] counts;
    private final int mask;
    private volatile boolean closed;

    /**
     * A hold over {@code mapping} (a segment of a shared arena, or any other) with at least {@code stripes}
     * counters (rounded up to a power of two): callers holding at once should use different stripes.
     */
    // reinterpret is restricted: safe here, as the view has exactly the mapping's address and length, and close()
    // waits for every hold before the owner may unmap.
    @SuppressWarnings("restricted")
    public MappingHold(MemorySegment mapping, int stripes) {
        if (stripes < 1) {
            throw new IllegalArgumentException("stripes " + stripes + " must be at least 1");
        }
        int n = Integer.highestOneBit(Math.min(stripes, 1 << 16) * 2 - 1);
        this.mask = n - 1;
        this.counts = new int[n * PAD];
        this.view = MemorySegment.ofAddress(mapping.address()).reinterpret(mapping.byteSize());
    }

    /**
     * Holds the mapping for the calling thread until {@link #exit} with the same stripe, and returns the view to
     * use meanwhile. Throws IllegalStateException once the owner has closed it (nothing is held then).
     */
    public MemorySegment enter(int stripe) {
        int at = (stripe & mask) * PAD;
        COUNT.getAndAdd(counts, at, 1);
        if (closed) {
            COUNT.getAndAdd(counts, at, -1);
            throw new IllegalStateException("the mapping is closed (or closing): it was unmapped, or is about to be");
        }
        return view;
    }

    /** Ends the hold {@link #enter} began on {@code stripe}. */
    public void exit(int stripe) {
        COUNT.getAndAdd(counts, (stripe & mask) * PAD, -1);
    }

    /**
     * For the mapping's owner, before it unmaps: refuses new holds and waits up to {@code timeoutNanos} for the
     * current ones to end. Throws (and takes new holds again) if one is still held then, so the owner keeps the
     * mapping. Idempotent.
     */
    void close(long timeoutNanos) throws IOException {
        closed = true;
        VarHandle.fullFence();
        long deadline = System.nanoTime() + timeoutNanos;
        for (int i = 0; i < counts.length; i += PAD) {
            while ((int) COUNT.getVolatile(counts, i) != 0) {
                if (System.nanoTime() - deadline > 0) {
                    closed = false;
                    throw new IOException("a batch of native calls still holds the mapping after "
                            + TimeUnit.NANOSECONDS.toMillis(timeoutNanos) + " ms");
                }
                LockSupport.parkNanos(100_000);
            }
        }
    }

    /** Takes new holds again: the owner's unmap did not happen after all. */
    void reopen() {
        closed = false;
    }
}
