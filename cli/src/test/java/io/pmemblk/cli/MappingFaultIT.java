package io.pmemblk.cli;

import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The backing file truncated to half behind a running {@code pmemblk serve}: every access to the lost half is a
 * SIGBUS on the mapping (as a poisoned pmem line is). Requests there answer EIO to the real NBD client
 * (python3-libnbd), the intact half still reads back, the JVM lives (no hs_err file) and serves a new
 * connection, and the faults are counted in the metrics. Once on the page-cache path, once with libpmem's
 * non-temporal copies (PMEM_IS_PMEM_FORCE=1).
 */
class MappingFaultIT {
    static final long MIB = 1 << 20;
    @TempDir
    Path dir;

    @ParameterizedTest(name = "PMEM_IS_PMEM_FORCE={0}")
    @ValueSource(strings = {"0", "1"})
    void requestsIntoATruncatedFileAnswerEioAndTheServerServesTheRest(String forcePmem) throws Exception {
        Path img = dir.resolve("pmem.img");
        int metricsPort = freeTcpPort();
        List<String> args = new ArrayList<>();
        for (String s : List.of("pmem.path=" + img, "pmem.size=64M", "nbd.socket=" + dir.resolve("nbd.sock"),
                "nbd.port=0", "queue.buffer-bytes=32M", "metrics.port=" + metricsPort)) {
            args.add("--set");
            args.add(s);
        }
        // hs_err files of a crash land in dir, where this test looks for them
        Map<String, String> env = Map.of("PMEM_IS_PMEM_FORCE", forcePmem,
                "JAVA_TOOL_OPTIONS", "-XX:ErrorFile=" + dir.resolve("hs_err_pid%p.log"));
        try (ServerProcess s = ServerProcess.start(dir, env, args, 1)) {
            String written = nbdsh(s.unixUri(), """
                    h.pwrite(b'\\x5a' * 1048576, 0)
                    h.pwrite(b'\\xa5' * 1048576, 40 * 1048576)
                    h.flush()
                    print("written")
                    """);
            assertThat(written).contains("written");

            try (FileChannel fc = FileChannel.open(img, StandardOpenOption.WRITE)) {
                fc.truncate(32 * MIB); // behind the server: its mapping still spans 64 MiB
            }

            String faults = nbdsh(s.unixUri(), """
                    import errno
                    def tryit(name, f):
                        try:
                            f()
                            print(name, "OK")
                        except nbd.Error as e:
                            print(name, errno.errorcode.get(e.errno, e.errno))
                    M = 1048576
                    tryit("zero-64k", lambda: h.zero(65536, 50 * M))
                    tryit("write-4k", lambda: h.pwrite(b'\\x01' * 4096, 48 * M))
                    tryit("write-1m-fua", lambda: h.pwrite(b'\\x02' * M, 40 * M, nbd.CMD_FLAG_FUA))
                    tryit("read-4k", lambda: h.pread(4096, 48 * M))
                    tryit("read-1m", lambda: h.pread(M, 40 * M))
                    tryit("read-straddling", lambda: h.pread(8192, 32 * M - 4096))
                    ok = h.pread(M, 0) == b'\\x5a' * M
                    print("intact", ok)
                    """);
            assertThat(faults.lines().toList()).as("client output:%n%s%nserver stderr:%n%s", faults, s.stderr())
                    .contains("read-4k EIO", "read-1m EIO", "read-straddling EIO", "write-4k EIO", "write-1m-fua EIO",
                            "zero-64k EIO", "intact True");

            // a new connection is served, and the writes it makes in the intact half land
            String second = nbdsh(s.unixUri(), """
                    h.pwrite(b'\\x3c' * 65536, 8 * 1048576)
                    h.flush()
                    print("second", h.pread(65536, 8 * 1048576) == b'\\x3c' * 65536, h.pread(4096, 0) == b'\\x5a' * 4096)
                    """);
            assertThat(second).as(second).contains("second True True");
            assertThat(s.process.isAlive()).as("the server process lives; stderr:%n%s", s.stderr()).isTrue();
            assertThat(metric(metricsPort, "pmemblk_mapping_faults_total"))
                    .as("one counted fault per failed request").isEqualTo(6.0);
            assertThat(s.stderr()).contains("answered EIO").contains("at offset");
            s.terminate();
        }
        try (Stream<Path> files = Files.list(dir)) {
            assertThat(files.filter(p -> p.getFileName().toString().startsWith("hs_err")).toList())
                    .as("the JVM wrote no crash report").isEmpty();
        }
    }

    private static String nbdsh(String uri, String script) throws Exception {
        ServerProcess.Run r = ServerProcess.run(List.of("/usr/bin/python3", "-m", "nbd", "-u", uri, "-c", script), 120);
        assertThat(r.exit()).as("nbdsh failed: %s", r.out()).isZero();
        return r.out();
    }
}
