package io.pmemblk.cli;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code serve --set ublk.enabled=true} on a machine without the ublk driver (this one: its kernel has no
 * ublk_drv) fails at once with the hint a user needs, exit 1, and leaves nothing behind: no device file, no
 * socket. The ublk frontend itself is tested in the guest (scripts/vm-test ublk*) and its data path in the
 * ublk module.
 */
class UblkServeIT {
    @TempDir
    Path dir;

    @Test
    void withoutUblkDrvServeSaysToModprobeAndCreatesNothing() throws Exception {
        assumeFalse(Files.exists(Path.of("/dev/ublk-control")), "this kernel has ublk_drv loaded");
        Path file = dir.resolve("p.img");
        Path sock = dir.resolve("nbd.sock");
        ServerProcess.Run r = ServerProcess.serveToExit("ublk.enabled=true", "pmem.path=" + file, "pmem.size=8M",
                "nbd.socket=" + sock, "nbd.port=0");
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        assertThat(r.out()).contains("modprobe ublk_drv").doesNotContain("ready:").doesNotContain("Exception");
        assertThat(file).doesNotExist();
        assertThat(sock).doesNotExist();
    }

    @Test
    void ublkSettingsThatCannotWorkTogetherAreRefusedAsSettings() throws Exception {
        ServerProcess.Run r = ServerProcess.serveToExit("ublk.enabled=true", "queue.depth=64", "ublk.depth=128",
                "pmem.path=" + dir.resolve("q.img"));
        assertThat(r.exit()).as(r.out()).isEqualTo(2);
        assertThat(r.out()).contains("ublk.depth").contains("queue.depth=64");
    }
}
