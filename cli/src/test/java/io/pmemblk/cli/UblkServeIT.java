package io.pmemblk.cli;

import static org.assertj.core.api.Assertions.assertThat;

import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * ublk settings are checked before anything is opened ({@link KernelDriverAbsentIT}: the hint a machine without
 * ublk_drv gives). The ublk frontend itself is tested in the guest (scripts/vm-test ublk*) and its data path in
 * the ublk module.
 */
class UblkServeIT {
    @TempDir
    Path dir;

    @Test
    void ublkSettingsThatCannotWorkTogetherAreRefusedAsSettings() throws Exception {
        ServerProcess.Run r = ServerProcess.serveToExit("ublk.enabled=true", "queue.depth=64", "ublk.depth=128",
                "pmem.path=" + dir.resolve("q.img"));
        assertThat(r.exit()).as(r.out()).isEqualTo(2);
        assertThat(r.out()).contains("ublk.depth").contains("queue.depth=64");
    }
}
