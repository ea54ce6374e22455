package io.pmemblk.vhost.virtq;

import io.pmemblk.vhost.memory.GuestMemory;
import io.pmemblk.vhost.memory.ScatterSink;
import io.pmemblk.vhost.spec.SplitRingLayout;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * The device side of one split virtqueue: pops descriptor chains (checking everything the guest wrote), pushes
 * used entries, decides when to interrupt the driver and when to ask it for kicks, and keeps the inflight region.
 *
 * <h2>Threads</h2>
 * One queue thread pops ({@link #pop}, {@link #enableKicks}, {@link #disableKicks}, {@link #beginBatch},
 * {@link #endBatch}); completions ({@link #push}) come from any thread: the queue thread itself (requests the
 * driver completed inline, requests answered without it) and the DMA engine's completion thread. Used-ring writes
 * are made under this object's monitor: there are at most two writers, the section is a few stores, and while the
 * queue thread is between {@link #beginBatch} and {@link #endBatch} its own completions only write their entries
 * and used.idx is published once, at the end of the batch, with one interrupt decision. A lock-free hand-off to
 * the queue thread would need it to wake up for the engine's completions (a second eventfd and a poll of two);
 * the monitor costs an uncontended CAS per completion instead.
 *
 * <h2>Checks (virtio 1.2 section 2.7, and what qemu/qemu libvhost-user and spdk/spdk lib/vhost check)</h2>
 * avail.idx more than the queue size ahead; a head outside the table; a head made available while still in
 * flight, or completed but not yet published (and so more heads in flight or held than the queue has); next
 * outside its table; a chain longer than its table
 * (a loop); a zero-length buffer; a device-readable buffer after a device-writable one; INDIRECT without the
 * feature, with NEXT, after the head or inside an indirect table; an indirect table whose length is 0, not a
 * multiple of 16 or above the limit, or that lies outside guest memory; any buffer with a byte outside guest
 * memory. Each breaks the queue ({@link BrokenRingException}). A table or buffer crossing from one region into
 * the next is served: a buffer as two pieces, an indirect table copied into a scratch table first (a guest's
 * table is physically contiguous memory, which may span two hot-plugged DIMMs; virtio does not forbid it, and
 * copying also fixes the table against the guest changing it while it is walked).
 */
public final class Virtqueue {
    private final int index;
    private final SplitRing ring;
    private final int size;
    private final boolean eventIdx;
    private final boolean indirectDesc;
    private final int maxIndirect;
    private final Inflight inflight;
    private final MemorySegment indirectScratch;
    private final IndirectTable locator = new IndirectTable();

    // Queue thread only.
    private int lastAvail;
    private int shadowAvail;
    private int[] resubmit = new int[0];
    private int resubmitNext;
    /** The last pop was a resubmitted head (what {@link #unpop} takes back). */
    private boolean lastPopAgain;
    private Thread batchOwner;

    // Under this.
    /**
     * Each head's state: {@link #FREE}, {@link #IN_FLIGHT} (popped, not completed) or {@link #UNPUBLISHED} (its used
     * entry written, used.idx not yet past it). A head is the guest's again only once published: until then the
     * guest cannot have seen it complete, so offering it again is the guest's error, and accepting it would let
     * {@link #unpublished} take more heads than the ring has and a publish clear the inflight mark of the head's
     * new request.
     */
    private final byte[] state;
    private static final byte FREE = 0, IN_FLIGHT = 1, UNPUBLISHED = 2;
    private int inFlightCount;
    private int shadowUsed;
    private int publishedUsed;
    private boolean signalledValid;
    /** Heads pushed and not yet published, in push order: each {@link #UNPUBLISHED}, so at most the ring's size. */
    private final int[] unpublished;
    private int unpublishedCount;
    private boolean stopped;
    private int idleWaiters;

    /**
     * @param features    the negotiated virtio features (INDIRECT_DESC bit 28; EVENT_IDX is the ring's)
     * @param lastAvail   SET_VRING_BASE's index (replaced by the inflight region's count when there is one)
     * @param maxIndirect the most descriptors an indirect table may hold
     * @param inflight    this queue's inflight tracking, or null
     */
    public Virtqueue(int index, SplitRing ring, long features, int lastAvail, int maxIndirect, Inflight inflight) {
        this.index = index;
        this.ring = ring;
        this.size = ring.size();
        this.eventIdx = ring.eventIdx();
        this.indirectDesc = (features & (1L << VirtioFeatures.RING_INDIRECT_DESC)) != 0;
        this.maxIndirect = maxIndirect;
        this.inflight = inflight;
        this.indirectScratch = Arena.ofAuto().allocate((long) SplitRingLayout.DESC_BYTES * maxIndirect, 16);
        this.state = new byte[size];
        this.unpublished = new int[size];
        this.lastAvail = lastAvail & 0xffff;
        this.shadowAvail = this.lastAvail;
        this.shadowUsed = ring.usedIdx();
        this.publishedUsed = shadowUsed;
    }

    public int index() {
        return index;
    }

    public SplitRing ring() {
        return ring;
    }

    /**
     * Restart with an inflight region: the heads the last incarnation popped and never completed are popped again
     * first, in the order it popped them, and avail entries are taken from used.idx + their number on (the
     * restart rule of docs/interop/vhost-user.rst "Inflight I/O tracking"). Queue thread, before the first pop.
     * @return how many heads will be resubmitted
     * @throws IllegalStateException when the region contradicts the ring
     */
    public int recover() {
        if (inflight == null) {
            return 0;
        }
        Inflight.Recovered r = inflight.recover(ring);
        if (r.fresh()) {
            return 0;
        }
        resubmit = r.heads();
        resubmitNext = 0;
        lastAvail = (r.usedIdx() + resubmit.length) & 0xffff;
        shadowAvail = lastAvail;
        return resubmit.length;
    }

    /** The next avail index to pop: GET_VRING_BASE's answer once the queue is stopped. */
    public int lastAvail() {
        return lastAvail;
    }

    /** Whether avail.idx has moved past what was popped (one read of the driver's index, no fence). */
    public boolean hasAvailable() {
        return resubmitNext < resubmit.length || ring.availIdx() != lastAvail;
    }

    /**
     * Pops the next chain into {@code chain}, its buffers resolved through {@code memory}; false when none is
     * available. The head is in flight from here until {@link #push}, and not offered again until published.
     */
    public boolean pop(GuestMemory memory, Chain chain) throws BrokenRingException {
        int head;
        boolean again = resubmitNext < resubmit.length;
        if (again) {
            head = resubmit[resubmitNext];
        } else {
            if (lastAvail == shadowAvail) {
                int idx = ring.availIdx();
                int n = (idx - lastAvail) & 0xffff;
                if (n > size) {
                    throw broken("avail.idx moved from " + lastAvail + " to " + idx + ", " + n
                            + " entries ahead: at most the queue size " + size);
                }
                if (n == 0) {
                    return false;
                }
                shadowAvail = idx;
                SplitRing.acquire(); // ring[] and the descriptors after the index that published them
            }
            head = ring.availRing(lastAvail % size);
            if (head >= size) {
                throw broken("avail.ring[" + (lastAvail % size) + "] is head " + head
                        + ": outside the descriptor table of " + size);
            }
        }
        walk(memory, head, chain);
        synchronized (this) {
            if (state[head] != FREE) {
                // Also bounds the heads in flight and held: distinct heads below size are at most size.
                throw broken("head " + head + (state[head] == IN_FLIGHT ? " made available again while still in flight"
                        : " made available again before its completion was published: a head is the driver's again"
                        + " once used.idx has passed its used entry"));
            }
            state[head] = IN_FLIGHT;
            inFlightCount++;
            if (inflight != null) {
                inflight.popped(head);
            }
        }
        if (again) {
            resubmitNext++;
        } else {
            lastAvail = (lastAvail + 1) & 0xffff;
        }
        lastPopAgain = again;
        return true;
    }

    /**
     * Takes back the chain just popped, which was never submitted (the queue thread was interrupted before it
     * could be): it is popped again by the next pop, or counted as not popped by GET_VRING_BASE.
     */
    public void unpop(int head) {
        boolean again = lastPopAgain;
        synchronized (this) {
            state[head] = FREE;
            inFlightCount--;
            if (inflight != null && !again) {
                inflight.completed(head); // a resubmitted head stays marked: the next incarnation owes it too
            }
            notifyIdle();
        }
        if (again) {
            resubmitNext--;
        } else {
            lastAvail = (lastAvail - 1) & 0xffff;
        }
    }

    private void walk(GuestMemory memory, int head, Chain chain) throws BrokenRingException {
        chain.reset(head);
        MemorySegment table = ring.descriptorTable();
        long base = 0;
        int max = size;
        int i = head;
        boolean indirect = false;
        int flags = SplitRing.descFlags(table, SplitRingLayout.DESC_BYTES * (long) head);
        if ((flags & SplitRingLayout.F_INDIRECT) != 0) {
            long at = SplitRingLayout.DESC_BYTES * (long) head;
            long addr = SplitRing.descAddr(table, at);
            long len = SplitRing.descLen(table, at);
            if (!indirectDesc) {
                throw broken("head " + head + " is INDIRECT, but VIRTIO_RING_F_INDIRECT_DESC was not negotiated");
            }
            if ((flags & SplitRingLayout.F_NEXT) != 0) {
                throw broken("head " + head + " is INDIRECT and has NEXT: virtio 1.2 2.7.5.3.1 allows one or the other");
            }
            if (len == 0 || len % SplitRingLayout.DESC_BYTES != 0 || len / SplitRingLayout.DESC_BYTES > maxIndirect) {
                throw broken("indirect table of head " + head + " is " + len + " bytes: allowed a multiple of 16 of 16.."
                        + (SplitRingLayout.DESC_BYTES * (long) maxIndirect) + " bytes");
            }
            locator.start(false);
            int pieces = memory.scatter(addr, len, locator);
            if (pieces < 0) {
                throw broken("indirect table of head " + head + " at gpa 0x" + Long.toHexString(addr) + ", " + len
                        + " bytes, is outside guest memory");
            }
            if (pieces == 1) {
                table = locator.mapping;
                base = locator.offset;
            } else {
                locator.start(true);
                memory.scatter(addr, len, locator);
                table = indirectScratch;
            }
            max = (int) (len / SplitRingLayout.DESC_BYTES);
            i = 0;
            indirect = true;
        }
        for (int seen = 1; ; seen++) {
            long at = base + SplitRingLayout.DESC_BYTES * (long) i;
            long addr = SplitRing.descAddr(table, at);
            long len = SplitRing.descLen(table, at);
            flags = SplitRing.descFlags(table, at);
            int next = SplitRing.descNext(table, at);
            if (seen > max) {
                throw broken("the chain of head " + head + " is longer than its table of " + max
                        + (indirect ? " (indirect)" : "") + " descriptors: a loop");
            }
            if ((flags & SplitRingLayout.F_INDIRECT) != 0) {
                throw broken(indirect ? "descriptor " + i + " of head " + head + "'s indirect table is INDIRECT: one"
                        + " table per descriptor (virtio 1.2 2.7.5.3.1)"
                        : "descriptor " + i + " of head " + head + " is INDIRECT: only a chain's head may be");
            }
            if (len == 0) {
                throw broken("descriptor " + i + (indirect ? " of the indirect table" : "") + " of head " + head
                        + " has a zero-length buffer");
            }
            boolean writable = (flags & SplitRingLayout.F_WRITE) != 0;
            if (writable != chain.writing()) {
                if (!writable) {
                    throw broken("descriptor " + i + " of head " + head + " is device-readable after a device-writable"
                            + " one: readable buffers come first (virtio 1.2 2.7.4.2)");
                }
                chain.startWritable();
            }
            if (memory.scatter(addr, len, chain) < 0) {
                throw broken("descriptor " + i + (indirect ? " of the indirect table" : "") + " of head " + head
                        + ": buffer at gpa 0x" + Long.toHexString(addr) + ", " + len + " bytes, is outside guest memory");
            }
            if ((flags & SplitRingLayout.F_NEXT) == 0) {
                break;
            }
            if (next >= max) {
                throw broken("descriptor " + i + " of head " + head + " has next " + next + ": outside its table of " + max
                        + (indirect ? " (indirect)" : ""));
            }
            i = next;
        }
        chain.finish();
    }

    /** Finds where a one-piece indirect table is, or copies a table of several pieces into the scratch table. */
    private final class IndirectTable implements ScatterSink {
        MemorySegment mapping;
        long offset;
        long copied;
        boolean copying;

        void start(boolean copy) {
            copying = copy;
            copied = 0;
        }

        @Override
        public void piece(MemorySegment mapping, long offset, long length, long iova) {
            if (copying) {
                MemorySegment.copy(mapping, offset, indirectScratch, copied, length);
            } else if (copied == 0) {
                this.mapping = mapping;
                this.offset = offset;
            }
            copied += length;
        }
    }

    private BrokenRingException broken(String what) {
        return new BrokenRingException("virtqueue " + index + ": " + what);
    }

    // Kick suppression, queue thread only.

    /**
     * Asks the driver not to kick while the queue thread is busy: without EVENT_IDX, used.flags NO_NOTIFY; with
     * it, avail_event is simply left where it was (the driver kicks only when avail.idx passes it).
     */
    public void disableKicks() {
        if (!eventIdx) {
            ring.usedFlags(SplitRingLayout.USED_F_NO_NOTIFY);
        }
    }

    /**
     * Before sleeping: asks for a kick at the next entry (avail_event = last popped, or NO_NOTIFY cleared), then
     * with a full fence re-reads avail.idx (libvhost-user {@code vu_queue_set_notification} + the re-check of
     * {@code vub_process_vq}): an entry added before the driver could see the request would otherwise sleep.
     * @return true when entries are available after all (the caller then processes them, kicks disabled)
     */
    public boolean enableKicks() {
        if (eventIdx) {
            ring.availEvent(lastAvail);
        } else {
            ring.usedFlags(0);
        }
        SplitRing.full();
        return hasAvailable();
    }

    // Completions.

    /** The queue thread starts a batch: its own completions are published at {@link #endBatch}. */
    public void beginBatch() {
        batchOwner = Thread.currentThread();
    }

    /** Ends the batch: publishes what it completed; true when the driver is to be interrupted. */
    public boolean endBatch() {
        return endBatch(0);
    }

    /**
     * Ends the batch, publishing what is completed only once {@code hold} or more completions wait; fewer stay
     * held for {@link #publishHeld} (or the next publish, whoever makes it). True when the driver is to be
     * interrupted.
     */
    public boolean endBatch(int hold) {
        batchOwner = null;
        synchronized (this) {
            return unpublishedCount < hold ? false : publish();
        }
    }

    /** Completions pushed and not yet published. */
    public synchronized int unpublished() {
        return unpublishedCount;
    }

    /** Publishes the completions held; true when the driver is to be interrupted. */
    public synchronized boolean publishHeld() {
        return publish();
    }

    /**
     * Head {@code head} is done, {@code len} bytes written to its device-writable buffers. Published at once
     * unless the queue thread pushes it inside a batch.
     * @return true when the driver is to be interrupted now
     * @throws IllegalStateException when the head is not in flight (a completion twice: a bug, not the guest's)
     */
    public synchronized boolean push(int head, int len) {
        if (stopped) {
            return false;
        }
        if (state[head] != IN_FLIGHT) {
            throw new IllegalStateException("virtqueue " + index + ": head " + head + " completed but not in flight");
        }
        ring.usedElem(shadowUsed % size, head, len);
        shadowUsed = (shadowUsed + 1) & 0xffff;
        state[head] = UNPUBLISHED;
        inFlightCount--;
        unpublished[unpublishedCount++] = head;
        notifyIdle();
        // The current thread is the batch's owner only on the queue thread, inside a batch.
        return Thread.currentThread() != batchOwner && publish();
    }

    /** Whether the queue is stopped: completions then touch guest memory no more. Caller holds the monitor. */
    public synchronized boolean stopped() {
        return stopped;
    }

    private boolean publish() {
        if (stopped || unpublishedCount == 0) {
            return false;
        }
        if (inflight != null) {
            inflight.beforePublish(unpublished[unpublishedCount - 1]);
        }
        SplitRing.release(); // the entries, and the data and status they cover, before the index
        ring.usedIdx(shadowUsed);
        for (int i = 0; i < unpublishedCount; i++) {
            state[unpublished[i]] = FREE;
            if (inflight != null) {
                inflight.completed(unpublished[i]);
            }
        }
        if (inflight != null) {
            inflight.afterPublish(shadowUsed);
        }
        unpublishedCount = 0;
        int old = publishedUsed;
        publishedUsed = shadowUsed;
        // libvhost-user vring_notify: the index must be visible before the driver's flags or used_event are read.
        SplitRing.full();
        if (!eventIdx) {
            return (ring.availFlags() & SplitRingLayout.AVAIL_F_NO_INTERRUPT) == 0;
        }
        boolean valid = signalledValid;
        signalledValid = true;
        return !valid || SplitRingLayout.needEvent(ring.usedEvent(), publishedUsed, old);
    }

    public synchronized int inFlight() {
        return inFlightCount;
    }

    private void notifyIdle() {
        if (inFlightCount == 0 && idleWaiters > 0) {
            notifyAll();
        }
    }

    /** Waits (bounded) until no head is in flight. */
    public synchronized boolean awaitIdle(long timeoutMillis) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutMillis * 1_000_000L;
        while (inFlightCount > 0) {
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            idleWaiters++;
            try {
                wait(Math.max(1, left / 1_000_000L));
            } finally {
                idleWaiters--;
            }
        }
        return true;
    }

    /** The heads in flight now (for a stop that timed out: what the guest is still waiting for). */
    public synchronized String inFlightHeads() {
        StringBuilder b = new StringBuilder();
        for (int h = 0; h < size; h++) {
            if (state[h] == IN_FLIGHT) {
                b.append(b.isEmpty() ? "" : ", ").append(h);
            }
        }
        return b.toString();
    }

    /**
     * From here on completions release their requests but write nothing to guest memory, nor to the inflight
     * region: a head still in flight stays marked there, for the next start to resubmit ({@link #abandon}).
     */
    public synchronized void stop() {
        stopped = true;
    }

    /**
     * A head of a stopped queue completed: it is no longer in flight, and that is all. Its used entry is not
     * written (the ring is no longer this queue's: GET_VRING_BASE has answered, or the front-end has gone) and its
     * inflight mark stays, so the next start resubmits it if the front-end still owes it to the guest.
     * @return how many heads are still in flight
     */
    public synchronized int abandon(int head) {
        if (!stopped) {
            throw new IllegalStateException("virtqueue " + index + ": head " + head + " abandoned while the queue runs");
        }
        if (state[head] == IN_FLIGHT) {
            state[head] = FREE;
            inFlightCount--;
            notifyIdle();
        }
        return inFlightCount;
    }
}
