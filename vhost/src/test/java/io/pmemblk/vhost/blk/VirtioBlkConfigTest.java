package io.pmemblk.vhost.blk;

import io.pmemblk.queueing.HardwareQueue;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The configuration space at the offsets of QEMU 7.2's {@code virtio_blk.h} (read back here with a ByteBuffer at
 * the header's offsets, not the class's constants) and the features offered.
 */
class VirtioBlkConfigTest {
    static final int MAX_REQUEST = 32 << 20;

    @Test
    void theSixtyBytesSayWhatTheGuestMaySend() {
        BlkDevice d = new BlkDevice(2_000_000, 4096, false, true, true, "x");
        ByteBuffer c = ByteBuffer.wrap(VirtioBlkConfig.bytes(d, 2, 128, MAX_REQUEST)).order(ByteOrder.LITTLE_ENDIAN);
        assertThat(c.capacity()).isEqualTo(60);
        assertThat(c.getLong(0)).as("capacity").isEqualTo(2_000_000);
        int sizeMax = c.getInt(8), segMax = c.getInt(12);
        assertThat(segMax).as("seg_max: queue size - 2 (header, status)").isEqualTo(126);
        assertThat(2L * segMax).as("every segment split once still fits a request").isLessThanOrEqualTo(HardwareQueue.MAX_IOVS);
        assertThat(sizeMax % 4096).isZero();
        assertThat((long) segMax * sizeMax).as("seg_max x size_max within one request").isLessThanOrEqualTo(MAX_REQUEST);
        assertThat(c.getInt(20)).as("blk_size").isEqualTo(4096);
        assertThat(c.getShort(26)).as("min_io_size").isEqualTo((short) 1);
        assertThat(c.get(32)).as("wce: writeback, so the guest sends FLUSH").isEqualTo((byte) 1);
        assertThat(c.getShort(34)).as("num_queues").isEqualTo((short) 2);
        assertThat(c.getInt(36)).as("max_discard_sectors").isEqualTo(32768);
        assertThat(c.getInt(40)).as("max_discard_seg").isEqualTo(1);
        assertThat(c.getInt(44)).as("discard_sector_alignment: blk_size in sectors").isEqualTo(8);
        assertThat(c.getInt(48)).as("max_write_zeroes_sectors").isEqualTo(32768);
        assertThat(c.getInt(52)).as("max_write_zeroes_seg").isEqualTo(1);
        assertThat(c.get(56)).as("write_zeroes_may_unmap").isEqualTo((byte) 1);
    }

    @Test
    void segMaxShrinksForSmallQueuesAndSmallRequests() {
        assertThat(VirtioBlkConfig.segMax(1024, MAX_REQUEST)).as("bounded by MAX_IOVS / 2").isEqualTo(128);
        assertThat(VirtioBlkConfig.segMax(16, MAX_REQUEST)).isEqualTo(14);
        assertThat(VirtioBlkConfig.segMax(128, 64 << 10)).as("a page per segment at least").isEqualTo(16);
        assertThat(VirtioBlkConfig.sizeMax(128, 64 << 10)).isEqualTo(4096);
        assertThat(VirtioBlkConfig.sizeMax(128, 1 << 20) * VirtioBlkConfig.segMax(128, 1 << 20)).isLessThanOrEqualTo(1 << 20);
    }

    @Test
    void featuresFollowTheDevice() {
        long rw = VirtioBlkConfig.features(new BlkDevice(8, 512, false, true, false, ""));
        long ro = VirtioBlkConfig.features(new BlkDevice(8, 512, true, true, true, ""));
        assertThat(rw & 1L << VirtioBlk.F_DISCARD).isNotZero();
        assertThat(rw & 1L << VirtioBlk.F_WRITE_ZEROES).isZero();
        assertThat(rw & 1L << VirtioBlk.F_RO).isZero();
        assertThat(ro & 1L << VirtioBlk.F_RO).isNotZero();
        assertThat(ro & (1L << VirtioBlk.F_DISCARD | 1L << VirtioBlk.F_WRITE_ZEROES)).as("no writes at all").isZero();
        for (long f : new long[]{rw, ro}) {
            assertThat(f & 1L << 32).as("VERSION_1").isNotZero();
            assertThat(f & (1L << 28 | 1L << 29)).as("INDIRECT_DESC, EVENT_IDX").isEqualTo(1L << 28 | 1L << 29);
            assertThat(f & (1L << 34 | 1L << 24 | 1L << VirtioBlk.F_GEOMETRY)).as("no packed ring, NOTIFY_ON_EMPTY, geometry").isZero();
            assertThat(f & (1L << VirtioBlk.F_FLUSH | 1L << VirtioBlk.F_CONFIG_WCE)).isNotZero();
        }
    }

    @Test
    void aSerialLongerThanGetIdCarriesIsRefused() {
        assertThatThrownBy(() -> new BlkDevice(8, 512, false, false, false, "123456789012345678901"))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("at most 20");
        assertThatThrownBy(() -> new BlkDevice(8, 1000, false, false, false, "x"))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("power of two");
    }

    @Test
    void aDriversMinimumBlockBecomesBlkSizeAndTheCapacityWholeBlocks() {
        BlkDevice btt = BlkDevice.of((1 << 20) + 512 * 3, 4096, false, true, true, "btt");
        assertThat(btt.blkSize()).isEqualTo(4096);
        assertThat(btt.capacitySectors()).as("in 512-byte units, a partial 4 KiB block left out").isEqualTo(2048);
        assertThat(VirtioBlkConfig.features(btt) & (1L << VirtioBlk.F_BLK_SIZE)).isNotZero();
        BlkDevice raw = BlkDevice.of((1 << 20) + 512 * 3, 1, false, true, true, "raw");
        assertThat(raw.blkSize()).isEqualTo(512);
        assertThat(raw.capacitySectors()).isEqualTo(2051);
    }
}
