package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The decision of {@link PrivateTmp} on mount tables in the format of /proc/PID/mountinfo (proc(5)), as systemd's
 * PrivateTmp=yes leaves them (a bind of /tmp/systemd-private-...-unit-.../tmp over /tmp) and as a host has them.
 * PathSafetyIT runs the real serve in a real mount namespace set up that way.
 */
class PrivateTmpTest {
    static final String HOST = """
            27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
            40 27 0:35 / /tmp rw,nosuid,nodev - tmpfs tmpfs rw
            """;
    /** What a service with PrivateTmp=yes sees: its own namespace, the private directories bound over both. */
    static final String SERVICE = HOST + """
            812 27 0:35 /systemd-private-5d1e-pmemblk@a.service-Qx9/tmp /tmp rw,nosuid,nodev - tmpfs tmpfs rw
            813 27 254:0 /var/tmp/systemd-private-5d1e-pmemblk@a.service-Vb2/tmp /var/tmp rw - ext4 /dev/vda rw
            """;
    static final Map<String, String> SYSTEMD = Map.of("INVOCATION_ID", "5d1e");

    @TempDir
    Path dir;

    private String decide(String path, Map<String, String> env, String own, String init) throws Exception {
        Path o = Files.writeString(dir.resolve("own"), own);
        Path i = init == null ? dir.resolve("unreadable") : Files.writeString(dir.resolve("init"), init);
        return PrivateTmp.refusal(Path.of(path), env, o, i);
    }

    @Test
    void aPathInTheServicesPrivateTmpOrVarTmpIsRefusedNamingWhereItIsMountedFrom() throws Exception {
        assertThat(decide("/tmp/pmemblk/p.img", SYSTEMD, SERVICE, HOST))
                .contains("pmem.path /tmp/pmemblk/p.img is in /tmp, which is private to this service")
                .contains("mounted from /systemd-private-5d1e-pmemblk@a.service-Qx9/tmp")
                .contains("ReadWritePaths=");
        assertThat(decide("/var/tmp/x/../p.img", Map.of("NOTIFY_SOCKET", "/run/systemd/notify"), SERVICE, null))
                .as("PID 1's table unreadable (ProtectProc=invisible): the systemd-private- bind decides")
                .contains("pmem.path /var/tmp/p.img is in /var/tmp");
    }

    @Test
    void aFreshTmpfsOverTmpThatPid1DoesNotSeeIsPrivateToo() throws Exception {
        String disconnected = HOST + "900 27 0:99 / /tmp rw - tmpfs tmpfs rw\n"; // PrivateTmp=disconnected
        assertThat(decide("/tmp/p.img", SYSTEMD, disconnected, HOST)).contains("is in /tmp");
    }

    @Test
    void theHostsTmpOrAnotherDirectoryOrNoSystemdIsNotRefused() throws Exception {
        assertThat(decide("/tmp/p.img", SYSTEMD, HOST, HOST)).as("same /tmp as PID 1").isNull();
        assertThat(decide("/tmp/p.img", SYSTEMD, HOST, null)).as("no systemd-private- bind").isNull();
        assertThat(decide("/var/lib/pmemblk/p.img", SYSTEMD, SERVICE, HOST)).isNull();
        assertThat(decide("/tmpfoo/p.img", SYSTEMD, SERVICE, HOST)).as("a prefix of the name only").isNull();
        assertThat(decide("/tmp/p.img", Map.of(), SERVICE, HOST)).as("not run by systemd").isNull();
    }

    @Test
    void escapedMountPointsAreRead() {
        PrivateTmp.Mount m = PrivateTmp.Mount.holding(Path.of("/mnt/my disk/p.img"),
                java.util.List.of("27 1 254:0 / / rw - ext4 /dev/vda rw", "50 27 8:1 /a\\134b /mnt/my\\040disk rw - ext4 /dev/sda1 rw"));
        assertThat(m.mountPoint()).isEqualTo(Path.of("/mnt/my disk"));
        assertThat(m.root()).isEqualTo("/a\\b");
    }
}
