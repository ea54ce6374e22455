package io.pmemblk.cli;

import io.pmemblk.posix.Libc;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Two attacks on the paths serve opens, for real, against the real serve run as root: another user (a uid that owns no
 * account: files are chowned to it) prepares a world-writable directory with {@code p.img} linked to its own file,
 * or owns the socket's directory. serve must refuse both with exit 1, a message saying what is wrong and how to
 * fix it, and nothing created or touched. Also: TLS settings that cannot work, and the warning for a TCP bind
 * beyond loopback without TLS.
 */
class PathSafetyIT {
    static final int MALLORY = 4242;

    @TempDir
    Path tmp;
    Path dir;

    @BeforeEach
    void rootOnly() throws Exception {
        assumeTrue(Libc.geteuid() == 0, "the attacks are set up by chowning files to another user: run as root (CI does)");
        dir = tmp.toRealPath();
    }

    static void chown(Path p, int uid) throws Exception {
        Files.setAttribute(p, "unix:uid", uid, LinkOption.NOFOLLOW_LINKS);
    }

    static ServerProcess.Run serve(String... sets) throws Exception {
        List<String> args = new ArrayList<>();
        for (String s : sets) {
            args.add("--set");
            args.add(s);
        }
        return ServerProcess.run(ServerProcess.command("serve", args), 60);
    }

    @Test
    void anotherUsersDirectoryWithALinkToItsFileIsRefusedAndTheFileIsUntouched() throws Exception {
        Path evil = Files.createDirectory(dir.resolve("pm-evil"));
        Files.setPosixFilePermissions(evil, PosixFilePermissions.fromString("rwxrwxrwx"));
        Path theirs = evil.resolve("theirs.img");
        try (var f = java.nio.channels.FileChannel.open(theirs, java.nio.file.StandardOpenOption.CREATE_NEW,
                java.nio.file.StandardOpenOption.WRITE)) {
            f.truncate(64 << 20);
        }
        chown(theirs, MALLORY);
        Path link = Files.createSymbolicLink(evil.resolve("p.img"), theirs);
        chown(link, MALLORY);
        chown(evil, MALLORY);
        long before = Files.getLastModifiedTime(theirs).toMillis();

        ServerProcess.Run r = serve("pmem.path=" + link, "pmem.size=64M", "nbd.socket=" + dir.resolve("nbd.sock"),
                "nbd.port=0");
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        assertThat(r.out()).contains("pmemblk: pmem.path " + link + ": directory " + evil + " is owned by uid "
                + MALLORY + ", not by root or by the user pmemblk runs as (root)")
                .contains("chown 0 " + evil).doesNotContain("ready:").doesNotContain("Exception");
        assertThat(Files.getLastModifiedTime(theirs).toMillis()).isEqualTo(before);
        assertThat(dir.resolve("nbd.sock")).doesNotExist();

        // the same link in a shared sticky directory (as /tmp itself): the final link is what is refused
        Path shared = Files.createDirectory(dir.resolve("shared"));
        Files.setAttribute(shared, "unix:mode", 01777);
        Path link2 = Files.createSymbolicLink(shared.resolve("p.img"), theirs);
        chown(link2, MALLORY);
        ServerProcess.Run r2 = serve("pmem.path=" + link2, "pmem.size=64M", "nbd.socket=" + dir.resolve("nbd.sock"),
                "nbd.port=0");
        assertThat(r2.exit()).as(r2.out()).isEqualTo(1);
        assertThat(r2.out()).contains("pmem.path " + link2 + " is a symbolic link (to " + theirs + ")")
                .contains("does not follow a final symbolic link");
    }

    @Test
    void aSocketDirectoryOwnedByAnotherUserIsRefusedBeforeTheDeviceIsCreated() throws Exception {
        Path evil = Files.createDirectory(dir.resolve("pm-evil"));
        Files.setPosixFilePermissions(evil, PosixFilePermissions.fromString("rwxrwxrwx"));
        chown(evil, MALLORY);
        Path image = dir.resolve("p.img");
        ServerProcess.Run r = serve("pmem.path=" + image, "pmem.size=8M", "nbd.socket=" + evil.resolve("nbd.sock"),
                "nbd.port=0");
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        assertThat(r.out()).contains("pmemblk: nbd.socket " + evil.resolve("nbd.sock") + ": directory " + evil + " is owned by uid "
                        + MALLORY)
                .contains("that user can replace anything below it").doesNotContain("Exception");
        assertThat(image).as("refused before the device is created").doesNotExist();
        assertThat(evil.resolve("nbd.sock")).doesNotExist();

        // a root-owned directory that others may write (no sticky bit) is refused too, with the chmod that fixes it
        Path open = Files.createDirectory(dir.resolve("open"));
        Files.setPosixFilePermissions(open, PosixFilePermissions.fromString("rwxrwxrwx"));
        ServerProcess.Run o = serve("pmem.path=" + image, "pmem.size=8M", "nbd.socket=" + open.resolve("nbd.sock"),
                "nbd.port=0");
        assertThat(o.exit()).as(o.out()).isEqualTo(1);
        assertThat(o.out()).contains("directory " + open + " is writable by group or others without the sticky bit"
                + " (mode 0777)").contains("chmod go-w " + open);
    }

    @Test
    void tlsSettingsThatCannotWorkAreRefusedWithWhatToDo() throws Exception {
        ServerProcess.Run noCert = serve("nbd.tls=require", "pmem.path=" + dir.resolve("p.img"));
        assertThat(noCert.exit()).as(noCert.out()).isEqualTo(2);
        assertThat(noCert.out()).contains("nbd.tls: 'require' needs nbd.tls.certificate and nbd.tls.key");

        Path pki = ServerProcess.testPki(dir);
        String[] base = {"pmem.path=" + dir.resolve("p.img"), "pmem.size=8M", "nbd.socket=" + dir.resolve("s"),
                "nbd.port=0", "nbd.tls=on"};
        ServerProcess.Run missing = serve(concat(base, "nbd.tls.certificate=" + pki.resolve("nope.pem"),
                "nbd.tls.key=" + pki.resolve("server-key.pem")));
        assertThat(missing.exit()).as(missing.out()).isEqualTo(1);
        assertThat(missing.out()).contains("nbd.tls.certificate " + pki.resolve("nope.pem") + ": cannot be read");

        ServerProcess.Run mismatch = serve(concat(base, "nbd.tls.certificate=" + pki.resolve("server-cert.pem"),
                "nbd.tls.key=" + pki.resolve("client/client-key.pem")));
        assertThat(mismatch.exit()).as(mismatch.out()).isEqualTo(1);
        assertThat(mismatch.out()).contains("does not belong to the certificate in nbd.tls.certificate");

        ServerProcess.Run notPem = serve(concat(base, "nbd.tls.certificate=" + pki.resolve("server-key.pem"),
                "nbd.tls.key=" + pki.resolve("server-key.pem")));
        assertThat(notPem.exit()).as(notPem.out()).isEqualTo(1);
        assertThat(notPem.out()).contains("nbd.tls.certificate " + pki.resolve("server-key.pem") + ": not a PEM X.509 certificate")
                .contains("allowed: PEM certificates");
        assertThat(dir.resolve("p.img")).as("nothing created for settings that cannot work").doesNotExist();
    }

    @Test
    void aTcpBindBeyondLoopbackWithoutTlsWarnsAndNamesTheRisk() throws Exception {
        int port = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=8M",
                "nbd.socket=", "nbd.port=" + port, "nbd.bind=0.0.0.0", "queue.buffer-bytes=32M")) {
            assertThat(s.stderr()).contains("pmemblk: warning: nbd.bind=0.0.0.0 serves the device beyond this machine"
                    + " with nbd.tls=off").contains("read and overwrite all of it").contains("set nbd.tls=require");
            assertThat(s.terminate()).isZero();
        }
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=8M",
                "nbd.socket=", "nbd.port=" + port, "nbd.bind=127.0.0.1", "queue.buffer-bytes=32M")) {
            assertThat(s.stderr()).doesNotContain("warning");
            assertThat(s.terminate()).isZero();
        }
    }

    /**
     * Directories made after the check are checked too: once they were never checked, and Files.createDirectories made
     * them with whatever the umask allowed: under umask 000, world-writable directories above the device and the
     * socket. Now each is made 0755 (less the umask) in its checked parent and judged after it is made. serve stops at
     * a TCP port already taken, after both have been created.
     */
    @Test
    void directoriesServeMakesAreCheckedAndNeverWritableByOthersWhateverTheUmask() throws Exception {
        try (java.net.ServerSocket taken = new java.net.ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            List<String> cmd = new ArrayList<>(List.of("/bin/sh", "-c", "umask 000; exec \"$@\"", "sh"));
            cmd.addAll(ServerProcess.command("serve", List.of("--set", "pmem.path=" + dir.resolve("state/a/p.img"),
                    "--set", "pmem.size=8M", "--set", "nbd.socket=" + dir.resolve("run/b/nbd.sock"),
                    "--set", "nbd.port=" + taken.getLocalPort(), "--set", "nbd.bind=127.0.0.1")));
            ServerProcess.Run r = ServerProcess.run(cmd, 60);
            assertThat(r.exit()).as(r.out()).isEqualTo(1);
            assertThat(r.out()).contains("cannot start");
        }
        for (String d : new String[]{"state", "state/a", "run", "run/b"}) {
            assertThat(PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve(d))))
                    .as(d).isEqualTo("rwxr-xr-x");
        }
        assertThat(PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("state/a/p.img"))))
                .isEqualTo("rw-------");
    }

    /**
     * The lock holds on an existing file: a server that opens one (every restart) once lost its lock on it when the
     * mapper closed its own descriptor, so a second server on the same file started too, and its pmem.resize could
     * truncate the file under the first (SIGBUS). Now the second is refused as long as the first runs.
     */
    @Test
    void aRestartedServerKeepsItsFileLockedAgainstASecondServer() throws Exception {
        Path image = dir.resolve("p.img");
        String[] sets = {"pmem.path=" + image, "pmem.size=8M", "nbd.socket=" + dir.resolve("a.sock"), "nbd.port=0",
                "queue.buffer-bytes=32M"};
        try (ServerProcess first = ServerProcess.start(dir, sets)) {
            assertThat(first.terminate()).isZero();
        }
        try (ServerProcess restarted = ServerProcess.start(dir, sets)) {
            ServerProcess.Run second = serve("pmem.path=" + image, "pmem.size=16M", "pmem.resize=true",
                    "nbd.socket=" + dir.resolve("b.sock"), "nbd.port=0", "queue.buffer-bytes=32M");
            assertThat(second.exit()).as(second.out()).isEqualTo(1);
            assertThat(second.out()).contains(image + " is in use by another process");
            assertThat(Files.size(image)).isEqualTo(8 << 20);
            assertThat(restarted.terminate()).isZero();
        }
    }

    /**
     * A device under PrivateTmp is refused: under the unit's PrivateTmp=yes, /tmp and /var/tmp are systemd's private
     * directories, deleted when the service stops; a device there is empty at the next start. Set up as systemd does
     * it: a mount namespace with {@code <dir>/systemd-private-...-pmemblk@t.service-.../tmp} bound over /tmp, and
     * $INVOCATION_ID set.
     */
    @Test
    void aPmemPathInSystemdsPrivateTmpIsRefused() throws Exception {
        assumeTrue(Files.isExecutable(Path.of("/usr/bin/unshare")), "needs unshare (util-linux)");
        assumeTrue(!ServerProcess.JAR.startsWith("/tmp"), "the build is under /tmp, which the test hides behind the bind");
        Path privateTmp = Files.createDirectories(dir.resolve("systemd-private-0123abcd-pmemblk@t.service-Xy12/tmp"));
        List<String> cmd = new ArrayList<>(List.of("/usr/bin/unshare", "--mount", "--propagation", "private",
                "/bin/sh", "-c", "mount --bind \"$0\" /tmp && exec \"$@\"", privateTmp.toString(),
                "/usr/bin/env", "INVOCATION_ID=0123abcd"));
        cmd.addAll(ServerProcess.command("serve", List.of("--set", "pmem.path=/tmp/pmemblk/p.img",
                "--set", "pmem.size=8M", "--set", "nbd.socket=/run/pmemblk-private-tmp-it/nbd.sock", "--set", "nbd.port=0")));
        ServerProcess.Run r = ServerProcess.run(cmd, 60);
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        assertThat(r.out()).contains("pmemblk: pmem.path /tmp/pmemblk/p.img is in /tmp, which is private to this"
                        + " service (systemd's PrivateTmp=yes: mounted from " + privateTmp + ")")
                .contains("deleted by systemd when the service stops")
                .contains("pmem.path=auto (/var/lib/pmemblk/pmem0.img)").doesNotContain("Exception");
        assertThat(privateTmp.resolve("pmemblk")).as("nothing created in the private /tmp").doesNotExist();
        assertThat(Path.of("/run/pmemblk-private-tmp-it")).as("refused before the socket directory is made").doesNotExist();
    }

    static String[] concat(String[] a, String... b) {
        String[] all = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, all, a.length, b.length);
        return all;
    }
}
