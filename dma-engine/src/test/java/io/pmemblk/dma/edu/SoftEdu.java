package io.pmemblk.dma.edu;

import static io.pmemblk.dma.edu.EduSpec.*;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.IovaFault;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.SoftInterrupt;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * QEMU's edu device (hw/misc/edu.c) in software, for the channel's tests: the registers EduDevice uses, a 4 KiB
 * buffer, DMA through an {@link IovaSpace} (a fault moves nothing, as behind the IOMMU) finished on another thread,
 * 28-bit address masking, and QEMU 7.2's abort on a transfer reaching the buffer's end (as a test failure).
 */
final class SoftEdu implements Mmio {
    final SoftInterrupt irq = new SoftInterrupt();
    final AtomicInteger transfers = new AtomicInteger();
    final AtomicInteger faults = new AtomicInteger();
    volatile String abort;
    private final IovaSpace space;
    private final MemorySegment buffer = Arena.ofAuto().allocate(4096);
    private volatile long src, dst, count, cmd;
    private volatile int liveness, irqStatus;

    SoftEdu(IovaSpace space) {
        this.space = space;
    }

    @Override public int read8(long o) { throw new AssertionError("edu takes 4- or 8-byte accesses, not 1 at 0x" + Long.toHexString(o)); }
    @Override public int read16(long o) { throw new AssertionError("edu takes 4- or 8-byte accesses, not 2"); }
    @Override public void write8(long o, int v) { throw new AssertionError("edu takes 4- or 8-byte accesses"); }
    @Override public void write16(long o, int v) { throw new AssertionError("edu takes 4- or 8-byte accesses"); }

    @Override
    public int read32(long o) {
        return switch ((int) o) {
            case 0x00 -> 0x010000ed;
            case 0x04 -> ~liveness;
            case 0x24 -> irqStatus;
            default -> (int) read64(o);
        };
    }

    @Override
    public long read64(long o) {
        if (o < 0x80) {
            throw new AssertionError("8-byte access below 0x80 at 0x" + Long.toHexString(o));
        }
        return switch ((int) o) {
            case 0x80 -> src;
            case 0x88 -> dst;
            case 0x90 -> count;
            case 0x98 -> cmd;
            default -> 0;
        };
    }

    @Override
    public void write32(long o, int v) {
        switch ((int) o) {
            case 0x04 -> liveness = v;
            case 0x64 -> irqStatus &= ~v;
            default -> write64(o, Integer.toUnsignedLong(v));
        }
    }

    @Override
    public void write64(long o, long v) {
        switch ((int) o) {
            case 0x80 -> src = v;
            case 0x88 -> dst = v;
            case 0x90 -> count = v;
            case 0x98 -> {
                cmd = v;
                if ((v & CMD_START) != 0) {
                    Thread.ofVirtual().start(this::run); // QEMU finishes it later, on its timer
                }
            }
            default -> throw new AssertionError("write to 0x" + Long.toHexString(o));
        }
    }

    private void run() {
        boolean toRam = (cmd & CMD_TO_RAM) != 0;
        long ram = (toRam ? dst : src) & (DMA_LIMIT - 1);
        long dev = toRam ? src : dst;
        if (dev < BUFFER || dev + count >= BUFFER + 4096) { // QEMU 7.2's check: the end must lie inside
            abort = "hardware error: EDU: DMA range 0x" + Long.toHexString(dev) + "+" + count + " out of bounds";
            return;
        }
        try {
            MemorySegment m = space.translate(ram, count);
            if (toRam) {
                m.copyFrom(buffer.asSlice(dev - BUFFER, count));
            } else {
                buffer.asSlice(dev - BUFFER, count).copyFrom(m);
            }
        } catch (IovaFault e) {
            faults.incrementAndGet(); // the IOMMU refused it; edu does not notice
        }
        transfers.incrementAndGet();
        cmd = cmd & ~CMD_START;
        if ((cmd & CMD_IRQ) != 0) {
            irqStatus |= IRQ_DMA;
            irq.signal();
        }
    }

    Interrupt interrupt() {
        return irq;
    }
}
