package io.pmemblk.pmem;

import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Route;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.log.RateLimitedLog;

import java.io.IOException;
import java.lang.System.Logger.Level;

/**
 * How the driver completes a request, once, and says what went wrong: the first Error of a batch kept for the
 * caller, a failure answered EIO as its kind asks, and the lines something outside the driver can repeat at
 * will (a halted channel fails every copy behind it, a truncated file every access) written at most once a
 * second each, through {@link RateLimitedLog}.
 */
final class Completions {
    /** The driver's lines keep its logger's name, whichever of its parts writes them: operators filter by it. */
    static final System.Logger LOG = System.getLogger(PmemBlockDriver.class.getName());

    private final PmemRegion region;
    private final CopyStats stats;
    // Four limits, one per kind of line, not one shared: each kind keeps its line a second whatever the others do.
    // A halted channel fails every copy behind it, and a client can send refused requests as fast as it likes;
    // with one limit either flood would hide the first mapping fault (a truncated file, a bad block), the line an
    // operator has to act on. All four are RateLimitedLog: the limiting is written once, only the budgets are apart.

    /** A DMA copy that failed or a channel that threw: the CPU redoes it. */
    private final RateLimitedLog faults = RateLimitedLog.withOwnLimit(LOG, Level.WARNING, 1);
    private final RateLimitedLog mappingFaults = RateLimitedLog.withOwnLimit(LOG, Level.ERROR, 1);
    private final RateLimitedLog callerFaults = RateLimitedLog.withOwnLimit(LOG, Level.ERROR, 1);
    /** What the BTT refused (an unaligned request, an arena read-only, a block marked bad): its reason. */
    private final RateLimitedLog bttRefusals = RateLimitedLog.withOwnLimit(
            System.getLogger(BttCpuRequests.class.getName()), Level.WARNING, 1);
    private volatile long faultsAtLastLog;

    Completions(PmemRegion region, CopyStats stats) {
        this.region = region;
        this.stats = stats;
    }

    /** The DMA fault lines: build one only once {@link RateLimitedLog#due} says so (an Error is written always). */
    RateLimitedLog faults() {
        return faults;
    }

    /**
     * Completes r once. What the completion throws (the frontend's callback, or a second completion the request
     * refuses) is logged and never retried: the request's state has moved on, and calling again would run the
     * frontend's completion twice.
     */
    static Throwable complete(Request r, int status, Throwable error) {
        try {
            r.complete(status);
            return error;
        } catch (Throwable t) {
            LOG.log(System.Logger.Level.ERROR, "completing " + r + " threw: " + t, t);
            return firstError(error, t);
        }
    }

    /** Executes r by the CPU on {@code layout} and completes it: EIO when that throws. */
    Throwable completeByCpu(Request r, Executor layout, Throwable error) {
        int status;
        try {
            status = layout.execute(r);
        } catch (Throwable t) {
            return completeFailed(r, t, error);
        }
        return complete(r, status, error);
    }

    /**
     * Completes r with EIO for {@code t}, what executing it threw: logged as its kind asks (the BTT's grouped
     * writes answer their failures here too, as they would have been answered executed alone).
     */
    Throwable completeFailed(Request r, Throwable t, Throwable error) {
        if (t instanceof WriteBackFailedException) {
            region.writeBack().countRefused(); // the region has said why, once: one line, not one per request
        } else if (t instanceof MappingFault f) {
            mappingFault(r, f);
        } else if (t instanceof CallerMemoryFault f) {
            callerMemoryFault(r, f);
        } else {
            error = failed(r, "failed", t, error);
        }
        return complete(r, Status.EIO, error);
    }

    /** Logs what r's execution threw; keeps the first Error (the rest answer EIO and are done with). */
    static Throwable failed(Request r, String what, Throwable t, Throwable error) {
        LOG.log(System.Logger.Level.ERROR, "request " + r + " " + what + ": " + t, t);
        return firstError(error, t);
    }

    static Throwable firstError(Throwable first, Throwable t) {
        return first != null || !(t instanceof Error) ? first : t;
    }

    /**
     * The mapping could not be accessed for r (truncated file, bad block, machine check): r answers EIO and the
     * driver goes on. One line per second at most, with the offset; the count is a metric.
     */
    private void mappingFault(Request r, MappingFault f) {
        stats.mappingFault();
        if (mappingFaults.due()) {
            long total = stats.mappingFaults();
            mappingFaults.write(Level.ERROR, r.op + " at offset " + r.offset + " answered EIO: " + f.getMessage()
                    + " (" + total + " mapping faults so far, " + (total - faultsAtLastLog - 1) + " not logged since the"
                    + " last line); if the backing file was truncated, stop the server and restore it; if the pmem has"
                    + " bad blocks, `ndctl list --media-errors` shows them", null);
            faultsAtLastLog = total;
        }
    }

    /**
     * r's own memory faulted under its copy (a frontend's buffer taken away: a vhost-user front end truncated its
     * guest RAM): r answers EIO, the pmem file is not at fault and the driver goes on. One line per second at most.
     */
    private void callerMemoryFault(Request r, CallerMemoryFault f) {
        if (callerFaults.due()) {
            callerFaults.write(Level.ERROR, r + " answered EIO: " + f.getMessage() + "; the pmem file is intact;"
                    + " the frontend that owns this memory took it away while the request used it", null);
        }
    }

    /**
     * Completes a BTT WRITE whose sectors have all been written or failed ({@code st}), as the BTT's own write
     * answers: EINVAL when it was refused whole, OK counted on {@code route} when every sector is durable, EIO when
     * the BTT refused a sector (its reason logged once a second), else as {@link #completeFailed}.
     */
    Throwable completeBttWrite(Request r, BttPerRequest st, Route route, Throwable error) {
        Throwable f = st.failure;
        st.failure = null;
        if (st.invalid) {
            return complete(r, Status.EINVAL, error);
        }
        if (f == null) {
            stats.count(route, true, r.length);
            r.route = route;
            return complete(r, Status.OK, error);
        }
        if (f instanceof IOException e) {
            bttRefused(r, "failed: " + e.getMessage());
            return complete(r, Status.EIO, error);
        }
        return completeFailed(r, f, error);
    }

    /** The BTT refused r ({@code why}): once a second, not a stack per request. */
    void bttRefused(Request r, String why) {
        if (bttRefusals.due()) {
            bttRefusals.write(Level.WARNING, r.op + " of " + r.length + " bytes at offset " + r.offset + " " + why,
                    null);
        }
    }
}
