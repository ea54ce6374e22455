package io.pmemblk.pmem;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.queueing.BufferPool;
import io.pmemblk.queueing.Request;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;

/**
 * The driver's per-request area ({@link Request#driverData}): made once per tag, reused. It is also the
 * request's list of copies for {@link DmaChannel#placeAll}, so placing allocates nothing. A layout over the
 * device keeps its own per-request state beside it ({@link #btt}), as SPDK's vbdevs keep theirs in the I/O's
 * driver context.
 */
final class PerRequest implements DmaChannel.Copies {
    private static final VarHandle OUTSTANDING;

    static {
        try {
            OUTSTANDING = MethodHandles.lookup().findVarHandle(PerRequest.class, "outstanding", int.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /**
     * Segment copies not yet reported by the channel, plus the placer's share while it is still placing;
     * the channel's completion thread and the placer drop it concurrently, so only atomically
     * ({@link #drop}). The first failure's status is written before the writer's drop.
     */
    volatile int outstanding;
    int failedStatus;
    /** The placer's own: the request's copies, those it put in the ring (0 or all: placeAll), and an Error the channel threw at it. */
    int count;
    int placed;
    Throwable placeError;
    private ByteBuffer[] windows;
    /** The copy list of a caller-memory request; made on the tag's first one. */
    private IovCopies iovCopies;
    /** The BTT layout's state of the request; made on the tag's first request there, null on the raw layout. */
    private BttPerRequest btt;

    private Request request;
    private long poolIova;
    private long deviceIova;
    private boolean write;

    /** r's area, made on its tag's first use and reused after. */
    static PerRequest of(Request r) {
        Object d = r.driverData;
        if (d == null) {
            PerRequest p = new PerRequest();
            r.driverData = p;
            return p;
        }
        return (PerRequest) d;
    }

    /** The request's BTT state, made on first use. */
    BttPerRequest btt() {
        BttPerRequest b = btt;
        if (b == null) {
            b = btt = new BttPerRequest();
        }
        return b;
    }

    /**
     * Before the request's {@code n} copies are placed as one unit: nothing failed, placed or thrown yet, and its
     * count one per copy plus the placer's share, which the placer drops once it is done ({@link #drop}). Set
     * before placing, not after: a report (on the completion thread) may come before placeAll returns.
     */
    void beginCopies(int n) {
        failedStatus = 0;
        placed = 0;
        placeError = null;
        outstanding = n + 1;
        count = n;
    }

    /** Points the copy list at r: its segments in the pool at poolIova, its range at deviceIova. */
    DmaChannel.Copies copies(Request r, long poolIova, long deviceIova, boolean write) {
        this.request = r;
        this.poolIova = poolIova;
        this.deviceIova = deviceIova;
        this.write = write;
        return this;
    }

    /** The copy list of r's pieces of caller memory, its range at deviceIova. */
    DmaChannel.Copies iovCopies(Request r, long deviceIova, boolean write) {
        IovCopies c = iovCopies;
        if (c == null) {
            c = iovCopies = new IovCopies();
        }
        c.request = r;
        c.deviceIova = deviceIova;
        c.write = write;
        return c;
    }

    @Override
    public int count() {
        return request.segments();
    }

    @Override
    public long srcIova(int i) {
        return write ? poolIova + request.segmentPoolOffset(i) : deviceIova + (long) i * BufferPool.CHUNK;
    }

    @Override
    public long dstIova(int i) {
        return write ? deviceIova + (long) i * BufferPool.CHUNK : poolIova + request.segmentPoolOffset(i);
    }

    @Override
    public long length(int i) {
        return request.segmentLength(i);
    }

    /** Drops n shares; returns what is left (0: the caller completes the request). */
    int drop(int n) {
        return (int) OUTSTANDING.getAndAdd(this, -n) - n;
    }

    ByteBuffer[] windows(DeviceViews views) {
        if (windows == null) {
            windows = views.newWindowCache();
        }
        return windows;
    }

    /** One copy per piece of caller memory, straight between the piece's iova and its place in the mapping. */
    private static final class IovCopies implements DmaChannel.Copies {
        private Request request;
        private long deviceIova;
        private boolean write;

        @Override
        public int count() {
            return request.iovCount();
        }

        @Override
        public long srcIova(int i) {
            return write ? request.iovIova(i) : deviceIova + request.iovOffset(i);
        }

        @Override
        public long dstIova(int i) {
            return write ? deviceIova + request.iovOffset(i) : request.iovIova(i);
        }

        @Override
        public long length(int i) {
            return request.iovLength(i);
        }
    }
}
