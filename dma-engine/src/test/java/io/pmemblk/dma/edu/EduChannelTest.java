package io.pmemblk.dma.edu;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.pmemblk.dma.DmaCompletionListener;
import io.pmemblk.dma.IovaSpace;
import io.pmemblk.dma.Recorder;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The edu channel against the software edu model: chunking, ordering, the IOVA limit, close. */
class EduChannelTest {
    final IovaSpace space = new IovaSpace(1 << 20, EduSpec.DMA_LIMIT);

    @Test
    void copiesOfAnyLengthGoThroughTheBufferInChunksThatNeverReachItsEnd() {
        SoftEdu edu = new SoftEdu(space);
        Recorder rec = new Recorder();
        try (Arena a = Arena.ofShared()) {
            MemorySegment src = a.allocate(16384, 4096);
            MemorySegment dst = a.allocate(16384, 4096);
            for (int i = 0; i < 16384; i++) {
                src.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 13 + 5));
            }
            long s = space.map(src);
            long d = space.map(dst);
            EduChannel ch = new EduChannel(0, new EduDevice(edu, edu.interrupt()), 4);
            ch.listener(rec);
            long[] lengths = {8192, 1, 4095, 3000};
            long off = 0;
            for (int i = 0; i < lengths.length; i++) {
                assertThat(ch.place(s + off, d + off, lengths[i], "c" + i)).isTrue();
                off += lengths[i];
            }
            assertThat(ch.freeSlots()).isZero();
            assertThat(ch.place(s, d, 1, "full")).as("ring full").isFalse();
            ch.submit();
            rec.awaitCount(4);
            for (int i = 0; i < 4; i++) {
                assertThat(rec.status("c" + i)).isZero();
            }
            assertThat(edu.abort).isNull();
            assertThat(MemorySegment.mismatch(src, 0, off, dst, 0, off)).isEqualTo(-1);
            // 8192: 4 chunks; 1: 1; 4095: 2; 3000: 2 -> 9 chunks, each there and back.
            assertThat(edu.transfers.get()).isEqualTo(18);
            assertThat(ch.bytesCopied()).isEqualTo(off);
            assertThat(ch.device().transfers()).isEqualTo(18);
            assertThat(ch.device().missedInterrupts()).isZero();
            ch.close();
            assertThatThrownBy(() -> ch.place(s, d, 1, "late")).isInstanceOf(IllegalStateException.class).hasMessageContaining("closed");
        }
    }

    @Test
    void copiesPlacedButNeverSubmittedAreReportedClosed() {
        SoftEdu edu = new SoftEdu(space);
        Recorder rec = new Recorder();
        EduChannel ch = new EduChannel(0, new EduDevice(edu, edu.interrupt()), 8);
        ch.listener(rec);
        assertThat(ch.place(0x100000, 0x200000, 64, "never")).isTrue();
        ch.close();
        assertThat(rec.status("never")).isEqualTo(DmaCompletionListener.STATUS_CLOSED);
        assertThat(edu.transfers.get()).isZero();
    }

    /** {@code pmemblk dma check}'s self-test, against the model: the copy matches, the unmapped DMA moves nothing. */
    @Test
    void theSelfTestPassesAndItsDmaToAnUnmappedIovaMovesNothing() throws Exception {
        SoftEdu edu = new SoftEdu(space);
        EduDevice dev = new EduDevice(edu, edu.interrupt());
        try (Arena a = Arena.ofShared()) {
            EduSelfTest.Result r = EduSelfTest.run(dev, space, a, TimeUnit.SECONDS.toNanos(5));
            assertThat(r.copyFinished()).isTrue();
            assertThat(r.copied()).isTrue();
            assertThat(r.transfers()).as("4096 bytes in 2048-byte chunks, there and back").isEqualTo(4);
            assertThat(r.refusedDone()).as("edu reports done anyway").isTrue();
            assertThat(edu.faults.get()).as("the model's IOMMU refused the DMA").isEqualTo(1);
            assertThat(r.bytesChanged()).isZero();
            assertThat(r.passed()).isTrue();
        }
    }

    @Test
    void badTransfersAreRefusedBeforeTheDeviceSeesThem() {
        SoftEdu edu = new SoftEdu(space);
        EduDevice dev = new EduDevice(edu, edu.interrupt());
        assertThatThrownBy(() -> dev.transfer(0x100000, 4096, true, 1)).hasMessageContaining("1..2048");
        assertThatThrownBy(() -> dev.transfer(EduSpec.DMA_LIMIT - 16, 64, true, 1)).hasMessageContaining("28-bit");
        assertThat(edu.transfers.get()).isZero();
    }

    @Test
    void theSpaceRefusesWhatTheDeviceCannotReach() {
        IovaSpace small = new IovaSpace(1 << 20, 4 << 20);
        try (Arena a = Arena.ofConfined()) {
            small.map(a.allocate(2 << 20));
            assertThatThrownBy(() -> small.map(a.allocate(2 << 20)))
                    .isInstanceOf(IllegalStateException.class).hasMessageContaining("device's limit 0x400000");
        }
    }
}
