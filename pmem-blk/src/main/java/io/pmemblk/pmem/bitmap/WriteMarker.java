package io.pmemblk.pmem.bitmap;

import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.Arrays;

/**
 * Marks every WRITE, WRITE_ZEROES and TRIM in the active bitmaps, durably, before it may reach the device, and
 * records per tag which set of bitmaps each write in flight marked, so that a swap of the set waits for exactly the
 * writes that marked the old one. Each write is marked once, under one set: at dispatch, or, for a write received
 * straight into the device, when it is received (before its payload lands), and then not again at dispatch. So a
 * write racing a swap is in the old set's bitmaps or in the new one's, never in both or neither.
 *
 * <p>A swap ({@link DirtyBitmaps}'s checkpoint, clear, add, remove) is {@link #publish} of the new set, then
 * {@link #awaitMarkers} (a {@link Grace} period: every marker that read the old set has persisted its bits and
 * recorded its writes), then, where the old set's writes must have landed, {@link #awaitWrites}. Both are bounded:
 * a device that never completes a write, or a client that never sends a payload being received in place, makes
 * the swap fail naming it, instead of stalling it and every management request after it.
 *
 * <p>A record ends when its write's data is in the device, which is all {@link #awaitWrites} waits for:
 * <ul>
 *   <li>A write marked at dispatch lands while the device executes it: its record ends at its completion, which
 *       the tag interposes ({@link Tag#completed}) before handing the request back to the frontend's.</li>
 *   <li>A write received in place has landed before it is dispatched: the frontend dispatches it only once its
 *       payload is in the device. Its record ends there ({@link #mark}), with nothing interposed on its
 *       completion; or, never dispatched (its payload cut short), where it is released ({@link #abandoned}). A
 *       swap that sees the record ended sees the payload in the device (release store, acquire load); one that
 *       sees it still set waits, and the write is in the old set alone, marked when it was received.</li>
 *   <li>A batch with no write to mark at dispatch (only reads, flushes, and writes received in place) reads no
 *       set, so it enters no grace period: a grace period guards a marker's read of the set against a swap, and
 *       ending a record is a single store that a swap reads whenever it comes.</li>
 * </ul>
 *
 * <p>Cost on the write path: a write received in place pays, when received, the grace's enter and exit (an atomic
 * add each, on the queue's own cache line), per bitmap a load of a heap word when its bits are already durable,
 * and its tag's record (a few plain stores and a release store); at dispatch one release store; at release one
 * load. A batch with writes to mark at dispatch pays the grace's enter and exit once, the same loads per write and
 * bitmap, the record, and a release store at completion (on x86 all plain moves). The first write to a block
 * after a swap pays one persist of the bitmap's words per batch. Nothing is allocated, no lock is taken, markers
 * never wait.
 */
final class WriteMarker {
    private static final System.Logger LOG = System.getLogger(WriteMarker.class.getName());
    /** Stuck writes named in a failed swap's message: enough to find them, short enough for a reply line. */
    private static final int STUCK_SHOWN = 8;

    private final Grace grace;
    private final long deviceSize;
    /** Where the bitmaps are, for the failure's message. */
    private final String where;
    /** The active bitmaps, as markers see them: replaced whole (copy on write), never changed in place. */
    private volatile BitmapFile[] active = new BitmapFile[0];
    /** Per hardware queue, per tag: the write in flight on that tag. Replaced whole when a queue attaches. */
    private volatile Tag[][] queues = new Tag[0][];
    /** Set once a bit could not be made durable; from then on every marked write fails (EIO), as the region does. */
    private volatile String failure;

    WriteMarker(int stripes, long deviceSize, String where) {
        this.grace = new Grace(stripes);
        this.deviceSize = deviceSize;
        this.where = where;
    }

    /**
     * One tag's write in flight: which set it marked (null when none is in flight), what it is (for naming it when
     * stuck), and, for a write marked at dispatch, the completion that ends it and hands the request back to the
     * frontend's.
     */
    static final class Tag implements Request.Completion {
        private static final VarHandle MARKED;

        static {
            try {
                MARKED = MethodHandles.lookup().findVarHandle(Tag.class, "marked", BitmapFile[].class);
            } catch (ReflectiveOperationException e) {
                throw new ExceptionInInitializerError(e);
            }
        }

        final int queue, tag;
        /**
         * The set this tag's write marked, until its data is in the device: written with release, read with
         * acquire.
         */
        @SuppressWarnings("unused") // through MARKED
        private volatile BitmapFile[] marked;
        private Op op;
        private long offset, length;
        private boolean inPlace;
        private Request.Completion frontend;

        Tag(int queue, int tag) {
            this.queue = queue;
            this.tag = tag;
        }

        /** Records a write marked under {@code set}; the release store publishes the fields before it. */
        void marked(Request r, BitmapFile[] set, boolean receivedInPlace) {
            op = r.op;
            offset = r.offset;
            length = r.length;
            inPlace = receivedInPlace;
            MARKED.setRelease(this, set);
        }

        BitmapFile[] marked() {
            return (BitmapFile[]) MARKED.getAcquire(this);
        }

        /** A write marked at dispatch goes to the device: its completion comes here first. */
        void dispatched(Request r) {
            frontend = r.completion;
            r.completion = this;
        }

        @Override
        public void completed(Request r) {
            Request.Completion c = frontend;
            frontend = null;
            r.completion = c;
            // the write has reached the device: a swap waiting for it may go on before the reply is sent
            MARKED.setRelease(this, (BitmapFile[]) null);
            c.completed(r);
        }

        /** A write received in place is dispatched: its payload is in the device, a swap need not wait for it. */
        void landed() {
            MARKED.setRelease(this, (BitmapFile[]) null);
        }

        /**
         * A write received in place is released: if it was never dispatched (its payload cut short, a refused
         * digest), its record ends here. Its tag is still held, so the record is this write's.
         */
        void released() {
            if (MARKED.getAcquire(this) != null) {
                MARKED.setRelease(this, (BitmapFile[]) null);
            }
        }

        @Override
        public String toString() {
            return "queue " + queue + " tag " + tag + ": " + op + " of " + length + " bytes at " + offset
                    + (inPlace ? " (its payload is still being received from the client)" : " (on the device)");
        }
    }

    /** Makes the records of {@code depth} tags of hardware queue {@code queue}; before its first request. */
    synchronized void attach(int queue, int depth) {
        Tag[][] q = Arrays.copyOf(queues, Math.max(queues.length, queue + 1));
        Tag[] tags = new Tag[depth];
        for (int t = 0; t < depth; t++) {
            tags[t] = new Tag(queue, t);
        }
        q[queue] = tags;
        queues = q;
    }

    /** Whether an op changes data, so its blocks are dirty. */
    static boolean changes(Op op) {
        return op == Op.WRITE || op == Op.WRITE_ZEROES || op == Op.TRIM;
    }

    /** Whether a write is marked now: one received in place was marked when it was received. */
    private boolean marksAtDispatch(Request r) {
        return changes(r.op) && !r.dataInPlace
                && r.offset >= 0 && r.length > 0 && r.length <= deviceSize - r.offset; // others the driver refuses
    }

    /**
     * Marks the writes of {@code batch[0..count)} on hardware queue {@code hwq} in every active bitmap, durably,
     * and records each in flight until it completes; ends the records of the writes received in place, whose
     * payload is in the device now.
     * @return false when the bits could not be made durable ({@link #failure()}): the writes must then not be
     *         passed on (nothing was recorded)
     */
    boolean mark(int hwq, Request[] batch, int count) {
        Tag[] tags = queues[hwq];
        boolean toMark = false;
        for (int i = 0; i < count; i++) {
            Request r = batch[i];
            if (r.dataInPlace) { // only a WRITE is received in place
                tags[r.tag()].landed();
            } else if (changes(r.op)) {
                toMark = true;
            }
        }
        if (!toMark) {
            return failure == null;
        }
        int token = grace.enter(hwq);
        try {
            BitmapFile[] set = active;
            for (BitmapFile b : set) {
                long lo = Long.MAX_VALUE, hi = -1;
                for (int i = 0; i < count; i++) {
                    Request r = batch[i];
                    if (marksAtDispatch(r) && !b.durablySet(r.offset, r.length)) {
                        b.set(r.offset, r.length);
                        lo = Math.min(lo, r.offset);
                        hi = Math.max(hi, r.offset + r.length);
                    }
                }
                if (hi >= 0) {
                    b.persist(lo, hi);
                    for (int i = 0; i < count; i++) {
                        Request r = batch[i];
                        if (marksAtDispatch(r)) {
                            b.published(r.offset, r.length);
                        }
                    }
                }
            }
            if (failure != null) {
                return false;
            }
            // recorded before the grace ends, so a swap that waited for this marker sees the records
            for (int i = 0; i < count; i++) {
                Request r = batch[i];
                if (changes(r.op) && !r.dataInPlace) {
                    Tag t = tags[r.tag()];
                    t.marked(r, set, false);
                    t.dispatched(r);
                }
            }
            return true;
        } catch (IOException | RuntimeException e) {
            fail(e);
            return false;
        } finally {
            grace.exit(token);
        }
    }

    /**
     * Marks one write about to be received straight into the device, durably, before its payload can reach it,
     * and records it in flight from now: it is not marked again at dispatch, and a swap meanwhile waits for it.
     * Ended by its dispatch ({@link #mark}), or by {@link #abandoned} when it is never dispatched.
     * @return null, or why it was refused (nothing recorded)
     */
    String markInPlace(int hwq, Request r) {
        Tag t = queues[hwq][r.tag()];
        int token = grace.enter(hwq);
        try {
            BitmapFile[] set = active;
            for (BitmapFile b : set) {
                if (!b.durablySet(r.offset, r.length)) {
                    b.set(r.offset, r.length);
                    b.persist(r.offset, r.offset + r.length);
                    b.published(r.offset, r.length);
                }
            }
            String f = failure;
            if (f == null) {
                t.marked(r, set, true);
            }
            return f;
        } catch (IOException | RuntimeException e) {
            return fail(e);
        } finally {
            grace.exit(token);
        }
    }

    /** A request received in place is released: if it was never dispatched, its record ends here. */
    void abandoned(Request r) {
        queues[r.queue().index()][r.tag()].released();
    }

    /** Hands markers {@code set}; those that read the one before may still be marking it ({@link #awaitMarkers}). */
    void publish(BitmapFile[] set) {
        active = set;
    }

    /**
     * Returns once every marker that may have read a set published before the current one is done with it: its
     * bits are durable and its writes recorded. Throws naming {@code what} when one is not by {@code deadline}.
     */
    void awaitMarkers(String what, long deadline) throws IOException {
        if (!grace.await(deadline)) {
            throw new IOException(what + ": a queue has been marking the bitmaps (persisting their bits under "
                    + where + ") for longer than the wait allows; the storage under it is stuck");
        }
    }

    /**
     * Returns once every write that marked a set other than the current one has completed (its data is in the
     * device), after {@link #awaitMarkers}. Throws naming {@code what} and the writes still in flight when they
     * have not all completed by {@code deadline}.
     */
    void awaitWrites(String what, long deadline) throws IOException {
        BitmapFile[] now = active;
        for (Tag[] tags : queues) {
            for (Tag t : tags) {
                if (!Backoff.until(() -> settled(t, now), deadline)) {
                    throw new IOException(what + " gave up: " + stuck(now) + "; nothing was changed, retry once"
                            + " they complete (a device or client that never completes them needs a restart)");
                }
            }
        }
    }

    private static boolean settled(Tag t, BitmapFile[] now) {
        BitmapFile[] m = t.marked();
        return m == null || m == now;
    }

    private String stuck(BitmapFile[] now) {
        StringBuilder b = new StringBuilder();
        int n = 0;
        for (Tag[] tags : queues) {
            for (Tag t : tags) {
                if (!settled(t, now)) {
                    if (n < STUCK_SHOWN) {
                        b.append(n == 0 ? "" : "; ").append(t);
                    }
                    n++;
                }
            }
        }
        if (n > STUCK_SHOWN) {
            b.append("; and ").append(n - STUCK_SHOWN).append(" more");
        }
        return n + " write" + (n == 1 ? "" : "s") + " marked before it still in flight (" + b + ")";
    }

    private String fail(Exception e) {
        String f = failure;
        if (f == null) {
            synchronized (grace) {
                if (failure == null) {
                    failure = "a dirty bitmap's bits could not be made durable (" + e + "): writes are refused (EIO)"
                            + " so that none reaches the device untracked; fix the storage under " + where
                            + " and restart";
                    LOG.log(System.Logger.Level.ERROR, failure);
                }
                f = failure;
            }
        }
        return f;
    }

    /** Why writes are refused, or null. */
    String failure() {
        return failure;
    }
}
