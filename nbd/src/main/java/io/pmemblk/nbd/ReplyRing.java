package io.pmemblk.nbd;

import io.pmemblk.queueing.Request;

/**
 * The completed requests of one connection waiting for their replies: a fixed ring of queue-depth slots
 * (a connection never holds more tags than that, so a push never waits), filled by whichever thread completes
 * a request and drained whole by the connection's sender. Also counts the connection's requests in flight, so
 * the sender knows when the last reply of a closing connection has gone.
 *
 * <p>It is the requests' {@link Request.Completion} itself: a completion goes straight into the ring.
 */
final class ReplyRing implements Request.Completion {
    private final Request[] ring;
    /** The unreplied ranges: every path that releases a request says so here first. */
    private final OverlapGuard guard;
    private int head;
    private int count;
    private int inflight;
    private boolean readerDone;
    private boolean senderWaiting;
    /** The reader is dispatching and will drain inline afterwards: completions need not wake the sender. */
    private boolean inline;
    private boolean abandoned;
    /**
     * The sender drained replies and has not released them yet: the reader's inline drain takes nothing
     * meanwhile, or a later reply (a READ of what an earlier WRITE wrote) could go out before the earlier one.
     */
    private boolean senderHolds;
    /** The reader handed the rest of an inline batch to the sender: its drain returns even with nothing new. */
    private boolean handedOff;
    /** Times the sender came back from waiting: what a spurious wake-up costs is a futex and a context switch. */
    private long senderWakeups;
    /** The reader waits for the reply of a request its next one overlaps ({@link #awaitReplies}). */
    private boolean readerWaiting;

    ReplyRing(int capacity) {
        this.ring = new Request[capacity];
        this.guard = new OverlapGuard(capacity);
    }

    OverlapGuard guard() {
        return guard;
    }

    /**
     * Reader: waits until no unreplied request overlaps [offset, offset + length) where either side changes data
     * (see {@link OverlapGuard}). The caller dispatched its batch first, so every such request is on its way to a
     * reply; a broken connection releases them all without one, and ends the wait too.
     */
    synchronized void awaitReplies(long offset, long length, boolean changesData) throws InterruptedException {
        readerWaiting = true;
        try {
            while (guard.overlaps(offset, length, changesData)) {
                wait();
            }
        } finally {
            readerWaiting = false;
        }
    }

    /** Two threads may wait on this monitor (the sender always, the reader in awaitReplies): wake the right one. */
    private void wake() {
        if (readerWaiting) {
            notifyAll();
        } else {
            notify();
        }
    }

    /** A request of this connection took a tag. */
    synchronized void acquired() {
        inflight++;
    }

    @Override
    public void completed(Request request) {
        push(request);
    }

    /** Called on completion (any thread). */
    synchronized void push(Request r) {
        if (abandoned) { // the sender is gone: nobody will reply, give the tag back now
            guard.replied(r.tag());
            r.release();
            inflight--;
            return;
        }
        if (count == ring.length) {
            // Cannot happen while every pushed request holds one of our <= depth tags; fail loudly if it does.
            throw new IllegalStateException("reply ring overflow: " + count + " replies pending");
        }
        int tail = head + count;
        ring[tail >= ring.length ? tail - ring.length : tail] = r;
        count++;
        if (senderWaiting && !inline) {
            wake();
        }
    }

    synchronized void inlineBegin() {
        inline = true;
    }

    /** Ends an inline drain; wakes the sender for replies that arrived after it (or that it could not take). */
    synchronized void inlineEnd() {
        inline = false;
        if ((count > 0 || handedOff) && senderWaiting) {
            wake();
        }
    }

    /**
     * Moves every pending reply into {@code out} without waiting; returns how many: none while the sender holds
     * replies it drained earlier (they must go out first).
     */
    synchronized int drainNow(Request[] out) {
        return count == 0 || senderHolds ? 0 : take(out);
    }

    /** The reader left the rest of an inline batch for the sender: wakes it (see {@link #drain}). */
    synchronized void handOff() {
        handedOff = true;
        if (senderWaiting && !inline) {
            wake();
        }
    }

    /**
     * The sender's drain: moves every pending reply into {@code out}, waiting for at least one or a hand-off
     * (then it may return 0). Returns -1 once the reader has stopped and nothing is in flight any more. What
     * it returns is the sender's until {@link #senderReleased}.
     */
    synchronized int drain(Request[] out) throws InterruptedException {
        while (count == 0) {
            if (handedOff) {
                handedOff = false;
                return 0;
            }
            if (readerDone && inflight == 0) {
                return -1;
            }
            senderWaiting = true;
            try {
                wait();
            } finally {
                senderWaiting = false;
                senderWakeups++;
            }
        }
        handedOff = false;
        senderHolds = true;
        return take(out);
    }

    private int take(Request[] out) {
        int n = count;
        for (int i = 0; i < n; i++) {
            int slot = head + i;
            if (slot >= ring.length) {
                slot -= ring.length;
            }
            out[i] = ring[slot];
            ring[slot] = null;
        }
        head = (head + n) % ring.length;
        count = 0;
        return n;
    }

    /** {@code n} requests were released (by the sender after replying, or by the reader on teardown). */
    synchronized void released(int n) {
        inflight -= n;
        // Only a closing connection's sender waits for inflight to reach 0; waking it on every idle moment of
        // an open one cost a futex wake and a context switch per request at low queue depth.
        if (readerWaiting) {
            notifyAll(); // the releaser called guard.replied first: the reader's overlap may be gone
        } else if (inflight == 0 && readerDone && senderWaiting) {
            notify();
        }
    }

    /** The sender replied to (or dropped) what it drained and released {@code n} requests. */
    synchronized void senderReleased(int n) {
        senderHolds = false;
        released(n);
    }

    /** The reader will acquire nothing more. */
    synchronized void readerDone() {
        readerDone = true;
        if (senderWaiting) {
            wake();
        }
    }

    /** The sender has stopped: releases what waits for a reply, and from now on every completion at once. */
    void abandon() {
        Request[] left;
        int n;
        synchronized (this) {
            abandoned = true;
            left = new Request[count];
            n = take(left);
        }
        for (int i = 0; i < n; i++) {
            guard.replied(left[i].tag());
            left[i].release();
        }
        released(n);
    }

    synchronized long senderWakeups() {
        return senderWakeups;
    }

    synchronized int inflight() {
        return inflight;
    }
}
