package io.pmemblk.cli;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * {@code serve} with a frontend or engine whose kernel driver this machine lacks (its kernel has no ublk_drv, no
 * /dev/vfio) fails at once with the hint a user needs, exit 1, and leaves nothing behind: no device file, no
 * socket. The frontends and engines themselves run in the guest (scripts/vm-test ublk*, vfio) and in their
 * modules' tests.
 */
class KernelDriverAbsentIT {
    @TempDir
    Path dir;

    static Stream<Arguments> drivers() {
        return Stream.of(
                Arguments.of("ublk.enabled=true", "/dev/ublk-control", "this kernel has ublk_drv loaded",
                        List.of("modprobe ublk_drv")),
                Arguments.of("dma.engine=vfio", "/dev/vfio/vfio", "this machine has VFIO",
                        List.of("dma.engine=vfio", "nothing to use", "/dev/vfio does not exist", "modprobe vfio-pci")));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("drivers")
    void serveSaysWhatToLoadAndCreatesNothing(String setting, String driverFile, String present, List<String> hints)
            throws Exception {
        assumeFalse(Files.exists(Path.of(driverFile)), present);
        Path file = dir.resolve("p.img");
        Path sock = dir.resolve("nbd.sock");
        ServerProcess.Run r = ServerProcess.serveToExit(setting, "pmem.path=" + file, "pmem.size=8M",
                "nbd.socket=" + sock, "nbd.port=0");
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        for (String hint : hints) {
            assertThat(r.out()).contains(hint);
        }
        assertThat(r.out()).doesNotContain("ready:").doesNotContain("Exception");
        assertThat(file).as("refused before the backing file is created").doesNotExist();
        assertThat(sock).doesNotExist();
    }
}
