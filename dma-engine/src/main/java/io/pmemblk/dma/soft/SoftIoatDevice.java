package io.pmemblk.dma.soft;

import static io.pmemblk.dma.ioat.IoatSpec.*;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.SoftInterrupt;
import io.pmemblk.posix.MemoryFaults;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.function.IntFunction;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A software Intel I/OAT v3 device: the BAR0 register file behind {@link Mmio}, one engine thread per channel
 * that fetches descriptors through the {@link IovaSpace} like the hardware fetches them through the IOMMU.
 *
 * <p>Model (what a driver may rely on, kept close to the hardware):
 * <ul>
 *   <li>DMACOUNT is the running count of descriptors the driver has made available since the last RESET; the engine
 *       processes descriptors while its own processed count (u16) differs from it, starting at CHAINADDR and then
 *       following each descriptor's {@code next}. A DMACOUNT write wakes the engine (unpark); idle engines park.</li>
 *   <li>After RESET the channel is HALTED with DMACOUNT, processed count, CHANCTRL and CHANCMP zeroed; CHANERR is
 *       only cleared by writing 1s to it. Writing CHAINADDR while CHANERR is clear and the channel is not active arms
 *       it (ARMED) and sets the completed descriptor address to 0 ("none since arming").</li>
 *   <li>CHANSTS = completed descriptor address | state after every descriptor. A descriptor with completion_update
 *       writes CHANSTS to the 8-byte word at CHANCMP; int_enable raises the channel's interrupt vector.</li>
 *   <li>Any error halts (ANY_ERR_ABORT_EN is assumed): CHANERR |= cause, state HALTED, CHANSTS keeps the last good
 *       descriptor; with ERR_COMPLETION_EN the writeback word is written, with ERR_INT_EN the vector is raised.
 *       A copy whose source or destination memory faults (a mapped file truncated, a poisoned line) halts with
 *       READ_DATA or WRITE_DATA; the engine thread survives it ({@link MemoryFaults}).</li>
 *   <li>Descriptors run one at a time in ring order, so fence is honoured trivially. COPY and null are supported,
 *       and, on a device made with them in DMACAPABILITY, XOR, XOR_VAL, PQ and PQ_VAL (with their extension
 *       descriptors; a failed validation halts with XOR_P_OR_CRC / XOR_Q); any other op halts with
 *       CHANERR_CONTROL.</li>
 *   <li>Register commands (CHANCMD, CHAINADDR) take the channel lock, which the engine holds for one descriptor,
 *       so a RESET returns only after the descriptor in flight has finished: CHANCMD reads back 0 at once.</li>
 *   <li>A doorbell is seen at once: while descriptors are pending (DMACOUNT ahead of the processed count) an ARMED or
 *       IDLE channel reads ACTIVE, as the hardware turns active on the DMACOUNT write. Linux's
 *       {@code ioat_alloc_chan_resources} polls CHANSTS for ACTIVE or IDLE for about 20 us after its first
 *       doorbell, which a parked engine thread may not meet.</li>
 *   <li>The 64-bit registers (CHANSTS, CHAINADDR, CHANCMP) take 32-bit accesses to either half, as Linux writes
 *       CHAINADDR and CHANCMP (two writel, low then high); a CHAINADDR write of either half arms with the whole.</li>
 * </ul>
 */
public final class SoftIoatDevice implements Mmio, AutoCloseable {
    private static final VarHandle WORD = FIELD_U64.varHandle();
    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();

    private final IovaSpace space;
    private final int xfercapLog2;
    private final long maxTransfer;
    private final Channel[] channels;
    private final SoftFaults faults;
    /** DMACAPABILITY: 0 (copies only), or DMACAP_XOR and/or DMACAP_PQ, which enable those descriptors. */
    private final int dmaCapability;
    private volatile int intrctrl;
    private volatile boolean closed;

    /** A device with {@code channelCount} channels and descriptors of at most 2^xfercapLog2 bytes (20 = 1 MiB on hardware). */
    public SoftIoatDevice(IovaSpace space, int channelCount, int xfercapLog2) {
        this(space, channelCount, xfercapLog2, SoftFaults.NONE);
    }

    /**
     * As {@link #SoftIoatDevice(IovaSpace, int, int)}, its engines asking {@code faults} before each descriptor
     * (tests: a channel that fails on cue). After a change of what {@code faults} answers, {@link #wake} the
     * channel so its engine looks again.
     */
    public SoftIoatDevice(IovaSpace space, int channelCount, int xfercapLog2, SoftFaults faults) {
        this(space, channelCount, xfercapLog2, faults, n -> new SoftInterrupt());
    }

    /**
     * As {@link #SoftIoatDevice(IovaSpace, int, int, SoftFaults)}, channel n raising {@code vectors.apply(n)} (a
     * device served to another process raises its client's MSI-X vector there).
     */
    public SoftIoatDevice(IovaSpace space, int channelCount, int xfercapLog2, SoftFaults faults,
                          IntFunction<? extends Interrupt> vectors) {
        this(space, channelCount, xfercapLog2, faults, vectors, 0);
    }

    /**
     * As {@link #SoftIoatDevice(IovaSpace, int, int, SoftFaults, IntFunction)}, with the RAID operations of
     * {@code dmaCapability} ({@link io.pmemblk.dma.ioat.IoatSpec#DMACAP_XOR}: XOR and XOR_VAL;
     * {@link io.pmemblk.dma.ioat.IoatSpec#DMACAP_PQ}: PQ and PQ_VAL), advertised in DMACAPABILITY. Linux's async_tx
     * gives md RAID456 only to a device with all of them (device_has_all_tx_types), and ioatdma makes one without
     * XOR or PQ private.
     */
    public SoftIoatDevice(IovaSpace space, int channelCount, int xfercapLog2, SoftFaults faults,
                          IntFunction<? extends Interrupt> vectors, int dmaCapability) {
        if ((dmaCapability & ~(DMACAP_XOR | DMACAP_PQ)) != 0) {
            throw new IllegalArgumentException("DMACAPABILITY 0x" + Integer.toHexString(dmaCapability)
                    + ": the model does copies, and XOR (0x100) and PQ (0x200) when asked; nothing else");
        }
        this.dmaCapability = dmaCapability;
        if (channelCount < 1 || channelCount > 255) {
            throw new IllegalArgumentException("channel count " + channelCount + " not in 1..255 (CHANCNT is a u8)");
        }
        if (xfercapLog2 < 6 || xfercapLog2 > 31) {
            throw new IllegalArgumentException("XFERCAP " + xfercapLog2 + " not in 6..31");
        }
        this.space = space;
        this.faults = faults;
        this.xfercapLog2 = xfercapLog2;
        this.maxTransfer = 1L << xfercapLog2;
        this.channels = new Channel[channelCount];
        for (int i = 0; i < channelCount; i++) {
            channels[i] = new Channel(i, vectors.apply(i));
        }
        for (Channel c : channels) {
            c.thread.start();
        }
    }

    /** The MSI-X vector of channel {@code n}; the driver waits on it. */
    public Interrupt interrupt(int n) {
        return channel(n).vector;
    }

    public int channelCount() {
        return channels.length;
    }

    /** Has channel {@code n}'s engine look at its registers and its {@link SoftFaults} again. */
    public void wake(int n) {
        LockSupport.unpark(channel(n).thread);
    }

    // ---- observation, for tests and benchmarks ----

    /** Descriptors the channel has completed since it was created (monotonic, not reset by RESET). */
    public long descriptorsCompleted(int channel) {
        return channel(channel).completedTotal;
    }

    /** Bytes the channel's copy descriptors moved since it was created (monotonic). */
    public long bytesCopied(int channel) {
        return channel(channel).bytesTotal;
    }

    /** Bytes all channels' copy descriptors moved. */
    public long bytesCopied() {
        long sum = 0;
        for (Channel c : channels) {
            sum += c.bytesTotal;
        }
        return sum;
    }

    /** CPU time of the channel's engine thread, in nanoseconds (-1 if the JVM cannot measure it). */
    public long engineCpuTimeNanos(int channel) {
        return THREADS.getThreadCpuTime(channel(channel).thread.threadId());
    }

    /** CPU time of all engine threads, in nanoseconds. */
    public long engineCpuTimeNanos() {
        long sum = 0;
        for (int i = 0; i < channels.length; i++) {
            long t = engineCpuTimeNanos(i);
            if (t > 0) {
                sum += t;
            }
        }
        return sum;
    }

    /** The global INTRCTRL register as the driver last wrote it (MASTER_INT_EN gates a served device's vectors). */
    public int intrctrl() {
        return intrctrl;
    }

    /**
     * A device reset (PCI FLR, a vfio-user client's RESET, or the client gone): every channel as after CHANCMD
     * RESET, and also CHANERR, CHANERR_MASK, CHAINADDR and the completed-descriptor address cleared, and INTRCTRL 0
     * (interrupts off until a driver turns them on). Returns after any descriptor in flight has finished.
     */
    public void reset() {
        intrctrl = 0;
        for (Channel c : channels) {
            c.lock.lock();
            try {
                c.resetRegisters();
                c.chanerr = 0;
                c.chanerrMask = 0;
                c.chainaddr = 0;
                c.lastCompleted = 0;
                c.setState(CHANSTS_HALTED);
            } finally {
                c.lock.unlock();
            }
        }
    }

    /**
     * Returns once no engine is inside a descriptor it began before this call: memory it translated then is no
     * longer touched. With an address withdrawn from the {@link IovaSpace} first, what is behind it may then be
     * unmapped (a vfio-user client's DMA_UNMAP): the engine translates every descriptor under its channel lock,
     * so taking each lock once waits out the one in flight, and the next translation sees the new table.
     */
    public void fence() {
        for (Channel c : channels) {
            c.lock.lock();
            c.lock.unlock();
        }
    }

    /** Stops the engine threads (like unbinding the device); further register writes are ignored. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        for (Channel c : channels) {
            LockSupport.unpark(c.thread);
        }
        for (Channel c : channels) {
            try {
                c.thread.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    private Channel channel(int n) {
        if (n < 0 || n >= channels.length) {
            throw new IllegalArgumentException("channel " + n + " not in 0.." + (channels.length - 1));
        }
        return channels[n];
    }

    // ---- register file ----

    /** The channel a BAR0 offset falls in, or null for the global block. */
    private Channel channelAt(long offset) {
        long n = offset / CHANNEL_MMIO_SIZE - 1;
        if (n < 0) {
            return null;
        }
        if (n >= channels.length) {
            throw new IllegalArgumentException("BAR0 offset 0x" + Long.toHexString(offset) + " is past the last channel ("
                    + channels.length + " channels)");
        }
        return channels[(int) n];
    }

    /** Offset of a 64-bit register's upper half. */
    private static final int HIGH = 4;
    private static final long LOW_MASK = 0xFFFF_FFFFL;

    private long read(long offset) {
        Channel c = channelAt(offset);
        if (c == null) {
            return switch ((int) offset) {
                case CHANCNT -> channels.length;
                case XFERCAP -> xfercapLog2;
                case INTRCTRL -> intrctrl;
                case CBVER -> VER_3_3;
                case DMACAPABILITY -> dmaCapability; // no DCA, fill, page break or super-extended descriptors
                default -> 0;
            };
        }
        return switch ((int) (offset % CHANNEL_MMIO_SIZE)) {
            case CHANCTRL -> c.chanctrl;
            case CHANCMD -> 0; // commands complete synchronously
            case DMACOUNT -> c.dmacount;
            case CHANSTS -> c.status();
            case CHANSTS + HIGH -> c.status() >>> 32;
            case CHAINADDR -> c.chainaddr;
            case CHAINADDR + HIGH -> c.chainaddr >>> 32;
            case CHANCMP -> c.chancmp;
            case CHANCMP + HIGH -> c.chancmp >>> 32;
            case CHANERR -> c.chanerr;
            case CHANERR_MASK -> c.chanerrMask;
            default -> 0;
        };
    }

    /** A write of {@code value}, {@code bytes} wide (1, 2, 4 or 8), at {@code offset}. */
    private void write(long offset, long value, int bytes) {
        if (closed) {
            return;
        }
        Channel c = channelAt(offset);
        if (c == null) {
            if (offset == INTRCTRL) {
                intrctrl = (int) value & 0xFF;
            }
            return; // other global registers are read-only here
        }
        switch ((int) (offset % CHANNEL_MMIO_SIZE)) {
            case CHANCTRL -> c.chanctrl = (int) value & 0xFFFF;
            case CHANCMD -> c.command((int) value & 0xFF);
            case DMACOUNT -> {
                c.dmacount = (int) value & 0xFFFF;
                LockSupport.unpark(c.thread);
            }
            case CHAINADDR -> c.arm(bytes == 8 ? value : (c.chainaddr & ~LOW_MASK) | (value & LOW_MASK));
            case CHAINADDR + HIGH -> c.arm((c.chainaddr & LOW_MASK) | (value << 32));
            case CHANCMP -> c.chancmp = bytes == 8 ? value : (c.chancmp & ~LOW_MASK) | (value & LOW_MASK);
            case CHANCMP + HIGH -> c.chancmp = (c.chancmp & LOW_MASK) | (value << 32);
            case CHANERR -> c.clearErrors((int) value);
            case CHANERR_MASK -> c.chanerrMask = (int) value;
            default -> { }
        }
    }

    @Override public int read8(long offset) { return (int) read(offset) & 0xFF; }
    @Override public int read16(long offset) { return (int) read(offset) & 0xFFFF; }
    @Override public int read32(long offset) { return (int) read(offset); }
    @Override public long read64(long offset) { return read(offset); }
    @Override public void write8(long offset, int value) { write(offset, value & 0xFF, 1); }
    @Override public void write16(long offset, int value) { write(offset, value & 0xFFFF, 2); }
    @Override public void write32(long offset, int value) { write(offset, value & 0xFFFF_FFFFL, 4); }
    @Override public void write64(long offset, long value) { write(offset, value, 8); }

    /** One channel's registers and engine. Fields written under {@link #lock} unless noted. */
    private final class Channel implements Runnable {
        final int index;
        final ReentrantLock lock = new ReentrantLock();
        final Interrupt vector;
        final Thread thread;

        volatile int chanctrl;
        volatile int chanerr;
        volatile int chanerrMask;
        /** Written by the driver without the lock (doorbell). */
        volatile int dmacount;
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
        long lastCompleted;
        long nextDescriptor;
        boolean fetchingFromChainaddr;

        Channel(int index, Interrupt vector) {
            this.index = index;
            this.vector = vector;
            this.thread = Thread.ofPlatform().daemon().name("soft-ioat-ch" + index).unstarted(this);
        }

        private void setState(int s) {
            state = s;
            chansts = lastCompleted | s;
        }

        /** CHANSTS as a read sees it: ACTIVE from the doorbell on, before the engine has picked the work up. */
        long status() {
            long s = chansts;
            long st = s & CHANSTS_STATUS_MASK;
            if ((st == CHANSTS_ARMED || st == CHANSTS_IDLE) && ((dmacount - processed) & 0xFFFF) != 0) {
                return (s & ~CHANSTS_STATUS_MASK) | CHANSTS_ACTIVE;
            }
            return s;
        }

        /** What CHANCMD RESET clears. Caller holds the lock. */
        void resetRegisters() {
            state = CHANSTS_HALTED;
            chansts = lastCompleted | CHANSTS_HALTED;
            dmacount = 0;
            processed = 0;
            chanctrl = 0;
            chancmp = 0;
        }

        private boolean runnable() {
            return !faults.stalled(index) && (state == CHANSTS_ARMED || state == CHANSTS_IDLE || state == CHANSTS_ACTIVE)
                    && ((dmacount - processed) & 0xFFFF) != 0;
        }

        @Override
        public void run() {
            while (!closed) {
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
                    LockSupport.park(this);
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
                } finally {
                    lock.unlock();
                }
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
                    setState(((dmacount - processed) & 0xFFFF) != 0 ? CHANSTS_ACTIVE : CHANSTS_IDLE);
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
                dmacount = 0;
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
            setState(((dmacount - processed) & 0xFFFF) != 0 ? CHANSTS_ACTIVE : CHANSTS_IDLE);
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
                if (((dmacount - processed) & 0xFFFF) < 2) {
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
            if ((chanctrl & CHANCTRL_ERR_COMPLETION_EN) != 0 && !writeBack(halted)) {
                chanerr |= CHANERR_COMPLETION_ADDR;
            }
            chansts = halted;
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
            } catch (InternalError e) {
                if (!MemoryFaults.isFault(e)) {
                    throw e;
                }
                return false; // the completion word's page failed: a completion address error
            }
        }
    }
}
