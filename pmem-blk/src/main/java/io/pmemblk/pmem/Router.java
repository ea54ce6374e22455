package io.pmemblk.pmem;

import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;

import java.io.IOException;

/**
 * Where a request goes: answered at once (FLUSH, out of bounds, a write refused after a failed write-back), to a
 * DMA channel, or to the CPU, which on the raw layout may receive or send it in place. The one rule behind every
 * answer is {@link Routing}'s, with a route forced for benchmarks and the tuner.
 */
final class Router {
    private final PmemRegion region;
    private final long size;
    private final boolean hasEngine;
    /**
     * Whether the device's bytes are the mapping's (raw). Not on a BTT: a sector's place in the mapping is known
     * only once it is read or written, so nothing is received or sent in place there.
     */
    private final boolean inPlace;
    private volatile Routing routing;
    /** Forced route for benchmarks and the tuner; null = by {@link #routing}. */
    private volatile Route forced;

    Router(PmemRegion region, long size, boolean hasEngine, boolean inPlace, Routing routing) {
        this.region = region;
        this.size = size;
        this.hasEngine = hasEngine;
        this.inPlace = inPlace;
        this.routing = routing;
    }

    Routing routing() {
        return routing;
    }

    void routing(Routing routing) {
        this.routing = routing;
    }

    /** See {@link PmemBlockDriver#force}. */
    boolean force(Route route) {
        if (route == Route.DMA && !hasEngine) {
            return false;
        }
        forced = route;
        return true;
    }

    boolean receivesInPlace(long offset, long length) {
        // After a failed write-back the normal path answers it, with EIO.
        return inPlace && !region.writeBack().writeBackFailed() && byCpu(offset, length) && loadable(offset, length);
    }

    /**
     * Whether the kernel may copy into the range: a page it cannot load (truncated file, bad block) would fail
     * the frontend's socket read with EFAULT mid-request and lose the connection. Not loadable: the request takes
     * the buffers' path instead, where the copy fails alone, with EIO.
     */
    private boolean loadable(long offset, long length) {
        try {
            region.probe(offset, length);
            return true;
        } catch (MappingFault f) {
            return false;
        }
    }

    boolean sendsInPlace(long offset, long length) {
        // No probe here: a READ sent from the mapping is probed where it runs (execute), and fails alone with EIO.
        // Never on a BTT: the device's bytes are scattered over its data blocks (sinkReadsDevice is ignored there too).
        return inPlace && byCpu(offset, length);
    }

    /**
     * Whether a READ or WRITE of the range takes the CPU route, which copies straight between the mapping and
     * the frontend's socket or ublk: {@link #routesToDma}, the rule {@link #wantsDma} applies at dispatch, asked
     * before the request is acquired, so it takes buffers only for DMA. False out of bounds: the normal path
     * answers it with the right error.
     */
    private boolean byCpu(long offset, long length) {
        if (offset < 0 || length <= 0 || offset > size || length > size - offset || length > Integer.MAX_VALUE) {
            return false;
        }
        return !routesToDma(length, BufferPool.chunksFor(length), false);
    }

    /**
     * The route of a data request in bounds: forced, or by the thresholds, where a pool-buffer request (not
     * {@code callerMemory}) needs route.dma.bounce as well: the kernel's CPU copy into its buffers is already made.
     */
    private boolean routesToDma(long length, int segments, boolean callerMemory) {
        if (!hasEngine) {
            return false;
        }
        Route f = forced;
        if (f != null) {
            return f == Route.DMA;
        }
        Routing rule = routing;
        return (callerMemory || rule.bounce()) && rule.toDma(length, segments);
    }

    /** Whether r, at dispatch, goes to a DMA channel. */
    boolean wantsDma(Request r) {
        // A request acquired without buffers (in place) stays on the CPU even if the route changed since.
        if (!r.op.carriesData() || r.dataInPlace || !inBounds(r)
                || (r.op == Op.WRITE && region.writeBack().writeBackFailed())) {
            return false; // refused writes are answered by execute, before any copy
        }
        int n = r.segments();
        if (n > 0) {
            return routesToDma(r.length, n, false);
        }
        // No pool chunks: caller memory, or a READ sent from the mapping. A zero-length request has no copy that
        // would ever report it; pieces without an iova, or not covering the length, are execute's to answer.
        int pieces = r.iovCount();
        return pieces > 0 && r.iovsReachable() && r.iovBytes() == r.length && routesToDma(r.length, pieces, true);
    }

    boolean inBounds(Request r) {
        long off = r.offset;
        long len = r.length;
        return off >= 0 && len >= 0 && off <= size && len <= size - off;
    }

    /** {@link #answerAtOnce}: the request has data to move, or a range to change; its executor goes on. */
    static final int EXECUTE = -1;

    /**
     * What every layout answers before it looks at the data: FLUSH persists the region; out of bounds is ENOSPC
     * for what would write, EINVAL else; once write-back has failed, whatever would change the device is EIO.
     * Else {@link #EXECUTE}.
     */
    int answerAtOnce(Request r) throws IOException {
        Op op = r.op;
        if (op == Op.FLUSH) {
            region.writeBack().persistAll();
            return Status.OK;
        }
        if (!inBounds(r)) {
            return op == Op.WRITE || op == Op.WRITE_ZEROES ? Status.ENOSPC : Status.EINVAL;
        }
        if (op != Op.READ && op != Op.CACHE && region.writeBack().writeBackFailed()) {
            // Stored now, the bytes could never be made durable (the failed pages are clean to the kernel):
            // refused before they reach the mapping. A payload the kernel received in place has landed already,
            // as a write answered with an error may have.
            region.writeBack().countRefused();
            return Status.EIO;
        }
        return EXECUTE;
    }
}
