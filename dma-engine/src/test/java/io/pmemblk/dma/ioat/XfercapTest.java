package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.SoftInterrupt;
import io.pmemblk.dma.soft.SoftIoatDevice;
import org.junit.jupiter.api.Test;

/** XFERCAP read as SPDK reads it: bits 4:0 only, 0 the largest. */
class XfercapTest {

    @Test
    void onlyBits4To0CountAndZeroMeansTheLargest() {
        assertThat(IoatSpec.maxTransfer(20)).isEqualTo(1L << 20);
        assertThat(IoatSpec.maxTransfer(0xE0 | 12)).as("bits 7:5 set by the device are ignored").isEqualTo(4096);
        assertThat(IoatSpec.maxTransfer(0)).as("0: the largest a 32-bit size holds in a power of two").isEqualTo(1L << 31);
        assertThat(IoatSpec.maxTransfer(0x20)).as("only bit 5 set: bits 4:0 are 0").isEqualTo(1L << 31);
    }

    /** The device's registers, XFERCAP read with bits 7:5 set. */
    private record HighBits(Mmio inner) implements Mmio {
        @Override public int read8(long o) { return o == IoatSpec.XFERCAP ? inner.read8(o) | 0xE0 : inner.read8(o); }
        @Override public int read16(long o) { return inner.read16(o); }
        @Override public int read32(long o) { return inner.read32(o); }
        @Override public long read64(long o) { return inner.read64(o); }
        @Override public void write8(long o, int v) { inner.write8(o, v); }
        @Override public void write16(long o, int v) { inner.write16(o, v); }
        @Override public void write32(long o, int v) { inner.write32(o, v); }
        @Override public void write64(long o, long v) { inner.write64(o, v); }
    }

    @Test
    void aChannelSplitsCopiesAtTheMaskedTransferSize() {
        IovaSpace space = new IovaSpace();
        try (SoftIoatDevice dev = new SoftIoatDevice(space, 1, 12);
             IoatChannel ch = new IoatChannel(new HighBits(dev), 0, space, new SoftInterrupt(), 16)) {
            assertThat(ch.maxTransfer()).isEqualTo(4096);
            assertThat(ch.slotsFor(3 * 4096 + 1)).isEqualTo(4);
        }
    }
}
