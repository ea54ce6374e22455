package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EdgeWait;
import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.NativeException;
import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.spec.SplitRingLayout;
import io.pmemblk.vhost.virtq.BrokenRingException;
import io.pmemblk.vhost.virtq.Chain;
import io.pmemblk.vhost.virtq.Inflight;
import io.pmemblk.vhost.virtq.SplitRing;
import io.pmemblk.vhost.virtq.VirtioFeatures;
import io.pmemblk.vhost.virtq.Virtqueue;

import java.lang.foreign.MemorySegment;
import java.util.function.Supplier;

/**
 * One virtio-blk virtqueue served by its own thread, {@code vhost-blk-q<index>} (benchmarks read those threads'
 * CPU time): woken by the kick eventfd, it pops the available chains, turns each into a block-layer request on the
 * guest's own memory ({@link BlkRequests}: the driver copies between guest RAM and pmem, the only copy),
 * dispatches the whole batch in one {@link FrontendQueue#dispatch} (one doorbell per batch), and completes on
 * whichever thread the driver completes on ({@link BlkAnswers}; see {@link Virtqueue} for how used entries are
 * published from there). Requests the block layer has no part in (GET_ID, refusals) are answered on the queue
 * thread.
 *
 * <h2>Polling</h2>
 * When the ring is empty the thread polls avail.idx for its {@link RingPolling} window before it re-arms kicks and
 * sleeps: a kick costs the guest a VM exit and this thread a wake-up (together several microseconds), and when the
 * guest's requests come close together the next one is caught without either. The window adapts to the gaps it
 * sees (0 up to {@code vhost.busy-poll}, {@link #DEFAULT_POLL_NANOS} by default) and at most cores - 1 queue
 * threads of the server poll at once, so that on a host whose few CPUs the guest's vCPUs share, polling does not
 * take their CPU when it cannot catch anything. Not while requests of the queue are in flight on a DMA engine and
 * the ring is empty: their completion wakes the thread (its interrupt's eventfd, or the hand-off of the guest's
 * interrupt), and a guest at its queue depth sends its next request only once it has seen one complete, so a poll
 * then mostly catches nothing while costing the CPU the offload is meant to save; the thread sleeps on the kick,
 * its wake and the completions at once and is woken by whichever comes first, as SPDK's poller in interrupt mode.
 * Those sleeps do not adapt the window: they measure the device, not the guest. With {@link #KICKLESS_IN_FLIGHT} or
 * more of them in flight on an engine whose completions this thread reaps, the kick stays off too: the first
 * completion wakes the thread, which then takes what the guest made available meanwhile while the device still
 * copies the rest, so a request costs one wake-up (its completion's) instead of two (its kick's too), and the
 * device never runs dry for it.
 *
 * <h2>Completions</h2>
 * Published (the used index, and the call eventfd when the guest asked for it) at the end of each dispatch, or,
 * with {@code vhost.coalesce}, held back while the thread polls for the guest's next requests and published
 * together: one interrupt for several ({@link RingPolling}, the hold). A DMA route's completions, on the engine's
 * completion thread, are published at once, with whatever is held; their interrupt is sent by the queue thread
 * (the engine's thread, which every client shares, never writes a front end's descriptor). With requests in flight
 * on a DMA engine the hold is not spent: what is held is published at once, as the loop sleeps instead of polling.
 */
public final class VhostBlkQueue {
    private static final System.Logger LOG = System.getLogger(VhostBlkQueue.class.getName());
    public static final long DEFAULT_POLL_NANOS = 20_000;
    /**
     * Requests in flight on a DMA engine this thread reaps from which it sleeps with the guest's kicks off: woken by
     * the first completion, it takes the requests made available meanwhile while the device still has another to
     * copy, so the device does not run dry, and a request costs this thread one wake-up instead of two (its kick
     * and its completion). Below it, a kick wakes the thread as before: with one request on the device the next
     * must not wait for it.
     */
    static final int KICKLESS_IN_FLIGHT = 2;
    /**
     * vhost.coalesce's default, the longest a completion is held back for others ({@link RingPolling}, the hold):
     * long enough to gather a QD32 guest's next requests' completions into one interrupt (an interrupt costs the
     * guest far more than a request costs here), short enough that a guest waiting for its answers (QD1-4) loses
     * little, now that the hold is tried only every {@link RingPolling#HOLD_PROBE_MAX_PUBLISHES} publishes where it
     * does not pay. The measurements behind it: docs/performance.md, "The vhost queue's constants".
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
     * The measurements behind 4: docs/performance.md, "The vhost queue's constants".
     */
    static final int BATCH = 4;
    /**
     * Completions a hold gathers at most before they are published anyway ({@link RingPolling}: the hold): a
     * quarter to a half of a QD32 guest's depth, so the guest never waits long for a whole burst.
     */
    static final int HOLD_COMPLETIONS = 16;

    private final int index;
    /**
     * The thread's sleep: the kick and {@link #wake}, edge-triggered ({@link EdgeWait}), so a wake-up is one
     * epoll_wait and the kick's counter is never read (poll and read cost 5-8% of a DMA-route queue thread).
     */
    private final EdgeWait sleep;
    /** stop() signals it: the sleep needs no timeout to see the stop flag, and the kick is the front-end's. */
    private final EventFd wake;
    private final FrontendQueue frontend;
    private final Supplier<GuestMemory> memory;
    private final RingPolling.Window polling;
    /** When the oldest completion held back was made (System.nanoTime), or 0 when none is held. */
    private long heldSince;
    private final Virtqueue vq;
    private final Chain chain = new Chain(HardwareQueue.MAX_IOVS + BlkRequests.CHAIN_SLACK);
    private final Thread thread;
    private final BlkRequests requests;
    private final BlkAnswers answers;
    /** Broken, or halted and detached: the stop's bookkeeping and the thread's way out. */
    private final QueueStop stopping;

    private volatile boolean running;
    /** The queue thread reaps its requests' DMA completions itself ({@link #startReaping}); its own field. */
    private boolean reaping;
    /** SET_VRING_ENABLE: while false the thread pops nothing ({@link #enable}). */
    private volatile boolean enabled = true;

    /**
     * Maps the rings (QEMU's addresses of SET_VRING_ADDR, through the current memory table) and, with an inflight
     * region, recovers what an earlier back-end left in flight; {@link #start} starts serving.
     * @param ring   where the ring lies and the avail index it starts from
     * @param wiring what it is served with: features, eventfds, the block layer's queue, memory, device, polling
     * @throws IllegalArgumentException when a ring is outside guest memory or misaligned, or the size is not a power
     *         of 2 in 1..32768
     * @throws IllegalStateException when the inflight region contradicts the ring
     */
    public VhostBlkQueue(VringAddress ring, QueueWiring wiring) {
        int index = ring.index(), size = ring.size();
        if (size < 1 || size > SplitRingLayout.MAX_SIZE || Integer.bitCount(size) != 1) {
            throw new IllegalArgumentException("virtqueue " + index + " size " + size + ": allowed a power of 2 in 1.."
                    + SplitRingLayout.MAX_SIZE + " (virtio 1.2 2.7: a split queue's size is a power of 2)");
        }
        this.index = index;
        this.frontend = wiring.frontend();
        this.memory = wiring.memory();
        this.polling = wiring.polling().window();
        GuestMemory mem = memory.get();
        long features = wiring.features();
        boolean eventIdx = (features & VirtioFeatures.bit(VirtioFeatures.RING_EVENT_IDX)) != 0;
        SplitRing split = new SplitRing(size, eventIdx, area(mem, "descriptor table", ring.desc(), SplitRingLayout.descBytes(size)),
                area(mem, "avail ring", ring.avail(), SplitRingLayout.availBytes(size, eventIdx)),
                area(mem, "used ring", ring.used(), SplitRingLayout.usedBytes(size, eventIdx)));
        // Indirect tables: as long as the queue, or as a request of seg_max segments with header and status.
        int maxIndirect = Math.max(size, HardwareQueue.MAX_IOVS + 2);
        MemorySegment inflight = wiring.inflight();
        this.vq = new Virtqueue(index, split, features, ring.base(), maxIndirect,
                inflight == null ? null : new Inflight(inflight, size));
        vq.recover();
        this.thread = wiring.threads().newThread(this::run);
        thread.setName("vhost-blk-q" + index);
        thread.setDaemon(true);
        EventFd kick = wiring.kick();
        EventFd w = null;
        EdgeWait e = null;
        try {
            w = EventFd.create(true);
            e = EdgeWait.create(3); // the kick, the wake, and the DMA completions this thread reaps (startReaping)
            e.add(kick);
            e.add(w);
        } catch (NativeException x) {
            QueueStop.closeQuietly(e);
            QueueStop.closeQuietly(w);
            throw new IllegalStateException("virtqueue " + index + ": cannot wait for its kick " + kick + ": " + x.getMessage(), x);
        }
        this.wake = w;
        this.sleep = e;
        this.stopping = new QueueStop(index, vq, thread, sleep, wake, wiring.err());
        this.answers = new BlkAnswers(index, size, vq, wiring.call(), wake, thread, memory, stopping::quietIfDone);
        this.requests = new BlkRequests(index, vq, frontend, wiring.device(), answers);
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

    /**
     * Starts the queue thread.
     * @throws IllegalStateException when the system makes no thread for it (ulimit -u, a cgroup's pids.max, memory:
     *         Thread.start's OutOfMemoryError); the queue is then detached, its eventfds closed, nothing popped
     */
    public void start() {
        running = true;
        stopping.threadLive(true);
        try {
            thread.start();
        } catch (OutOfMemoryError e) {
            running = false;
            stopping.threadLive(false);
            detach(null);
            throw new IllegalStateException("virtqueue " + index + ": no thread could be made for it (" + e.getMessage()
                    + ")", e);
        }
    }

    /** The queue thread (its CPU time is what the benchmarks measure). */
    public Thread thread() {
        return thread;
    }

    /** Whether the guest broke the ring's rules: the queue then pops nothing more (logged once). */
    public boolean broken() {
        return stopping.broken();
    }

    /** What broke the queue (for the session's log or a metric), or null. */
    public String brokenReason() {
        return stopping.brokenReason();
    }

    /**
     * SET_CONFIG's wce: with the write cache off (write-through) the guest sends no FLUSH, so every write is made
     * durable before it completes (FUA).
     */
    public void writeCache(boolean enabled) {
        requests.writeCache(enabled);
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
        stopping.halt();
    }

    /**
     * Waits at most {@code millis} for the queue to be quiet after {@link #halt}: its thread ended and no request
     * in flight (each completed and published). A thread still alive {@link #STOP_MILLIS} after the halt is
     * interrupted, once: it is blocked waiting for a tag, and gives the chain it holds back ({@link Virtqueue#unpop}).
     * @return whether it is quiet: then {@link #detach} answers the ring's exact next avail index
     */
    public boolean awaitQuiet(long millis) throws InterruptedException {
        return stopping.awaitQuiet(millis);
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
        answers.sendDueCall();
        stopping.detach(whenQuiet);
        return vq.lastAvail();
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
        reaping = startReaping();
        try {
            vq.disableKicks();
            while (running) {
                turn();
            }
        } catch (BrokenRingException e) {
            stopping.breaks(e.getMessage(), null);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // stop() interrupted a wait for a tag
        } catch (Exception | Error e) {
            // A region unmapped under the ring, an eventfd gone: nothing the guest can be told through this queue.
            stopping.breaks("stopped by " + e, e);
        } finally {
            // Each step on its own: one that throws (a ring unmapped under publishHeld) must not skip the others,
            // nor leave threadLive set, or quietIfDone never closes the epoll and wake fds nor lets memory go.
            if (reaping) {
                stopping.leaving("stop reaping", () -> frontend.queue().driver().stopReaping(frontend.queue().index()));
            }
            stopping.leaving("dispatch what the batch holds", frontend::dispatch); // it still completes
            stopping.leaving("publish what is held", this::publishHeld); // before stop() returns and QEMU unmaps the ring
            stopping.leaving("send the call due", answers::sendDueCall);
            stopping.leaving("release the undispatched request", frontend::releaseUndispatched); // being filled as it threw
            stopping.threadEnded(); // a detached queue whose requests all completed while this thread was still busy
        }
    }

    /**
     * One turn of the queue thread: reap, dispatch what the guest made available, or sleep until there is more. A
     * method of its own so that the JIT compiles it as any method: {@link #run()} is entered once and would run its
     * loop in the interpreter until an on-stack replacement, which a loop that sleeps between turns reaches late
     * (5% of the queue thread's samples on the vfio-user route were the interpreter's).
     */
    private void turn() throws BrokenRingException, InterruptedException, NativeException {
        reap();
        answers.sendDueCall();
        if (!enabled) {
            if (heldSince != 0) {
                publishHeld(); // what was answered before the ring was disabled
            }
            sleep.await(-1); // enable(true) or halt() signals; a kick meanwhile only wakes it to sleep again
            return;
        }
        if (processBatch() > 0) {
            return;
        }
        // Requests in flight after a dispatch whose completions were not made here (a DMA engine's): their
        // completion wakes this thread, so it neither polls nor holds until then (class comment, Polling).
        boolean awaitingCompletions = vq.inFlight() > 0;
        if (heldSince != 0) {
            if (awaitingCompletions) {
                publishHeld();
            } else if (holdForRequests()) {
                return; // a request came: its completion joins the ones held
            }
        }
        long idleFrom = System.nanoTime();
        if (reaping && vq.inFlight() >= KICKLESS_IN_FLIGHT) {
            // Kicks stay off: the next completion wakes this thread (its interrupt, or, made elsewhere, the
            // wake it then sends), which takes what the guest made available meanwhile while the device
            // still copies the rest. The flag first, then the count: a completion elsewhere either sees the
            // flag and wakes us, or is seen here.
            answers.wakeOnEveryCompletion(true);
            if (vq.inFlight() >= KICKLESS_IN_FLIGHT) {
                sleep.await(-1);
            }
            answers.wakeOnEveryCompletion(false);
        } else if (awaitingCompletions || !pollRing(idleFrom)) {
            if (vq.enableKicks()) { // a request came as the kick was re-armed: no kick will say so
                vq.disableKicks();
            } else {
                sleep.await(-1); // a kick, stop()'s wake, or (reaping) the completions' interrupt
                vq.disableKicks();
            }
        }
        if (!awaitingCompletions) {
            polling.idled(System.nanoTime() - idleFrom);
        }
    }

    /**
     * Becomes the reaper of the DMA completions of this queue's requests (BlockDriver#startReaping): their
     * interrupt wakes this thread, which completes them itself, so that neither the engine's completion thread
     * nor a hand-off back here ({@link BlkAnswers}' callDue, the wake) is woken per completion. False when the driver has nothing to
     * reap here, or the sleep cannot take its eventfd (the engine's thread then completes, as without).
     */
    private boolean startReaping() {
        int hwq = frontend.queue().index();
        int fd = frontend.queue().driver().startReaping(hwq);
        if (fd < 0) {
            return false;
        }
        try {
            sleep.add(EventFd.adopt(fd)); // the engine's eventfd: only slept on here, never closed or read
            return true;
        } catch (NativeException | RuntimeException e) {
            frontend.queue().driver().stopReaping(hwq);
            LOG.log(System.Logger.Level.DEBUG, "vhost-blk-q" + index + ": DMA completions stay on the engine's thread: " + e);
            return false;
        }
    }

    /** Completes what the engine finished; the guest's interrupt, if due, is the caller's {@code sendDueCall}. */
    private void reap() {
        if (reaping) {
            answers.deferCalls(true);
            try {
                frontend.queue().driver().reapCompletions(frontend.queue().index());
            } finally {
                answers.deferCalls(false);
            }
        }
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
                if (workToDo()) {
                    return true;
                }
                reap();
                answers.sendDueCall(); // a DMA completion meanwhile: its interrupt is not held for the poll
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
                    reap();
                    answers.sendDueCall(); // a DMA completion published everything held with its own
                    if (workToDo()) {
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

    /** What the loop, its polls and its hold wait for: chains the guest made available. */
    private boolean workToDo() {
        return vq.hasAvailable();
    }

    private void publishHeld() {
        heldSince = 0;
        answers.signal(vq.publishHeld());
    }

    /**
     * Pops what is available (at most {@link #BATCH} chains, and no more than the frontend's free tags), submits
     * them, dispatches once and publishes the queue thread's own completions once, or holds them back (the
     * {@link RingPolling} hold) until {@link #HOLD_COMPLETIONS} wait or the hold is over.
     */
    private int processBatch() throws BrokenRingException, InterruptedException {
        if (!workToDo()) {
            return 0;
        }
        GuestMemory mem = memory.get();
        int n = 0;
        vq.beginBatch();
        try {
            // running: after halt() nothing more is taken (the thread may still be here, waiting for a tag)
            while (n < BATCH && running && !frontend.full() && vq.pop(mem, chain)) {
                n++;
                requests.submit(chain);
            }
            frontend.dispatch();
        } finally {
            boolean hold = polling.holdNanos() > 0;
            answers.signal(vq.endBatch(hold ? HOLD_COMPLETIONS : 0));
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
}
