package io.pmemblk.dma.edu;

import static io.pmemblk.dma.edu.EduSpec.*;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.dma.Mmio;
import java.util.concurrent.TimeUnit;

/**
 * One edu device's DMA engine over its BAR0 ({@link Mmio}) and its MSI vector: one transfer at a time between
 * RAM (an IOVA) and its 4 KiB buffer. Not thread-safe: one owner ({@link EduChannel}'s worker, or a check).
 */
public final class EduDevice {
    private final Mmio bar;
    private final Interrupt irq;
    private volatile long transfers;
    private volatile long missedInterrupts;

    /** Checks the identification and liveness registers; throws naming what was read when it is not an edu. */
    public EduDevice(Mmio bar, Interrupt irq) {
        int id = bar.read32(ID);
        if ((id & 0xffff) != ID_LOW) {
            throw new IllegalStateException("BAR0 register 0 reads 0x" + Integer.toHexString(id) + ", not an edu device"
                    + " (expected 0x....00ed)");
        }
        bar.write32(LIVENESS, 0x5a5a1234);
        int back = bar.read32(LIVENESS);
        if (back != ~0x5a5a1234) {
            throw new IllegalStateException("edu liveness register returned 0x" + Integer.toHexString(back) + " for 0x5a5a1234");
        }
        this.bar = bar;
        this.irq = irq;
    }

    /**
     * Moves {@code length} (1..{@link EduSpec#CHUNK}) bytes between RAM at {@code ramIova} and the device buffer,
     * and waits (bounded by {@code timeoutNanos}) for the device to finish and raise its interrupt.
     *
     * @return true when the device finished; false on timeout (the engine may still be running)
     */
    public boolean transfer(long ramIova, long length, boolean toRam, long timeoutNanos) throws InterruptedException {
        if (length < 1 || length > CHUNK) {
            throw new IllegalArgumentException("edu transfers 1.." + CHUNK + " bytes, not " + length);
        }
        if (ramIova < 0 || ramIova + length > DMA_LIMIT) {
            throw new IllegalArgumentException("IOVA 0x" + Long.toHexString(ramIova) + " (+" + length
                    + ") is beyond edu's 28-bit DMA mask");
        }
        bar.write64(DMA_SRC, toRam ? BUFFER : ramIova);
        bar.write64(DMA_DST, toRam ? ramIova : BUFFER);
        bar.write64(DMA_COUNT, length);
        bar.write64(DMA_CMD, CMD_START | CMD_IRQ | (toRam ? CMD_TO_RAM : 0));
        long deadline = System.nanoTime() + timeoutNanos;
        boolean raised = false;
        boolean done = false;
        // Both: the register says the copy is over, and its interrupt arrived (each transfer raises exactly one, so
        // the eventfd's count is the device's own count of transfers). A lost interrupt costs the timeout once.
        while (!(done && raised)) {
            if (!raised) {
                raised = irq.await(20, TimeUnit.MILLISECONDS);
            }
            done = (bar.read64(DMA_CMD) & CMD_START) == 0;
            if (System.nanoTime() - deadline > 0) {
                if (done) {
                    missedInterrupts++;
                    break;
                }
                return false;
            }
        }
        bar.write32(IRQ_ACK, IRQ_DMA);
        transfers++;
        return true;
    }

    /** Transfers this driver saw finish. */
    public long transfers() {
        return transfers;
    }

    /** Transfers that finished without their interrupt arriving in time (0 when MSI works). */
    public long missedInterrupts() {
        return missedInterrupts;
    }
}
