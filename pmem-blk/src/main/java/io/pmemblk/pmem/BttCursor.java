package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;

import java.lang.foreign.MemorySegment;

/**
 * A position in a request's data pieces: its pool chunks, or its pieces of caller memory (a vhost-user guest's
 * RAM), which may split a sector anywhere. One per BTT lane, used by whoever holds the lane.
 */
final class BttCursor {
    /**
     * Where {@link BttCpuRequests#reads} leaves the map entries it loaded ahead, so the JIT keeps the loads: in the
     * lane's cursor, not in a field of the shared BttCpuRequests, whose line every dispatching thread reads (a store
     * there from each batch bounced it between the cores: 2-job reads ran 0.85-0.88x raw).
     */
    int touched;
    private Request r;
    private MemorySegment pool;
    private boolean caller;
    private int count, piece;
    private long in;

    boolean start(Request r) {
        this.r = r;
        int n = r.segments();
        caller = n == 0;
        if (caller && r.iovBytes() != r.length) {
            return false;
        }
        count = caller ? r.iovCount() : n;
        pool = caller ? null : r.queue().pool().memory();
        piece = 0;
        in = 0;
        settle();
        return true;
    }

    MemorySegment memory() {
        return caller ? r.iovMapping(piece) : pool;
    }

    long at() {
        return (caller ? r.iovStart(piece) : r.segmentPoolOffset(piece)) + in;
    }

    long left() {
        return piece >= count ? 0 : (caller ? r.iovLength(piece) : r.segmentLength(piece)) - in;
    }

    void skip(long n) {
        in += n;
        settle();
    }

    /** Moves past exhausted (and empty) pieces. */
    private void settle() {
        while (piece < count && left() == 0) {
            piece++;
            in = 0;
        }
    }

    /** Copies n bytes between the pieces (from here on) and {@code b} at {@code bOff}: into b when {@code gather}. */
    void copy(MemorySegment b, long bOff, long n, boolean gather) {
        while (n > 0) {
            long k = Math.min(n, left());
            if (k == 0) {
                throw new IllegalStateException(r + ": its data pieces end " + n + " bytes before its length");
            }
            if (gather) {
                MemorySegment.copy(memory(), at(), b, bOff, k);
            } else {
                MemorySegment.copy(b, bOff, memory(), at(), k);
            }
            bOff += k;
            n -= k;
            skip(k);
        }
    }
}
