package io.pmemblk.cli;

import io.pmemblk.settings.SettingsException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import picocli.CommandLine;

import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

class FormatCommandTest {
    @TempDir
    Path dir;

    private static FormatCommand format(String... args) {
        FormatCommand format = new FormatCommand();
        new CommandLine(format).parseArgs(args);
        return format;
    }

    @Test
    void aFileThatIsNoFileIsRefusedNamingIt() {
        // Was "size must be positive, got 0": opened with size 0, refused before anything named the path.
        assertThatThrownBy(format("--layout", "btt", dir.toString())::call)
                .hasMessage("pmem.path " + dir + " is a directory; allowed: a regular file, or a device-DAX node"
                        + " /dev/daxX.Y");
    }

    @Test
    void aSizeThatIsNoSizeIsABadOptionForAnExistingFileToo() throws Exception {
        // Was Sizes.parse's IllegalArgumentException, "not a size: 1.5G", exit 1 instead of a usage error's 2.
        Path f = Files.write(dir.resolve("f.img"), new byte[4096]);
        assertThatThrownBy(format("--layout", "btt", "--size", "1.5G", f.toString())::call)
                .isInstanceOf(SettingsException.class)
                .hasMessageStartingWith("--size 1.5G is not allowed; allowed: a size that is a multiple of 4096");
        assertThat(Files.size(f)).isEqualTo(4096);
    }
}
