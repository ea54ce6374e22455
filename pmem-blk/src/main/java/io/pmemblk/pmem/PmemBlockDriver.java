package io.pmemblk.pmem;

import io.pmemblk.block.BlockDriver;
import io.pmemblk.block.Op;
import io.pmemblk.block.Request;
import io.pmemblk.block.Route;
import io.pmemblk.block.Status;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * The pmem block driver: executes block requests against a {@link PmemRegion}. Every request is
 * bounds-checked here (frontends' checks are not trusted) and completed exactly once.
 *
 * <p>Durability: a WRITE/TRIM/WRITE_ZEROES with FUA is persistent before it completes; a FLUSH makes every
 * write completed before it, on any queue, persistent ({@link PmemRegion#persistAll()}).
 */
public final class PmemBlockDriver implements BlockDriver {
    private static final System.Logger LOG = System.getLogger(PmemBlockDriver.class.getName());

    private final PmemRegion region;
    private final long size;
    private final CopyStats stats;

    public PmemBlockDriver(PmemRegion region, CopyStats stats) {
        this.region = region;
        this.size = region.size();
        this.stats = stats;
    }

    public PmemRegion region() {
        return region;
    }

    @Override
    public long size() {
        return size;
    }

    @Override
    public boolean isPmem() {
        return region.isPmem();
    }

    @Override
    public void queueRequests(int hwq, Request[] batch, int count) {
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            int status;
            try {
                status = execute(r);
            } catch (IOException | RuntimeException e) {
                LOG.log(System.Logger.Level.ERROR, "request " + r + " failed: " + e.getMessage(), e);
                status = Status.EIO;
            }
            r.complete(status);
        }
    }

    private int execute(Request r) throws IOException {
        Op op = r.op;
        if (op == Op.FLUSH) {
            region.persistAll();
            return Status.OK;
        }
        long off = r.offset;
        long len = r.length;
        if (off < 0 || len < 0 || off > size || len > size - off) {
            return op == Op.WRITE || op == Op.WRITE_ZEROES ? Status.ENOSPC : Status.EINVAL;
        }
        switch (op) {
            case READ -> {
                copyOut(r);
                stats.count(Route.CPU, false, len);
            }
            case WRITE -> {
                copyIn(r);
                stats.count(Route.CPU, true, len);
                if (r.fua) {
                    region.persistWritten(off, len);
                }
            }
            case TRIM, WRITE_ZEROES -> {
                // TRIM leaves the range reading as zeroes: deterministic for every client, and what
                // nbdkit's memory plugin does too.
                region.zero(off, len);
                if (r.fua) {
                    region.persistWritten(off, len);
                }
            }
            case CACHE -> { } // the mapping is already memory: nothing to prefetch
            default -> {
                return Status.EINVAL;
            }
        }
        r.route = Route.CPU;
        return Status.OK;
    }

    private void copyIn(Request r) {
        MemorySegment pool = r.queue().pool().memory();
        long dst = r.offset;
        for (int s = 0, n = r.segments(); s < n; s++) {
            int len = r.segmentLength(s);
            region.write(pool, r.segmentPoolOffset(s), dst, len);
            dst += len;
        }
    }

    private void copyOut(Request r) {
        MemorySegment pool = r.queue().pool().memory();
        long src = r.offset;
        for (int s = 0, n = r.segments(); s < n; s++) {
            int len = r.segmentLength(s);
            region.read(src, pool, r.segmentPoolOffset(s), len);
            src += len;
        }
    }

    @Override
    public void persistAll() throws IOException {
        region.persistAll();
    }

    @Override
    public void close() throws IOException {
        region.close();
    }
}
