package io.pmemblk.pmem.btt;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Two arenas: PMDK (and so BttLayout) accepts only arenas of 512 GiB but the last (nextoff 0 or 2^39), so this is a
 * sparse pool of 512 GiB + 32 MiB: a full arena 0 and a 32 MiB arena 1. Only the metadata is ever written (arena 0's
 * 512 MiB map, zeroed by the format; a few blocks), so it costs about that much disk and a few seconds.
 */
class BttMultiArenaTest {
    static final long SIZE = BttLayout.BTT_OFFSET + BttLayout.ARENA_MAX_SIZE + (32L << 20);

    @TempDir
    Path dir;

    @Test
    void blocksOnBothSidesOfTheArenaBoundaryAreWrittenReadAndReopenedAndPmdkAgrees() throws Exception {
        Path pool = dir.resolve("two.blk");
        List<BttLayout.Arena> g = BttLayout.arenas(SIZE - BttLayout.BTT_OFFSET, 4096);
        assertThat(g).hasSize(2);
        long first = g.get(0).externalNlba(), total = first + g.get(1).externalNlba();
        long[][] blocks = {{0, 1}, {first - 1, 2}, {first, 3}, {first + 1, 4}, {total - 1, 5}};
        try (Pools.Mapped m = Pools.map(pool, SIZE); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.none(), 4096, 2);
            assertThat(btt.arenaCount()).isEqualTo(2);
            assertThat(btt.blocks()).isEqualTo(total);
            assertThat(btt.freeBlocks()).isEqualTo(2 * BttLayout.NFREE);
            MemorySegment buf = arena.allocate(4096, 4096);
            for (long[] e : blocks) {
                BttTest.fill(buf, e[0], e[1]);
                btt.write((int) (e[1] % 2), e[0], buf);
            }
            btt.zero(0, first + 1); // a zeroing in arena 1 goes to arena 1's map
            blocks[3][1] = 0;
            // arena 1's info block sits at 512 GiB, and arena 0 points at it
            assertThat(m.memory().get(BttLayout.U64, BttLayout.BTT_OFFSET + BttLayout.INFO_NEXTOFF))
                    .isEqualTo(BttLayout.ARENA_MAX_SIZE);
            assertThat(m.memory().get(BttLayout.U32, BttLayout.BTT_OFFSET + BttLayout.ARENA_MAX_SIZE
                    + BttLayout.INFO_EXTERNAL_NLBA)).isEqualTo((int) g.get(1).externalNlba());
            m.memory().force(); // for the peers below
        }
        try (Pools.Mapped m = Pools.map(pool, SIZE); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.open(m.memory(), Pools.none(), 1);
            assertThat(btt.notes()).isEmpty();
            assertThat(btt.check()).isEmpty();
            MemorySegment buf = arena.allocate(4096, 4096);
            for (long[] e : blocks) {
                btt.read(0, e[0], buf);
                assertThat(BttTest.verify(buf, e[0])).as("block %d", e[0]).isEqualTo(e[1]);
            }
            assertThat(Btt.summarize(m.memory())).isEqualTo(new Btt.Summary(4096, total, 2, 2 * BttLayout.NFREE,
                    4096, null));
        }
        assumeTrue(Files.isExecutable(Path.of(BttInteropTest.PMEMPOOL)) && Files.exists(BttInteropTest.LIBPMEMBLK),
                "pmempool / libpmemblk not installed: PMDK's view of the two arenas is not checked");
        BttInteropTest.Result check = BttInteropTest.run(List.of(BttInteropTest.PMEMPOOL, "check", "-v", pool.toString()));
        assertThat(check.exit()).as(check.out()).isZero();
        assertThat(check.out()).contains("consistent").doesNotContain("not consistent");
    }
}
