package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Random;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * Interop tests: the real {@code pmemblk serve} process driven by the real peers (nbdinfo, qemu-io,
 * fio's nbd engine, nbdcopy, nbdsh), with restarts and a {@code kill -9} in between.
 *
 * <p>None of these tests shows durability: after {@code kill -9} the MAP_SHARED pages live on in the kernel's
 * page cache, so they would pass if FUA and FLUSH did nothing. Durability is asserted from a record of the
 * persistence operations in the pmem module ({@code io.pmemblk.pmem.DurabilityRecordTest}).
 */
class ServeInteropIT {
    @TempDir
    Path dir;

    private String[] settings(String size, String... extra) {
        String[] base = {"pmem.path=" + dir.resolve("pmem.img"), "pmem.size=" + size,
                "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0", "queue.buffer-bytes=32M"};
        String[] all = new String[base.length + extra.length];
        System.arraycopy(base, 0, all, 0, base.length);
        System.arraycopy(extra, 0, all, base.length, extra.length);
        return all;
    }

    @Test
    void nbdinfoSeesSizeFlagsAndBlockSizes() throws Exception {
        try (ServerProcess s = ServerProcess.start(dir, settings("256M"))) {
            assertThat(s.unixUri()).isEqualTo("nbd+unix:///pmem0?socket=" + dir.resolve("nbd.sock"));
            ServerProcess.Run r = ServerProcess.run(List.of("nbdinfo", "--json", s.unixUri()), 60);
            assertThat(r.exit()).as(r.out()).isZero();
            String j = r.out().replaceAll("\\s+", "");
            assertThat(j).contains("\"export-size\":268435456", "\"is_read_only\":false", "\"can_flush\":true",
                    "\"can_fua\":true", "\"can_trim\":true", "\"can_zero\":true", "\"can_fast_zero\":true",
                    "\"can_multi_conn\":true", "\"can_cache\":true", "\"can_df\":true",
                    "\"block_size_preferred\":4096");
            long min = jsonLong(j, "block_size_minimum");
            long max = jsonLong(j, "block_size_maximum");
            assertThat(Long.bitCount(min)).as("minimum is a power of two").isEqualTo(1);
            assertThat(min).isLessThanOrEqualTo(4096);
            assertThat(max).isGreaterThanOrEqualTo(1 << 20);
            // the default (empty) export name reaches the same export
            ServerProcess.Run d = ServerProcess.run(List.of("nbdinfo", "--size",
                    "nbd+unix://?socket=" + dir.resolve("nbd.sock")), 60);
            assertThat(d.out().trim()).isEqualTo("268435456");
        }
    }

    private static long jsonLong(String json, String key) {
        var m = java.util.regex.Pattern.compile("\"" + key + "\":(\\d+)").matcher(json);
        assertThat(m.find()).as(key + " in " + json).isTrue();
        return Long.parseLong(m.group(1));
    }

    @Test
    void qemuIoPatternsSurviveAGracefulRestart() throws Exception {
        List<String> write = List.of("qemu-io", "-f", "raw", "-c", "write -P 0xab 0 1M", "-c", "write -P 0x5c 1M 64k",
                "-c", "write -z 4M 1M", "-c", "write -P 0x11 -f 8M 4k", "-c", "flush");
        List<String> read = List.of("qemu-io", "-f", "raw", "-c", "read -P 0xab 0 1M", "-c", "read -P 0x5c 1M 64k",
                "-c", "read -P 0 4M 1M", "-c", "read -P 0x11 8M 4k");
        try (ServerProcess s = ServerProcess.start(dir, settings("64M"))) {
            ServerProcess.Run w = ServerProcess.run(with(write, s.unixUri()), 60);
            assertThat(w.exit()).as(w.out()).isZero();
            assertThat(w.out()).doesNotContain("failed", "error");
            ServerProcess.Run r = ServerProcess.run(with(read, s.unixUri()), 60);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).doesNotContain("Pattern verification failed");
            assertThat(s.terminate()).as("graceful stop exits 0; stderr: %s", s.stderr()).isZero();
        }
        try (ServerProcess s = ServerProcess.start(dir, settings("64M"))) {
            ServerProcess.Run r = ServerProcess.run(with(read, s.unixUri()), 60);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).doesNotContain("Pattern verification failed").contains("read 4096/4096 bytes at offset 8388608");
            // a wrong pattern must fail: the check above can fail
            ServerProcess.Run bad = ServerProcess.run(with(List.of("qemu-io", "-f", "raw", "-c", "read -P 0xac 0 4k"), s.unixUri()), 60);
            assertThat(bad.out()).contains("Pattern verification failed");
            assertThat(s.terminate()).isZero();
        }
    }

    private static List<String> with(List<String> cmd, String uri) {
        List<String> c = new java.util.ArrayList<>(cmd);
        c.add(uri);
        return c;
    }

    @Test
    void fioNbdEngineVerifiesMixedSizes() throws Exception {
        try (ServerProcess s = ServerProcess.start(dir, settings("128M"))) {
            ServerProcess.Run r = ServerProcess.run(List.of("fio", "--name=verify", "--ioengine=nbd",
                    "--uri=" + s.unixUri(), "--rw=randwrite", "--bsrange=4k-1m", "--size=64m", "--iodepth=16",
                    "--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1", "--do_verify=1", "--numjobs=1", "--output-format=normal"), 300);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).contains("err= 0").doesNotContain("bad magic", "verify failed", "err= 5", "err=22");
            assertThat(s.terminate()).isZero();
        }
    }

    @Test
    void nbdcopyInAndOutWithARestartInBetween() throws Exception {
        Path in = dir.resolve("in.bin");
        Path out = dir.resolve("out.bin");
        byte[] data = new byte[32 << 20];
        new Random(42).nextBytes(data);
        Files.write(in, data);
        try (ServerProcess s = ServerProcess.start(dir, settings("32M"))) {
            ServerProcess.Run r = ServerProcess.run(List.of("nbdcopy", in.toString(), s.unixUri()), 120);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(s.terminate()).isZero();
        }
        try (ServerProcess s = ServerProcess.start(dir, settings("32M"))) {
            ServerProcess.Run r = ServerProcess.run(List.of("nbdcopy", s.unixUri(), out.toString()), 120);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(sha256(out)).isEqualTo(sha256(in));
            assertThat(s.terminate()).isZero();
        }
    }

    /**
     * The server keeps no acknowledged write in buffers of its own: everything it answered (FUA or flushed)
     * is in the shared mapping when the process dies. Not a durability test (see the class comment).
     */
    @Test
    void acknowledgedWritesAreInTheMappingWhenTheServerIsKilled() throws Exception {
        String write = """
                for i in range(64):
                    h.pwrite(bytes([i % 251 + 1]) * 65536, i * 131072, nbd.CMD_FLAG_FUA)
                for i in range(64):
                    h.pwrite(bytes([255 - i]) * 4096, 16 * 1048576 + i * 8192)
                h.flush()
                print("written")
                """;
        String check = """
                bad = 0
                for i in range(64):
                    if h.pread(65536, i * 131072) != bytes([i % 251 + 1]) * 65536: bad += 1
                for i in range(64):
                    if h.pread(4096, 16 * 1048576 + i * 8192) != bytes([255 - i]) * 4096: bad += 1
                print("bad", bad)
                """;
        try (ServerProcess s = ServerProcess.start(dir, settings("64M"))) {
            ServerProcess.Run r = ServerProcess.run(nbdsh(s.unixUri(), write), 120);
            assertThat(r.out()).contains("written");
            s.kill9();
        }
        try (ServerProcess s = ServerProcess.start(dir, settings("64M"))) {
            ServerProcess.Run r = ServerProcess.run(nbdsh(s.unixUri(), check), 120);
            assertThat(r.out().trim()).as("acknowledged writes missing from the mapping after kill -9 (held in"
                    + " the server's own buffers?): " + r.out()).isEqualTo("bad 0");
            assertThat(s.terminate()).isZero();
        }
    }

    @Test
    void aBadSettingStopsStartUpWithExitTwoAndOneLine() throws Exception {
        ServerProcess.Run r = ServerProcess.serveToExit("pmem.size=12X", "pmem.path=" + dir.resolve("x.img"));
        assertThat(r.exit()).isEqualTo(2);
        assertThat(r.out().strip()).startsWith("pmemblk: pmem.size: '12X' is not allowed").doesNotContain("\n")
                .contains("allowed: a size");
        assertThat(dir.resolve("x.img")).doesNotExist();

        ServerProcess.Run u = ServerProcess.serveToExit("nbd.prt=1");
        assertThat(u.exit()).isEqualTo(2);
        assertThat(u.out()).contains("unknown setting 'nbd.prt'");
    }

    @Test
    void anExistingFileOfAnotherSizeIsRefusedAndLeftAlone() throws Exception {
        Files.write(dir.resolve("pmem.img"), new byte[1 << 20]);
        ServerProcess.Run r = ServerProcess.serveToExit("pmem.path=" + dir.resolve("pmem.img"), "pmem.size=2M",
                "nbd.port=0", "nbd.socket=" + dir.resolve("s"));
        assertThat(r.exit()).isEqualTo(1);
        assertThat(r.out()).contains("holds 1048576 bytes but pmem.size is 2097152");
        assertThat(Files.size(dir.resolve("pmem.img"))).isEqualTo(1 << 20);
    }

    @Test
    void aSecondServerOnTheSameFileIsRefusedAndTheFirstKeepsServing() throws Exception {
        try (ServerProcess s = ServerProcess.start(dir, settings("32M"))) {
            ServerProcess.Run second = ServerProcess.serveToExit("pmem.path=" + dir.resolve("pmem.img"),
                    "pmem.size=64M", "pmem.resize=true", "nbd.port=0", "nbd.socket=" + dir.resolve("other.sock"));
            assertThat(second.exit()).isEqualTo(1);
            assertThat(second.out()).contains("is in use by another process");
            assertThat(Files.size(dir.resolve("pmem.img"))).isEqualTo(32 << 20);
            ServerProcess.Run info = ServerProcess.run(List.of("nbdinfo", "--size", s.unixUri()), 60);
            assertThat(info.out().trim()).isEqualTo(Long.toString(32 << 20));
            assertThat(s.terminate()).isZero();
        }
    }

    @Test
    void infoReportsSizeIsPmemEngineAndThresholds() throws Exception {
        ServerProcess.Run r = ServerProcess.run(ServerProcess.command("info", List.of(
                "--set", "pmem.path=" + dir.resolve("none.img"), "--set", "route.dma.min-bytes=64K")), 60);
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).contains("size=1073741824 (1G)", "is_pmem=false", "engine=none", "route.dma.min-bytes=64K");
        assertThat(dir.resolve("none.img")).as("info does not create the file").doesNotExist();
    }

    /**
     * nbdsh runs "python3 -m nbd" from PATH, which may be a Python without Debian's libnbd binding (pyenv):
     * run the module with Debian's interpreter, where python3-libnbd installs it.
     */
    private static List<String> nbdsh(String uri, String script) {
        return List.of("/usr/bin/python3", "-m", "nbd", "-u", uri, "-c", script);
    }
}
