package io.pmemblk.settings;

import org.junit.jupiter.api.Test;

import java.nio.file.Path;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/** pmem.path=auto and nbd.socket=auto, for root (the systemd unit's directories) and for other users (XDG). */
class DefaultPathsTest {
    @Test
    void rootGetsTheUnitsStateAndRuntimeDirectoriesWhateverItsEnvironment() {
        Map<String, String> env = Map.of("XDG_DATA_HOME", "/root/.data", "XDG_RUNTIME_DIR", "/run/user/0", "HOME", "/root");
        assertThat(DefaultPaths.pmemPath(0, env)).isEqualTo(Path.of("/var/lib/pmemblk/pmem0.img"));
        assertThat(DefaultPaths.socketPath(0, env)).isEqualTo(Path.of("/run/pmemblk/nbd.sock"));
    }

    @Test
    void otherUsersGetTheirXdgDirectories() {
        Map<String, String> env = Map.of("XDG_DATA_HOME", "/home/u/data", "XDG_RUNTIME_DIR", "/run/user/1000",
                "HOME", "/home/u");
        assertThat(DefaultPaths.pmemPath(1000, env)).isEqualTo(Path.of("/home/u/data/pmemblk/pmem0.img"));
        assertThat(DefaultPaths.socketPath(1000, env)).isEqualTo(Path.of("/run/user/1000/pmemblk/nbd.sock"));
    }

    @Test
    void withoutXdgVariablesTheSpecsFallbacksAndRelativeValuesAreIgnored() {
        Map<String, String> env = Map.of("HOME", "/home/u", "XDG_DATA_HOME", "relative/data");
        assertThat(DefaultPaths.pmemPath(1000, env)).isEqualTo(Path.of("/home/u/.local/share/pmemblk/pmem0.img"));
        // no runtime directory (no login session): the socket goes beside the image, never to /tmp
        assertThat(DefaultPaths.socketPath(1000, env)).isEqualTo(Path.of("/home/u/.local/share/pmemblk/nbd.sock"));
    }
}
