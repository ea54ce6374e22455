package io.pmemblk.pmem.btt;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static io.pmemblk.queueing.testing.Digests.sha256;
import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Real peers: Debian's PMDK 1.12 (pmdk-tools' pmempool, libpmemblk1 through Python's ctypes). A pool PMDK made and
 * wrote is served with its data; a pool this BTT formatted and wrote passes {@code pmempool check} and reads back
 * through {@code pmemblk_read}. scripts/test installs the packages; without them the tests are skipped, as the
 * project's other interop tests are without their peers.
 */
class BttInteropTest {
    static final String PMEMPOOL = "/usr/bin/pmempool", PYTHON = "/usr/bin/python3";
    static final Path LIBPMEMBLK = Path.of("/usr/lib/x86_64-linux-gnu/libpmemblk.so.1");

    /** pmemblk through ctypes: write, read and dump modes (its header says how each is called). */
    static final Path PMEMBLK_PY = Path.of("src", "test", "python", "pmemblk_ctypes.py").toAbsolutePath();

    @TempDir
    Path dir;

    @BeforeEach
    void peersInstalled() {
        assumeTrue(Files.isExecutable(Path.of(PMEMPOOL)), PMEMPOOL + " is not installed (apt-get install pmdk-tools)");
        assumeTrue(Files.exists(LIBPMEMBLK), LIBPMEMBLK + " is not installed (apt-get install libpmemblk1)");
        assumeTrue(Files.isExecutable(Path.of(PYTHON)), PYTHON + " is not installed");
    }

    /** The Python generator's pattern, for the Java side. */
    static void fill(MemorySegment block, long lba, long version) {
        for (int i = 0; i < block.byteSize(); i++) {
            block.set(ValueLayout.JAVA_BYTE, i, (byte) (((lba * 131 + version * 7 + i * 3L) ^ (i >> 8)) & 0xFF));
        }
    }

    static void expect(MemorySegment block, long lba, long version) {
        for (int i = 0; i < block.byteSize(); i++) {
            byte want = version == 0 ? 0 : (byte) (((lba * 131 + version * 7 + i * 3L) ^ (i >> 8)) & 0xFF);
            if (block.get(ValueLayout.JAVA_BYTE, i) != want) {
                throw new AssertionError("block " + lba + " byte " + i + " reads " + block.get(ValueLayout.JAVA_BYTE, i)
                        + ", expected " + want + " (version " + version + ")");
            }
        }
    }

    record Result(int exit, String out) {}

    static Result run(List<String> command) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(command).redirectErrorStream(true).start();
        byte[] out = p.getInputStream().readAllBytes();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new AssertionError(command + " did not finish in 60 s");
        }
        return new Result(p.exitValue(), new String(out, StandardCharsets.UTF_8));
    }

    static Result pmemblk(String mode, Path pool, int bsize, String... blocks) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(PYTHON, PMEMBLK_PY.toString(), mode, pool.toString(), Integer.toString(bsize)));
        cmd.addAll(List.of(blocks));
        return run(cmd);
    }

    @ParameterizedTest(name = "bsize {0}")
    @ValueSource(ints = {4096, 512})
    void aPoolPmdkMadeAndWroteIsServedWithItsData(int bsize) throws Exception {
        Path pool = dir.resolve("pmdk.blk");
        Result create = run(List.of(PMEMPOOL, "create", "-w", "blk", Integer.toString(bsize), pool.toString()));
        assertThat(create.exit()).as(create.out()).isZero();
        // 7 is written and then zeroed; 3 is written twice (its first block freed and reused through the flog)
        Result w = pmemblk("write", pool, bsize, "0:1", "3:1", "7:1", "3:2", "7:0", "100:5");
        assertThat(w.exit()).as(w.out()).isZero();
        long nblock = Long.parseLong(w.out().lines().findFirst().orElseThrow().split(" ")[1]);

        try (Pools.Mapped m = Pools.map(pool, Files.size(pool)); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.open(m.memory(), Pools.pageCache(), 2);
            assertThat(btt.blockSize()).isEqualTo(bsize);
            assertThat(btt.blocks()).isEqualTo(nblock);
            assertThat(btt.notes()).isEmpty();
            assertThat(btt.check()).isEmpty();
            MemorySegment buf = arena.allocate(bsize, 4096);
            for (long[] e : new long[][]{{0, 1}, {3, 2}, {7, 0}, {100, 5}, {1, 0}}) {
                btt.read(1, e[0], buf);
                expect(buf, e[0], e[1]);
            }
            // and back: what this BTT writes into PMDK's pool, PMDK reads
            fill(buf, 3, 9);
            btt.write(0, 3, buf);
            fill(buf, 50, 4);
            btt.write(1, 50, buf);
            btt.zero(0, 100);
            assertThat(btt.check()).isEmpty();
        }
        Result check = run(List.of(PMEMPOOL, "check", "-v", pool.toString()));
        assertThat(check.exit()).as(check.out()).isZero();
        assertThat(check.out()).contains("consistent").doesNotContain("not consistent");
        Result r = pmemblk("read", pool, bsize, "0:1", "3:9", "50:4", "100:0", "7:0");
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).contains("block 3 ok", "block 50 ok", "block 100 ok");
    }

    /**
     * serve's rule for a device nobody recorded (docs/btt.md "Which layout a device has"), against pools PMDK made:
     * one laid out ({@code pmempool create -w}) is served as pmem.layout=btt says, without a byte changed, and
     * recorded; one without a BTT laid out yet (no -w) is refused and left as it is: laying one out is what a raw
     * image holding a client-written pool header must never get.
     */
    @org.junit.jupiter.api.Test
    void aPmdkPoolIsTakenForABttOnlyWhenItIsWhollyOne() throws Exception {
        Path laidOut = dir.resolve("w.blk"), bare = dir.resolve("bare.blk");
        Result w = run(List.of(PMEMPOOL, "create", "-w", "-m", "0600", "blk", "4096", laidOut.toString()));
        assertThat(w.exit()).as(w.out()).isZero();
        Result b = run(List.of(PMEMPOOL, "create", "-m", "0600", "blk", "4096", bare.toString()));
        assertThat(b.exit()).as(b.out()).isZero();
        String before = sha256(laidOut);
        try (io.pmemblk.pmem.PmemRegion r = io.pmemblk.pmem.PmemRegion.open(laidOut, Files.size(laidOut), false,
                io.pmemblk.pmem.PmemRegion.Mapper.AUTO)) {
            assertThat(io.pmemblk.pmem.BttRegion.open(r, 1, 0).blockSize()).isEqualTo(4096);
        }
        assertThat(sha256(laidOut)).as("opened, not rewritten").isEqualTo(before);
        assertThat(Files.readString(dir.resolve("w.blk" + io.pmemblk.pmem.LayoutRecord.SUFFIX))).contains("state=btt");

        before = sha256(bare);
        try (io.pmemblk.pmem.PmemRegion r = io.pmemblk.pmem.PmemRegion.open(bare, Files.size(bare), false,
                io.pmemblk.pmem.PmemRegion.Mapper.AUTO)) {
            org.assertj.core.api.Assertions.assertThatThrownBy(() -> io.pmemblk.pmem.BttRegion.open(r, 1, 0))
                    .hasMessageContaining("no BTT is laid out").hasMessageContaining("nothing was written");
        }
        assertThat(sha256(bare)).isEqualTo(before);
        assertThat(dir.resolve("bare.blk" + io.pmemblk.pmem.LayoutRecord.SUFFIX)).doesNotExist();
    }

    @ParameterizedTest(name = "bsize {0}")
    @ValueSource(ints = {4096, 512})
    void aPoolThisBttFormattedPassesPmempoolCheckAndReadsThroughLibpmemblk(int bsize) throws Exception {
        Path pool = dir.resolve("ours.blk");
        long blocks;
        try (Pools.Mapped m = Pools.map(pool, Pools.MIN_POOL + (16L << 20)); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), bsize, 2);
            blocks = btt.blocks();
            MemorySegment buf = arena.allocate(bsize, 4096);
            for (long[] e : new long[][]{{0, 1}, {5, 1}, {5, 2}, {9, 3}, {blocks - 1, 4}}) {
                fill(buf, e[0], e[1]);
                btt.write((int) (e[1] % 2), e[0], buf);
            }
            btt.zero(1, 9);
            // grouped writes (both lanes in lockstep), 10 twice: the group splits before the second
            try (LaneHandle lane = btt.claim(0)) {
                Btt.Group g = lane.group();
                MemorySegment[] bufs = {arena.allocate(bsize, 4096), arena.allocate(bsize, 4096)};
                long[][] writes = {{10, 1}, {11, 1}, {10, 2}, {12, 3}};
                int used = 0;
                for (long[] e : writes) {
                    int slot = g.add(e[0], 0);
                    if (slot < 0) {
                        g.commit();
                        for (int s2 = 0; s2 < g.size(); s2++) {
                            assertThat(g.failure(s2)).isNull();
                        }
                        g.clear();
                        used = 0;
                        slot = g.add(e[0], 0);
                    }
                    fill(bufs[used], e[0], e[1]);
                    g.source(slot, bufs[used++], 0);
                }
                g.commit();
                for (int s2 = 0; s2 < g.size(); s2++) {
                    assertThat(g.failure(s2)).isNull();
                }
                g.clear();
            }
            assertThat(btt.check()).isEmpty();
        }
        Result check = run(List.of(PMEMPOOL, "check", "-v", pool.toString()));
        assertThat(check.exit()).as(check.out()).isZero();
        assertThat(check.out()).contains("consistent").doesNotContain("not consistent");
        Result r = pmemblk("read", pool, bsize, "0:1", "5:2", "9:0", (blocks - 1) + ":4", "2:0", "10:2", "11:1", "12:3");
        assertThat(r.exit()).as(r.out()).isZero();
        assertThat(r.out()).startsWith("nblock " + blocks).contains("block 0 ok", "block 5 ok", "block 9 ok",
                "block " + (blocks - 1) + " ok", "block 2 ok", "block 10 ok", "block 11 ok", "block 12 ok");
        // Only now: pmempool info finds the BTT at struct pmemblk's data - addr, run-time pointers that libpmemblk
        // leaves in the mapped header when it opens a pool (info_blk.c); before any pmemblk_open they are zero and
        // it says "wrong BTT layout offset" (pmempool check and libpmemblk use 8192).
        Result info = run(List.of(PMEMPOOL, "info", pool.toString()));
        assertThat(info.exit()).as(info.out()).isZero();
        assertThat(info.out()).contains("Signature                : PMEMBLK", "Block size               : " + bsize,
                "External LBA count       : " + blocks, "Checksum                 : ", "[OK]");
        // and PMDK's writes into our pool read back here, after its flog recovery and ours
        Result w = pmemblk("write", pool, bsize, "5:7", "6:8");
        assertThat(w.exit()).as(w.out()).isZero();
        try (Pools.Mapped m = Pools.map(pool, Files.size(pool)); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.open(m.memory(), Pools.pageCache(), 1);
            assertThat(btt.check()).isEmpty();
            MemorySegment buf = arena.allocate(bsize, 4096);
            for (long[] e : new long[][]{{5, 7}, {6, 8}, {0, 1}, {9, 0}}) {
                btt.read(0, e[0], buf);
                expect(buf, e[0], e[1]);
            }
        }
    }
}
