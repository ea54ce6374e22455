package io.pmemblk.pmem.btt;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;

import static io.pmemblk.pmem.btt.BttTest.ARENA0;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * Images this engine did not write, or that were damaged, with metadata whose checksums are valid but whose values
 * point where they must not: refused with what is wrong, never an unchecked exception, never a store outside the
 * data block a write owns.
 */
class BttDamagedImageTest {
    static final BttLayout.Arena G = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);

    @TempDir
    Path dir;

    /**
     * A write over a map entry naming a block past internal_nlba must be refused (Linux btt_write_pg: -EIO): else
     * that block becomes the lane's free block, and the lane's next write stores its data there, which for block
     * internal_nlba+1 is the map itself.
     */
    @Test
    void aWriteOverAMapEntryPastTheDataAreaIsRefusedAndFreesNothing() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            int beyond = G.internalNlba() + 1; // its data would sit at dataoff + 4086*4096 = mapoff
            assertThat(BttLayout.INFO_SIZE + (long) beyond * 4096).isEqualTo(G.mapOff());
            long entry5 = ARENA0 + G.mapOff() + 5 * 4;
            m.memory().set(BttLayout.U32, entry5, beyond | BttLayout.MAP_NORMAL);
            MemorySegment buf = arena.allocate(4096, 4096);
            BttTest.fill(buf, 5, 1);
            assertThatThrownBy(() -> btt.write(0, 5, buf)).isInstanceOf(IOException.class)
                    .hasMessageContaining("block 5 maps to internal block 4086, beyond the arena's 4085");
            try (LaneHandle l = btt.claim(0)) { // the group path too
                Btt.Group g = l.group();
                int s = g.add(5, 0);
                g.source(s, buf, 0);
                g.commit();
                assertThat(g.failure(s)).isInstanceOf(IOException.class)
                        .hasMessageContaining("block 5 maps to internal block 4086");
                g.clear();
            }
            assertThat(m.memory().get(BttLayout.U32, entry5)).isEqualTo(beyond | BttLayout.MAP_NORMAL);
            int[] map = m.memory().asSlice(ARENA0 + G.mapOff(), 4096).toArray(BttLayout.U32);
            for (int i = 0; i < 3; i++) { // the lane's free block is still its own: the map is never written as data
                BttTest.fill(buf, 6, i + 1);
                btt.write(0, 6, buf);
            }
            int[] after = m.memory().asSlice(ARENA0 + G.mapOff(), 4096).toArray(BttLayout.U32);
            after[6] = map[6];
            assertThat(after).as("the map page but block 6's entry").isEqualTo(map);
            btt.read(0, 6, buf);
            assertThat(BttTest.verify(buf, 6)).isEqualTo(3);
            assertThat(btt.check()).containsExactly("arena 0 map entry 5 names block 4086, beyond 4085",
                    "arena 0: 1 blocks referenced by nothing, the first 5"); // the damage, and nothing more
        }
    }
}
