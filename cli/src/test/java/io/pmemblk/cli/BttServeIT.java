package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The BTT served by the real {@code pmemblk serve} ({@code pmem.layout=btt}) over NBD: made by {@code pmemblk
 * format}, written by nbdcopy and qemu-io, then read by an independent implementation: {@code pmempool check -v}
 * finds the pool consistent and libpmemblk ({@code pmemblk_read} through Python's ctypes) reads back the same bytes
 * the NBD clients wrote. Also what must be refused: a raw image served as a BTT, a BTT served raw, formatting over
 * data without --force.
 */
class BttServeIT {
    static final String PMEMPOOL = "/usr/bin/pmempool", PYTHON = "/usr/bin/python3";

    /** libpmemblk through ctypes (pmem-blk's BTT tests use it too): dump FILE BSIZE OUT writes every block to OUT. */
    static final Path PMEMBLK_PY = Path.of("..", "pmem-blk", "src", "test", "python", "pmemblk_ctypes.py").toAbsolutePath();

    @TempDir
    Path dir;

    private List<String> settings(Path file, String... extra) {
        List<String> s = new ArrayList<>(List.of("pmem.path=" + file, "pmem.layout=btt",
                "nbd.socket=" + dir.resolve("nbd.sock"), "nbd.port=0", "queue.buffer-bytes=32M"));
        s.addAll(List.of(extra));
        return s;
    }

    private ServerProcess serve(Path file, String... extra) throws Exception {
        return ServerProcess.start(dir, settings(file, extra).toArray(String[]::new));
    }

    private static ServerProcess.Run pmemblk(String sub, String... args) throws Exception {
        return ServerProcess.run(ServerProcess.command(sub, List.of(args)), 120);
    }

    @Test
    void writtenOverNbdCheckedByPmempoolAndReadBackByLibpmemblk() throws Exception {
        Path file = dir.resolve("btt.img");
        ServerProcess.Run f = pmemblk("format", "--layout", "btt", "--size", "64M", file.toString());
        assertThat(f.exit()).as(f.out()).isZero();
        assertThat(f.out()).contains("formatted " + file + ": BTT of ", "sectors of 4096 bytes", "1 arena(s), 256 free blocks");

        ServerProcess.Run info = pmemblk("info", "--set", "pmem.path=" + file, "--set", "pmem.layout=btt");
        assertThat(info.exit()).as(info.out()).isZero();
        assertThat(info.out()).contains("layout=btt", "btt.sector_size=4096", "btt.arenas=1", "btt.free_blocks=256")
                .doesNotContain("layout_mismatch", "btt.problem");
        long capacity = Long.parseLong(info.out().lines().filter(l -> l.startsWith("btt.capacity="))
                .findFirst().orElseThrow().split("[= ]")[1]);

        byte[] expect = new byte[(int) capacity];
        new Random(25).nextBytes(expect);
        Path in = dir.resolve("in.bin"), out = dir.resolve("out.bin");
        Files.write(in, expect);
        try (ServerProcess s = serve(file)) {
            ServerProcess.Run size = ServerProcess.run(List.of("nbdinfo", "--size", s.unixUri()), 60);
            assertThat(size.out().trim()).as("the export is the BTT's sectors").isEqualTo(Long.toString(capacity));
            ServerProcess.Run json = ServerProcess.run(List.of("nbdinfo", "--json", s.unixUri()), 60);
            assertThat(json.out()).as("clients are told to write whole sectors")
                    .containsPattern("\"block_size_minimum\":\\s*4096").containsPattern("\"block_size_preferred\":\\s*4096");
            nbdcopy(in.toString(), s.unixUri());
            ServerProcess.Run q = ServerProcess.run(List.of("qemu-io", "-f", "raw", "-c", "write -P 0xab 0 64k",
                    "-c", "write -z 1M 64k", "-c", "discard 2M 8k", "-c", "write -P 0x11 -f 3M 4k", "-c", "flush",
                    "-c", "read -P 0 1M 64k", s.unixUri()), 60);
            assertThat(q.exit()).as(q.out()).isZero();
            assertThat(q.out()).doesNotContain("failed", "error", "Pattern verification");
            assertThat(s.terminate()).as("graceful stop; stderr: %s", s.stderr()).isZero();
        }
        Arrays.fill(expect, 0, 64 << 10, (byte) 0xab);
        Arrays.fill(expect, 1 << 20, (1 << 20) + (64 << 10), (byte) 0);
        Arrays.fill(expect, 2 << 20, (2 << 20) + 8192, (byte) 0);
        Arrays.fill(expect, 3 << 20, (3 << 20) + 4096, (byte) 0x11);
        Files.write(in, expect);

        assumeTrue(Files.isExecutable(Path.of(PMEMPOOL)) && Files.exists(Path.of("/usr/lib/x86_64-linux-gnu/libpmemblk.so.1")),
                "pmdk-tools / libpmemblk1 not installed: PMDK's view is not checked");
        ServerProcess.Run check = ServerProcess.run(List.of(PMEMPOOL, "check", "-v", file.toString()), 120);
        assertThat(check.exit()).as(check.out()).isZero();
        assertThat(check.out()).contains("consistent").doesNotContain("not consistent");
        ServerProcess.Run dump = ServerProcess.run(List.of(PYTHON, PMEMBLK_PY.toString(), "dump", file.toString(), "4096",
                out.toString()), 120);
        assertThat(dump.exit()).as(dump.out()).isZero();
        assertThat(dump.out()).contains("nblock " + capacity / 4096);
        assertThat(sha256(out)).as("libpmemblk reads what the NBD clients wrote").isEqualTo(sha256(in));

        // served again after PMDK opened it (its flog recovery ran): the same bytes over NBD
        Files.delete(out);
        try (ServerProcess s = serve(file)) {
            nbdcopy(s.unixUri(), out.toString());
            assertThat(s.terminate()).isZero();
        }
        assertThat(sha256(out)).isEqualTo(sha256(in));
    }

    @Test
    void rawAndBttImagesAreNeverTakenForEachOtherAndFormatRefusesData() throws Exception {
        Path raw = dir.resolve("raw.img"), btt = dir.resolve("btt.img");
        byte[] data = new byte[32 << 20];
        data[1024] = 0x53; // say, a superblock
        Files.write(raw, data);
        ServerProcess.Run f = pmemblk("format", "--layout", "btt", raw.toString());
        assertThat(f.exit()).isEqualTo(1);
        assertThat(f.out()).contains(raw + " holds data (a non-zero byte at offset 1024 of " + data.length + ")", "--force");
        assertThat(Files.readAllBytes(raw)).as("refused: untouched").isEqualTo(data);

        ServerProcess.Run serveRaw = ServerProcess.serveToExit(settings(raw).toArray(String[]::new));
        assertThat(serveRaw.exit()).isNotZero();
        assertThat(serveRaw.out()).contains("is not recorded as a BTT", "pmemblk format --layout btt");
        assertThat(Files.readAllBytes(raw)).isEqualTo(data);
        // a file that does not exist has nothing to reinterpret: created with a BTT, as raw creates its file
        Path fresh = dir.resolve("fresh.img");
        try (ServerProcess s = serve(fresh, "pmem.size=32M")) {
            ServerProcess.Run size = ServerProcess.run(List.of("nbdinfo", "--size", s.unixUri()), 60);
            assertThat(Long.parseLong(size.out().trim())).isPositive().isLessThan(32L << 20);
            assertThat(s.terminate()).isZero();
        }
        assertThat(pmemblk("info", "--set", "pmem.path=" + fresh, "--set", "pmem.layout=btt").out())
                .contains("layout=btt", "btt.sector_size=4096");

        assertThat(pmemblk("format", "--layout", "btt", "--sector-size", "512", "--size", "32M", btt.toString()).exit()).isZero();
        ServerProcess.Run again = pmemblk("format", "--layout", "btt", btt.toString());
        assertThat(again.exit()).isEqualTo(1);
        assertThat(again.out()).contains("is recorded as a BTT already");
        List<String> asRaw = new ArrayList<>(settings(btt));
        asRaw.set(1, "pmem.layout=raw");
        asRaw.add("pmem.size=" + Files.size(btt));
        ServerProcess.Run servedRaw = ServerProcess.serveToExit(asRaw.toArray(String[]::new));
        assertThat(servedRaw.exit()).isNotZero();
        assertThat(servedRaw.out()).contains("is recorded as a BTT", "serve it with --set pmem.layout=btt");
        ServerProcess.Run wrongSector =
                ServerProcess.serveToExit(settings(btt, "pmem.sector-size=4096").toArray(String[]::new));
        assertThat(wrongSector.out()).contains("is a BTT of 512-byte sectors, but pmem.sector-size is 4096");
        ServerProcess.Run forced = pmemblk("format", "--layout", "btt", "--force", raw.toString());
        assertThat(forced.exit()).as(forced.out()).isZero();
        try (ServerProcess s = serve(btt)) {
            ServerProcess.Run q = ServerProcess.run(List.of("qemu-io", "-f", "raw", "-c", "write -P 0x5a 512 512",
                    "-c", "read -P 0x5a 512 512", s.unixUri()), 60);
            assertThat(q.exit()).as(q.out()).isZero();
            assertThat(q.out()).doesNotContain("failed", "Pattern verification");
            assertThat(s.terminate()).isZero();
        }
    }

    private static void nbdcopy(String from, String to) throws Exception {
        ServerProcess.Run c = ServerProcess.run(List.of("nbdcopy", from, to), 120);
        assertThat(c.exit()).as(c.out()).isZero();
    }
}
