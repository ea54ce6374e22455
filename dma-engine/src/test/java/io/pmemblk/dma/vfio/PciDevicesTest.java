package io.pmemblk.dma.vfio;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Candidates read from a sysfs tree laid out as the kernel's /sys/bus/pci/devices (files and symlinks). */
class PciDevicesTest {
    @TempDir
    Path dir;

    private void device(String address, String vendor, String device, String driver, String group) throws Exception {
        Path d = Files.createDirectories(dir.resolve("sys").resolve(address));
        Files.writeString(d.resolve("vendor"), vendor + "\n");
        Files.writeString(d.resolve("device"), device + "\n");
        if (driver != null) {
            Files.createSymbolicLink(d.resolve("driver"), Path.of("../../../bus/pci/drivers/" + driver));
        }
        if (group != null) {
            Files.createSymbolicLink(d.resolve("iommu_group"), Path.of("../../../kernel/iommu_groups/" + group));
        }
    }

    @Test
    void findsEduAndIoatAndSaysWhatIsMissing() throws Exception {
        device("0000:00:02.0", "0x1234", "0x11e8", "vfio-pci", "3");
        device("0000:00:04.0", "0x8086", "0x2021", "ioatdma", "5");
        device("0000:00:04.1", "0x8086", "0x0b00", null, null);
        device("0000:00:1f.0", "0x8086", "0x2918", "lpc_ich", "6"); // not a DMA engine: skipped
        Path devVfio = Files.createDirectories(dir.resolve("vfio"));
        Files.createFile(devVfio.resolve("3"));
        List<PciDevices.Candidate> found = PciDevices.scan(dir.resolve("sys"), devVfio);
        assertThat(found).extracting(PciDevices.Candidate::address).containsExactly("0000:00:02.0", "0000:00:04.0", "0000:00:04.1");
        assertThat(found.get(0).kind()).isEqualTo(PciDevices.Kind.EDU);
        assertThat(found.get(0).usable()).isTrue();
        assertThat(found.get(0).group()).isEqualTo(3);
        assertThat(found.get(1).kind()).isEqualTo(PciDevices.Kind.IOAT);
        assertThat(found.get(1).problem()).contains("bound to ioatdma, not vfio-pci")
                .contains("echo vfio-pci > /sys/bus/pci/devices/0000:00:04.0/driver_override")
                .contains("echo 0000:00:04.0 > /sys/bus/pci/drivers_probe");
        assertThat(found.get(2).problem()).contains("no IOMMU group").contains("intel_iommu=on");
        assertThat(VfioEngine.choose(List.of(), found, devVfio)).extracting(PciDevices.Candidate::address)
                .containsExactly("0000:00:02.0");
        assertThatThrownBy(() -> VfioEngine.choose(List.of("0000:00:04.0"), found, devVfio))
                .isInstanceOf(VfioException.class).hasMessageContaining("0000:00:04.0 cannot be used: bound to ioatdma");
    }

    @Test
    void aGroupWithoutItsDeviceNodeIsNotUsable() throws Exception {
        device("0000:00:02.0", "0x1234", "0x11e8", "vfio-pci", "3");
        List<PciDevices.Candidate> found = PciDevices.scan(dir.resolve("sys"), dir.resolve("novfio"));
        assertThat(found.getFirst().problem()).contains("novfio/3 is missing");
    }
}
