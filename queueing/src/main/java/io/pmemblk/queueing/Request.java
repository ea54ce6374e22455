package io.pmemblk.queueing;

import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;

/**
 * One block request, owned by a tag of a {@link HardwareQueue}. Request objects, their segment arrays and
 * NIO views are allocated once per tag at start-up and reused: nothing is allocated per I/O.
 *
 * <p>Life: {@link HardwareQueue#acquire} (tag + buffers) -> the frontend fills the fields and, for a write,
 * the data -> {@link HardwareQueue#dispatch} -> the driver calls {@link #complete(int)} (on any thread) ->
 * the frontend replies and calls {@link #release()}. {@link #complete} also records the request's latency
 * ({@link HardwareQueue#latency}).
 *
 * <p>Exactly once: a request is completed at most once per acquire and released exactly once. A second
 * {@link #complete} or {@link #release} throws {@link IllegalStateException} naming the request and changes
 * nothing: a tag pushed twice on the free stack would hand one Request to two later acquirers, whose data
 * and completions would then mix silently. The check is one atomic on a state word, no allocation. It cannot
 * see a stale release that comes after the tag was acquired again (the state is then "acquired" once more):
 * that would need a generation in every caller's hands.
 */
public final class Request {
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
        return "Request[q" + queue.index() + " tag " + tag + " " + op + " off " + offset + " len " + length
                + (fua ? " FUA" : "") + "]";
    }
}
