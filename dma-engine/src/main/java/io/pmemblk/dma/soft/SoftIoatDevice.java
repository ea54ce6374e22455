package io.pmemblk.dma.soft;

import static io.pmemblk.dma.ioat.IoatSpec.*;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.SoftInterrupt;
import io.pmemblk.dma.ioat.DoorbellPage;
import io.pmemblk.posix.MemoryFaults;
import java.lang.foreign.MemorySegment;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.function.IntFunction;
import java.util.concurrent.locks.LockSupport;

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
    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();

    private final IovaSpace space;
    private final int xfercapLog2;
    private final long maxTransfer;
    private final SoftIoatChannel[] channels;
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
        this.channels = new SoftIoatChannel[channelCount];
        for (int i = 0; i < channelCount; i++) {
            channels[i] = new SoftIoatChannel(this, i, vectors.apply(i), space, faults, maxTransfer, dmaCapability);
        }
        for (SoftIoatChannel c : channels) {
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

    /**
     * Offers {@code page} as the device's {@link DoorbellPage} (a device served to another process maps it into
     * the client's as BAR2): formats it for this device's channels and has the engines take doorbells rung there and
     * say there when they sleep. Before any driver uses the device; the page must outlive it.
     */
    public void useDoorbellPage(MemorySegment page) {
        if (channels.length > DoorbellPage.MAX_CHANNELS) {
            throw new IllegalArgumentException(channels.length + " channels: a doorbell page holds at most "
                    + DoorbellPage.MAX_CHANNELS);
        }
        DoorbellPage.format(page, channels.length);
        for (SoftIoatChannel c : channels) {
            c.page = page;
            LockSupport.unpark(c.thread); // an engine parked before it had the page goes to sleep again, saying so there
        }
    }

    /** Writes of DMACOUNT's register to channel {@code n} so far (a doorbell rung in the page is not one). */
    public long registerDoorbells(int n) {
        return channel(n).registerDoorbells;
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
        for (SoftIoatChannel c : channels) {
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
        MemorySegment page = channels[0].page;
        if (page != null) {
            DoorbellPage.writeHeader(page, channels.length);
        }
        for (SoftIoatChannel c : channels) {
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
            // Each engine goes to sleep again and says so in the page afresh: a client before this one could have
            // written its SLEEP word over, and a sleeping engine that the page calls awake would never hear the
            // next client's doorbells.
            LockSupport.unpark(c.thread);
        }
    }

    /**
     * Returns once no engine is inside a descriptor it began before this call: memory it translated then is no
     * longer touched. With an address withdrawn from the {@link IovaSpace} first, what is behind it may then be
     * unmapped (a vfio-user client's DMA_UNMAP): the engine translates every descriptor under its channel lock,
     * so taking each lock once waits out the one in flight, and the next translation sees the new table.
     */
    public void fence() {
        for (SoftIoatChannel c : channels) {
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
        for (SoftIoatChannel c : channels) {
            LockSupport.unpark(c.thread);
        }
        for (SoftIoatChannel c : channels) {
            try {
                c.thread.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    /** Whether {@link #close} stopped the device: the engines leave their loops. */
    boolean isClosed() {
        return closed;
    }

    private SoftIoatChannel channel(int n) {
        if (n < 0 || n >= channels.length) {
            throw new IllegalArgumentException("channel " + n + " not in 0.." + (channels.length - 1));
        }
        return channels[n];
    }

    // ---- register file ----

    /** The channel a BAR0 offset falls in, or null for the global block. */
    private SoftIoatChannel channelAt(long offset) {
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
        SoftIoatChannel c = channelAt(offset);
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
            case DMACOUNT -> c.count();
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
        SoftIoatChannel c = channelAt(offset);
        if (c == null) {
            if (offset == INTRCTRL) {
                intrctrl = (int) value & 0xFF;
            }
            return; // other global registers are read-only here
        }
        switch ((int) (offset % CHANNEL_MMIO_SIZE)) {
            case CHANCTRL -> c.chanctrl = (int) value & 0xFFFF;
            case CHANCMD -> c.command((int) value & 0xFF);
            case DMACOUNT -> c.registerDoorbell((int) value & 0xFFFF);
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
}
