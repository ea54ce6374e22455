package io.pmemblk.dma.testing;

import io.pmemblk.dma.Mmio;

/**
 * A device's registers as a test sees them on the way: every access passed to {@link #inner}; a subclass overrides
 * the accesses it counts, holds back or alters (a doorbell counted, a register write on its way, a bit set).
 */
public abstract class ForwardingMmio implements Mmio {
    protected final Mmio inner;

    protected ForwardingMmio(Mmio inner) {
        this.inner = inner;
    }

    @Override public int read8(long offset) { return inner.read8(offset); }
    @Override public int read16(long offset) { return inner.read16(offset); }
    @Override public int read32(long offset) { return inner.read32(offset); }
    @Override public long read64(long offset) { return inner.read64(offset); }
    @Override public void write8(long offset, int value) { inner.write8(offset, value); }
    @Override public void write16(long offset, int value) { inner.write16(offset, value); }
    @Override public void write32(long offset, int value) { inner.write32(offset, value); }
    @Override public void write64(long offset, long value) { inner.write64(offset, value); }
}
