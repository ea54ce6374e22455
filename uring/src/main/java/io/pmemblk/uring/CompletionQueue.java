package io.pmemblk.uring;

import io.pmemblk.posix.NativeException;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;

import static io.pmemblk.uring.IoUringAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The completion side of an {@link IoUring}. {@link #drain} reads the kernel's tail with acquire (its CQE stores
 * happen before its release of the tail), hands each CQE's fields to a {@link CompletionHandler} as primitives, and
 * publishes the new head with one release store (our CQE loads happen before the kernel may reuse the slots).
 *
 * <p>Overflow: when more completions arrive than the CQ holds, a kernel with IORING_FEAT_NODROP (5.5+) keeps the
 * extra ones on an internal list and sets IORING_SQ_CQ_OVERFLOW in the SQ ring's flags; they come back into the
 * CQ only on an io_uring_enter with GETEVENTS. {@link #drain} does that enter itself whenever the flag is set
 * after the CQ has been emptied, so no completion is left behind. Without NODROP they are lost and counted in
 * {@link #overflow()}.
 */
public final class CompletionQueue {
    private static final VarHandle INT = JAVA_INT.varHandle();

    private final IoUring ring;
    private final MemorySegment cqRing;
    private final long headOff;
    private final long tailOff;
    private final long overflowOff;
    private final long cqesOff;
    private final int mask;
    private final int entries;
    /** Our head; the kernel only reads it, so the copy here is always current. */
    private int head;

    CompletionQueue(IoUring ring, MemorySegment cqRing, MemorySegment sqRing, MemorySegment params) {
        this.ring = ring;
        this.cqRing = cqRing;
        this.headOff = params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_HEAD);
        this.tailOff = params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_TAIL);
        this.overflowOff = params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_OVERFLOW);
        this.cqesOff = params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_CQES);
        this.mask = cqRing.get(JAVA_INT, params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_RING_MASK));
        this.entries = cqRing.get(JAVA_INT, params.get(JAVA_INT, PARAMS_CQ_OFF + CQ_OFF_RING_ENTRIES));
        this.head = (int) INT.getAcquire(cqRing, headOff);
    }

    /** CQ slots (a power of two). */
    public int entries() {
        return entries;
    }

    /** CQEs ready to reap now (not counting any still on the kernel's overflow list). */
    public int ready() {
        ring.ensureOpen();
        return (int) INT.getAcquire(cqRing, tailOff) - head;
    }

    /**
     * Completions the kernel could not post and dropped (cq ring {@code overflow}). Stays 0 on a NODROP kernel
     * unless it ran out of memory for the overflow list.
     */
    public int overflow() {
        ring.ensureOpen();
        return (int) INT.getAcquire(cqRing, overflowOff);
    }

    /**
     * Reaps every ready CQE, including ones the kernel held back on its overflow list, into {@code handler};
     * returns how many. Does not wait. Allocates nothing. If the handler throws, the CQEs before it and the one
     * it threw on are consumed, the rest stay in the CQ.
     */
    public int drain(CompletionHandler handler) throws NativeException {
        ring.ensureOpen();
        int reaped = 0;
        for (;;) {
            int tail = (int) INT.getAcquire(cqRing, tailOff);
            if (tail == head) {
                // Empty. Completions on the kernel's overflow list return only on an enter with GETEVENTS; there is
                // room for them now, as the head published below (or before) freed the whole CQ.
                if ((ring.sq().ringFlags() & IORING_SQ_CQ_OVERFLOW) == 0) {
                    return reaped;
                }
                ring.sq().flushOverflow();
                if ((int) INT.getAcquire(cqRing, tailOff) == head) {
                    return reaped; // nothing came back (another flush is under way in the kernel): try again later
                }
                continue;
            }
            int h = head;
            try {
                while (h != tail) {
                    long cqe = cqesOff + ((long) (h & mask) * CQE_SIZE);
                    long userData = cqRing.get(JAVA_LONG, cqe + CQE_USER_DATA);
                    int res = cqRing.get(JAVA_INT, cqe + CQE_RES);
                    int flags = cqRing.get(JAVA_INT, cqe + CQE_FLAGS);
                    h++;
                    reaped++;
                    handler.onCompletion(userData, res, flags);
                }
            } finally {
                head = h;
                INT.setRelease(cqRing, headOff, h);
            }
        }
    }
}
