package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import picocli.CommandLine;

import java.nio.file.Files;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThatThrownBy;

class InfoCommandTest {
    @TempDir
    Path dir;

    private InfoCommand info(Path pmemPath) {
        InfoCommand info = new InfoCommand();
        new CommandLine(info).parseArgs("--set", "pmem.path=" + pmemPath, "--set", "pmem.size=1M");
        return info;
    }

    @Test
    void aPmemPathThatIsNoFileIsRefusedAsServeRefusesIt() throws Exception {
        // Was "size must be positive, got 0": neither the key nor what it named nor what is allowed.
        assertThatThrownBy(info(dir)::call).hasMessage("pmem.path " + dir + " is a directory; allowed: a regular"
                + " file, or a device-DAX node /dev/daxX.Y");
        assertThatThrownBy(info(Path.of("/dev/null"))::call)
                .hasMessageContaining("/dev/null is neither a regular file nor a device-DAX node");
    }

    @Test
    void anEmptyFileIsRefusedNamingItsSizeAndPmemSize() throws Exception {
        Path empty = Files.createFile(dir.resolve("empty.img"));
        assertThatThrownBy(info(empty)::call).hasMessageStartingWith(empty + " holds 0 bytes but pmem.size is 1048576");
    }
}
