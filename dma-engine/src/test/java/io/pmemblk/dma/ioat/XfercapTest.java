package io.pmemblk.dma.ioat;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Mmio;
import io.pmemblk.dma.testing.ForwardingMmio;
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
    private static final class HighBits extends ForwardingMmio {
        HighBits(Mmio inner) {
            super(inner);
        }

        @Override
        public int read8(long o) {
            return o == IoatSpec.XFERCAP ? inner.read8(o) | 0xE0 : inner.read8(o);
        }
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
