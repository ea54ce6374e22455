package io.pmemblk.dma.soft;

import static io.pmemblk.dma.ioat.IoatSpec.*;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.ioat.DoorbellPage;
import io.pmemblk.posix.MemoryFaults;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One channel of {@link SoftIoatDevice}: its registers and its engine thread, which runs the descriptors the driver
 * makes available (the device's model, described there). Fields written under {@link #lock} unless noted.
 */
final class SoftIoatChannel implements Runnable {
    private static final System.Logger LOG = System.getLogger(SoftIoatChannel.class.getName());
    private static final VarHandle WORD = FIELD_U64.varHandle();

    private final SoftIoatDevice device;
    private final IovaSpace space;
    private final SoftFaults faults;
    private final long maxTransfer;
    /** DMACAPABILITY: 0 (copies only), or DMACAP_XOR and/or DMACAP_PQ, which enable those descriptors. */
    private final int dmaCapability;
    final int index;
    final ReentrantLock lock = new ReentrantLock();
    final Interrupt vector;
    final Thread thread;

    volatile int chanctrl;
    volatile int chanerr;
    volatile int chanerrMask;
    /** Written by the driver without the lock (doorbell). */
    volatile int dmacount;
    /** DMACOUNT register writes (one writer a channel, the driver's submitter): what the doorbell page saves. */
    volatile long registerDoorbells;
    /**
     * The device's {@link DoorbellPage}, or null: where the driver may ring instead of DMACOUNT's register, and where
     * the engine says it sleeps.
     */
    volatile MemorySegment page;
    volatile long chansts = CHANSTS_HALTED;
    volatile long chainaddr;
    volatile long chancmp;
    volatile long completedTotal;
    /** Written by the engine only. */
    volatile long bytesTotal;

    /** The RAID operations' sources and coefficients, and an extension descriptor: reused, under the lock. */
    final MemorySegment[] sources = new MemorySegment[RAID_MAX_SOURCES];
    final int[] coefs = new int[RAID_MAX_SOURCES];
    MemorySegment extension;
    int state = CHANSTS_HALTED;
    /** Written by the engine under the lock; read without it by {@link #status}. */
    volatile int processed;
    /**
     * Set while {@link #halt} writes the halt back to the completion word and CHANSTS does not show it yet: a
     * driver that read HALTED in the word and then reads CHANSTS must find HALTED there too, so {@link #status}
     * waits for the halt to finish (it holds the lock). CHANSTS cannot show HALTED before the write-back instead:
     * a failed write-back adds COMPLETION_ADDR to CHANERR, which must be complete once CHANSTS shows the halt.
     */
    private volatile boolean halting;
    long lastCompleted;
    long nextDescriptor;
    boolean fetchingFromChainaddr;

    /** Channel {@code index} of {@code device}, whose {@link SoftIoatDevice#isClosed} stops the engine. */
    SoftIoatChannel(SoftIoatDevice device, int index, Interrupt vector, IovaSpace space, SoftFaults faults,
                    long maxTransfer, int dmaCapability) {
        this.device = device;
        this.space = space;
        this.faults = faults;
        this.maxTransfer = maxTransfer;
        this.dmaCapability = dmaCapability;
        this.index = index;
        this.vector = vector;
        this.thread = Thread.ofPlatform().daemon().name("soft-ioat-ch" + index).unstarted(this);
    }

    /**
     * DMACOUNT as the engine takes it: the page's doorbell once the driver rang it there since the last reset or
     * re-arm (it is the newer: the driver stores it before it writes the register, if it writes it), else the
     * register's.
     */
    int count() {
        MemorySegment p = page;
        if (p != null) {
            int d = DoorbellPage.doorbell(p, index);
            if ((d & DoorbellPage.VALID) != 0) {
                return d & 0xFFFF;
            }
        }
        return dmacount;
    }

    /**
     * A write of DMACOUNT's register: the engine is woken, and the page stops saying that it sleeps at once, not when
     * the engine gets a CPU (on a busy host that can take longer than the driver takes to ring again): until the
     * engine has looked and gone to sleep again, saying so afresh, the driver's doorbells go to the page alone, and
     * the engine, woken, takes them ({@link DoorbellPage}).
     */
    void registerDoorbell(int count) {
        dmacount = count;
        registerDoorbells++;
        MemorySegment p = page;
        if (p != null) {
            DoorbellPage.awake(p, index);
        }
        LockSupport.unpark(thread);
    }

    /** The count restarts (RESET, a re-arm): a doorbell left in the page is not taken as the new chain's. */
    private void restartCount() {
        dmacount = 0;
        MemorySegment p = page;
        if (p != null) {
            DoorbellPage.doorbell(p, index, 0);
        }
    }

    void setState(int s) {
        state = s;
        chansts = lastCompleted | s;
    }

    /** CHANSTS as a read sees it: ACTIVE from the doorbell on, before the engine has picked the work up. */
    long status() {
        if (halting) {
            lock.lock(); // halt() holds it until CHANSTS shows the halt; microseconds, and only while halting
            lock.unlock();
        }
        long s = chansts;
        long st = s & CHANSTS_STATUS_MASK;
        if ((st == CHANSTS_ARMED || st == CHANSTS_IDLE) && ((count() - processed) & 0xFFFF) != 0) {
            return (s & ~CHANSTS_STATUS_MASK) | CHANSTS_ACTIVE;
        }
        return s;
    }

    /** What CHANCMD RESET clears. Caller holds the lock. */
    void resetRegisters() {
        state = CHANSTS_HALTED;
        chansts = lastCompleted | CHANSTS_HALTED;
        restartCount();
        processed = 0;
        chanctrl = 0;
        chancmp = 0;
    }

    private boolean runnable() {
        return !faults.stalled(index) && (state == CHANSTS_ARMED || state == CHANSTS_IDLE || state == CHANSTS_ACTIVE)
                && ((count() - processed) & 0xFFFF) != 0;
    }

    @Override
    public void run() {
        while (!device.isClosed()) {
            if (!runnable()) {
                int cause = faults.haltNow(index);
                if (cause != 0) {
                    lock.lock();
                    try {
                        halt(cause);
                    } finally {
                        lock.unlock();
                    }
                    continue;
                }
                if (mayPark()) {
                    LockSupport.park(this);
                    awake();
                }
                continue;
            }
            lock.lock();
            try {
                if (runnable()) {
                    step();
                }
            } catch (InternalError e) {
                if (!MemoryFaults.isFault(e)) {
                    throw e;
                }
                // a descriptor itself in memory that failed (a client truncated the file its ring is in): a
                // read error, and the engine lives on for the driver's reset, as after a failed copy
                halt(CHANERR_READ_DATA);
            } catch (RuntimeException e) {
                // Client memory the model could not read as a descriptor (one at a host address not aligned for
                // its fields throws IllegalArgumentException from the aligned layouts). The client controls it,
                // so it must not end this thread: reset() does not restart one, and the channel would never
                // complete again for any later client. A read error (Linux's ioat_eh fails the descriptor with
                // DMA_TRANS_READ_FAILED and restarts), the halt an IOVA fault takes.
                LOG.log(System.Logger.Level.WARNING, "soft-ioat: channel {0} halts with READ_DATA: the descriptor"
                        + " at IOVA 0x{1} could not be used: {2}", index, Long.toHexString(nextDescriptor), e.toString());
                halt(CHANERR_READ_DATA);
            } finally {
                lock.unlock();
            }
        }
    }

    /**
     * Before the engine sleeps: says so in the doorbell page, then looks once more, so that a doorbell the driver
     * rang in the page before it could read that (and so did not write the register) is taken now
     * ({@link DoorbellPage}: both sides store, fence, then load). False: there is work after all.
     */
    private boolean mayPark() {
        MemorySegment p = page;
        if (p == null) {
            return true;
        }
        DoorbellPage.sleeping(p, index);
        VarHandle.fullFence();
        if (runnable()) {
            DoorbellPage.awake(p, index);
            return false;
        }
        return true;
    }

    private void awake() {
        MemorySegment p = page;
        if (p != null) {
            DoorbellPage.awake(p, index);
        }
    }

    void command(int cmd) {
        lock.lock();
        try {
            if ((cmd & CHANCMD_RESET) != 0) {
                resetRegisters();
                return;
            }
            if ((cmd & CHANCMD_ABORT) != 0) {
                halt(0);
                return;
            }
            if ((cmd & CHANCMD_SUSPEND) != 0 && state != CHANSTS_HALTED) {
                setState(CHANSTS_SUSPENDED);
            }
            if ((cmd & CHANCMD_RESUME) != 0 && state == CHANSTS_SUSPENDED) {
                setState(((count() - processed) & 0xFFFF) != 0 ? CHANSTS_ACTIVE : CHANSTS_IDLE);
            }
        } finally {
            lock.unlock();
        }
        LockSupport.unpark(thread); // START / APPEND / RESUME: look at DMACOUNT again
    }

    void arm(long address) {
        lock.lock();
        try {
            chainaddr = address;
            if (state == CHANSTS_ACTIVE || chanerr != 0 || faults.broken(index)) {
                return; // hardware ignores a chain address while running or with errors pending
            }
            nextDescriptor = address;
            fetchingFromChainaddr = true;
            lastCompleted = 0;
            // a new chain starts counting from 0: Linux's ioat_restart_channel re-arms a halted channel
            // without RESET and then writes DMACOUNT from 0 (__ioat_restart_chan: dmacount = 0)
            restartCount();
            processed = 0;
            setState(CHANSTS_ARMED);
        } finally {
            lock.unlock();
        }

    }

    void clearErrors(int bits) {
        lock.lock();
        try {
            chanerr &= ~bits;
        } finally {
            lock.unlock();
        }
    }

    /** Processes the descriptor at nextDescriptor. Caller holds the lock. */
    private void step() {
        long address = nextDescriptor;
        if ((address & (DESC_BYTES - 1)) != 0) {
            halt(CHANERR_NEXT_DESC_ALIGN);
            return;
        }
        MemorySegment d;
        try {
            d = space.translate(address, DESC_BYTES);
        } catch (IovaFault f) {
            halt(fetchingFromChainaddr ? CHANERR_CHAIN_ADDR_VALUE : CHANERR_NEXT_ADDR);
            return;
        }
        if (state != CHANSTS_ACTIVE) {
            setState(CHANSTS_ACTIVE);
        }
        long size = Integer.toUnsignedLong(d.get(FIELD_U32, DESC_SIZE));
        int control = d.get(FIELD_U32, DESC_CONTROL);
        long src = d.get(FIELD_U64, DESC_SRC);
        long dst = d.get(FIELD_U64, DESC_DST);
        long next = d.get(FIELD_U64, DESC_NEXT);
        int injected = faults.failDescriptor(index);
        if (injected != 0) {
            halt(injected);
            return;
        }
        int consumed = 1;
        int op = (control & CTRL_OP_MASK) >>> CTRL_OP_SHIFT;
        // the null bit is the copy format's (bit 5); in XOR and PQ descriptors bits 7:5 are the source count
        if (op != OP_COPY || (control & CTRL_NULL) == 0) {
            if (op == OP_COPY) {
                int err = copy(src, dst, size);
                if (err != 0) {
                    halt(err);
                    return;
                }
            } else if ((op == OP_XOR || op == OP_XOR_VAL) && (dmaCapability & DMACAP_XOR) != 0
                    || (op == OP_PQ || op == OP_PQ_VAL) && (dmaCapability & DMACAP_PQ) != 0) {
                if (size > maxTransfer) {
                    halt(CHANERR_LENGTH);
                    return;
                }
                consumed = raid(op, control, d, size);
                if (consumed < 0) {
                    halt(-consumed);
                    return;
                }
                if (consumed == 2) {
                    next = extension.get(FIELD_U64, DESC_NEXT); // the chain goes on after the extension
                    extension = null;
                }
            } else {
                halt(CHANERR_CONTROL);
                return;
            }
        }
        processed = (processed + consumed) & 0xFFFF;
        completedTotal++;
        lastCompleted = address;
        nextDescriptor = next;
        fetchingFromChainaddr = false;
        setState(((count() - processed) & 0xFFFF) != 0 ? CHANSTS_ACTIVE : CHANSTS_IDLE);
        if ((control & CTRL_COMPLETION_UPDATE) != 0 && !writeBack(chansts)) {
            halt(CHANERR_COMPLETION_ADDR);
            return;
        }
        if ((control & CTRL_INT_ENABLE) != 0) {
            vector.signal();
        }
    }

    /** A COPY of {@code size} bytes: 0, or the CHANERR bits to halt with. Caller holds the lock. */
    private int copy(long src, long dst, long size) {
        if (size > maxTransfer) {
            return CHANERR_LENGTH;
        }
        MemorySegment from;
        MemorySegment to;
        try {
            from = space.translate(src, size);
        } catch (IovaFault f) {
            return CHANERR_SRC_ADDR;
        }
        try {
            to = space.translate(dst, size);
        } catch (IovaFault f) {
            return CHANERR_DEST_ADDR;
        }
        try {
            MemoryFaults.copy(from, 0, to, 0, size);
        } catch (InternalError e) {
            if (!MemoryFaults.isFault(e)) {
                throw e;
            }
            // The memory behind a translated address failed (a file truncated under its mapping, a
            // poisoned line): hardware halts with a read or write data error, the descriptor not
            // completed, and its engine serves on after the driver's reset. So does this one.
            return MemoryFaults.loads(from) ? CHANERR_WRITE_DATA : CHANERR_READ_DATA;
        }
        bytesTotal += size;
        return 0;
    }

    /**
     * An XOR, XOR_VAL, PQ or PQ_VAL descriptor {@code d} at nextDescriptor, with its extension (the next ring
     * descriptor, by d's next pointer) when it has more sources than the base holds. XOR writes the sources' XOR
     * to the destination; XOR_VAL checks that the destination (Linux's first source) XOR the sources is zero.
     * PQ writes P and Q (unless disabled); PQ_VAL checks them. A failed check halts with XOR_P_OR_CRC / XOR_Q,
     * the descriptor not completed, which Linux's ioat_eh reads as the validation result and restarts from.
     * @return descriptors consumed (1 or 2), or minus the CHANERR bits to halt with. Caller holds the lock.
     */
    private int raid(int op, int control, MemorySegment d, long size) {
        boolean pq = op == OP_PQ || op == OP_PQ_VAL;
        boolean validate = op == OP_XOR_VAL || op == OP_PQ_VAL;
        int n = ((control & CTRL_SRC_CNT_MASK) >>> CTRL_SRC_CNT_SHIFT) + 2;
        if (n > RAID_MAX_SOURCES) {
            return -CHANERR_CONTROL;
        }
        int inBase = pq ? PQ_BASE_SOURCES : XOR_BASE_SOURCES;
        long[] offsets = pq ? PQ_SRC_OFFSETS : XOR_SRC_OFFSETS;
        int consumed = 1;
        if (n > inBase) {
            if (((count() - processed) & 0xFFFF) < 2) {
                return -CHANERR_DESCRIPTOR_COUNT; // the extension is not made available
            }
            long extAddress = d.get(FIELD_U64, DESC_NEXT);
            if ((extAddress & (DESC_BYTES - 1)) != 0) {
                return -CHANERR_NEXT_DESC_ALIGN;
            }
            try {
                extension = space.translate(extAddress, DESC_BYTES);
            } catch (IovaFault f) {
                return -CHANERR_NEXT_ADDR;
            }
            consumed = 2;
        }
        try {
            for (int i = 0; i < n; i++) {
                MemorySegment holder = i < inBase ? d : extension;
                sources[i] = space.translate(holder.get(FIELD_U64, offsets[i]), size);
            }
        } catch (IovaFault f) {
            return -CHANERR_SRC_ADDR;
        }
        int err = 0;
        try {
            if (!pq) {
                MemorySegment out;
                try {
                    out = space.translate(d.get(FIELD_U64, DESC_DST), size);
                } catch (IovaFault f) {
                    return validate ? -CHANERR_SRC_ADDR : -CHANERR_DEST_ADDR; // XOR_VAL reads it
                }
                if (RaidMath.xor(sources, n, out, size, validate)) {
                    err |= CHANERR_XOR_P_OR_CRC;
                }
            } else {
                boolean doP = (control & CTRL_P_DISABLE) == 0;
                boolean doQ = (control & CTRL_Q_DISABLE) == 0;
                MemorySegment p = null;
                MemorySegment q = null;
                try {
                    p = doP ? space.translate(d.get(FIELD_U64, PQ_P), size) : null;
                    q = doQ ? space.translate(d.get(FIELD_U64, PQ_Q), size) : null;
                } catch (IovaFault f) {
                    return -CHANERR_DEST_ADDR;
                }
                for (int i = 0; i < n; i++) {
                    coefs[i] = d.get(ValueLayout.JAVA_BYTE, PQ_COEF + i) & 0xFF;
                }
                if (doP && RaidMath.xor(sources, n, p, size, validate)) {
                    err |= CHANERR_XOR_P_OR_CRC;
                }
                if (doQ && RaidMath.q(sources, coefs, n, q, size, validate)) {
                    err |= CHANERR_XOR_Q;
                }
            }
        } catch (InternalError e) {
            if (!MemoryFaults.isFault(e)) {
                throw e;
            }
            return -CHANERR_READ_DATA; // a source or destination page failed under the operation
        } finally {
            java.util.Arrays.fill(sources, null); // hold no slice of client memory past the descriptor
        }
        if (err != 0) {
            return -err;
        }
        bytesTotal += size * n;
        return consumed;
    }

    /** Caller holds the lock. */
    void halt(int cause) {
        chanerr |= cause;
        // CHANERR is complete before CHANSTS shows HALTED (a failed error write-back included): a driver that
        // sees the halt reads CHANERR next and must find every cause there, not some of them.
        state = CHANSTS_HALTED;
        long halted = lastCompleted | CHANSTS_HALTED;
        halting = true;
        try {
            if ((chanctrl & CHANCTRL_ERR_COMPLETION_EN) != 0 && !writeBack(halted)) {
                chanerr |= CHANERR_COMPLETION_ADDR;
            }
            chansts = halted;
        } finally {
            halting = false;
        }
        if ((chanctrl & CHANCTRL_ERR_INT_EN) != 0) {
            vector.signal();
        }
    }

    /** Writes {@code status} (what CHANSTS reads) to the completion word; false where that fails. */
    private boolean writeBack(long status) {
        long cmp = chancmp;
        if ((cmp & (CHANCMP_ALIGN - 1)) != 0) {
            return false;
        }
        try {
            WORD.setVolatile(space.translate(cmp, 8), 0L, status);
            // HotSpot posts a fault in that store to the thread's next safepoint poll (MemoryFaults): make
            // it surface here, where it means a completion address error, not later in some other step
            io.pmemblk.posix.Mman.nativeRoundTrip(0);
            return true;
        } catch (IovaFault f) {
            return false;
        } catch (RuntimeException e) {
            return false; // a word the aligned store cannot take (its host address misaligned): as above
        } catch (InternalError e) {
            if (!MemoryFaults.isFault(e)) {
                throw e;
            }
            return false; // the completion word's page failed: a completion address error
        }
    }
}
