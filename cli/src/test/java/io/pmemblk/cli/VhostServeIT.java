package io.pmemblk.cli;

import io.pmemblk.posix.Libc;
import io.pmemblk.vhost.driver.FrontEnd;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;

import static io.pmemblk.vhost.spec.VhostUserSpec.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A real {@code pmemblk serve} with {@code vhost.socket}: it says where it serves, answers a vhost-user front-end
 * there with the settings' queue count, removes the socket when it stops; a socket path that cannot work is
 * refused before the device file exists; and the guest's write cache mode outlives the server process (QEMU does
 * not send it again when it reconnects).
 */
class VhostServeIT {
    @TempDir
    Path tmp;

    /** The 12-byte config header (offset 32: wce, size 1, flags 0) and {@code wce} when writing. */
    private static MemorySegment wceConfig(FrontEnd fe, int wce) {
        MemorySegment p = fe.payload(CONFIG_REGION + 1);
        p.set(ValueLayout.JAVA_INT, CONFIG_OFFSET, 32);
        p.set(ValueLayout.JAVA_INT, CONFIG_SIZE, 1);
        p.set(ValueLayout.JAVA_BYTE, CONFIG_REGION, (byte) Math.max(wce, 0));
        return p;
    }

    /** A front-end as QEMU's realize begins one (protocol features, owner); the wce GET_CONFIG answers, then {@code set}. */
    private static int wce(Path socket, int set) throws Exception {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            try {
                return wceOnce(socket, set);
            } catch (io.pmemblk.posix.NativeException e) {
                // One front-end at a time: until the server has seen the last one go, a new one is refused (reset).
                // The refusal shows as a reset on receive, or as EPIPE when it lands before our next send.
                boolean refused = e.errno() == io.pmemblk.posix.Errno.ECONNRESET || e.errno() == io.pmemblk.posix.Errno.EPIPE;
                if (!refused || System.nanoTime() > deadline) {
                    throw e;
                }
                Thread.sleep(10); // polling for the server to see the last close, bounded by the deadline
            }
        }
    }

    private static int wceOnce(Path socket, int set) throws Exception {
        try (FrontEnd fe = FrontEnd.connect(socket)) {
            long protocol = fe.get(GET_PROTOCOL_FEATURES);
            fe.set(SET_PROTOCOL_FEATURES, protocol); // all offered (REPLY_ACK, CONFIG among them)
            fe.send(SET_OWNER, 0, fe.empty());
            fe.send(GET_CONFIG, 0, wceConfig(fe, -1));
            MemorySegment config = fe.reply(GET_CONFIG).payload();
            assertThat(config.byteSize()).as("reply size").isEqualTo(CONFIG_REGION + 1);
            int wce = config.get(ValueLayout.JAVA_BYTE, CONFIG_REGION);
            if (set >= 0) {
                long result = fe.acked(SET_CONFIG, wceConfig(fe, set));
                assertThat(result).as("SET_CONFIG wce=" + set + " acked (REPLY_ACK 0)").isZero();
            }
            return wce;
        }
    }

    @Test
    void theGuestsWriteThroughOutlivesAKilledServeAndTheNextServeStartsWithIt() throws Exception {
        Path dir = tmp.toRealPath();
        Path socket = dir.resolve("vhost.sock");
        List<String> sets = ServerProcess.sets("pmem.path=" + dir.resolve("p.img"), "pmem.size=16M", "nbd.socket=",
                "nbd.port=0", "vhost.socket=" + socket, "vhost.queues=1");
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), sets, 1)) {
            assertThat(wce(socket, 0)).as("a fresh disk: writeback (wce 1)").isEqualTo(1);
            assertThat(wce(socket, -1)).as("a reconnect: the server's mode, write through").isZero();
            s.kill9(); // no chance to write anything at exit: the record was written before the ack
        }
        assertThat(dir.resolve("vhost.sock.write-cache")).as("the record beside the socket").exists();
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), sets, 1)) {
            assertThat(s.stderr()).contains("write cache off (write through), recorded in " + socket + ".write-cache");
            assertThat(wce(socket, 1)).as("QEMU realized again: told write through, as its guest set it").isZero();
            assertThat(s.terminate()).isZero();
        }
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), sets, 1)) {
            assertThat(wce(socket, -1)).as("the guest turned its cache on again: writeback after a restart").isEqualTo(1);
            assertThat(s.terminate()).isZero();
        }
    }

    @Test
    void aVhostOnlyServeAnnouncesItsSocketAnswersOnItAndRemovesItAtStop() throws Exception {
        Path dir = tmp.toRealPath();
        Path socket = dir.resolve("vhost.sock");
        // vhost only: no NBD listener at all
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), ServerProcess.sets(
                "pmem.path=" + dir.resolve("p.img"), "pmem.size=16M", "nbd.socket=", "nbd.port=0",
                "vhost.socket=" + socket, "vhost.queues=3"), 1)) {
            assertThat(s.uris).containsExactly("vhost-user-blk " + socket);
            assertThat(Files.getPosixFilePermissions(socket)).isEqualTo(PosixFilePermissions.fromString("rw-------"));
            try (FrontEnd fe = FrontEnd.connect(socket)) {
                assertThat(fe.get(GET_FEATURES) & (1L << 32)).as("GET_FEATURES offers VERSION_1").isNotZero();
                assertThat(fe.get(GET_QUEUE_NUM)).as("GET_QUEUE_NUM is vhost.queues").isEqualTo(3);
            }
            assertThat(s.terminate()).isZero();
        }
        assertThat(socket).as("removed at stop").doesNotExist();
    }

    /**
     * A non-root QEMU in vhost.socket-group reaches the socket, a user outside it does not: as root, the socket
     * given to group daemon (mode 0660), then a connect(2) as user nobody with and without that supplementary group
     * (setpriv). Elsewhere the group is the process's own and only the mode and owner are checked.
     */
    @Test
    void aSocketGroupLetsItsMembersConnectAndNobodyElse() throws Exception {
        Path dir = tmp.toRealPath();
        Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwxr-xr-x")); // searchable, as /run/pmemblk
        Path socket = dir.resolve("vhost.sock");
        boolean root = Libc.geteuid() == 0;
        String group = root ? "daemon" : Files.readAttributes(dir, java.nio.file.attribute.PosixFileAttributes.class)
                .group().getName();
        try (ServerProcess s = ServerProcess.start(dir, java.util.Map.of(), ServerProcess.sets(
                "pmem.path=" + dir.resolve("p.img"), "pmem.size=16M", "nbd.socket=", "nbd.port=0",
                "vhost.socket=" + socket, "vhost.socket-group=" + group, "vhost.queues=1"), 1)) {
            assertThat(Files.getPosixFilePermissions(socket, java.nio.file.LinkOption.NOFOLLOW_LINKS))
                    .isEqualTo(PosixFilePermissions.fromString("rw-rw----"));
            assertThat(Files.readAttributes(socket, java.nio.file.attribute.PosixFileAttributes.class,
                    java.nio.file.LinkOption.NOFOLLOW_LINKS).group().getName()).isEqualTo(group);
            if (root) {
                assertThat(connectAsNobody(socket, "daemon")).as("nobody in group daemon connects").isEqualTo("connected");
                assertThat(connectAsNobody(socket, "nogroup")).as("nobody outside it is refused")
                        .contains("Permission denied");
            }
            assertThat(s.terminate()).isZero();
        }
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("serve", ServerProcess.sets(
                "pmem.path=" + dir.resolve("q.img"), "pmem.size=16M", "nbd.socket=", "nbd.port=0",
                "vhost.socket=" + dir.resolve("v2.sock"), "vhost.socket-group=no-such-group-42")), 60);
        assertThat(r.exit()).as("a usage error: " + r.out()).isEqualTo(2);
        assertThat(r.out()).contains("vhost.socket-group: 'no-such-group-42' is not allowed");
    }

    /** connect(2) to {@code socket} as user nobody with {@code group} as its only supplementary group. */
    private static String connectAsNobody(Path socket, String group) throws Exception {
        Process p = new ProcessBuilder("setpriv", "--reuid=nobody", "--regid=nogroup", "--groups=" + group,
                "/usr/bin/python3", "-c", "import socket,sys\n"
                        + "s=socket.socket(socket.AF_UNIX)\n"
                        + "try:\n s.connect(sys.argv[1]); print('connected')\n"
                        + "except OSError as e: print(e)\n", socket.toString())
                .redirectErrorStream(true).start();
        assertThat(p.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)).as("setpriv finished").isTrue();
        return new String(p.getInputStream().readAllBytes()).trim();
    }

    @Test
    void aVhostSocketPathThatCannotWorkIsRefusedBeforeTheDeviceIsCreated() throws Exception {
        Path dir = tmp.toRealPath();
        Path notADirectory = Files.writeString(dir.resolve("file"), "x");
        Path image = dir.resolve("p.img");
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("serve", ServerProcess.sets("pmem.path=" + image,
                "pmem.size=16M", "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0",
                "vhost.socket=" + notADirectory.resolve("vhost.sock"))), 60);
        assertThat(r.exit()).as(r.out()).isEqualTo(1);
        assertThat(r.out()).contains("vhost.socket");
        assertThat(image).as("no device file made").doesNotExist();
        assertThat(List.of(dir.toFile().list())).containsExactly("file");
    }
}
