package io.pmemblk.cli;

import static org.assertj.core.api.Assertions.assertThat;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Native access is granted by module name, as the launcher runs pmemblk: the two modules that bind native
 * libraries get it, every other module (picocli, Prometheus, the frontends) is refused it
 * ({@code --illegal-native-access=deny}), so a restricted call from anywhere else fails instead of warning.
 */
class NativeAccessIT {
    @TempDir
    Path dir;

    private List<String> info(Path file) {
        return List.of("--set", "pmem.path=" + file, "--set", "pmem.size=1M", "--set", "pmem.mapper=libpmem");
    }

    @Test
    void theLauncherRunsOnTheModulePathWithNativeAccessForPosixAndPmemOnly() throws Exception {
        Path file = dir.resolve("a.img");
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("info", info(file)), 60);
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).contains("mapped_by=libpmem").doesNotContain("WARNING: A restricted method");
        ServerProcess.Run v = ServerProcess.run(ServerProcess.command("version", List.of()), 60);
        assertThat(v.out()).as("the module descriptor carries the version").doesNotContain("pmemblk dev");
    }

    @Test
    void aModuleWithoutTheGrantCannotCallNativeCode() throws Exception {
        // libc alone: the pmem module's libpmem binding is refused, and says which module asked
        Path file = dir.resolve("b.img");
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("io.pmemblk.posix", "info", info(file)), 60);
        assertThat(r.exit()).as(r.out()).isNotZero();
        assertThat(r.out()).contains("io.pmemblk.pmem");
        assertThat(Files.exists(file)).as("nothing mapped or created").isFalse();
    }
}
