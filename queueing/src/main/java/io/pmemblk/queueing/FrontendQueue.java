package io.pmemblk.queueing;

/**
 * What every frontend (NBD, ublk) does with the block layer, done once: one submitting thread's view
 * of a {@link HardwareQueue}. It acquires requests without deadlocking on its own batch, gathers them into a
 * batch, hands the batch to the driver in one call, receives WRITE payloads in place when the driver offers it,
 * and gives back on teardown whatever the driver never saw.
 *
 * <h2>Contract</h2>
 * <ol>
 *   <li><b>One submitting thread.</b> All methods except {@link #queue()} are called by the one thread that
 *       submits on this queue (an NBD connection's reader; a ublk queue's thread, which the ublk driver already
 *       ties to one hardware queue). Nothing here locks; completions run on any thread and never touch this
 *       object.</li>
 *   <li><b>Acquire.</b> {@link #acquire} (or {@link #acquireWrite} for a WRITE, {@link #acquireRead} for a
 *       READ) returns a reset request whose tag and buffers are held. When no tag or chunk is free, or this
 *       frontend holds its fair share of them ({@link HardwareQueue}'s fair sharing), it first dispatches the
 *       batch, then waits: the tags and chunks it would wait for may be in this very batch, which never
 *       completes undispatched. Meanwhile the other frontends of the queue take tags: one that stops reading
 *       its replies stalls itself, not them. A ublk frontend gets its own tag from the kernel; it takes one of
 *       the hardware queue's reserved tags here ({@link #reserved}), as many as the ublk queue is deep, so it
 *       never waits behind the NBD connections.</li>
 *   <li><b>Fill.</b> The frontend sets {@link Request#op}, {@link Request#offset}, {@link Request#length} (for
 *       requests without data), {@link Request#fua}, {@link Request#cookie} (its handle: the NBD cookie, the ublk
 *       tag) and {@link Request#completion}. For a WRITE it puts the payload into
 *       {@link Request#dataBuffers()} ({@link Request#dataBufferCount()} of them): a scattering read from a
 *       socket, or a {@code pread} from {@code /dev/ublkcN} at the request's ublk offset.</li>
 *   <li><b>Caller memory.</b> {@link #acquireIov} is for a frontend whose data already sits in memory it holds
 *       (a vhost-user guest's RAM): no buffers are taken, the frontend lists the pieces
 *       ({@link Request#addIov}) and the driver copies between them and the device: the one copy.</li>
 *   <li><b>In place.</b> {@link #acquireWrite} asks the driver whether the WRITE can be received straight into
 *       the device ({@link BlockDriver#receivesInPlace}); then the data buffers are the device range itself and
 *       the frontend's one read is the only copy. {@link #acquireRead} likewise asks whether the READ's data
 *       will be sent straight out of the device ({@link BlockDriver#sendsInPlace}): then it takes no buffers at
 *       all. The route is decided before anything is taken, so a READ from the mapping never waits for chunks.
 *       The frontend does not care which it got.</li>
 *   <li><b>Batch and dispatch.</b> {@link #add} puts a filled request in the batch; {@link #dispatch} hands the
 *       whole batch to the driver in one call, so the driver places every descriptor and rings one doorbell per
 *       batch, as blk-mq's plug does. The frontend dispatches before it blocks on its own input (a socket read,
 *       an io_uring wait) and when {@link #full()}; nothing else dispatches.</li>
 *   <li><b>Answer here.</b> A request the frontend answers itself (a validation error, a query it can answer
 *       without the driver) goes through {@link #completeHere}: its completion runs like the driver's would, so
 *       every reply takes the same way out.</li>
 *   <li><b>Complete.</b> The driver calls {@link Request#complete} once per request, on any thread; the
 *       frontend's {@link Request.Completion} replies (NBD: a reply on the socket; ublk: COMMIT_AND_FETCH_REQ
 *       with the result, after a {@code pwrite} of a READ's data) and then calls {@link Request#release()}.</li>
 *   <li><b>Teardown.</b> When the submitting thread stops for any reason, {@link #releaseUndispatched()} gives
 *       back the requests acquired but never dispatched (the one being filled and the batch). Requests already
 *       dispatched are the completion side's to release.</li>
 * </ol>
 *
 * <p>Cost: no allocation after construction, no lock, no thread hand-off; a final class, so every call here
 * inlines into the frontend's loop.
 */
public final class FrontendQueue {
    private final HardwareQueue queue;
    private final Share share;
    private final BlockDriver driver;
    private final Request[] batch;
    private int batched;
    /** Acquired and not yet added, completed here or released: the request being filled. */
    private Request filling;

    /** A frontend on the queue's shared tags, within a fair share of them (an NBD connection). */
    public FrontendQueue(HardwareQueue queue) {
        this(queue, queue.newShare(false));
    }

    private FrontendQueue(HardwareQueue queue, Share share) {
        this.queue = queue;
        this.share = share;
        this.driver = queue.driver();
        this.batch = new Request[queue.depth()];
    }

    /**
     * The frontend that owns the queue's reserved tags (a ublk queue, sized as deep as them): it never waits
     * for a tag behind the shared submitters. One per queue.
     * @throws IllegalStateException when the queue has no reserved tags, or they belong to another frontend
     */
    public static FrontendQueue reserved(HardwareQueue queue) {
        return new FrontendQueue(queue, queue.newShare(true));
    }

    public HardwareQueue queue() {
        return queue;
    }

    /**
     * A request with a tag and buffers for {@code dataBytes} (0: none). Never waits while this frontend holds
     * undispatched requests: when nothing is free it dispatches the batch before waiting.
     * @throws IllegalArgumentException when {@code dataBytes} is negative or above the queue's maxRequestBytes
     * @throws IllegalStateException when the queue is closed
     * @throws InterruptedException when interrupted while waiting (nothing is taken; the batch was dispatched)
     */
    public Request acquire(int dataBytes) throws InterruptedException {
        Request r = queue.tryAcquire(share, dataBytes);
        if (r == null) {
            dispatch();
            r = queue.acquire(share, dataBytes);
        }
        filling = r;
        return r;
    }

    /**
     * Like {@link #acquire} but never waits and dispatches nothing: null when no tag or chunk is free for this
     * frontend now. For a frontend that must keep reading its input while it has no tag (an NVMe/TCP queue whose
     * held tags wait for data still in its socket): it parks the command instead of blocking.
     */
    public Request tryAcquire(int dataBytes) {
        Request r = queue.tryAcquire(share, dataBytes);
        if (r != null) {
            filling = r;
        }
        return r;
    }

    /**
     * A WRITE of {@code length} bytes at {@code offset}, ready to receive its payload into
     * {@link Request#dataBuffers()}: the device range itself when the driver receives in place
     * ({@link Request#dataInPlace} is then set), else the request's own buffers. {@code op}, {@code offset} and
     * {@code length} are set; the caller sets the rest as for {@link #acquire}.
     */
    public Request acquireWrite(long offset, int length) throws InterruptedException {
        return write(offset, length, true);
    }

    /** {@link #acquireWrite} that never waits: null as {@link #tryAcquire}. */
    public Request tryAcquireWrite(long offset, int length) throws InterruptedException {
        return write(offset, length, false);
    }

    private Request write(long offset, int length, boolean wait) throws InterruptedException {
        boolean inPlace = driver.receivesInPlace(offset, length);
        Request r = take(Op.WRITE, offset, length, inPlace, wait);
        if (r != null && inPlace) {
            try {
                driver.receiveInPlace(r);
            } catch (RuntimeException | Error e) {
                // The caller never got it, so it would never be released: a leaked tag hangs the queue's drain.
                filling = null;
                r.release();
                throw e;
            }
        }
        return r;
    }

    /**
     * A READ of {@code length} bytes at {@code offset}, for a frontend that sends the data with a write of its
     * own (a gathering socket write, a {@code pwrite} to the kernel): {@link Request#sinkReadsDevice} is set.
     * When the driver sends it straight out of the device ({@link BlockDriver#sendsInPlace}) no buffers are
     * taken, else buffers for its length. {@code op}, {@code offset} and {@code length} are set; the caller sets
     * the rest as for {@link #acquire}.
     */
    public Request acquireRead(long offset, int length) throws InterruptedException {
        return read(offset, length, true);
    }

    /** {@link #acquireRead} that never waits: null as {@link #tryAcquire}. */
    public Request tryAcquireRead(long offset, int length) throws InterruptedException {
        return read(offset, length, false);
    }

    private Request read(long offset, int length, boolean wait) throws InterruptedException {
        Request r = take(Op.READ, offset, length, driver.sendsInPlace(offset, length), wait);
        if (r != null) {
            r.sinkReadsDevice = true;
        }
        return r;
    }

    /**
     * What a READ and a WRITE take alike: {@link #acquire} (or {@link #tryAcquire} without {@code wait}: null when
     * nothing is free now) with buffers for {@code length} unless the data moves in place, and the range set.
     */
    private Request take(Op op, long offset, int length, boolean inPlace, boolean wait) throws InterruptedException {
        int dataBytes = inPlace ? 0 : length;
        Request r = wait ? acquire(dataBytes) : tryAcquire(dataBytes);
        if (r != null) {
            r.op = op;
            r.offset = offset;
            if (inPlace) {
                r.length = length;
            }
        }
        return r;
    }

    /**
     * A READ or WRITE of {@code length} bytes at {@code offset} whose data sits in memory the frontend holds (a
     * vhost-user guest's RAM): no pool chunks are taken ({@link Request#segments()} is 0), so it waits only for
     * a tag, as {@link #acquire} does. The frontend then lists the data's pieces with {@link Request#addIov}, in
     * order, adding up to {@code length}, and adds and dispatches it as any other; the driver copies between
     * the pieces and the device, by the CPU or, when every piece has an iova, by the DMA engine. {@code op},
     * {@code offset} and {@code length} are set; the caller sets the rest as for {@link #acquire}.
     * @throws IllegalArgumentException when {@code op} carries no data, or {@code length} is negative or above the
     *         queue's maxRequestBytes (nothing is taken)
     */
    public Request acquireIov(Op op, long offset, long length) throws InterruptedException {
        if (!op.carriesData() || length < 0 || length > queue.maxRequestBytes()) {
            throw new IllegalArgumentException(op + " of " + length + " bytes in caller memory on hardware queue "
                    + queue.index() + ": allowed READ or WRITE of 0.." + queue.maxRequestBytes() + " bytes");
        }
        Request r = acquire(0);
        r.useCallerMemory();
        r.op = op;
        r.offset = offset;
        r.length = length;
        return r;
    }

    /** Puts the filled request in the batch. At most {@code depth} requests fit: see {@link #full()}. */
    public void add(Request r) {
        batch[batched++] = r;
        filling = null;
    }

    /** True when the batch holds a request per tag: dispatch before acquiring more. */
    public boolean full() {
        return batched == batch.length;
    }

    /** Requests in the batch, not yet dispatched. */
    public int batched() {
        return batched;
    }

    /** Hands the whole batch to the driver in one call (nothing when empty). */
    public void dispatch() {
        int n = batched;
        if (n > 0) {
            batched = 0;
            queue.dispatch(batch, n);
            for (int i = 0; i < n; i++) {
                batch[i] = null; // the driver may keep them; we must not hold completed requests alive
            }
        }
    }

    /** Completes a request the frontend answers itself ({@code status}: OK or an errno of {@link Status}). */
    public void completeHere(Request r, int status) {
        if (r == filling) {
            filling = null;
        }
        r.complete(status);
    }

    /**
     * Teardown: releases the request being filled and the undispatched batch; returns how many it released.
     * Dispatched requests are not touched.
     */
    public int releaseUndispatched() {
        int n = 0;
        if (filling != null) {
            filling.release();
            filling = null;
            n++;
        }
        for (int i = 0; i < batched; i++) {
            batch[i].release();
            batch[i] = null;
            n++;
        }
        batched = 0;
        return n;
    }
}
