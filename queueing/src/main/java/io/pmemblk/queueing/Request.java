package io.pmemblk.queueing;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.util.Arrays;

/**
 * One block request, owned by a tag of a {@link HardwareQueue}. Request objects, their segment arrays and
 * NIO views are allocated once per tag at start-up and reused: nothing is allocated per I/O.
 *
 * <p>Life: {@link HardwareQueue#acquire} (tag + buffers) -> the frontend fills the fields and, for a write,
 * the data -> {@link HardwareQueue#dispatch} -> the driver calls {@link #complete(int)} (on any thread) ->
 * the frontend replies and calls {@link #release()}. {@link #complete} also records the request's latency
 * ({@link HardwareQueue#latency}).
 *
 * <p>Caller memory ({@link FrontendQueue#acquireIov}): a request whose data already sits in memory the frontend
 * holds (a vhost-user guest's RAM) takes no pool chunks; the frontend lists the pieces of that memory with
 * {@link #addIov}, in order, and the driver copies between them and the device: the one copy, with no pool buffer
 * in between. The piece arrays are made on a tag's first such request and reused: a server that never sees one
 * (NBD, ublk) never makes them.
 *
 * <p>Exactly once: a request is completed at most once per acquire and released exactly once. A second
 * {@link #complete} or {@link #release} throws {@link IllegalStateException} naming the request and changes
 * nothing: a tag pushed twice on the free stack would hand one Request to two later acquirers, whose data
 * and completions would then mix silently. The check is one atomic on a state word, no allocation. It cannot
 * see a stale release that comes after the tag was acquired again (the state is then "acquired" once more):
 * that would need a generation in every caller's hands.
 */
public final class Request {
    /** The iova of a piece the DMA engine cannot reach ({@link #addIov}): such a request is copied by the CPU. */
    public static final long NO_IOVA = -1;
    /** Pieces shown by {@link #toString}: enough to see where a chain went wrong, short enough for a log line. */
    private static final int IOVS_SHOWN = 4;

    /** {@link #state}: the tag is on the free stack / held by a frontend / completed by the driver, not yet released. */
    private static final int FREE = 0, ACQUIRED = 1, COMPLETED = 2;
    private static final VarHandle STATE;

    static {
        try {
            STATE = MethodHandles.lookup().findVarHandle(Request.class, "state", int.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /** Called once per request when the driver has finished with it. */
    @FunctionalInterface
    public interface Completion {
        void completed(Request request);
    }

    private final HardwareQueue queue;
    /** The submitter whose share holds this tag (null: a caller without one); set when the tag is taken. */
    Share share;
    private final int tag;
    private final int[] chunks;
    private final ByteBuffer[] views;
    private int segments;
    /** Caller memory: set by {@link FrontendQueue#acquireIov}, cleared with the pieces at {@link #release}. */
    private boolean callerMemory;
    /** The pieces, their engine addresses and where each starts in the request's data (null until first used). */
    private MemorySegment[] iovs;
    private long[] iovStarts;
    private long[] iovLengths;
    private long[] iovIovas;
    private long[] iovOffsets;
    private int iovCount;
    private long iovBytes;
    /** Some piece has {@link #NO_IOVA}: kept as pieces are added, so the router need not look at each. */
    private boolean iovUnreachable;

    public Op op;
    public long offset;
    /**
     * Bytes the request covers. For READ/WRITE it is the data length set by {@link HardwareQueue#acquire}
     * (at most {@link HardwareQueue#maxRequestBytes()}, so it fits an int); TRIM, WRITE_ZEROES and CACHE carry
     * no data and may cover up to 4 GiB - 1 (NBD's u32 length) or more, hence a long.
     */
    public long length;
    /** Force unit access: persistent before completion. */
    public boolean fua;
    /** Frontend's handle (NBD cookie), echoed in the reply. */
    public long cookie;
    /**
     * Set by a frontend that sends a READ's data with a gathering write of its own: the driver may then leave
     * the data where it is (the device mapping) and point {@link #dataBuffers()} at it instead of copying it
     * into the request's buffers; the kernel's copy into the socket becomes the only copy.
     */
    public boolean sinkReadsDevice;
    /** A WRITE whose payload was received straight into the device ({@link BlockDriver#receiveInPlace}). */
    public boolean dataInPlace;
    /** The driver's private per-request area (blk-mq's PDU): lives with the tag, set and read by the driver only. */
    public Object driverData;
    private final ByteBuffer[] external = new ByteBuffer[2];
    private int externalCount;
    public Completion completion;
    /** Which route the data copy took, set by the driver (for metrics and tests). */
    public Route route;
    private volatile int status;
    @SuppressWarnings("unused") // through STATE
    private volatile int state = FREE;
    /** Submission timestamp (System.nanoTime) for latency metrics. */
    public long startNanos;

    Request(HardwareQueue queue, int tag, int maxSegments) {
        this.queue = queue;
        this.tag = tag;
        this.chunks = new int[maxSegments];
        this.views = new ByteBuffer[maxSegments];
    }

    public int tag() {
        return tag;
    }

    public HardwareQueue queue() {
        return queue;
    }

    /** Number of data segments (buffer chunks) this request holds. */
    public int segments() {
        return segments;
    }

    /** Byte offset of segment i in its queue's {@link BufferPool#memory()}. */
    public long segmentPoolOffset(int i) {
        return queue.pool().chunkOffset(chunks[i]);
    }

    public int segmentLength(int i) {
        // Only data requests have segments, and their length is at most maxRequestBytes (an int).
        return i < segments - 1 ? BufferPool.CHUNK : (int) (length - (long) (segments - 1) * BufferPool.CHUNK);
    }

    /** Segment i as a memory segment (a view: owns nothing). */
    public MemorySegment segment(int i) {
        return queue.pool().memory().asSlice(segmentPoolOffset(i), segmentLength(i));
    }

    /**
     * The data as NIO buffers for scattering reads / gathering writes, positioned at 0 and limited to the
     * request's length. Only the first {@link #segments()} entries are meaningful.
     */
    public ByteBuffer[] buffers() {
        for (int i = 0; i < segments; i++) {
            views[i].clear().limit(segmentLength(i));
        }
        return views;
    }

    /**
     * Where a completed READ's data is, for the frontend's gathering write: the request's own buffers, or the
     * device views a driver set with {@link #dataFromDevice}. The first {@link #dataBufferCount()} count.
     */
    public ByteBuffer[] dataBuffers() {
        return externalCount > 0 ? external : buffers();
    }

    public int dataBufferCount() {
        return externalCount > 0 ? externalCount : segments;
    }

    /** Driver side of {@link #sinkReadsDevice}: the data is in {@code a} (and {@code b}, may be null), positioned. */
    public void dataFromDevice(ByteBuffer a, ByteBuffer b) {
        external[0] = a;
        external[1] = b;
        externalCount = b == null ? 1 : 2;
    }

    /** Marks a chunk-less request as caller memory; the piece arrays are made on the tag's first one. */
    void useCallerMemory() {
        if (iovs == null) {
            iovs = new MemorySegment[HardwareQueue.MAX_IOVS];
            iovStarts = new long[HardwareQueue.MAX_IOVS];
            iovLengths = new long[HardwareQueue.MAX_IOVS];
            iovIovas = new long[HardwareQueue.MAX_IOVS];
            iovOffsets = new long[HardwareQueue.MAX_IOVS];
        }
        callerMemory = true;
    }

    /** Whether the data is in the caller's memory ({@link FrontendQueue#acquireIov}), not in pool chunks. */
    public boolean callerMemory() {
        return callerMemory;
    }

    /** {@link #addIov(MemorySegment, long, long, long)} of the whole of {@code data}. */
    public void addIov(MemorySegment data, long iova) {
        addIov(data, 0, data.byteSize(), iova);
    }

    /**
     * Appends the next piece of a caller-memory request's data: bytes [start, start + length) of {@code mapping}
     * hold the bytes at the request's data offset {@link #iovBytes()} (so the pieces, in the order added, cover
     * {@link #length}); {@code iova} is the address the DMA engine reaches that first byte at
     * ({@link BlockDriver#registerMemory}'s base plus the offset in the region), or {@link #NO_IOVA}. The mapping
     * and a place in it, not a slice of it: a frontend adds pieces per request and allocates nothing for them. The
     * request holds the mapping only until its release.
     * @throws IllegalStateException when the request is not caller memory, or holds {@link HardwareQueue#MAX_IOVS}
     *         pieces already (nothing is added)
     * @throws IllegalArgumentException when the piece is empty, is not inside {@code mapping}, or would run past
     *         {@link #length}, or the iova is negative and not {@link #NO_IOVA} (nothing is added)
     */
    public void addIov(MemorySegment mapping, long start, long length, long iova) {
        int n = iovCount;
        if (!callerMemory) {
            throw new IllegalStateException(this + ": addIov on a request with pool buffers; allowed only on one"
                    + " from FrontendQueue.acquireIov");
        }
        if (n == HardwareQueue.MAX_IOVS) {
            throw new IllegalStateException(this + " already holds " + n + " pieces: at most HardwareQueue.MAX_IOVS ("
                    + HardwareQueue.MAX_IOVS + ") per request; the frontend bounds its chains below that");
        }
        if (length <= 0 || length > this.length - iovBytes) {
            throw new IllegalArgumentException(this + ": piece " + n + " of " + length + " bytes after " + iovBytes
                    + " bytes; allowed: 1.." + (this.length - iovBytes) + " bytes (the pieces add up to the length)");
        }
        if (start < 0 || start > mapping.byteSize() - length) {
            throw new IllegalArgumentException(this + ": piece " + n + " at " + start + " + " + length + " bytes of a "
                    + mapping.byteSize() + "-byte mapping; allowed: inside the mapping");
        }
        if (iova < 0 && iova != NO_IOVA) {
            throw new IllegalArgumentException(this + ": piece " + n + " at iova 0x" + Long.toHexString(iova)
                    + "; allowed: an address from BlockDriver.registerMemory, or Request.NO_IOVA");
        }
        iovs[n] = mapping;
        iovStarts[n] = start;
        iovLengths[n] = length;
        iovIovas[n] = iova;
        iovOffsets[n] = iovBytes;
        iovBytes += length;
        iovCount = n + 1;
        if (iova == NO_IOVA) {
            iovUnreachable = true;
        }
    }

    /** Pieces added with {@link #addIov}. */
    public int iovCount() {
        return iovCount;
    }

    /** The mapping piece i lies in (caller memory). */
    public MemorySegment iovMapping(int i) {
        return iovs[i];
    }

    /** Where piece i starts in {@link #iovMapping}. */
    public long iovStart(int i) {
        return iovStarts[i];
    }

    /** Bytes of piece i. */
    public long iovLength(int i) {
        return iovLengths[i];
    }

    /** The engine address of piece i, or {@link #NO_IOVA}. */
    public long iovIova(int i) {
        return iovIovas[i];
    }

    /** Where piece i starts in the request's data: it covers the device from {@code offset + iovOffset(i)}. */
    public long iovOffset(int i) {
        return iovOffsets[i];
    }

    /** Bytes of the pieces added so far; equal to {@link #length} once the frontend has added them all. */
    public long iovBytes() {
        return iovBytes;
    }

    /** Whether every piece has an iova: only then can the DMA engine copy the request. */
    public boolean iovsReachable() {
        return !iovUnreachable;
    }

    void attach(int n) {
        segments = n;
        BufferPool pool = queue.pool();
        for (int i = 0; i < n; i++) {
            ByteBuffer v = pool.view(chunks[i]);
            if (views[i] != v) { // a tag often gets the same chunks back: skip the reference store (GC barrier)
                views[i] = v;
            }
        }
    }

    int[] chunks() {
        return chunks;
    }

    public int status() {
        return status;
    }

    /**
     * Completes the request with OK or an errno from {@link Status}; runs the frontend's completion.
     * @throws IllegalStateException when the request was already completed or released (nothing is changed,
     *         the completion does not run again)
     */
    public void complete(int status) {
        if (!STATE.compareAndSet(this, ACQUIRED, COMPLETED)) {
            throw new IllegalStateException(this + " completed twice, or after its release ("
                    + stateName((int) STATE.getVolatile(this)) + "): a request is completed at most once per acquire");
        }
        this.status = status;
        Op o = op;
        if (o != null) { // before the completion: the frontend may release and reuse the tag from there
            queue.latency(o).record(System.nanoTime() - startNanos);
        }
        completion.completed(this);
    }

    /**
     * Returns the tag and the buffers. The request must not be touched afterwards.
     * @throws IllegalStateException when it was released already (the free stack is left as it was)
     */
    public void release() {
        if ((int) STATE.getAndSet(this, FREE) == FREE) {
            throw new IllegalStateException(this + " released twice: its tag is already free, and pushing it again"
                    + " would give one request to two acquirers");
        }
        if (callerMemory) {
            clearIovs();
        }
        queue.release(this);
    }

    /** Called by the queue with the tag just taken off the free stack (so by its only holder). */
    void acquired() {
        // The tag came off the free stack under the queue's monitor, after its release pushed it there under the
        // same monitor: that already orders this with the release's getAndSet. A release store is enough (a
        // plain store on x86); a volatile one would add a full fence to every request.
        STATE.setRelease(this, ACQUIRED);
    }

    /** Whether the driver has completed the request since it was acquired (and it is not released yet). */
    public boolean isCompleted() {
        return (int) STATE.getVolatile(this) == COMPLETED;
    }

    private static String stateName(int state) {
        return switch (state) {
            case FREE -> "released";
            case ACQUIRED -> "acquired";
            default -> "completed";
        };
    }

    /** A free tag holds no view of the caller's memory: the caller may unmap it once its requests are released. */
    private void clearIovs() {
        Arrays.fill(iovs, 0, iovCount, null);
        iovCount = 0;
        iovBytes = 0;
        iovUnreachable = false;
        callerMemory = false;
    }

    void reset() {
        op = null;
        offset = 0;
        length = 0;
        fua = false;
        cookie = 0;
        completion = null;
        route = null;
        status = 0;
        segments = 0;
        sinkReadsDevice = false;
        dataInPlace = false;
        if (externalCount > 0) {
            external[0] = null;
            external[1] = null;
            externalCount = 0;
        }
    }

    @Override
    public String toString() {
        String s = "Request[q" + queue.index() + " tag " + tag + " " + op + " off " + offset + " len " + length
                + (fua ? " FUA" : "");
        if (!callerMemory) {
            return s + "]";
        }
        StringBuilder b = new StringBuilder(s).append(" iovs ").append(iovCount);
        if (iovBytes != length) {
            b.append(" (").append(iovBytes).append(" of ").append(length).append(" bytes)");
        }
        b.append(" [");
        for (int i = 0, n = Math.min(iovCount, IOVS_SHOWN); i < n; i++) {
            b.append(i == 0 ? "" : ", ").append(iovLengths[i]).append('@')
                    .append(iovIovas[i] == NO_IOVA ? "no-iova" : "0x" + Long.toHexString(iovIovas[i]));
        }
        if (iovCount > IOVS_SHOWN) {
            b.append(", +").append(iovCount - IOVS_SHOWN).append(" more");
        }
        return b.append("]]").toString();
    }
}
