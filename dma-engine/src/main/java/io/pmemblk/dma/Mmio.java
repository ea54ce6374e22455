package io.pmemblk.dma;

/**
 * A device register window (BAR0 on hardware), little-endian, addressed by byte offset.
 *
 * <p>Ordering contract, which every implementation must give because drivers depend on it:
 * <ul>
 *   <li>Each access is a single access of its width (never split or merged), performed with at least volatile
 *       (sequentially consistent) semantics, so accesses reach the device in program order.</li>
 *   <li>A write is a release: plain stores to DMA memory (descriptors) made before it are visible to the device
 *       when it observes the write (the doorbell rule: fill descriptors, then write DMACOUNT).</li>
 *   <li>A read is an acquire: memory the device wrote before updating the register is visible after the read.</li>
 * </ul>
 * Reads of registers with side effects (none on I/OAT) are not speculated or cached.
 */
public interface Mmio {
    int read8(long offset);

    int read16(long offset);

    int read32(long offset);

    long read64(long offset);

    void write8(long offset, int value);

    void write16(long offset, int value);

    void write32(long offset, int value);

    void write64(long offset, long value);
}
