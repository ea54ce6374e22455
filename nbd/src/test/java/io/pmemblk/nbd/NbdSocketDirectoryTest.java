package io.pmemblk.nbd;

import io.pmemblk.nbd.testing.NbdTestClient;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.posix.TrustedDirectory;
import io.pmemblk.posix.TrustedPath;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The unix socket is bound in the directory that was checked: once the directory was checked at start-up and the socket
 * bound by name after the device had opened, so a directory put in its place meanwhile got the socket. Now the
 * directory is held open from the check and the socket bound through it; a directory swapped under its name fails the
 * start, nothing goes into the replacement. Real sockets, real renames.
 */
class NbdSocketDirectoryTest {
    static final int SIZE = 1 << 20, MAX = 1 << 17;

    @TempDir
    Path tmp;
    Path dir;
    MemoryBlockDriver driver;
    BlockLayer layer;

    @BeforeEach
    void setUp() throws IOException {
        dir = tmp.toRealPath();
        driver = new MemoryBlockDriver(SIZE);
        layer = new BlockLayer(driver, 1, 8, 2L * MAX, MAX);
    }

    @AfterEach
    void tearDown() {
        layer.close();
        driver.close();
    }

    private NbdServer server(Path socket) {
        return new NbdServer(new NbdConfig("pmem0", socket, "127.0.0.1", 0, MAX, 4, ""), layer);
    }

    @Test
    void aSocketDirectoryReplacedAfterTheCheckGetsNoSocketAndTheStartFails() throws Exception {
        Path run = dir.resolve("run");
        Path socket = run.resolve("nbd.sock");
        TrustedDirectory checked = TrustedPath.ofThisProcess().openParentOf(socket, "nbd.socket"); // makes run/
        // While the device opens, the directory's name is given to another directory.
        Path moved = Files.move(run, dir.resolve("run.checked"));
        Path replacement = Files.createDirectory(run);
        Files.setPosixFilePermissions(replacement, PosixFilePermissions.fromString("rwxrwxrwx"));
        try (NbdServer s = server(socket).unixSocketDirectory(checked)) {
            assertThatThrownBy(s::start).isInstanceOf(IOException.class)
                    .hasMessageContaining("nbd.socket " + socket + ": " + run + " is no longer the directory pmemblk"
                            + " checked and bound the socket in (" + run + " was moved or replaced")
                    .hasMessageContaining("nobody could connect at " + socket);
        }
        try (var in = Files.list(replacement)) {
            assertThat(in).as("nothing created in the replacement").isEmpty();
        }
        try (var in = Files.list(moved)) {
            assertThat(in).as("the socket bound in the checked directory is removed again").isEmpty();
        }
    }

    @Test
    void theSocketIsBoundThroughTheHeldDirectoryWhateverTheLengthOfItsName() throws Exception {
        // a socket path of 100 bytes, near sun_path's 108 that clients connect with: its directory's name alone is
        // longer than the /proc/self/fd/N/s that bind is given
        String deep = "d".repeat(Math.max(1, 100 - dir.toString().length() - "/nbd.sock".length() - 1));
        Path socket = dir.resolve(deep).resolve("nbd.sock");
        assertThat(socket.toString().length()).isEqualTo(100);
        try (NbdServer s = server(socket)) {
            assertThat(s.start().getFirst().toString()).endsWith("socket=" + socket);
            assertThat(Files.getPosixFilePermissions(socket)).isEqualTo(PosixFilePermissions.fromString("rw-------"));
            try (NbdTestClient c = new NbdTestClient(socket).go("pmem0", false, false)) {
                assertThat(c.exportSize).isEqualTo(SIZE);
            }
            try (var in = Files.list(socket.getParent())) {
                assertThat(in).as("no staging directory left").containsExactly(socket);
            }
        }
        assertThat(socket).as("removed on close").doesNotExist();
    }
}
