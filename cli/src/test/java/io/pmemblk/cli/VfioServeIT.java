package io.pmemblk.cli;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * On this machine (no /dev/vfio, no DMA device) {@code serve --set dma.engine=vfio} exits 1 naming what is
 * missing ({@link KernelDriverAbsentIT}; here a device named but not there), and {@code pmemblk dma list} says
 * there is nothing to use and why. The VFIO path itself runs in the guest (scripts/vm-test vfio), its pieces in
 * the dma module's tests.
 */
class VfioServeIT {
    @TempDir
    Path dir;

    @Test
    void serveWithVfioAndANamedDeviceThatIsNotThereSaysSo() throws Exception {
        assumeFalse(Files.exists(Path.of("/dev/vfio/vfio")), "this machine has VFIO");
        Path sock = dir.resolve("nbd.sock");
        ServerProcess.Run named = ServerProcess.serveToExit("dma.engine=vfio", "dma.vfio.devices=0000:00:04.0",
                "pmem.path=" + dir.resolve("p.img"), "pmem.size=8M", "nbd.socket=" + sock, "nbd.port=0");
        assertThat(named.exit()).as(named.out()).isEqualTo(1);
        assertThat(named.out()).contains("no I/OAT or edu PCI device at 0000:00:04.0").doesNotContain("Exception");
    }

    @Test
    void dmaListSaysThereIsNothingToUseAndWhy() throws Exception {
        assumeFalse(Files.exists(Path.of("/dev/vfio/vfio")), "this machine has VFIO");
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("dma", List.of("list")), 60);
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).contains("nothing to use for dma.engine=vfio").contains("/dev/vfio does not exist");
    }

    @Test
    void aMalformedDeviceAddressIsASettingsError() throws Exception {
        ServerProcess.Run r = ServerProcess.serveToExit("dma.engine=vfio", "dma.vfio.devices=00:02.0",
                "pmem.path=" + dir.resolve("q.img"));
        assertThat(r.exit()).as(r.out()).isEqualTo(2);
        assertThat(r.out()).contains("dma.vfio.devices: '00:02.0' is not allowed").contains("dddd:bb:dd.f");
    }
}
