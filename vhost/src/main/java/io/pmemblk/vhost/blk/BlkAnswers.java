package io.pmemblk.vhost.blk;

import io.pmemblk.posix.EventFd;
import io.pmemblk.posix.MemoryFaults;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.log.RateLimitedLog;
import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.virtq.Virtqueue;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.function.Supplier;

/**
 * A request's answer to the guest: its status byte written, its head pushed to the used ring, and the guest
 * interrupted when the ring asks for it (SPDK's {@code blk_request_finish}). Answers come from the queue thread
 * (GET_ID, refusals, the CPU route's completions inside a dispatch) and from whichever thread the driver completes
 * on; an interrupt due from another thread is sent by the queue thread ({@link #answer}).
 */
final class BlkAnswers {
    /** Logged as the queue's: one logger for everything a ring's thread refuses or breaks on. */
    private static final System.Logger LOG = System.getLogger(VhostBlkQueue.class.getName());
    /** A fault in guest RAM is the operator's to know (rate-limited as the refusals: a front end can repeat it). */
    private static final RateLimitedLog GUEST_RAM_FAULTS = RateLimitedLog.withOwnLimit(LOG, System.Logger.Level.WARNING);

    private final int index;
    private final Virtqueue vq;
    private final EventFd call;
    /** The queue thread's wake-up: how a completion elsewhere hands it an interrupt to send. */
    private final EventFd wake;
    private final Thread thread;
    private final Supplier<GuestMemory> memory;
    /** {@link QueueStop#quietIfDone}: runs the queue's quiet action once detached and the last request is done. */
    private final Runnable quietIfDone;
    /** Per head: where its status byte is and what used.len an OK answer reports. */
    private final MemorySegment[] statusMapping;
    private final long[] statusOffset;
    private final int[] okLength;
    /**
     * A completion on another thread (the DMA engine's completion thread, which every client shares) published
     * used entries the guest is to be interrupted for: the queue thread writes the call eventfd
     * ({@link #sendDueCall}), woken by {@link #wake}. The call fd is the front end's: a front end can make a write
     * to it block (its counter full and O_NONBLOCK cleared on the description it shares with us), and then only
     * its own queue thread waits, never the engine that serves every other client.
     */
    private volatile boolean callDue;
    /**
     * Set by the queue thread while it sleeps with the guest's kicks off ({@link VhostBlkQueue}, KICKLESS_IN_FLIGHT):
     * it takes the guest's new requests only when woken, so every completion made elsewhere wakes it, the guest's
     * interrupt due or not.
     */
    private volatile boolean wakeOnEvery;
    /**
     * Set by the queue thread while it reaps a DMA engine's completions ({@link #deferCalls}): the interrupt one of
     * them makes due is left to {@link #sendDueCall} after the last, so the guest, woken once, finds them all
     * published. Sent at the first, it woke the front end's thread while the rest were still unpublished: that
     * thread preempted this one mid-reap (on 2 CPUs), and the guest, having re-armed its interrupt on the first,
     * took a second one for the rest.
     */
    private boolean deferCalls;
    private boolean signalFailed;

    /**
     * @param size        the ring's size: the heads there can be
     * @param call        the call eventfd, or null when the queue has no interrupt vector
     * @param wake        the queue thread's own wake-up (non-blocking)
     * @param thread      the queue thread: answers made on it signal the guest themselves
     * @param memory      the memory table, to name the region a faulting piece was in
     * @param quietIfDone what a completion into a detached queue runs when it was the last
     */
    BlkAnswers(int index, int size, Virtqueue vq, EventFd call, EventFd wake, Thread thread,
               Supplier<GuestMemory> memory, Runnable quietIfDone) {
        this.index = index;
        this.vq = vq;
        this.call = call;
        this.wake = wake;
        this.thread = thread;
        this.memory = memory;
        this.quietIfDone = quietIfDone;
        this.statusMapping = new MemorySegment[size];
        this.statusOffset = new long[size];
        this.okLength = new int[size];
    }

    /** Where head {@code head}'s status byte is: the chain's last device-writable byte. */
    void statusAt(int head, MemorySegment mapping, long offset) {
        statusMapping[head] = mapping;
        statusOffset[head] = offset;
    }

    /** What used.len an OK answer to {@code head} reports: the status byte, and for IN the data written. */
    void okLength(int head, int usedLen) {
        okLength[head] = usedLen;
    }

    /** The driver completed a request (any thread): its status goes to the guest, its tag back to the layer. */
    void completed(Request r) {
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

    /**
     * Writes the status byte and pushes the head; signals the call eventfd when the ring says so: on the queue
     * thread itself, or, from another thread, by handing the signal to the queue thread ({@link #callDue}), whose
     * wake-up is our own non-blocking eventfd, signalled under vq's monitor: after {@link VhostBlkQueue#detach} stops vq no
     * completion reaches it, so it may be closed. On a detached queue it writes nothing: the last such completion
     * runs the quiet action.
     */
    void answer(int head, byte status, int usedLen) {
        boolean signal = false;
        boolean lastOfDetached = false;
        boolean queueThread = Thread.currentThread() == thread;
        synchronized (vq) {
            if (vq.stopped()) {
                lastOfDetached = vq.abandon(head) == 0; // the ring is no longer ours, nor perhaps guest memory
            } else {
                statusMapping[head].set(ValueLayout.JAVA_BYTE, statusOffset[head], status);
                signal = vq.push(head, usedLen);
                if (signal && deferCalls && queueThread) {
                    callDue = true; // sent by sendDueCall after the reap
                    signal = false;
                }
                boolean handOff = signal && !queueThread && call != null;
                if (handOff) {
                    callDue = true;
                }
                if (handOff || !queueThread && wakeOnEvery) {
                    try {
                        wake.signal(); // never blocks: ours, non-blocking (EAGAIN, a full counter, is a wake pending)
                    } catch (RuntimeException e) {
                        LOG.log(System.Logger.Level.DEBUG, "vhost-blk-q" + index + ": waking the queue thread: " + e);
                    }
                }
                if (handOff) {
                    return;
                }
            }
        }
        if (lastOfDetached) {
            quietIfDone.run();
            return;
        }
        signal(signal);
    }

    /** See {@link #wakeOnEvery}; the queue thread sets it, then looks at what is in flight, then sleeps. */
    void wakeOnEveryCompletion(boolean on) {
        wakeOnEvery = on;
    }

    /** See {@link #deferCalls}: on while the queue thread reaps; a call made due meanwhile waits for {@link #sendDueCall}. */
    void deferCalls(boolean on) {
        deferCalls = on;
    }

    /** Sends the interrupt a completion on another thread (or in a reap, {@link #deferCalls}) left due ({@link #callDue}): queue thread, or stop(). */
    void sendDueCall() {
        if (callDue) {
            callDue = false;
            signal(true);
        }
    }

    void signal(boolean due) {
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
