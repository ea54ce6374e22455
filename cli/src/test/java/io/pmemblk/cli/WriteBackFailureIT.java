package io.pmemblk.cli;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static io.pmemblk.cli.ServerProcess.metrics;
import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Write-back that really fails, and a server that really dies, with the real {@code serve}:
 * the backing file lives on ext4 on a loop device whose backing file sits on a small tmpfs, sparse and larger
 * than it. ext4 accepts the writes into the page cache; when they are written back the loop device's writes hit
 * ENOSPC on the tmpfs and the kernel reports the failure, once, to the next msync. Clients are libnbd's Python
 * binding (as nbdsh runs it) with Debian's interpreter.
 */
class WriteBackFailureIT {
    private static final long MIB = 1 << 20;

    @TempDir
    Path dir;
    private final List<ServerProcess> servers = new ArrayList<>();
    private LoopFs fs;

    @AfterEach
    void cleanUp() throws Exception {
        try {
            for (ServerProcess s : servers) {
                s.close(); // SIGKILL if still running: nothing may keep the mount busy
            }
        } finally {
            if (fs != null) {
                fs.close();
            }
        }
    }

    /**
     * 80 MiB written into a 128 MiB pmem file on ext4 whose storage (a 64 MiB tmpfs) cannot take them: the first
     * FLUSH's msync fails with ENOSPC. Linux then marks the pages clean and would answer the next msync OK, so
     * before the fix the FLUSHes answered EIO, OK, OK, and SIGTERM printed "data persisted" while ext4 logged
     * "potential data loss". Now: EIO three times, writes refused, reads served, the metric set, and SIGTERM
     * says data NOT persisted and exits 3.
     */
    @ParameterizedTest(name = "pmem.mapper={0}")
    @ValueSource(strings = {"java", "auto"})
    void afterAFailedWriteBackEveryFlushAnswersEioAndTheStopSaysNotPersisted(String mapper) throws Exception {
        fs = LoopFs.mount(dir, 64);
        int port = freeTcpPort();
        ServerProcess s = serve(mapper, port);
        String out = nbd(s, """
                for i in range(80):
                    h.pwrite(bytes([i + 1]) * (1 << 20), i << 20)
                print("WROTE 80")
                for k in range(3):
                    print("FLUSH", outcome(h.flush))
                print("WRITE", outcome(lambda: h.pwrite(b"x" * 4096, 0)))
                print("FUA", outcome(lambda: h.pwrite(b"x" * 4096, 0, nbd.CMD_FLAG_FUA)))
                print("READ", "ok" if h.pread(4096, 5 << 20) == bytes([6]) * 4096 else "wrong data")
                """);
        assertThat(out).as("plain writes are accepted into the page cache").contains("WROTE 80");
        assertThat(lines(out, "FLUSH")).as("every FLUSH after the failed write-back").containsExactly("EIO", "EIO", "EIO");
        assertThat(lines(out, "WRITE")).containsExactly("EIO");
        assertThat(lines(out, "FUA")).containsExactly("EIO");
        assertThat(lines(out, "READ")).as("reads keep working").containsExactly("ok");
        String metrics = metrics(port);
        assertThat(metric(metrics, "pmemblk_writeback_failed")).isEqualTo(1.0);
        assertThat(metric(metrics, "pmemblk_writeback_refused_requests_total")).isEqualTo(5.0);
        assertThat(s.terminate()).as("exit code of a stop that persisted nothing").isEqualTo(ServeCommand.EXIT_NOT_PERSISTED);
        String err = s.stderr();
        assertThat(err).contains("; data NOT persisted: ").doesNotContain("data persisted");
        assertThat(err.lines().filter(l -> l.contains("failed (msync of bytes 0 to ") && !l.contains("NOT persisted")).count())
                .as("the failure is logged once, with its range:%n%s", err).isEqualTo(1);
        assertThat(err).contains("No space left on device").contains("restart the server");
    }

    /**
     * The restart case on storage that cannot take the data: a server killed after plain writes leaves them dirty
     * in the page cache; the next server's start-up msync finds the failure (Linux reports an error nobody has
     * seen to the next file opened), so its first FLUSH answers EIO. Before the fix the new server's FLUSH skipped
     * the msync (its dirty flag started false) and answered OK for 80 MiB that never reached the storage.
     */
    @Test
    void aServerKilledAfterPlainWritesLeavesThemToTheNextWhichFindsTheFailure() throws Exception {
        fs = LoopFs.mount(dir, 64);
        ServerProcess first = serve("auto", 0);
        assertThat(nbd(first, """
                for i in range(80):
                    h.pwrite(bytes([i + 1]) * (1 << 20), i << 20)
                print("WROTE 80")
                """)).contains("WROTE 80");
        first.kill9();
        ServerProcess second = serve("auto", 0);
        String out = nbd(second, """
                for k in range(2):
                    print("FLUSH", outcome(h.flush))
                """);
        assertThat(lines(out, "FLUSH")).as("FLUSHes on the restarted server, over writes the killed one took")
                .containsExactly("EIO", "EIO");
        assertThat(second.stderr()).contains("write-back at start-up, of what an earlier process left in");
        assertThat(second.terminate()).isEqualTo(ServeCommand.EXIT_NOT_PERSISTED);
    }

    /**
     * The restart case on storage with room: 32 MiB of plain writes, kill -9, a new server. Before it says ready,
     * the data is on the loop device (its tmpfs backing file has grown by it): the new server made durable what
     * the killed one left. Before the fix nothing was written back until the kernel's own write-back, 30 s
     * later, or never before a power cut.
     */
    @Test
    void aRestartedServerMakesWhatTheKilledOneLeftDurableBeforeItIsReady() throws Exception {
        fs = LoopFs.mount(dir, 512);
        ServerProcess first = serve("auto", 0);
        long start = fs.storedBytes();
        assertThat(nbd(first, """
                for i in range(32):
                    h.pwrite(bytes([i + 1]) * (1 << 20), i << 20)
                print("WROTE 32")
                """)).contains("WROTE 32");
        first.kill9();
        long beforeRestart = fs.storedBytes();
        ServerProcess second = serve("auto", 0);
        long atReady = fs.storedBytes();
        assertThat(atReady - start).as("bytes on the storage when the new server is ready (%d before the restart,"
                + " of 32 MiB written)", beforeRestart - start).isGreaterThanOrEqualTo(32 * MIB);
        String out = nbd(second, """
                print("FLUSH", outcome(h.flush))
                print("READ", "ok" if h.pread(1 << 20, 31 << 20) == bytes([32]) * (1 << 20) else "wrong data")
                """);
        assertThat(lines(out, "FLUSH")).containsExactly("OK");
        assertThat(lines(out, "READ")).containsExactly("ok");
        assertThat(second.terminate()).isZero();
        assertThat(second.stderr()).contains("stopped; data persisted");
    }

    private ServerProcess serve(String mapper, int metricsPort) throws Exception {
        ServerProcess s = ServerProcess.start(dir, "pmem.path=" + fs.mnt.resolve("pool"), "pmem.size=128M",
                "pmem.mapper=" + mapper, "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0",
                "metrics.port=" + metricsPort);
        servers.add(s);
        return s;
    }

    /** Runs {@code body} in libnbd's Python binding connected to the server; {@code outcome(f)} is "OK" or the errno name. */
    private static String nbd(ServerProcess s, String body) throws Exception {
        String script = """
                import nbd
                def outcome(f):
                    try:
                        f()
                        return "OK"
                    except nbd.Error as e:
                        return e.errno or e.string
                """ + body;
        ServerProcess.Run r = ServerProcess.run(List.of("/usr/bin/python3", "-m", "nbd", "-u", s.unixUri(), "-c", script), 300);
        assertThat(r.exit()).as("nbdsh script:%n%s%noutput:%n%s%nserver:%n%s", script, r.out(), s.stderr()).isZero();
        return r.out();
    }

    private static List<String> lines(String out, String key) {
        return out.lines().filter(l -> l.startsWith(key + " ")).map(l -> l.substring(key.length() + 1)).toList();
    }

    /**
     * ext4 on a loop device over a sparse file on a tmpfs of a given size: storage that runs out (or not) only
     * when the page cache is written back. Needs root and loop devices; {@link #close} undoes every step that was
     * made, whichever failed.
     */
    static final class LoopFs implements AutoCloseable {
        final Path tmpfs;
        final Path mnt;
        final Path backing;
        String loop;
        boolean tmpfsMounted;
        boolean extMounted;

        private LoopFs(Path dir) {
            this.tmpfs = dir.resolve("tmpfs");
            this.mnt = dir.resolve("mnt");
            this.backing = tmpfs.resolve("backing");
        }

        static LoopFs mount(Path dir, int tmpfsMib) throws Exception {
            assumeTrue("root".equals(System.getProperty("user.name")), "needs root (mount, losetup)");
            assumeTrue(Files.exists(Path.of("/dev/loop-control")), "no loop devices (/dev/loop-control missing)");
            for (String tool : List.of("losetup", "mkfs.ext4", "mount", "umount")) {
                assumeTrue(run(List.of("sh", "-c", "command -v " + tool)).exit() == 0, tool + " not installed");
            }
            LoopFs fs = new LoopFs(dir);
            try {
                Files.createDirectories(fs.tmpfs);
                Files.createDirectories(fs.mnt);
                must(List.of("mount", "-t", "tmpfs", "-o", "size=" + tmpfsMib + "m", "tmpfs", fs.tmpfs.toString()));
                fs.tmpfsMounted = true;
                must(List.of("truncate", "-s", "256M", fs.backing.toString()));
                fs.loop = must(List.of("losetup", "-f", "--show", fs.backing.toString())).strip();
                must(List.of("mkfs.ext4", "-q", "-F", fs.loop));
                must(List.of("mount", "-t", "ext4", fs.loop, fs.mnt.toString()));
                fs.extMounted = true;
                return fs;
            } catch (Exception | Error e) {
                fs.close();
                throw e;
            }
        }

        /** Bytes the loop device has stored so far: the tmpfs blocks of its sparse backing file. */
        long storedBytes() throws Exception {
            return Long.parseLong(must(List.of("stat", "-c", "%b", backing.toString())).strip()) * 512;
        }

        @Override
        public void close() throws Exception {
            List<String> failures = new ArrayList<>();
            if (extMounted) {
                ServerProcess.Run r = run(List.of("umount", mnt.toString()));
                if (r.exit() != 0) {
                    r = run(List.of("umount", "-l", mnt.toString())); // lazy: the loop device detaches when free
                }
                if (r.exit() != 0) failures.add("umount " + mnt + ": " + r.out());
            }
            if (loop != null) {
                ServerProcess.Run r = run(List.of("losetup", "-d", loop));
                if (r.exit() != 0) failures.add("losetup -d " + loop + ": " + r.out());
            }
            if (tmpfsMounted) {
                ServerProcess.Run r = run(List.of("umount", tmpfs.toString()));
                if (r.exit() != 0) {
                    r = run(List.of("umount", "-l", tmpfs.toString()));
                }
                if (r.exit() != 0) failures.add("umount " + tmpfs + ": " + r.out());
            }
            if (!failures.isEmpty()) {
                throw new IOException("cleaning up the loop file system: " + failures);
            }
        }

        private static ServerProcess.Run run(List<String> cmd) throws Exception {
            return ServerProcess.run(cmd, 120);
        }

        private static String must(List<String> cmd) throws Exception {
            ServerProcess.Run r = run(cmd);
            if (r.exit() != 0) {
                throw new IOException(String.join(" ", cmd) + " failed (exit " + r.exit() + "): " + r.out());
            }
            return r.out();
        }
    }
}
