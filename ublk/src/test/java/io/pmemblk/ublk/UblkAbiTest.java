package io.pmemblk.ublk;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

class UblkAbiTest {
    @Test
    void userCopyPositionsAddTheBaseSoTag64DoesNotAliasTag0() {
        assertThat(UblkAbi.userCopyPosition(0, 0, 0)).isEqualTo(0x8000_0000L);
        assertThat(UblkAbi.userCopyPosition(0, 64, 0)).isEqualTo(0x8000_0000L + (64L << 25));
        assertThat(UblkAbi.userCopyPosition(0, 64, 0)).isNotEqualTo(UblkAbi.userCopyPosition(0, 0, 0));
        assertThat(UblkAbi.userCopyPosition(3, 5, 4096)).isEqualTo(0x8000_0000L + (3L << 41) + (5L << 25) + 4096);
    }

    /** ublk_ch_mmap accepts only these: the array rounded to the kernel's page, at a page-rounded maximum stride. */
    @Test
    void descriptorArraysAreSizedAndPlacedByTheKernelsPage() {
        assertThat(UblkAbi.descriptorBytes(128, 4096)).isEqualTo(4096);
        assertThat(UblkAbi.descriptorBytes(171, 4096)).as("171 x 24 = 4104 bytes").isEqualTo(8192);
        assertThat(UblkAbi.descriptorOffset(1, 4096)).as("4096 x 24, a whole number of 4 KiB pages").isEqualTo(98304);
        assertThat(UblkAbi.descriptorBytes(128, 65536)).isEqualTo(65536);
        assertThat(UblkAbi.descriptorOffset(3, 65536)).as("98304 rounded up to 64 KiB pages").isEqualTo(3 * 131072L);
    }

    /** struct ublk_params as ublk_cmd.h lays it out (offsets checked with gcc offsetof against the 6.12 header). */
    @Test
    void paramsAdvertiseAVolatileCacheWithFuaDiscardAndTheSize() {
        DeviceParams p = new DeviceParams(64L << 20, 512, 1 << 20, 256 << 20);
        try (Arena a = Arena.ofConfined()) {
            MemorySegment s = a.allocate(UblkAbi.PARAMS_SIZE);
            p.write(s);
            byte[] b = s.toArray(JAVA_BYTE);
            assertThat(le32(b, 0)).as("len").isEqualTo(112);
            assertThat(le32(b, 4)).as("types BASIC|DISCARD").isEqualTo(3);
            assertThat(le32(b, 8)).as("attrs VOLATILE_CACHE|FUA").isEqualTo(4 | 8);
            assertThat(b[12]).as("logical_bs_shift").isEqualTo((byte) 9);
            assertThat(b[13]).as("physical_bs_shift").isEqualTo((byte) 12);
            assertThat(le32(b, 16)).as("max_sectors").isEqualTo(2048);
            assertThat(le32(b, 24) | ((long) le32(b, 28) << 32)).as("dev_sectors").isEqualTo((64L << 20) >> 9);
            assertThat(le32(b, 44)).as("discard_granularity").isEqualTo(4096);
            assertThat(le32(b, 48)).as("max_discard_sectors").isEqualTo((256 << 20) >> 9);
            assertThat(le32(b, 52)).as("max_write_zeroes_sectors").isEqualTo((256 << 20) >> 9);
            assertThat(b[56] | b[57] << 8).as("max_discard_segments").isEqualTo(1);
            assertThat(DeviceParams.read(s)).isEqualTo(p);
        }
    }

    @Test
    void paramsRefuseWhatTheKernelWould() {
        assertThatThrownBy(() -> new DeviceParams(64L << 20, 1024, 1 << 20, 0)).hasMessageContaining("512 or 4096");
        assertThatThrownBy(() -> new DeviceParams(4095, 512, 1 << 20, 0)).hasMessageContaining("multiple of 4096");
        assertThatThrownBy(() -> new DeviceParams(1 << 20, 512, 64 << 20, 0)).hasMessageContaining("25 bits");
        assertThatThrownBy(() -> new UblkConfig(-2, 1, 1, 4096, 1 << 20, true)).hasMessageContaining("-1");
        assertThatThrownBy(() -> new UblkConfig(0, 1, 4097, 4096, 1 << 20, true)).hasMessageContaining("1..4096");
    }

    /** This machine's kernel has no ublk_drv: the error says how to get it, as serve prints it. */
    @Test
    void withoutTheDriverTheErrorSaysToLoadIt() {
        assumeFalse(Files.exists(Path.of(UblkAbi.CONTROL_DEVICE)), "this kernel has ublk loaded");
        assertThatThrownBy(UblkDevice::checkAvailable).isInstanceOf(UblkException.class)
                .hasMessageContaining("/dev/ublk-control does not exist").hasMessageContaining("modprobe ublk_drv");
    }

    private static int le32(byte[] b, int o) {
        return (b[o] & 0xFF) | (b[o + 1] & 0xFF) << 8 | (b[o + 2] & 0xFF) << 16 | (b[o + 3] & 0xFF) << 24;
    }
}
