package io.pmemblk.dma.vfio;

import static io.pmemblk.dma.vfio.VfioAbi.*;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.posix.Errno;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The VFIO structs and ioctl numbers against include/uapi/linux/vfio.h as shared/notes/vfio.md §1.1 lists them. */
class VfioAbiTest {
    @Test
    void ioctlNumbersAreSemicolonHundredPlusN() {
        assertThat(GET_API_VERSION).isEqualTo(0x3B64);
        assertThat(SET_IOMMU).isEqualTo(0x3B66);
        assertThat(GROUP_GET_DEVICE_FD).isEqualTo(0x3B6A);
        assertThat(DEVICE_SET_IRQS).isEqualTo(0x3B6E);
        assertThat(DEVICE_RESET).isEqualTo(0x3B6F);
        assertThat(IOMMU_GET_INFO).isEqualTo(0x3B70);
        assertThat(IOMMU_MAP_DMA).isEqualTo(0x3B71);
        assertThat(IOMMU_UNMAP_DMA).isEqualTo(0x3B72);
    }

    @Test
    void structSizesAndOffsets() {
        assertThat(GROUP_STATUS.byteSize()).isEqualTo(8);
        assertThat(DEVICE_INFO.byteSize()).isEqualTo(24);
        assertThat(offset(DEVICE_INFO, "num_irqs")).isEqualTo(12);
        assertThat(REGION_INFO.byteSize()).isEqualTo(32);
        assertThat(offset(REGION_INFO, "size")).isEqualTo(16);
        assertThat(offset(REGION_INFO, "offset")).isEqualTo(24);
        assertThat(IRQ_INFO.byteSize()).isEqualTo(16);
        assertThat(IRQ_SET.byteSize()).as("data[] starts at 20").isEqualTo(20);
        assertThat(IOMMU_INFO.byteSize()).isEqualTo(24);
        assertThat(offset(IOMMU_INFO, "iova_pgsizes")).isEqualTo(8);
        assertThat(offset(IOMMU_INFO, "cap_offset")).isEqualTo(16);
        assertThat(DMA_MAP.byteSize()).isEqualTo(32);
        assertThat(offset(DMA_MAP, "vaddr")).isEqualTo(8);
        assertThat(offset(DMA_MAP, "iova")).isEqualTo(16);
        assertThat(offset(DMA_MAP, "size")).isEqualTo(24);
        assertThat(DMA_UNMAP.byteSize()).isEqualTo(24);
        assertThat(offset(DMA_UNMAP, "size")).isEqualTo(16);
        assertThat(CAP_HEADER.byteSize()).isEqualTo(8);
    }

    /** A GET_INFO answer as the kernel writes it: a migration capability, then the IOVA ranges (end inclusive). */
    @Test
    void iovaRangesAreReadFromTheCapabilityChain() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment info = a.allocate(24 + 16 + 16 + 2 * 16, 8);
            info.set(ValueLayout.JAVA_INT, 4, IOMMU_INFO_PGSIZES | IOMMU_INFO_CAPS);
            info.set(ValueLayout.JAVA_INT, 16, 24);                      // first cap at 24: id 2 (migration)
            info.set(ValueLayout.JAVA_SHORT, 24, (short) 2);
            info.set(ValueLayout.JAVA_INT, 28, 40);                      // next at 40
            info.set(ValueLayout.JAVA_SHORT, 40, (short) IOMMU_TYPE1_INFO_CAP_IOVA_RANGE);
            info.set(ValueLayout.JAVA_INT, 44, 0);                       // last
            info.set(ValueLayout.JAVA_INT, 48, 2);                       // nr_iovas
            info.set(ValueLayout.JAVA_LONG, 56, 0L);
            info.set(ValueLayout.JAVA_LONG, 64, 0xfedfffffL);
            info.set(ValueLayout.JAVA_LONG, 72, 0xfef00000L);
            info.set(ValueLayout.JAVA_LONG, 80, -1L);
            assertThat(VfioContainer.iovaRanges(info)).containsExactly(
                    new VfioContainer.IovaRange(0, 0xfedfffffL), new VfioContainer.IovaRange(0xfef00000L, -1L));
            info.set(ValueLayout.JAVA_INT, 4, IOMMU_INFO_PGSIZES);
            assertThat(VfioContainer.iovaRanges(info)).as("no CAPS flag: no chain").isEmpty();
        }
    }

    @Test
    void mapRefusalsNameTheFix() {
        assertThat(VfioContainer.mapFailure(Errno.EOPNOTSUPP, 0x7f0000000000L, 0x100000, 1 << 20))
                .contains("fsdax").contains("/dev/daxX.Y").contains("tmpfs").contains("IOVA 0x100000");
        assertThat(VfioContainer.mapFailure(Errno.EFAULT, 0, 0x100000, 4096)).contains("page-cache file").contains("device-DAX");
        assertThat(VfioContainer.mapFailure(Errno.ENOMEM, 0, 0x100000, 4096)).contains("RLIMIT_MEMLOCK");
    }

    @Test
    void nothingUsableSaysWhy() throws Exception {
        java.nio.file.Path nowhere = java.nio.file.Path.of("/nonexistent/vfio");
        assertThat(PciDevices.nothingUsable(List.of(), nowhere))
                .contains("no I/OAT").contains("edu").contains("/nonexistent/vfio does not exist").contains("modprobe vfio-pci");
        org.assertj.core.api.Assertions.assertThatThrownBy(() -> VfioEngine.choose(List.of(), List.of(), nowhere))
                .isInstanceOf(VfioException.class).hasMessageContaining("nothing to use");
        org.assertj.core.api.Assertions.assertThatThrownBy(() -> VfioEngine.choose(List.of("0000:00:04.0"), List.of(), nowhere))
                .isInstanceOf(VfioException.class).hasMessageContaining("no I/OAT or edu PCI device at 0000:00:04.0");
    }
}
