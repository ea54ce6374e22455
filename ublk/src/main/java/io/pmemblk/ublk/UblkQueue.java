package io.pmemblk.ublk;

import io.pmemblk.queueing.FrontendQueue;
import io.pmemblk.posix.FileIo;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.Mman;
import io.pmemblk.posix.NativeException;
import io.pmemblk.uring.CompletionHandler;
import io.pmemblk.uring.IoUring;
import io.pmemblk.uring.IoUringAbi;
import io.pmemblk.uring.SubmissionQueue;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;

import static io.pmemblk.ublk.UblkAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * One ublk queue: the platform thread the kernel ties the queue to (6.12 accepts FETCH and COMMIT only from the
 * task that fetched the last tag), its io_uring, and the queue's descriptor array mapped from
 * {@code /dev/ublkcN}. Each tag goes round: FETCH_REQ -> the kernel posts a CQE when it has a request for the tag
 * -> the descriptor says what -> a block-layer request on hardware queue {@code q} -> the driver completes it ->
 * COMMIT_AND_FETCH_REQ with the result, which also fetches the tag's next request. STOP_DEV ends it: every tag's
 * fetch completes with -ENODEV, and the thread exits when none is left.
 *
 * <p>What a request becomes, and how its data moves (one copy, the kernel's, with UBLK_F_USER_COPY), is
 * {@link UblkRequests}'; this class is the ring, the descriptors and the threads.
 *
 * <h2>Completions from other threads</h2>
 * CPU-route requests complete inside {@link FrontendQueue#dispatch}, on this thread. DMA-route ones complete on
 * the channel's thread: the completion does the READ's pwrite there (any thread may, between the fetch and the
 * commit), releases the request and pushes the tag on a lock-free stack, and an eventfd wakes this thread, which
 * keeps a read of it in the ring. Tags are pushed at most once per fetch, so the stack has no ABA problem, and
 * it is taken whole with one getAndSet.
 *
 * <p>Nothing is allocated per request: the per-tag arrays, the SQEs written in place, the eventfd buffers.
 */
final class UblkQueue implements Runnable, CompletionHandler {
    private static final System.Logger LOG = System.getLogger(UblkQueue.class.getName());
    /** user_data of the eventfd read (tags are below 4096). */
    private static final long EVENT = 1L << 32;
    /** How long a closing queue waits for a wake-up inside its eventfd write (one non-blocking write). */
    private static final long WAKE_RETIRE_MILLIS = 5_000;
    /** Index of /dev/ublkcN in the ring's registered files. */
    private static final int UBLKC_FIXED = 0;

    private final int q;
    private final int depth;
    private final int ublkcFd;
    /** This queue's writers' view of {@code /dev/ublkcN}: retired before the device closes the number. */
    private final FdGuard ublkc;
    private final FrontendQueue frontend;
    private final UblkRequests requestsOf;
    private final String name;
    private final CompletableFuture<Void> fetched = new CompletableFuture<>();
    /** Completes when the thread has ended and its ring is closed: exceptionally with what ended it, if it failed. */
    private final CompletableFuture<Void> ended = new CompletableFuture<>();
    private final Thread thread;

    /** Per tag: the value the next COMMIT carries (bytes done, 0, or -errno). */
    private final int[] result;
    /** Tags completed on this thread, to commit. */
    private final int[] local;
    private int localCount;
    /** Tags completed on other threads: a stack linked through {@link #remoteNext}, head -1 when empty. */
    private final int[] remoteNext;
    private final AtomicInteger remoteHead = new AtomicInteger(-1);
    /** 1, written to the eventfd by other threads (shared, constant). */
    private final MemorySegment one = Arena.ofAuto().allocate(JAVA_LONG);

    /** The wake-up eventfd (null until the thread made it); retired, then closed, when the thread ends. */
    private volatile FdGuard event;
    private volatile boolean abandon;
    private IoUring ring;
    private SubmissionQueue sq;
    private MemorySegment sqes;
    private MemorySegment descriptors;
    private MemorySegment eventValue;
    private boolean eventArmed;
    /** Tags whose fetch has not come back with -ENODEV (or an error) yet. */
    private int live;
    /** Requests taken from the kernel (read by the metrics thread: a plain counter, one writer). */
    private long requests;

    UblkQueue(int deviceId, int q, int depth, int ublkcFd, FrontendQueue frontend, int maxIoBytes, int maxDiscardBytes) {
        this.q = q;
        this.depth = depth;
        this.ublkcFd = ublkcFd;
        this.ublkc = new FdGuard(ublkcFd);
        this.frontend = frontend;
        this.name = "ublk" + deviceId + "-q" + q;
        this.requestsOf = new UblkRequests(q, ublkc, frontend, maxIoBytes, maxDiscardBytes, this::finish, name);
        this.result = new int[depth];
        this.local = new int[depth];
        this.remoteNext = new int[depth];
        this.one.set(JAVA_LONG, 0, 1L);
        // A platform thread: the kernel binds the queue to this Linux task; a virtual thread could move carriers.
        this.thread = Thread.ofPlatform().name(name).daemon(true).unstarted(this);
    }

    void start() {
        thread.start();
    }

    /** Completes when every tag's FETCH has been submitted (START_DEV may be sent), or exceptionally. */
    CompletableFuture<Void> fetched() {
        return fetched;
    }

    /**
     * Completes when this queue's thread has ended and its ring is closed: normally when its tags were all aborted
     * (STOP_DEV, whoever sent it) or it was abandoned, exceptionally with what ended it when it failed.
     */
    CompletableFuture<Void> ended() {
        return ended;
    }

    int index() {
        return q;
    }

    long requests() {
        return requests;
    }

    /** Waits for the thread to end (after STOP_DEV aborted its tags). */
    boolean join(long millis) throws InterruptedException {
        return thread.join(java.time.Duration.ofMillis(millis));
    }

    /**
     * Makes the thread leave without waiting for its tags to be aborted (a failed start, or a STOP_DEV that did
     * not end it in time): closing its ring cancels what is still fetched.
     */
    void abandon() {
        abandon = true;
        wake();
    }

    /**
     * Before the device closes {@code /dev/ublkcN}: from here this queue's late completions (a DMA READ finishing
     * after its queue was abandoned) skip their hand-back instead of writing to a number the next open may get.
     * @return false when a hand-back is still inside its pwrite after {@code millis}: the fd must stay open
     */
    boolean retireUblkc(long millis) {
        return ublkc.retire(millis);
    }

    @Override
    public void run() {
        // Not try-with-resources: the arena holds eventValue, the buffer of the eventfd read armed in the ring,
        // and the kernel may still write into it until the ring is closed. A resource closes before finally runs,
        // which would free that buffer while the read is still armed (a wake() in between lands 8 bytes in freed
        // memory). So the ring closes first, then the arena.
        Arena mappings = Arena.ofConfined();
        Throwable failure = null;
        try {
            // Memory reclaim must not wait for writeback through /dev/ublkbN, which this very thread serves
            // (ublksrv does the same; its test generic/008 checks the flags).
            int flusher = Libc.setIoFlusher();
            if (flusher != 0) {
                LOG.log(System.Logger.Level.WARNING, name + ": prctl(PR_SET_IO_FLUSHER) failed (" + UblkControl.errnoText(flusher)
                        + "): under memory pressure with writeback to this device the queue could stall");
            }
            ring = IoUring.open(Integer.highestOneBit(depth) * 2, 0, IoUringAbi.IORING_SETUP_COOP_TASKRUN);
            sq = ring.sq();
            sqes = sq.sqes();
            ring.registerFiles(ublkcFd);
            long page = Libc.pageSize();
            // Read-only (the kernel refuses PROT_WRITE), at the queue's fixed stride whatever the depth.
            descriptors = Mman.map(ublkcFd, descriptorBytes(depth, page), Mman.PROT_READ,
                    Mman.MAP_SHARED | Mman.MAP_POPULATE, descriptorOffset(q, page), mappings);
            eventValue = mappings.allocate(JAVA_LONG);
            event = new FdGuard(FileIo.eventfd(0, 0));
            armEvent();
            for (int tag = 0; tag < depth; tag++) {
                command(UBLK_U_IO_FETCH_REQ, tag, 0);
            }
            live = depth;
            ring.submit();
            fetched.complete(null);
            loop();
        } catch (Throwable t) {
            failure = t;
            if (!fetched.completeExceptionally(t)) {
                LOG.log(System.Logger.Level.ERROR, name + " failed; the kernel aborts its requests when its ring closes: " + t, t);
            }
        } finally {
            try {
                frontend.releaseUndispatched();
                if (ring != null) {
                    ring.close(); // cancels whatever is still fetched (an abandoned queue), and the eventfd read
                }
                closeEvent();
                mappings.close();
            } finally {
                if (failure != null) {
                    ended.completeExceptionally(failure);
                } else {
                    ended.complete(null);
                }
            }
        }
    }

    /**
     * Completions may still come (an abandoned queue's DMA requests) and wake this thread after it has gone:
     * the eventfd is retired first, so none of them writes to its number once it is closed and reused.
     */
    private void closeEvent() {
        FdGuard e = event;
        if (e == null) {
            return;
        }
        if (!e.retire(WAKE_RETIRE_MILLIS)) {
            LOG.log(System.Logger.Level.ERROR, name + ": a wake-up is still inside its eventfd write after "
                    + WAKE_RETIRE_MILLIS + " ms; the eventfd is left open rather than closed under it");
            return;
        }
        try {
            Libc.close(e.fd());
        } catch (NativeException ignored) {
            // an eventfd close does not fail on a valid fd
        }
    }

    private void loop() throws NativeException {
        while (live > 0 && !abandon) {
            ring.submitAndWait(1);
            ring.cq().drain(this);
            requestsOf.dispatch(); // CPU-route completions run in here, on this thread
            takeRemote();
            commitDone();
            if (!eventArmed) {
                armEvent();
            }
        }
        if (abandon && live > 0) {
            LOG.log(System.Logger.Level.WARNING, name + ": leaving with " + live + " tags still fetched");
        }
    }

    /** A CQE of this queue's ring: a tag's fetch (a new request, or the end) or the eventfd. */
    @Override
    public void onCompletion(long userData, int res, int flags) {
        if (userData == EVENT) {
            eventArmed = false;
            return;
        }
        int tag = (int) userData;
        if (res == UBLK_IO_RES_OK) {
            requests++;
            long d = (long) tag * IO_DESC_SIZE;
            requestsOf.serve(tag, descriptors.get(JAVA_INT, d + IO_DESC_OP_FLAGS),
                    descriptors.get(JAVA_LONG, d + IO_DESC_START_SECTOR), descriptors.get(JAVA_INT, d + IO_DESC_NR_SECTORS));
        } else {
            live--;
            if (res != UBLK_IO_RES_ABORT) {
                // The kernel refused the command itself (EINVAL, EBUSY): the tag is gone for this server.
                LOG.log(System.Logger.Level.ERROR, name + ": the kernel refused the command of tag " + tag + ": "
                        + UblkControl.errnoText(res));
            }
        }
    }

    /** Records tag's result and queues it for commit by this queue's thread (any thread). */
    private void finish(int tag, int res) {
        result[tag] = res;
        if (Thread.currentThread() == thread) {
            local[localCount++] = tag;
            return;
        }
        int head;
        do {
            head = remoteHead.get();
            remoteNext[tag] = head;
        } while (!remoteHead.compareAndSet(head, tag));
        if (head == -1) {
            wake(); // the stack was empty: the queue thread may be waiting in the ring
        }
    }

    private void wake() {
        FdGuard g = event;
        if (g == null) {
            return; // not made yet: the thread checks abandon before it first waits
        }
        int e = g.enter();
        try {
            if (e >= 0) {
                FileIo.write(e, one); // a full counter (2^64-2 wake-ups unread) is the only failure, and cannot happen
            }
        } finally {
            g.exit();
        }
    }

    private void takeRemote() {
        int tag = remoteHead.getAndSet(-1);
        while (tag != -1) {
            local[localCount++] = tag;
            tag = remoteNext[tag];
        }
    }

    private void commitDone() throws NativeException {
        for (int i = 0; i < localCount; i++) {
            int tag = local[i];
            command(UBLK_U_IO_COMMIT_AND_FETCH_REQ, tag, result[tag]);
        }
        localCount = 0;
    }

    /**
     * Prepares a FETCH or COMMIT_AND_FETCH SQE for tag, its ublksrv_io_cmd written in place in the SQE (no
     * payload segment: nothing allocated, nothing copied).
     */
    private void command(int cmdOp, int tag, int res) throws NativeException {
        long sqe = sq.uringCmd(UBLKC_FIXED, IoUringAbi.IOSQE_FIXED_FILE, cmdOp, tag);
        if (sqe < 0) {
            ring.submit(); // cannot happen with one command per tag in a ring of 2 x depth, but never drop one
            sqe = sq.uringCmd(UBLKC_FIXED, IoUringAbi.IOSQE_FIXED_FILE, cmdOp, tag);
            if (sqe < 0) {
                throw new IllegalStateException(name + ": submission queue full after a submit");
            }
        }
        long cmd = sqe + IoUringAbi.SQE_CMD;
        sqes.set(JAVA_SHORT, cmd + IO_CMD_Q_ID, (short) q);
        sqes.set(JAVA_SHORT, cmd + IO_CMD_TAG, (short) tag);
        sqes.set(JAVA_INT, cmd + IO_CMD_RESULT, res);
        sqes.set(JAVA_LONG, cmd + IO_CMD_ADDR, 0L); // USER_COPY: must be 0
    }

    /** Keeps one read of the eventfd in the ring, so a completion on another thread wakes the wait. */
    private void armEvent() {
        if (!sq.read(event.fd(), eventValue, -1, EVENT)) {
            throw new IllegalStateException(name + ": no SQ slot for the eventfd read");
        }
        eventArmed = true;
    }

    @Override
    public String toString() {
        return name;
    }
}
