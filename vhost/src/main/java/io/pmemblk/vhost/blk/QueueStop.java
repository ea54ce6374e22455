package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EdgeWait;
import io.pmemblk.posix.EventFd;
import io.pmemblk.vhost.virtq.Virtqueue;

import java.util.concurrent.TimeUnit;

/**
 * How a {@link VhostBlkQueue} stops serving: broken by the guest (the front-end told once, through the err
 * eventfd), or halted, waited for and detached (the session's three steps), and the queue thread's way out of its
 * loop. Under this object's monitor: whether the thread runs, detach was called, and the quiet action ran, so that
 * the action runs once, on whichever thread is last: the thread leaving, the last completion, or detach itself.
 */
final class QueueStop {
    /** Logged as the queue's: one logger for everything a ring's thread refuses or breaks on. */
    private static final System.Logger LOG = System.getLogger(VhostBlkQueue.class.getName());

    /** {@code vhost-blk-q<index>}, as its thread: what its log lines begin with. */
    private final String name;
    private final Virtqueue vq;
    private final Thread thread;
    /** The queue thread's sleep and wake: closed once quiet ({@link #quietIfDone}), never before. */
    private final EdgeWait sleep;
    private final EventFd wake;
    /** The front-end's err eventfd, or null: signalled once when the ring breaks, never after {@link #detach}. */
    private final EventFd err;
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

    /**
     * @param thread the queue thread, unstarted
     * @param sleep  what the thread sleeps on, closed once quiet
     * @param wake   the thread's wake-up: {@link #halt} ends its sleep; closed once quiet
     * @param err    the front-end's err eventfd, or null
     */
    QueueStop(int index, Virtqueue vq, Thread thread, EdgeWait sleep, EventFd wake, EventFd err) {
        this.name = "vhost-blk-q" + index;
        this.vq = vq;
        this.thread = thread;
        this.sleep = sleep;
        this.wake = wake;
        this.err = err;
    }

    static void closeQuietly(AutoCloseable c) {
        if (c != null) {
            try {
                c.close();
            } catch (Exception x) {
                LOG.log(System.Logger.Level.DEBUG, "closing " + c + ": " + x);
            }
        }
    }

    /** Whether the thread runs, as quietIfDone sees it: set before Thread.start, cleared as the thread ends. */
    synchronized void threadLive(boolean live) {
        threadLive = live;
    }

    /** Whether the guest broke the ring's rules: the queue then pops nothing more (logged once). */
    boolean broken() {
        return broken;
    }

    /** What broke the queue (for the session's log or a metric), or null. */
    String brokenReason() {
        return brokenReason;
    }

    /** {@link VhostBlkQueue#halt}'s part here: the time it was called, and the thread woken from its sleep. */
    void halt() {
        haltedAt = System.nanoTime();
        if (thread.isAlive()) {
            try {
                wake.signal(); // ends its sleep
            } catch (RuntimeException e) {
                LOG.log(System.Logger.Level.DEBUG, name + ": waking the queue thread: " + e);
            }
        }
    }

    /** See {@link VhostBlkQueue#awaitQuiet}. */
    boolean awaitQuiet(long millis) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
        if (thread.isAlive() && !interrupted) {
            long interruptAt = haltedAt + TimeUnit.MILLISECONDS.toNanos(VhostBlkQueue.STOP_MILLIS);
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

    /** {@link VhostBlkQueue#detach}'s bookkeeping, once vq is stopped: {@code whenQuiet} runs once quiet. */
    void detach(Runnable whenQuiet) {
        synchronized (this) {
            quietAction = whenQuiet;
            detached = true;
        }
        quietIfDone();
    }

    /** Runs the quiet action once detached, the thread ended and nothing in flight (any thread). */
    void quietIfDone() {
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

    /** One step of the queue thread's way out: what it throws is logged, and the thread goes on leaving. */
    void leaving(String step, Runnable r) {
        try {
            r.run();
        } catch (RuntimeException | Error e) {
            LOG.log(System.Logger.Level.WARNING, name + ": leaving, could not " + step + ": " + e, e);
        }
    }

    /** The thread's last step: it no longer runs, and the queue may be quiet now. */
    void threadEnded() {
        threadLive(false);
        quietIfDone();
    }

    void breaks(String why, Throwable t) {
        brokenReason = why;
        broken = true;
        LOG.log(System.Logger.Level.WARNING, name + " broken, it serves no more requests until the"
                + " front-end restarts it: " + why, t);
        signalErr();
    }

    /**
     * Tells the front-end through the ring's err eventfd (vhost-user.rst SET_VRING_ERR; QEMU logs it), as
     * libvhost-user's vu_panic does. Under this, and not once detached: the session closes the fd after
     * {@link #detach}, and a write then could reach whatever file reused its number.
     */
    private void signalErr() {
        synchronized (this) {
            if (err == null || detached) {
                return;
            }
            try {
                err.signal(); // the front-end's notifier, non-blocking (EventFd.adoptNotifier)
            } catch (RuntimeException e) {
                LOG.log(System.Logger.Level.WARNING, name + ": signalling the err eventfd " + err
                        + ": " + e);
            }
        }
    }
}
