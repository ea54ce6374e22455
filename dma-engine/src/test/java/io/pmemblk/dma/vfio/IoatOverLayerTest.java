package io.pmemblk.dma.vfio;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.DmaEngine;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Recorder;
import io.pmemblk.dma.ioat.IoatChannel;
import io.pmemblk.dma.ioat.IoatSpec;
import io.pmemblk.dma.soft.SoftIoatDevice;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The I/OAT start-up VfioEngine uses on a real BAR (version and capability checks, interrupts on, every CHANCNT
 * channel started), run here against the software device through the same interfaces (Mmio, Interrupt,
 * IovaSpace), with copies checked byte for byte.
 */
class IoatOverLayerTest {
    @Test
    void everyChannelTheDeviceReportsIsStartedAndCopies() {
        IovaSpace space = new IovaSpace(VfioEngine.IOVA_BASE, VfioEngine.WIDE_LIMIT);
        SoftIoatDevice dev = new SoftIoatDevice(space, 3, 16);
        Recorder rec = new Recorder();
        List<IoatChannel> channels = VfioEngine.ioatChannels(dev, space, dev::interrupt, 64, 0);
        try (Arena a = Arena.ofShared(); DmaEngine engine = DmaEngine.of(space, channels, dev)) {
            assertThat(engine.channelCount()).isEqualTo(3);
            assertThat(dev.read8(IoatSpec.INTRCTRL) & IoatSpec.INTRCTRL_MASTER_INT_EN).as("interrupts on").isNotZero();
            engine.onCompletion(rec);
            MemorySegment src = a.allocate(3 << 17, 4096);
            MemorySegment dst = a.allocate(3 << 17, 4096);
            for (int i = 0; i < src.byteSize(); i++) {
                src.set(ValueLayout.JAVA_BYTE, i, (byte) (i ^ (i >>> 9)));
            }
            long s = space.map(src);
            long d = space.map(dst);
            for (int c = 0; c < 3; c++) {
                long off = (long) c << 17;
                assertThat(engine.channel(c).place(s + off, d + off, 1 << 17, "ch" + c)).isTrue(); // 2 descriptors each
                engine.channel(c).submit();
            }
            rec.awaitCount(3);
            assertThat(rec.statuses.values()).containsOnly(0);
            assertThat(src.mismatch(dst)).isEqualTo(-1);
        }
    }

    @Test
    void aDeviceWithoutChannelsIsRefusedByName() {
        IovaSpace space = new IovaSpace();
        // A BAR of plain memory: the registers say what a device without usable channels would say.
        try (Arena a = Arena.ofConfined()) {
            MemorySegment bar = a.allocate(0x200);
            bar.set(ValueLayout.JAVA_BYTE, IoatSpec.CBVER, (byte) 0x20);
            assertThatThrownBy(() -> VfioEngine.ioatChannels(new io.pmemblk.dma.SegmentMmio(bar), space, i -> null, 64, 0))
                    .hasMessageContaining("CBVER 0x20").hasMessageContaining("v3");
            bar.set(ValueLayout.JAVA_BYTE, IoatSpec.CBVER, (byte) 0x33);
            assertThatThrownBy(() -> VfioEngine.ioatChannels(new io.pmemblk.dma.SegmentMmio(bar), space, i -> null, 64, 0))
                    .hasMessageContaining("CHANCNT 0").hasMessageContaining("no usable channel");
        }
    }
}
