package io.pmemblk.vhost.blk;

import io.pmemblk.posix.MemoryFaults;
import io.pmemblk.posix.EdgeWait;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.virtq.BrokenRingException;
import io.pmemblk.vhost.virtq.Chain;
import io.pmemblk.vhost.virtq.Inflight;
import io.pmemblk.vhost.virtq.SplitRing;
import io.pmemblk.vhost.virtq.VirtioFeatures;
import io.pmemblk.vhost.virtq.Virtqueue;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * One virtio-blk virtqueue served by its own thread, {@code vhost-blk-q<index>} (benchmarks read those threads'
 * CPU time): woken by the kick eventfd, it pops the available chains, turns each into a block-layer request on the
 * guest's own memory ({@link FrontendQueue#acquireIov}: the driver copies between guest RAM and pmem, the only
 * copy), dispatches the whole batch in one {@link FrontendQueue#dispatch} (one doorbell per batch), and completes
 * on whichever thread the driver completes on (see {@link Virtqueue} for how used entries are published from
 * there). Requests the block layer has no part in (GET_ID, refusals) are answered on the queue thread.
 *
 * <h2>Requests (virtio 1.2 section 5.2.6)</h2>
 * A 16-byte header in the first device-readable bytes (split anywhere), data, and the status in the chain's last
 * device-writable byte. IN / OUT: a non-zero multiple of blk_size at a blk_size-aligned sector, inside the
 * device, at most the block layer's maxRequestBytes (seg_max x size_max stays within it), and no more than {@link HardwareQueue#MAX_IOVS} pieces, else IOERR;
 * IN with readable data past the header, or OUT with writable bytes besides the status, IOERR; OUT on a read-only
 * device IOERR. FLUSH -> the block layer's FLUSH (durable). GET_ID -> the serial, NUL-padded, in at most 20
 * bytes. DISCARD / WRITE_ZEROES -> TRIM / WRITE_ZEROES of exactly one 16-byte segment (max_discard_seg 1, more:
 * UNSUPP, as qemu-storage-daemon), flags other than UNMAP on WRITE_ZEROES UNSUPP, a range outside the device or
 * above the advertised maximum IOERR. Anything else UNSUPP. A chain without a device-writable byte cannot be
 * answered at all: the queue breaks.
 *
 * <h2>Polling</h2>
 * When the ring is empty the thread polls avail.idx for its {@link RingPolling} window before it re-arms kicks and
 * sleeps: a kick costs the guest a VM exit and this thread a wake-up (together several microseconds), and when the
 * guest's requests come close together the next one is caught without either. The window adapts to the gaps it
 * sees (0 up to {@code vhost.busy-poll}, {@link #DEFAULT_POLL_NANOS} by default) and at most cores - 1 queue
 * threads of the server poll at once, so that on a host whose few CPUs the guest's vCPUs share, polling does not
 * take their CPU when it cannot catch anything.
 *
 * <h2>Completions</h2>
 * Published (the used index, and the call eventfd when the guest asked for it) at the end of each dispatch, or,
 * with {@code vhost.coalesce}, held back while the thread polls for the guest's next requests and published
 * together: one interrupt for several ({@link RingPolling}, the hold). A DMA route's completions, on the engine's
 * completion thread, are published at once, with whatever is held; their interrupt is sent by the queue thread
 * (the engine's thread, which every client shares, never writes a front end's descriptor).
 */
public final class VhostBlkQueue {
    private static final System.Logger LOG = System.getLogger(VhostBlkQueue.class.getName());
    /** A guest can refuse itself as fast as it fills the ring: its refusals are rate-limited. */
    private static final RateLimitedLog REFUSALS = RateLimitedLog.to(LOG, System.Logger.Level.DEBUG);
    /** A fault in guest RAM is the operator's to know (rate-limited as the refusals: a front end can repeat it). */
    private static final RateLimitedLog GUEST_RAM_FAULTS = RateLimitedLog.withOwnLimit(LOG, System.Logger.Level.WARNING);
    public static final long DEFAULT_POLL_NANOS = 20_000;
    /**
     * vhost.coalesce's default, the longest a completion is held back for others ({@link RingPolling}, the hold).
     * bench-vhost, pmemblk/qsd in one guest, 4k QD32 and 64k QD16 jobs: no hold 0.76-1.01, 30 us 0.87-1.34,
     * 80 us 0.91-1.24; the guest's interrupts per request fell from 0.42-0.78 to 0.23-0.39. Then 100 us against
     * 50 us, pmemblk-alt/pmemblk by round (2026-12-04): 0.89-1.30 on 4k QD32, 64k QD16 and 2M QD4 jobs (median
     * 1.14), interrupts 0.16-0.34 a 4k or 64k request from 0.21-0.49; 0.95 and 0.92 at QD1 and QD4, where a guest
     * waiting for its answers paid 8 holds per 64 round trips (now per up to 4096:
     * {@link RingPolling#HOLD_PROBE_MAX_PUBLISHES}).
     */
    public static final long DEFAULT_HOLD_NANOS = 100_000;
    /**
     * STOP_MILLIS: how long after {@link #halt} the thread may take to leave its loop before it is interrupted (it is
     * then waiting for a tag). DRAIN_MILLIS: what {@link #stop} gives in-flight requests on top of that; the session
     * gives them as long as the front-end waits ({@link #awaitQuiet}).
     */
    static final long STOP_MILLIS = 5_000, DRAIN_MILLIS = 10_000;
    /**
     * Chains per dispatch: on the CPU route requests complete inside the dispatch, and the guest sees none of a
     * batch's completions until it ends. A whole ring's worth at once (32 at QD32) keeps the guest's vCPU waiting
     * for the last copy before it can handle the first completion; a few at a time lets it complete and submit
     * while this thread copies the next few, as qemu-storage-daemon does completing each request on its own. Still
     * a batch: one doorbell for the DMA engine, one publish and at most one interrupt per {@code BATCH} requests.
     * Measured (bench-vhost, pmemblk/qsd in one guest): 32 per dispatch 0.80-0.94 at 4k and 0.86-1.10 at 64k; 8 and 2
     * both higher (0.91-1.20, 0.71-1.39) on a host too loaded to tell them apart; 4 stands between them.
     */
    static final int BATCH = 4;
    /**
     * Completions a hold gathers at most before they are published anyway ({@link RingPolling}: the hold): a
     * quarter to a half of a QD32 guest's depth, so the guest never waits long for a whole burst.
     */
    static final int HOLD_COMPLETIONS = 16;
    /** Pieces a chain may have besides its data: header and status, each possibly split once. */
    private static final int CHAIN_SLACK = 4;

    private final int index;
    private final int size;
    private final EventFd call;
    /**
     * The thread's sleep: the kick and {@link #wake}, edge-triggered ({@link EdgeWait}), so a wake-up is one
     * epoll_wait and the kick's counter is never read (poll and read cost 5-8% of a DMA-route queue thread).
     */
    private final EdgeWait sleep;
    /** stop() signals it: the sleep needs no timeout to see the stop flag, and the kick is the front-end's. */
    private final EventFd wake;
    private final FrontendQueue frontend;
    private final Supplier<GuestMemory> memory;
    private final BlkDevice device;
    private final RingPolling.Window polling;
    /** When the oldest completion held back was made (System.nanoTime), or 0 when none is held. */
    private long heldSince;
    private final long maxDataBytes;
    private final Virtqueue vq;
    private final Chain chain = new Chain(HardwareQueue.MAX_IOVS + CHAIN_SLACK);
    private final Thread thread;
    private final MemorySegment serialBytes;
    /** Per head: where its status byte is and what used.len an OK answer reports. */
    private final MemorySegment[] statusMapping;
    private final long[] statusOffset;
    private final int[] okLength;

    /** What the driver calls when one of this queue's requests is done (any thread). */
    private final Request.Completion completion = this::completed;
    private volatile boolean running;
    /**
     * A completion on another thread (the DMA engine's completion thread, which every client shares) published
     * used entries the guest is to be interrupted for: the queue thread writes the call eventfd
     * ({@link #sendDueCall}), woken by {@link #wake}. The call fd is the front end's: a front end can make a write
     * to it block (its counter full and O_NONBLOCK cleared on the description it shares with us), and then only
     * its own queue thread waits, never the engine that serves every other client.
     */
    private volatile boolean callDue;
    /** SET_VRING_ENABLE: while false the thread pops nothing ({@link #enable}). */
    private volatile boolean enabled = true;
    /** When {@link #halt} was called (System.nanoTime), and whether {@link #awaitQuiet} interrupted the thread. */
    private volatile long haltedAt;
    private boolean interrupted;
    /** Under this: whether the thread runs, {@link #detach} was called, its action ran (see {@link #quietIfDone}). */
    private boolean threadLive;
    private boolean detached;
    private boolean quiet;
    private Runnable quietAction;
    private volatile boolean broken;
    private volatile String brokenReason;
    private volatile boolean writeThrough;
    private boolean signalFailed;

    /** With the default polling; see {@link #VhostBlkQueue(int, int, long, long, long, int, long, EventFd, EventFd,
     *  FrontendQueue, Supplier, MemorySegment, BlkDevice, RingPolling)}. */
    public VhostBlkQueue(int index, int size, long descUser, long availUser, long usedUser, int baseIndex,
                         long features, EventFd kick, EventFd call, FrontendQueue frontend,
                         Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device) {
        this(index, size, descUser, availUser, usedUser, baseIndex, features, kick, call, frontend, memory, inflight,
                device, new RingPolling(DEFAULT_POLL_NANOS, DEFAULT_HOLD_NANOS, RingPolling.defaultMaxPollers()));
    }

    /**
     * Maps the rings (QEMU's addresses of SET_VRING_ADDR, through the current memory table) and, with an inflight
     * region, recovers what an earlier back-end left in flight; {@link #start} starts serving.
     * @param features  the negotiated virtio features
     * @param call      the call eventfd, or null when the queue has no interrupt vector
     * @param inflight  this queue's slice of the inflight region (its desc_num written), or null
     * @param polling   the server's polling bounds, of which this queue takes one window
     * @throws IllegalArgumentException when a ring is outside guest memory or misaligned, or the size is not 1..32768
     * @throws IllegalStateException when the inflight region contradicts the ring
     */
    public VhostBlkQueue(int index, int size, long descUser, long availUser, long usedUser, int baseIndex,
                         long features, EventFd kick, EventFd call, FrontendQueue frontend,
                         Supplier<GuestMemory> memory, MemorySegment inflight, BlkDevice device, RingPolling polling) {
        if (size < 1 || size > SplitRing.MAX_SIZE) {
            throw new IllegalArgumentException("virtqueue " + index + " size " + size + ": allowed 1.." + SplitRing.MAX_SIZE);
        }
        this.index = index;
        this.size = size;
        this.call = call;
        this.frontend = frontend;
        this.memory = memory;
        this.device = device;
        this.polling = polling.window();
        this.maxDataBytes = frontend.queue().maxRequestBytes();
        GuestMemory mem = memory.get();
        boolean eventIdx = (features & VirtioFeatures.bit(VirtioFeatures.RING_EVENT_IDX)) != 0;
        SplitRing ring = new SplitRing(size, eventIdx, area(mem, "descriptor table", descUser, SplitRing.descBytes(size)),
                area(mem, "avail ring", availUser, SplitRing.availBytes(size, eventIdx)),
                area(mem, "used ring", usedUser, SplitRing.usedBytes(size, eventIdx)));
        // Indirect tables: as long as the queue, or as a request of seg_max segments with header and status.
        int maxIndirect = Math.max(size, HardwareQueue.MAX_IOVS + 2);
        this.vq = new Virtqueue(index, ring, features, baseIndex, maxIndirect,
                inflight == null ? null : new Inflight(inflight, size));
        vq.recover();
        byte[] serial = device.serial().getBytes(StandardCharsets.US_ASCII);
        this.serialBytes = MemorySegment.ofArray(new byte[VirtioBlk.ID_BYTES]); // NUL-padded
        MemorySegment.copy(MemorySegment.ofArray(serial), 0, serialBytes, 0, serial.length);
        this.statusMapping = new MemorySegment[size];
        this.statusOffset = new long[size];
        this.okLength = new int[size];
        this.thread = Thread.ofPlatform().name("vhost-blk-q" + index).daemon(true).unstarted(this::run);
        EventFd w = null;
        EdgeWait e = null;
        try {
            w = EventFd.create(true);
            e = EdgeWait.create(2);
            e.add(kick);
            e.add(w);
        } catch (NativeException x) {
            closeQuietly(e);
            closeQuietly(w);
            throw new IllegalStateException("virtqueue " + index + ": cannot wait for its kick " + kick + ": " + x.getMessage(), x);
        }
        this.wake = w;
        this.sleep = e;
    }

    private static void closeQuietly(AutoCloseable c) {
        if (c != null) {
            try {
                c.close();
            } catch (Exception x) {
                LOG.log(System.Logger.Level.DEBUG, "closing " + c + ": " + x);
            }
        }
    }

    private MemorySegment area(GuestMemory mem, String what, long userAddr, long bytes) {
        MemorySegment s = mem.userSlice(userAddr, bytes);
        if (s == null) {
            throw new IllegalArgumentException("virtqueue " + index + ": " + what + " at QEMU address 0x"
                    + Long.toHexString(userAddr) + ", " + bytes + " bytes, is not inside one guest memory region");
        }
        return s;
    }

    public int index() {
        return index;
    }

    /** Starts the queue thread. */
    public void start() {
        running = true;
        synchronized (this) {
            threadLive = true;
        }
        thread.start();
    }

    /** The queue thread (its CPU time is what the benchmarks measure). */
    public Thread thread() {
        return thread;
    }

    /** Whether the guest broke the ring's rules: the queue then pops nothing more (logged once). */
    public boolean broken() {
        return broken;
    }

    /** What broke the queue (for the session's log or a metric), or null. */
    public String brokenReason() {
        return brokenReason;
    }

    /**
     * SET_CONFIG's wce: with the write cache off (write-through) the guest sends no FLUSH, so every write is made
     * durable before it completes (FUA).
     */
    public void writeCache(boolean enabled) {
        writeThrough = !enabled;
    }

    /**
     * SET_VRING_ENABLE: a disabled ring is not processed (vhost-user.rst "Ring states": a started but disabled
     * ring is processed "without causing any side effects", and for a block device every request is one): its
     * avail entries stay where they are, untouched, until it is enabled again; requests already taken still
     * complete. A queue is enabled unless told otherwise; the session disables it before {@link #start} when
     * VHOST_USER_F_PROTOCOL_FEATURES was negotiated (rings then start disabled).
     */
    public void enable(boolean on) {
        enabled = on;
        if (on && thread.isAlive()) {
            wake.signal(); // it may be asleep with the guest's kicks already spent
        }
    }

    /**
     * GET_VRING_BASE, and as long as it takes, the first of three steps (then {@link #awaitQuiet}, then
     * {@link #detach}): the thread stops popping and leaves its loop once its batch is dispatched. Requests in
     * flight go on, and their completions are still published to the guest. Once.
     */
    public void halt() {
        running = false;
        haltedAt = System.nanoTime();
        if (thread.isAlive()) {
            try {
                wake.signal(); // ends its sleep
            } catch (RuntimeException e) {
                LOG.log(System.Logger.Level.DEBUG, "vhost-blk-q" + index + ": waking the queue thread: " + e);
            }
        }
    }

    /**
     * Waits at most {@code millis} for the queue to be quiet after {@link #halt}: its thread ended and no request
     * in flight (each completed and published). A thread still alive {@link #STOP_MILLIS} after the halt is
     * interrupted, once: it is blocked waiting for a tag, and gives the chain it holds back ({@link Virtqueue#unpop}).
     * @return whether it is quiet: then {@link #detach} answers the ring's exact next avail index
     */
    public boolean awaitQuiet(long millis) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        if (thread.isAlive() && !interrupted) {
            long interruptAt = haltedAt + TimeUnit.MILLISECONDS.toNanos(STOP_MILLIS);
            join(Math.min(deadline, interruptAt));
            if (thread.isAlive() && System.nanoTime() - interruptAt >= 0) {
                interrupted = true;
                thread.interrupt();
            }
        }
        join(deadline);
        if (thread.isAlive()) {
            return false;
        }
        return vq.awaitIdle(Math.max(0, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())));
    }

    /** Joins the thread until {@code deadline} (System.nanoTime) at the latest. */
    private void join(long deadline) throws InterruptedException {
        long left = deadline - System.nanoTime();
        if (left > 0 && thread.isAlive()) {
            thread.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left))); // join(0) would wait for ever
        }
    }

    /** The heads in flight now, for a log line (what the guest is still waiting for). */
    public String inFlightHeads() {
        return vq.inFlightHeads();
    }

    /**
     * The last step of a stop: from here on nothing is written to guest memory or the inflight region: a request
     * still in flight completes into nothing (it stays marked in the inflight region, for the next start to
     * resubmit). {@code whenQuiet} runs once when the thread has ended and the last such request has completed:
     * at once, here, when the queue is quiet already (after {@link #awaitQuiet} said so), else on the thread that
     * ends the last of them. Until then guest memory may still be touched (a copy under way), so it must stay
     * mapped: {@code whenQuiet} is where the session lets it go.
     * @param whenQuiet run once quiet, or null
     * @return the next avail index: the ring's true position (GET_VRING_BASE's answer) when the queue was quiet
     */
    public int detach(Runnable whenQuiet) {
        synchronized (vq) {
            vq.stop();
        }
        // After vq.stop() completions write nothing (nor wake the thread); what those before it left due goes now,
        // before the session closes the call fd (the thread has ended or no longer sends it).
        sendDueCall();
        synchronized (this) {
            quietAction = whenQuiet;
            detached = true;
        }
        quietIfDone();
        return vq.lastAvail();
    }

    /** Runs the quiet action once detached, the thread ended and nothing in flight (any thread). */
    private void quietIfDone() {
        Runnable action;
        synchronized (this) {
            if (!detached || quiet || threadLive || vq.inFlight() > 0) {
                return;
            }
            quiet = true;
            action = quietAction;
            quietAction = null;
        }
        closeQuietly(sleep); // the thread has ended and halt() has signalled: nobody uses them any more
        closeQuietly(wake);
        if (action != null) {
            action.run();
        }
    }

    /**
     * halt, awaitQuiet and detach in one (the queue's own tests, and a back-end without a session): waits at most
     * 2 x {@link #STOP_MILLIS} + {@link #DRAIN_MILLIS}.
     * @return the next avail index
     * @throws IllegalStateException when the queue is not quiet by then (naming the heads in flight); nothing more
     *         is written to guest memory either way
     */
    public int stop() throws InterruptedException {
        halt();
        boolean quietNow = awaitQuiet(2 * STOP_MILLIS + DRAIN_MILLIS);
        String left = quietNow ? "" : vq.inFlightHeads();
        int base = detach(null);
        if (!quietNow) {
            throw new IllegalStateException("vhost-blk-q" + index + (thread.isAlive() ? " did not stop; it is "
                    + thread.getState() : ": requests of heads " + left + " still in flight") + " "
                    + (2 * STOP_MILLIS + DRAIN_MILLIS) + " ms after stop; the guest will not see them complete");
        }
        return base;
    }

    /** The next avail index the queue would pop (GET_VRING_BASE's value). */
    public int lastAvail() {
        return vq.lastAvail();
    }

    /** Heads in flight now. */
    public int inFlight() {
        return vq.inFlight();
    }

    private void run() {
        try {
            vq.disableKicks();
            while (running) {
                sendDueCall();
                if (!enabled) {
                    if (heldSince != 0) {
                        publishHeld(); // what was answered before the ring was disabled
                    }
                    sleep.await(-1); // enable(true) or halt() signals; a kick meanwhile only wakes it to sleep again
                    continue;
                }
                if (processBatch() > 0) {
                    continue;
                }
                if (heldSince != 0 && holdForRequests()) {
                    continue; // a request came: its completion joins the ones held
                }
                long idleFrom = System.nanoTime();
                if (!pollRing(idleFrom)) {
                    if (vq.enableKicks()) { // a request came as the kick was re-armed: no kick will say so
                        vq.disableKicks();
                    } else {
                        sleep.await(-1); // a kick, or stop()'s wake
                        vq.disableKicks();
                    }
                }
                polling.idled(System.nanoTime() - idleFrom);
            }
        } catch (BrokenRingException e) {
            breaks(e.getMessage(), null);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // stop() interrupted a wait for a tag
        } catch (Exception | Error e) {
            // A region unmapped under the ring, an eventfd gone: nothing the guest can be told through this queue.
            breaks("stopped by " + e, e);
        } finally {
            frontend.dispatch(); // what the batch holds still completes
            publishHeld(); // before stop() returns and QEMU unmaps the ring
            sendDueCall();
            frontend.releaseUndispatched(); // a request being filled when something threw
            synchronized (this) {
                threadLive = false;
            }
            quietIfDone(); // a detached queue whose requests all completed while this thread was still busy
        }
    }

    private void breaks(String why, Throwable t) {
        brokenReason = why;
        broken = true;
        LOG.log(System.Logger.Level.WARNING, "vhost-blk-q" + index + " broken, it serves no more requests until the"
                + " front-end restarts it: " + why, t);
    }

    /**
     * Polls avail.idx for this queue's window, when it has one and one of the server's polling places is free.
     * @return true when a request is available (no need to re-arm the kick)
     */
    private boolean pollRing(long from) {
        if (!polling.beginPoll()) {
            return false;
        }
        try {
            long window = polling.nanos();
            do {
                Thread.onSpinWait();
                if (vq.hasAvailable()) {
                    return true;
                }
                sendDueCall(); // a DMA completion meanwhile: its interrupt is not held for the poll
            } while (System.nanoTime() - from < window);
            return false;
        } finally {
            polling.endPoll();
        }
    }

    /**
     * The ring is empty and completions are held: polls it for the rest of the hold ({@link RingPolling}, the
     * hold) while a polling place is free. True when a request came (the caller processes it, the completions
     * still held); else they are published, and the guest interrupted if it asked to be.
     */
    private boolean holdForRequests() {
        if (polling.beginHold()) {
            try {
                long hold = polling.holdNanos();
                while (running && System.nanoTime() - heldSince < hold) {
                    Thread.onSpinWait();
                    sendDueCall(); // a DMA completion published everything held with its own
                    if (vq.hasAvailable()) {
                        polling.held(true);
                        return true;
                    }
                }
                // Ran out with no request in it: the guest sent nothing while its answers waited, so it may have
                // been waiting for them (a guest at QD1, or at QD4 with all four held), whatever their number.
                polling.held(false);
            } finally {
                polling.endPoll();
            }
        }
        publishHeld();
        return false;
    }

    private void publishHeld() {
        heldSince = 0;
        signal(vq.publishHeld());
    }

    /**
     * Pops what is available (at most {@link #BATCH} chains, and no more than the frontend's free tags), submits
     * them, dispatches once and publishes the queue thread's own completions once, or holds them back (the
     * {@link RingPolling} hold) until {@link #HOLD_COMPLETIONS} wait or the hold is over.
     */
    private int processBatch() throws BrokenRingException, InterruptedException {
        if (!vq.hasAvailable()) {
            return 0;
        }
        GuestMemory mem = memory.get();
        int n = 0;
        vq.beginBatch();
        try {
            // running: after halt() nothing more is taken (the thread may still be here, waiting for a tag)
            while (n < BATCH && running && !frontend.full() && vq.pop(mem, chain)) {
                n++;
                submit(chain);
            }
            frontend.dispatch();
        } finally {
            boolean hold = polling.holdNanos() > 0;
            signal(vq.endBatch(hold ? HOLD_COMPLETIONS : 0));
            if (!hold) {
                polling.published();
            }
        }
        if (vq.unpublished() == 0) {
            heldSince = 0; // published here, or by a DMA completion meanwhile
        } else if (heldSince == 0) {
            heldSince = System.nanoTime();
        }
        return n;
    }

    private void submit(Chain c) throws BrokenRingException, InterruptedException {
        int head = c.head();
        MemorySegment statusMap = c.lastWritableMapping();
        if (statusMap == null) {
            vq.unpop(head);
            throw new BrokenRingException("virtqueue " + index + ": the chain of head " + head
                    + " has no device-writable byte for its status");
        }
        statusMapping[head] = statusMap;
        statusOffset[head] = c.lastWritableOffset();
        if (c.readableBytes() < VirtioBlk.OUTHDR_BYTES) {
            refuse(head, VirtioBlk.S_IOERR, "a header of " + c.readableBytes() + " device-readable bytes: 16 needed");
            return;
        }
        if (c.overflowed()) {
            refuse(head, VirtioBlk.S_IOERR, "a chain of more than " + (HardwareQueue.MAX_IOVS + CHAIN_SLACK)
                    + " pieces of guest memory");
            return;
        }
        int type = (int) c.readLE(VirtioBlk.OUTHDR_TYPE, 4);
        long sector = c.readLE(VirtioBlk.OUTHDR_SECTOR, 8);
        long readData = c.readableBytes() - VirtioBlk.OUTHDR_BYTES;
        long writeData = c.writableBytes() - 1;
        switch (type) {
            case VirtioBlk.T_IN -> {
                if (readData != 0) {
                    refuse(head, VirtioBlk.S_IOERR, "IN with " + readData + " device-readable bytes after its header");
                } else if (dataOk(head, "IN", sector, writeData)) {
                    data(c, head, Op.READ, sector, writeData);
                }
            }
            case VirtioBlk.T_OUT -> {
                if (writeData != 0) {
                    refuse(head, VirtioBlk.S_IOERR, "OUT with " + writeData + " device-writable bytes besides its status");
                } else if (device.readOnly()) {
                    refuse(head, VirtioBlk.S_IOERR, "OUT on a read-only device");
                } else if (dataOk(head, "OUT", sector, readData)) {
                    data(c, head, Op.WRITE, sector, readData);
                }
            }
            case VirtioBlk.T_FLUSH -> range(head, Op.FLUSH, 0, 0);
            case VirtioBlk.T_GET_ID -> {
                if (writeData == 0) {
                    refuse(head, VirtioBlk.S_IOERR, "GET_ID without a device-writable buffer for the serial");
                    return;
                }
                long written = c.writeFrom(serialBytes, Math.min(writeData, VirtioBlk.ID_BYTES));
                answer(head, VirtioBlk.S_OK, (int) written + 1);
            }
            case VirtioBlk.T_DISCARD, VirtioBlk.T_WRITE_ZEROES -> discardOrZero(c, head, type, readData);
            default -> refuse(head, VirtioBlk.S_UNSUPP, "request type " + Integer.toUnsignedString(type)
                    + ": served IN 0, OUT 1, FLUSH 4, GET_ID 8, DISCARD 11, WRITE_ZEROES 13");
        }
    }

    /** Whether an IN / OUT of {@code bytes} at {@code sector} may be served; refused (IOERR) if not. */
    private boolean dataOk(int head, String what, long sector, long bytes) {
        int blk = device.blkSize();
        String wrong = null;
        if (bytes <= 0 || bytes % blk != 0) {
            wrong = bytes + " data bytes: allowed a non-zero multiple of the block size " + blk;
        } else if (bytes > maxDataBytes) {
            wrong = bytes + " data bytes: at most " + maxDataBytes + " (the block layer's maxRequestBytes, which seg_max"
                    + " x size_max stays within)";
        } else if (!inDevice(sector, bytes / VirtioBlk.SECTOR)) {
            wrong = "sector " + Long.toUnsignedString(sector) + " + " + bytes / VirtioBlk.SECTOR
                    + " sectors: outside the device of " + device.capacitySectors() + " sectors";
        } else if (sector % (blk / VirtioBlk.SECTOR) != 0) {
            wrong = "sector " + sector + ": not aligned to the block size " + blk;
        }
        if (wrong != null) {
            refuse(head, VirtioBlk.S_IOERR, what + " of " + wrong);
            return false;
        }
        return true;
    }

    /** Unsigned: sectors [sector, sector + count) lie in the device (no overflow: sector is compared first). */
    private boolean inDevice(long sector, long count) {
        long cap = device.capacitySectors();
        return Long.compareUnsigned(sector, cap) <= 0 && count <= cap - sector;
    }

    /**
     * IN / OUT: the data are the chain's readable bytes after the header (OUT) or its writable bytes before the
     * status byte (IN), {@code bytes} of them, in pieces as the chain has them.
     */
    private void data(Chain c, int head, Op op, long sector, long bytes) throws InterruptedException {
        boolean write = op == Op.WRITE;
        int first = write ? 0 : c.readable();
        int end = write ? c.readable() : c.count();
        long skip = write ? VirtioBlk.OUTHDR_BYTES : 0;
        int pieces = dataPieces(c, first, end, skip, bytes); // counted before a request is taken for it
        if (pieces > HardwareQueue.MAX_IOVS) {
            refuse(head, VirtioBlk.S_IOERR, op + " in " + pieces + " pieces of guest memory: at most "
                    + HardwareQueue.MAX_IOVS + " (seg_max segments, each split at most once between regions)");
            return;
        }
        Request r;
        try {
            r = frontend.acquireIov(op, sector * VirtioBlk.SECTOR, bytes);
        } catch (InterruptedException e) {
            vq.unpop(head); // never submitted: popped again by the next pop, or not counted by GET_VRING_BASE
            throw e;
        }
        long left = bytes;
        for (int i = first; i < end && left > 0; i++) {
            long off = c.offset(i), len = c.length(i);
            if (skip >= len) {
                skip -= len;
                continue;
            }
            long take = Math.min(len - skip, left);
            long iova = c.iova(i);
            r.addIov(c.mapping(i), off + skip, take, iova == Request.NO_IOVA ? iova : iova + skip);
            skip = 0;
            left -= take;
        }
        okLength[head] = write ? 1 : (int) bytes + 1;
        submitRequest(r, head);
    }

    /** How many pieces {@code bytes} data bytes take from pieces [first, end) after skipping {@code skip} bytes. */
    private static int dataPieces(Chain c, int first, int end, long skip, long bytes) {
        int n = 0;
        for (int i = first; i < end && bytes > 0; i++) {
            long len = c.length(i);
            if (skip >= len) {
                skip -= len;
                continue;
            }
            bytes -= Math.min(len - skip, bytes);
            skip = 0;
            n++;
        }
        return n;
    }

    private void discardOrZero(Chain c, int head, int type, long readData) throws InterruptedException {
        boolean zero = type == VirtioBlk.T_WRITE_ZEROES;
        String name = zero ? "WRITE_ZEROES" : "DISCARD";
        if (!(zero ? device.canZero() : device.canDiscard())) {
            refuse(head, VirtioBlk.S_UNSUPP, name + ": not offered by this device");
            return;
        }
        if (device.readOnly()) {
            refuse(head, VirtioBlk.S_IOERR, name + " on a read-only device");
            return;
        }
        if (readData != VirtioBlk.SEGMENT_BYTES) {
            refuse(head, readData > 0 && readData % VirtioBlk.SEGMENT_BYTES == 0 ? VirtioBlk.S_UNSUPP : VirtioBlk.S_IOERR,
                    name + " with " + readData + " bytes of segments: exactly one 16-byte segment (max_discard_seg 1)");
            return;
        }
        long at = VirtioBlk.OUTHDR_BYTES;
        long sector = c.readLE(at + VirtioBlk.SEGMENT_SECTOR, 8);
        long count = c.readLE(at + VirtioBlk.SEGMENT_NUM_SECTORS, 4);
        int flags = (int) c.readLE(at + VirtioBlk.SEGMENT_FLAGS, 4);
        int allowed = zero ? VirtioBlk.WRITE_ZEROES_FLAG_UNMAP : 0;
        int align = device.blkSize() / VirtioBlk.SECTOR;
        if ((flags & ~allowed) != 0) {
            refuse(head, VirtioBlk.S_UNSUPP, name + " with flags 0x" + Integer.toHexString(flags) + ": allowed 0x"
                    + Integer.toHexString(allowed));
        } else if (count == 0 || count > VirtioBlkConfig.MAX_RANGE_SECTORS) {
            refuse(head, VirtioBlk.S_IOERR, name + " of " + count + " sectors: allowed 1.."
                    + VirtioBlkConfig.MAX_RANGE_SECTORS);
        } else if (!inDevice(sector, count)) {
            refuse(head, VirtioBlk.S_IOERR, name + " of sector " + Long.toUnsignedString(sector) + " + " + count
                    + ": outside the device of " + device.capacitySectors() + " sectors");
        } else if (sector % align != 0 || count % align != 0) {
            refuse(head, VirtioBlk.S_IOERR, name + " of sector " + sector + " + " + count + ": not aligned to the"
                    + " block size " + device.blkSize());
        } else {
            range(head, zero ? Op.WRITE_ZEROES : Op.TRIM, sector * VirtioBlk.SECTOR, count * VirtioBlk.SECTOR);
        }
    }

    /** A request without data (FLUSH, TRIM, WRITE_ZEROES) through the block layer. */
    private void range(int head, Op op, long offset, long length) throws InterruptedException {
        Request r;
        try {
            r = frontend.acquire(0);
        } catch (InterruptedException e) {
            vq.unpop(head);
            throw e;
        }
        r.op = op;
        r.offset = offset;
        r.length = length;
        okLength[head] = 1;
        submitRequest(r, head);
    }

    private void submitRequest(Request r, int head) {
        r.cookie = head;
        r.fua = writeThrough && r.op != Op.READ && r.op != Op.FLUSH;
        r.completion = completion;
        frontend.add(r);
    }

    /** The driver completed a request (any thread): its status goes to the guest, its tag back to the layer. */
    private void completed(Request r) {
        int head = (int) r.cookie;
        int status = r.status();
        if (status == Status.EIO && r.callerMemory()) {
            noteGuestRamFault(r, head); // before the release: the pieces are the request's
        }
        r.release(); // before the guest sees the head complete: its next request finds the tag free
        byte s = status == Status.OK ? VirtioBlk.S_OK : status == Status.ENOTSUP ? VirtioBlk.S_UNSUPP : VirtioBlk.S_IOERR;
        answer(head, s, s == VirtioBlk.S_OK ? okLength[head] : 1);
    }

    /**
     * A data request failed: when one of its pieces of guest RAM no longer loads (a poisoned line; memory a front
     * end took away), says so naming the region, so the log blames guest RAM, not the device. Failure path only,
     * rate-limited with the refusals; the loads are checked accesses ({@link MemoryFaults}), safe on any thread.
     */
    private void noteGuestRamFault(Request r, int head) {
        if (!GUEST_RAM_FAULTS.enabled()) {
            return;
        }
        GuestMemory mem = memory.get();
        for (int i = 0, n = r.iovCount(); i < n; i++) {
            MemorySegment piece = r.iovMapping(i).asSlice(r.iovStart(i), r.iovLength(i));
            if (!MemoryFaults.loads(piece)) {
                String region = "at address 0x" + Long.toHexString(piece.address());
                for (int k = 0; k < mem.regionCount(); k++) {
                    if (mem.region(k).mapping().address() == r.iovMapping(i).address()) {
                        region = mem.region(k) + " at offset 0x" + Long.toHexString(r.iovStart(i));
                    }
                }
                GUEST_RAM_FAULTS.refused("vhost-blk-q{0} head {1}: IOERR: guest RAM {2} ({3} bytes) faulted: the front"
                        + " end''s memory, not the device", index, head, region, Long.toString(r.iovLength(i)));
                return;
            }
        }
    }

    private void refuse(int head, byte status, String why) {
        refuseLog(head, why);
        answer(head, status, 1);
    }

    private void refuseLog(int head, String why) {
        if (REFUSALS.enabled()) {
            REFUSALS.refused("vhost-blk-q{0} head {1} refused: {2}", index, head, why);
        }
    }

    /**
     * Writes the status byte and pushes the head; signals the call eventfd when the ring says so: on the queue
     * thread itself, or, from another thread, by handing the signal to the queue thread ({@link #callDue}), whose
     * wake-up is our own non-blocking eventfd, signalled under vq's monitor: after {@link #detach} stops vq no
     * completion reaches it, so it may be closed. On a detached queue it writes nothing: the last such completion
     * runs the quiet action.
     */
    private void answer(int head, byte status, int usedLen) {
        boolean signal = false;
        boolean lastOfDetached = false;
        boolean queueThread = Thread.currentThread() == thread;
        synchronized (vq) {
            if (vq.stopped()) {
                lastOfDetached = vq.abandon(head) == 0; // the ring is no longer ours, nor perhaps guest memory
            } else {
                statusMapping[head].set(ValueLayout.JAVA_BYTE, statusOffset[head], status);
                signal = vq.push(head, usedLen);
                if (signal && !queueThread && call != null) {
                    callDue = true;
                    try {
                        wake.signal(); // never blocks: ours, non-blocking (EAGAIN, a full counter, is a wake pending)
                    } catch (RuntimeException e) {
                        LOG.log(System.Logger.Level.DEBUG, "vhost-blk-q" + index + ": waking the queue thread: " + e);
                    }
                    return;
                }
            }
        }
        if (lastOfDetached) {
            quietIfDone();
            return;
        }
        signal(signal);
    }

    /** Sends the interrupt a completion on another thread left due ({@link #callDue}): queue thread, or stop(). */
    private void sendDueCall() {
        if (callDue) {
            callDue = false;
            signal(true);
        }
    }

    private void signal(boolean due) {
        if (!due || call == null) {
            return;
        }
        try {
            call.signal();
        } catch (RuntimeException e) {
            if (!signalFailed) { // once: the session replaces or closes the call fd, the next SET_VRING_CALL fixes it
                signalFailed = true;
                LOG.log(System.Logger.Level.WARNING, "vhost-blk-q" + index + ": signalling the call eventfd " + e);
            }
        }
    }
}
