package io.pmemblk.dma.ioat;

import static io.pmemblk.dma.ioat.IoatSpec.*;

import io.pmemblk.dma.DmaChannel;
import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.RingPlacement;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Driver for one I/OAT v3 channel, programmed only through its registers ({@link Mmio}) and descriptors in
 * registered memory, the way SPDK's {@code lib/ioat/ioat.c} and DPDK's {@code drivers/dma/ioat} do it.
 *
 * <p>The ring of 2^k descriptors and the completion writeback word are allocated and registered once; every
 * {@code next} pointer is written once at start, so placing a copy only fills size/control/src/dst in place.
 * {@code head} (placed) and {@code tail} (reaped) are free-running counts masked by size-1; at most size-1
 * descriptors are outstanding so that "the completed descriptor is the one before tail" means "nothing new".
 * The hardware count in DMACOUNT restarts at 0 on every reset, so {@code hwBase} is the software count at which it
 * last restarted (DPDK's {@code offset}).
 *
 * <p>Locks: {@code submitLock} guards head/submitted/hwBase and the descriptor writes (place, submit, re-arm);
 * {@code reapLock} serialises reaping (tail, ctx slots, recovery). Recovery takes submitLock inside reapLock;
 * submitters never take reapLock, and the listener runs with only reapLock held, so it may place and submit.
 * Whoever calls {@link #poll} reaps; the {@link CompletionThread} does when nobody else does.
 */
public final class IoatChannel implements DmaChannel {
    private static final VarHandle WORD = FIELD_U64.varHandle();
    private static final long REGISTER_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(2);
    /** What a 32-bit register of a device that is gone reads (PCI master abort; {@code VfioUserMmio} likewise). */
    private static final int DEVICE_GONE_READ = 0xFFFF_FFFF;

    private final Mmio bar;
    private final long regs;
    private final int index;
    private final IovaSpace space;
    private final Interrupt vector;
    private final int size;
    private final int mask;
    private final long maxTransfer;
    private final Arena arena;
    private final MemorySegment ring;
    private final MemorySegment completion;
    private final long ringIova;
    private final long completionIova;
    private final Object[] contexts;
    /** Per slot with a context: how many placed copies it stands for (a merged run's, {@link RingPlacement}). */
    private final int[] copiesAt;

    private final ReentrantLock submitLock = new ReentrantLock();
    private final ReentrantLock reapLock = new ReentrantLock();
    private final RingPlacement placement = new RingPlacement(submitLock, new Descriptors());
    private volatile long head;
    private volatile long submitted;
    private long hwBase;
    private volatile long tail;

    private volatile DmaCompletionListener listener = (ctx, status) -> { };
    private volatile boolean closed;
    private volatile long drainTimeoutNanos = TimeUnit.SECONDS.toNanos(10);
    private volatile String brokenReason;
    /** Set by {@link #deviceLost}: the registers answer nothing any more, so {@link #close} leaves them alone. */
    private volatile boolean deviceGone;
    private final CompletionThread completions;
    /** The device's {@link DoorbellPage}, where {@link #submit} rings instead of the register; or null. */
    private final MemorySegment doorbellPage;
    /** The page's SLEEP word when the register was last written for a doorbell (a sleep that write ends). Under submitLock. */
    private int wokenSleep;

    /**
     * Starts channel {@code index} of the device behind {@code bar}: allocates and registers the ring, resets the
     * channel, arms it and runs a null descriptor through it; then starts the completion thread on {@code vector}.
     *
     * @param ringSize power of two, 2..32768
     */
    public IoatChannel(Mmio bar, int index, IovaSpace space, Interrupt vector, int ringSize) {
        this(bar, index, space, vector, ringSize, null);
    }

    /**
     * As {@link #IoatChannel(Mmio, int, IovaSpace, Interrupt, int)}, ringing the doorbells of {@link #submit} in
     * {@code doorbellPage} (the device's {@link DoorbellPage}, mapped) instead of DMACOUNT's register while the
     * engine is awake; null: the register only.
     * @throws IllegalArgumentException when {@code doorbellPage} is not a doorbell page for this channel
     */
    public IoatChannel(Mmio bar, int index, IovaSpace space, Interrupt vector, int ringSize, MemorySegment doorbellPage) {
        if (doorbellPage != null) {
            String wrong = DoorbellPage.refusal(doorbellPage, index);
            if (wrong != null) {
                throw new IllegalArgumentException("not a doorbell page for channel " + index + ": " + wrong);
            }
        }
        this.doorbellPage = doorbellPage;
        if (ringSize < 2 || ringSize > 1 << 15 || Integer.bitCount(ringSize) != 1) {
            throw new IllegalArgumentException("ring size " + ringSize + " must be a power of two in 2..32768");
        }
        int version = bar.read8(CBVER);
        if (version < VER_3_0) {
            throw new IllegalStateException("CBVER 0x" + Integer.toHexString(version) + ": only I/OAT v3 (0x30 and up) is supported");
        }
        int channels = bar.read8(CHANCNT);
        if (index < 0 || index >= channels) {
            throw new IllegalArgumentException("channel " + index + " not in 0.." + (channels - 1));
        }
        this.bar = bar;
        this.regs = channelBase(index);
        this.index = index;
        this.space = space;
        this.vector = vector;
        this.size = ringSize;
        this.mask = ringSize - 1;
        this.maxTransfer = IoatSpec.maxTransfer(bar.read8(XFERCAP));
        this.contexts = new Object[ringSize];
        this.copiesAt = new int[ringSize];
        this.arena = Arena.ofShared();
        this.ring = space.allocate(DESCRIPTOR.byteSize() * ringSize, DESC_BYTES, arena);
        this.completion = space.allocate(8, 64, arena);
        this.ringIova = space.map(ring);
        this.completionIova = space.map(completion);
        for (int i = 0; i < ringSize; i++) {
            ring.set(FIELD_U64, slotOffset(i) + DESC_NEXT, descriptorIova((i + 1) & mask));
        }
        try {
            start();
        } catch (RuntimeException e) {
            space.unmap(ringIova);
            space.unmap(completionIova);
            arena.close();
            throw e;
        }
        this.completions = new CompletionThread(this, vector);
    }

    @Override
    public void listener(DmaCompletionListener listener) {
        this.listener = listener == null ? (ctx, status) -> { } : listener;
    }

    /** How long {@link #close} waits for outstanding copies before reporting them closed (default 10 s). */
    public void closeTimeout(java.time.Duration timeout) {
        this.drainTimeoutNanos = timeout.toNanos();
    }

    @Override
    public int index() {
        return index;
    }

    /** Largest bytes one descriptor moves ({@link IoatSpec#maxTransfer}: 2^XFERCAP[4:0]). */
    public long maxTransfer() {
        return maxTransfer;
    }

    public int ringSize() {
        return size;
    }

    @Override
    public int freeSlots() {
        return (int) (mask - (head - tail));
    }

    @Override
    public int slotsFor(long length) {
        return IoatSpec.descriptorsFor(length, maxTransfer);
    }

    @Override
    public boolean place(long srcIova, long dstIova, long length, Object ctx) {
        int need = length < 1 ? 1 : slotsFor(length);
        if (need > mask) {
            throw new IllegalArgumentException("a copy of " + length + " bytes needs " + need + " descriptors of "
                    + maxTransfer + " bytes; the ring holds at most " + mask);
        }
        return placement.place(srcIova, dstIova, length, ctx);
    }

    @Override
    public boolean placeAll(Copies copies, Object ctx) {
        if (ctx == null) {
            throw new IllegalArgumentException("placeAll needs a context to report");
        }
        return placement.placeAll(copies, ctx);
    }

    /** The ring as {@link RingPlacement} fills it: at most size-1 descriptors outstanding. */
    private final class Descriptors implements RingPlacement.Ring {
        @Override
        public void checkOpen() {
            IoatChannel.this.checkOpen();
        }

        @Override
        public long room() {
            return mask - (head - tail);
        }

        @Override
        public int slotsFor(long length) {
            return IoatChannel.this.slotsFor(length);
        }

        @Override
        public long mergeLimit() {
            return maxTransfer;
        }

        @Override
        public void put(long srcIova, long dstIova, long length, Object ctx, int copies) {
            placeLocked(srcIova, dstIova, length, ctx, copies);
        }
    }

    /**
     * Fills the descriptors of one run of {@code copies} copies at head, ctx on its last. Caller holds submitLock
     * and checked the room (RingPlacement).
     */
    private void placeLocked(long srcIova, long dstIova, long length, Object ctx, int copies) {
        long h = head;
        long remaining = length;
        long offset = 0;
        int slot = 0;
        while (remaining > 0) {
            long chunk = Math.min(remaining, maxTransfer);
            slot = (int) (h & mask);
            long d = slotOffset(slot);
            ring.set(FIELD_U32, d + DESC_SIZE, (int) chunk);
            ring.set(FIELD_U32, d + DESC_CONTROL, OP_COPY << CTRL_OP_SHIFT);
            ring.set(FIELD_U64, d + DESC_SRC, srcIova + offset);
            ring.set(FIELD_U64, d + DESC_DST, dstIova + offset);
            contexts[slot] = null;
            offset += chunk;
            remaining -= chunk;
            h++;
        }
        contexts[slot] = ctx;
        copiesAt[slot] = copies;
        head = h;
    }

    @Override
    public void submit() {
        submitLock.lock();
        try {
            long h = head;
            if (h == submitted) {
                return;
            }
            long last = slotOffset((int) ((h - 1) & mask));
            ring.set(FIELD_U32, last + DESC_CONTROL,
                    ring.get(FIELD_U32, last + DESC_CONTROL) | CTRL_COMPLETION_UPDATE | CTRL_INT_ENABLE);
            submitted = h;
            ring((int) ((h - hwBase) & 0xFFFF));
        } finally {
            submitLock.unlock();
        }
    }

    /**
     * Makes descriptors up to {@code count} available. With a doorbell page: the count goes there (a volatile store,
     * so after the descriptors), and the register is written only when the device's engine says it sleeps, once a
     * sleep; the fence between the store and that load pairs with the engine's ({@link DoorbellPage}). Caller holds
     * submitLock.
     */
    private void ring(int count) {
        MemorySegment page = doorbellPage;
        if (page != null) {
            DoorbellPage.doorbell(page, index, DoorbellPage.VALID | count);
            VarHandle.fullFence();
            int sleep = DoorbellPage.sleepWord(page, index);
            if (!DoorbellPage.asleep(sleep) || sleep == wokenSleep) {
                return; // awake, or asleep in the sleep our last register write (still on its way) ends
            }
            wokenSleep = sleep;
        }
        bar.write16(regs + DMACOUNT, count); // Mmio write = release: descriptors first
    }

    /** Whether {@link #submit} rings in the device's doorbell page (a capability of the device, found at attach). */
    public boolean doorbellPage() {
        return doorbellPage != null;
    }

    @Override
    public int poll() {
        if (reapLock.isHeldByCurrentThread()) {
            return 0; // called from our own listener
        }
        reapLock.lock();
        try {
            return reap();
        } finally {
            reapLock.unlock();
        }
    }

    /** Copies placed but not yet reported. */
    public long outstanding() {
        return head - tail;
    }

    /** Caller holds reapLock. */
    private int reap() {
        long word = (long) WORD.getVolatile(completion, 0L);
        int reported = report(completedCount(word & CHANSTS_COMPLETED_DESCRIPTOR_MASK), 0);
        if ((word & CHANSTS_STATUS_MASK) == CHANSTS_HALTED && !deviceGone) { // a gone device has nothing to recover
            reported += recover();
        }
        return reported;
    }

    /** The count one past the descriptor at {@code address}, or tail when it says nothing new (or is stale). */
    private long completedCount(long address) {
        long t = tail;
        long offset = address - ringIova;
        if (offset < 0 || offset >= (long) size * DESC_BYTES) {
            return t; // 0 = "none since arming"
        }
        int slot = (int) (offset / DESC_BYTES);
        long n = (slot + 1 - t) & mask;
        return n <= submitted - t ? t + n : t;
    }

    /** Reports the copies of descriptors [tail, upTo) with status; how many copies. Caller holds reapLock. */
    private int report(long upTo, int status) {
        int reported = 0;
        DmaCompletionListener l = listener;
        for (long c = tail; c < upTo; c++) {
            int slot = (int) (c & mask);
            Object ctx = contexts[slot];
            int copies = copiesAt[slot];
            contexts[slot] = null;
            tail = c + 1; // frees the slot before the listener runs: it may place again
            if (ctx != null) {
                reported += copies;
                try {
                    l.completed(ctx, status, copies);
                } catch (Throwable t) {
                    Thread me = Thread.currentThread();
                    me.getUncaughtExceptionHandler().uncaughtException(me, t);
                }
            }
        }
        return reported;
    }

    /**
     * After HALTED: clear CHANERR, reset, re-arm at the next free descriptor, then report everything placed before
     * the re-arm as failed. Caller holds reapLock; the listener runs after submitLock is released.
     */
    private int recover() {
        int chanerr = bar.read32(regs + CHANERR);
        if (chanerr == DEVICE_GONE_READ) {
            // No CHANERR has every bit set (bits 31..19 are reserved): this is the read of a device that is gone
            // (surprise removal; a vfio-user device whose socket closed after it halted the channel as its
            // memory was unmapped). Taking it as the halt's cause reported the copies with status 0xffffffff, and
            // the reset and re-arm below then waited out their register timeouts under reapLock, holding up the
            // engine's own loss handling (deviceLost). The halt says the device stopped on this ring, so the
            // copies after it are lost, not in flight: report them so, once, as deviceLost would.
            return lose(DmaCompletionListener.STATUS_DEVICE_LOST, "CHANERR reads all ones after a halt: the device is gone");
        }
        int status = chanerr != 0 ? chanerr : DmaCompletionListener.STATUS_ABORTED;
        long failedUpTo;
        submitLock.lock();
        try {
            failedUpTo = head;
            try {
                reset();
                arm(failedUpTo);
            } catch (IllegalStateException e) {
                brokenReason = e.getMessage();
            }
        } finally {
            submitLock.unlock();
        }
        return report(failedUpTo, status);
    }

    /** Points the channel at ring[count] with the hardware count restarting there. Caller holds submitLock. */
    private void arm(long count) {
        bar.write16(regs + CHANCTRL, CHANCTRL_RUN);
        bar.write64(regs + CHANCMP, completionIova);
        // Prime the writeback word with "nothing completed since arming" before the device can overwrite it.
        WORD.setVolatile(completion, 0L, (long) CHANSTS_ARMED);
        bar.write64(regs + CHAINADDR, descriptorIova((int) (count & mask)));
        hwBase = count;
        submitted = count;
        long deadline = System.nanoTime() + REGISTER_TIMEOUT_NANOS;
        long sts;
        while (((sts = bar.read64(regs + CHANSTS)) & CHANSTS_STATUS_MASK) != CHANSTS_ARMED) {
            waitForDevice(deadline, "channel " + index + " to arm at ring[" + (count & mask) + "] (CHANSTS 0x"
                    + Long.toHexString(sts) + ", CHANERR 0x" + Integer.toHexString(bar.read32(regs + CHANERR)) + ")");
        }
    }

    /** SPDK's ioat_reset_hw: suspend if running, clear CHANERR, RESET, wait for the bit to clear. */
    private void reset() {
        long state = bar.read64(regs + CHANSTS) & CHANSTS_STATUS_MASK;
        if (state == CHANSTS_ACTIVE || state == CHANSTS_IDLE) {
            bar.write8(regs + CHANCMD, CHANCMD_SUSPEND);
            long deadline = System.nanoTime() + REGISTER_TIMEOUT_NANOS;
            while ((bar.read64(regs + CHANSTS) & CHANSTS_STATUS_MASK) == CHANSTS_ACTIVE) {
                waitForDevice(deadline, "channel " + index + " to suspend");
            }
        }
        bar.write32(regs + CHANERR, bar.read32(regs + CHANERR));
        bar.write8(regs + CHANCMD, CHANCMD_RESET);
        long deadline = System.nanoTime() + REGISTER_TIMEOUT_NANOS;
        while ((bar.read8(regs + CHANCMD) & CHANCMD_RESET) != 0) {
            waitForDevice(deadline, "channel " + index + " to finish RESET");
        }
    }

    private static void waitForDevice(long deadline, String what) {
        if (System.nanoTime() - deadline > 0) {
            throw new IllegalStateException("timed out waiting for " + what);
        }
        Thread.onSpinWait();
        LockSupport.parkNanos(1_000);
    }

    /** Reset, arm at ring[0], and run one null descriptor to prove the channel works (SPDK ioat_channel_start). */
    private void start() {
        submitLock.lock();
        try {
            reset();
            arm(0);
            long d = slotOffset(0);
            ring.set(FIELD_U32, d + DESC_SIZE, NULL_DESC_SIZE);
            ring.set(FIELD_U32, d + DESC_CONTROL, CTRL_NULL | CTRL_COMPLETION_UPDATE);
            ring.set(FIELD_U64, d + DESC_SRC, 0L);
            ring.set(FIELD_U64, d + DESC_DST, 0L);
            head = 1;
            submitted = 1;
            bar.write16(regs + DMACOUNT, 1);
            long deadline = System.nanoTime() + REGISTER_TIMEOUT_NANOS;
            long expect = ringIova | CHANSTS_IDLE;
            while ((long) WORD.getVolatile(completion, 0L) != expect) {
                waitForDevice(deadline, "channel " + index + " to complete its start-up null descriptor (CHANSTS 0x"
                        + Long.toHexString(bar.read64(regs + CHANSTS)) + ", CHANERR 0x"
                        + Integer.toHexString(bar.read32(regs + CHANERR)) + ")");
            }
            tail = 1;
        } finally {
            submitLock.unlock();
        }
    }

    @Override
    public int completionFd() {
        return vector.fd();
    }

    @Override
    public void pollers(boolean start) {
        completions.pollers(start);
    }

    /**
     * The device is gone (a vfio-user device process that died; on PCI, a surprise removal, where Linux's
     * ioatdma has its error handler stop the channels): copies the completion word already reports done are
     * reported done, every other one placed is reported with {@code status} now, without a register access, and
     * the channel takes nothing more ({@link #place} throws). {@link #close} then only releases the ring. The
     * device must not write our memory any more when this is called (a process that died cannot). Returns how
     * many copies were reported with {@code status}.
     */
    public int deviceLost(int status, String why) {
        reapLock.lock();
        try {
            long word = (long) WORD.getVolatile(completion, 0L);
            report(completedCount(word & CHANSTS_COMPLETED_DESCRIPTOR_MASK), 0);
            return lose(status, why);
        } finally {
            reapLock.unlock();
        }
    }

    /**
     * Marks the device gone and reports every copy not yet reported with {@code status}; how many. Caller holds
     * reapLock (and reported what the completion word says is done): whoever comes second, the reaper that found
     * the device gone or the engine's {@link #deviceLost}, finds tail at head and reports nothing again.
     */
    private int lose(int status, String why) {
        long failedUpTo;
        submitLock.lock();
        try {
            deviceGone = true;
            brokenReason = why;
            failedUpTo = head;
            submitted = head; // nothing is in the device's hands any more: close() need not wait
        } finally {
            submitLock.unlock();
        }
        return report(failedUpTo, status);
    }

    /** Whether the device was found gone ({@link #deviceLost}, or CHANERR read as all ones after a halt). */
    public boolean deviceGone() {
        return deviceGone;
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException("DMA channel " + index + " is closed");
        }
        String broken = brokenReason;
        if (broken != null) {
            throw new IllegalStateException("DMA channel " + index + (deviceGone ? " lost its device: "
                    : " could not recover from a halt: ") + broken);
        }
    }

    /**
     * Submits what was placed, waits (bounded) for everything outstanding, stops the completion thread, resets the
     * channel, reports whatever is left with {@link DmaCompletionListener#STATUS_CLOSED} and releases the ring.
     */
    @Override
    public void close() {
        submit();
        submitLock.lock();
        try {
            if (closed) {
                return;
            }
            closed = true;
            completions.stop();
        } finally {
            submitLock.unlock();
        }
        boolean onCompletionThread = completions.isCurrent();
        long deadline = System.nanoTime() + drainTimeoutNanos;
        while (tail != submitted && brokenReason == null && System.nanoTime() - deadline < 0) {
            if (poll() == 0) {
                LockSupport.parkNanos(100_000);
            }
        }
        if (!onCompletionThread) {
            completions.join(TimeUnit.NANOSECONDS.toMillis(REGISTER_TIMEOUT_NANOS));
        }
        reapLock.lock();
        try {
            submitLock.lock();
            try {
                try {
                    if (!deviceGone) { // a gone device answers no register: its RESET would only time out
                        reset();
                    }
                } catch (IllegalStateException e) {
                    // the ring is released regardless; a device that ignores RESET gets reset again at next start
                }
            } finally {
                submitLock.unlock();
            }
            report(head, DmaCompletionListener.STATUS_CLOSED);
        } finally {
            reapLock.unlock();
        }
        space.unmap(ringIova);
        space.unmap(completionIova);
        if (!onCompletionThread) {
            arena.close();
        }
    }

    private long slotOffset(int slot) {
        return slot * DESC_BYTES;
    }

    private long descriptorIova(int slot) {
        return ringIova + slot * DESC_BYTES;
    }

    @Override
    public String toString() {
        return "IoatChannel[" + index + ", ring " + size + ", head " + head + ", tail " + tail + "]";
    }
}
