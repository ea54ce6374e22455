package io.pmemblk.cli;

import io.pmemblk.posix.Libc;
import io.pmemblk.posix.UnixMessages;
import io.pmemblk.posix.UnixStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * A real {@code pmemblk serve} with {@code vhost.socket}: it says where it serves, answers a vhost-user front-end
 * there with the settings' queue count, removes the socket when it stops; and a socket path that cannot work is
 * refused before the device file exists.
 */
class VhostServeIT {
    @TempDir
    Path tmp;

    /** One vhost-user request without payload and its u64 reply (GET_FEATURES, GET_QUEUE_NUM), over {@code fd}. */
    private static long ask(int fd, int request) throws Exception {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment m = a.allocate(20, 8);
            m.set(ValueLayout.JAVA_INT, 0, request);
            m.set(ValueLayout.JAVA_INT, 4, 0x1); // version 1
            UnixMessages.send(fd, m.asSlice(0, 12));
            int got = 0;
            while (got < 20) {
                int n = UnixMessages.receive(fd, m.asSlice(got), new int[0]);
                assertThat(n).as("reply bytes").isPositive();
                got += n;
            }
            assertThat(m.get(ValueLayout.JAVA_INT, 0)).as("reply request").isEqualTo(request);
            assertThat(m.get(ValueLayout.JAVA_INT, 4)).as("reply flags").isEqualTo(0x5);
            assertThat(m.get(ValueLayout.JAVA_INT, 8)).as("reply size").isEqualTo(8);
            return m.get(ValueLayout.JAVA_LONG_UNALIGNED, 12);
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
            int fd = UnixStream.socket();
            try {
                UnixStream.connect(fd, socket.toString());
                Libc.receiveTimeout(fd, 10_000);
                assertThat(ask(fd, 1) & (1L << 32)).as("GET_FEATURES offers VERSION_1").isNotZero();
                assertThat(ask(fd, 17)).as("GET_QUEUE_NUM is vhost.queues").isEqualTo(3);
            } finally {
                Libc.close(fd);
            }
            assertThat(s.terminate()).isZero();
        }
        assertThat(socket).as("removed at stop").doesNotExist();
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
