package io.pmemblk.pmem.btt;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
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

    /** Sets the u64 {@code field} of arena 0's info block and of its backup, each with a valid checksum. */
    static void setBothInfos(MemorySegment pool, int field, long value) {
        for (long at : new long[]{ARENA0, ARENA0 + G.infoOff()}) {
            MemorySegment info = pool.asSlice(at, BttLayout.INFO_SIZE);
            info.set(BttLayout.U64, field, value);
            info.set(BttLayout.U64, BttLayout.INFO_CHECKSUM, BttLayout.checksum(info, 0, 4096, BttLayout.INFO_CHECKSUM, 4096));
        }
    }

    /**
     * dataoff, mapoff, flogoff or infooff near 2^63 (a u64 read as a long): the bounds sums wrapped and passed it, and the
     * open or the first read or write threw IndexOutOfBoundsException. Refused at open now, and nothing written.
     */
    @Test
    void anOffsetSoLargeItsSumWrapsIsRefused() throws Exception {
        for (int field : new int[]{BttLayout.INFO_DATAOFF, BttLayout.INFO_MAPOFF, BttLayout.INFO_FLOGOFF,
                BttLayout.INFO_INFOOFF}) {
            try (Pools.Mapped m = Pools.map(dir.resolve("p" + field + ".blk"), Pools.MIN_POOL)) {
                Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
                setBothInfos(m.memory(), field, 0x7FFF_FFFF_FFFF_F000L);
                byte[] before = m.memory().toArray(ValueLayout.JAVA_BYTE);
                assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1)).as("field %d", field)
                        .isInstanceOf(IOException.class)
                        .hasMessageContaining("has offsets outside its arena of 16777216 bytes")
                        .hasMessageContaining("9223372036854771712");
                assertThat(Btt.summarize(m.memory()).problem()).contains("has offsets outside its arena");
                assertThat(m.memory().mismatch(MemorySegment.ofArray(before))).as("first byte written").isEqualTo(-1L);
            }
        }
    }

    /**
     * A pool file cut short after arena 0's info block: nextoff says 2^39, the file holds 16 MiB. The offsets
     * were bounded by nextoff, not by the file, so a flog past the file passed and the open threw
     * IndexOutOfBoundsException; a chain running past the file passed too. PMDK read_layout refuses both
     * ("invalid next arena offset").
     */
    @Test
    void aNextArenaPastTheEndOfThePoolIsRefused() throws Exception {
        long max = BttLayout.ARENA_MAX_SIZE;
        for (boolean flogPastTheFile : new boolean[]{true, false}) {
            try (Pools.Mapped m = Pools.map(dir.resolve("p" + flogPastTheFile + ".blk"), Pools.MIN_POOL)) {
                Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
                setBothInfos(m.memory(), BttLayout.INFO_NEXTOFF, max);
                if (flogPastTheFile) { // the offsets of a 512 GiB arena, past the 16 MiB file
                    setBothInfos(m.memory(), BttLayout.INFO_INFOOFF, max - 4096);
                    setBothInfos(m.memory(), BttLayout.INFO_FLOGOFF, max - 4096 - BttLayout.flogSize(256));
                }
                byte[] before = m.memory().toArray(ValueLayout.JAVA_BYTE);
                assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1)).as("flog past the file %s", flogPastTheFile)
                        .isInstanceOf(IOException.class)
                        .hasMessageContaining("has nextoff 549755813888, past the end of the pool (16777216 bytes from"
                                + " this arena on)");
                assertThat(Btt.summarize(m.memory()).problem()).contains("past the end of the pool");
                assertThat(m.memory().mismatch(MemorySegment.ofArray(before))).as("first byte written").isEqualTo(-1L);
            }
        }
    }

    /**
     * An image the open refuses is left as it was: here a primary info block to restore from its backup and a
     * lane whose swap should be rolled forward come before a flog lane out of range. Both repairs were written
     * before the refusal, so the refused image was changed behind the operator's back (and no longer showed
     * pmempool check what had been found).
     */
    @Test
    void aRefusedImageIsNotWritten() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            MemorySegment pool = m.memory();
            Btt.format(pool, Pools.pageCache(), 4096, 1);
            int ext = G.externalNlba();
            pool.set(ValueLayout.JAVA_BYTE, ARENA0 + 200, (byte) 1); // the primary's checksum breaks; the backup is valid
            long lane1 = ARENA0 + G.flogOff() + 64;
            // lane 1: a swap of LBA 5 logged (slot 1, seq 2), its map store lost: open would roll it forward
            pool.set(BttLayout.U32, lane1 + 16, 5);
            pool.set(BttLayout.U32, lane1 + 16 + 4, 5 | BttLayout.MAP_NORMAL);
            pool.set(BttLayout.U32, lane1 + 16 + 8, (ext + 1) | BttLayout.MAP_NORMAL);
            pool.set(BttLayout.U32, lane1 + 16 + 12, 2);
            pool.set(BttLayout.U32, ARENA0 + G.flogOff() + 3 * 64, ext + 7); // lane 3's current entry: lba out of range
            byte[] before = pool.toArray(ValueLayout.JAVA_BYTE);
            assertThatThrownBy(() -> Btt.open(pool, Pools.pageCache(), 1)).isInstanceOf(IOException.class)
                    .hasMessageContaining("arena 0 flog lane 3 is out of range: lba " + (ext + 7) + " (< " + ext + ")");
            assertThat(pool.mismatch(MemorySegment.ofArray(before))).as("first byte written").isEqualTo(-1L);

            pool.set(BttLayout.U32, ARENA0 + G.flogOff() + 3 * 64, 3); // lane 3 repaired: now both repairs are made
            Btt btt = Btt.open(pool, Pools.pageCache(), 1);
            assertThat(btt.notes()).hasSize(2);
            assertThat(btt.notes().get(0)).contains("restored from its backup");
            assertThat(btt.notes().get(1)).contains("completed the interrupted write of block 5");
            assertThat(pool.get(BttLayout.U32, ARENA0 + G.mapOff() + 5 * 4)).isEqualTo((ext + 1) | BttLayout.MAP_NORMAL);
            assertThat(btt.check()).isEmpty();
        }
    }

    /**
     * Two flog lanes whose current entries hold one free block (pmempool check: a duplicate flog entry): a write
     * on each lane stored into that block and mapped its LBA to it, so two LBAs shared one block and the first
     * read the second's data. The arena is read-only now, as for an invalid seq pair (PMDK), naming both lanes.
     */
    @Test
    void twoLanesHoldingOneFreeBlockMakeTheArenaReadOnly() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            MemorySegment pool = m.memory();
            Btt.format(pool, Pools.pageCache(), 4096, 1);
            int shared = (G.externalNlba() + 3) | BttLayout.MAP_ZERO; // lane 3's initial free block
            long lane4 = ARENA0 + G.flogOff() + 4 * 64;
            pool.set(BttLayout.U32, lane4 + 4, shared);
            pool.set(BttLayout.U32, lane4 + 8, shared);
            Btt btt = Btt.open(pool, Pools.pageCache(), 8);
            assertThat(btt.notes()).singleElement().asString().contains("arena 0 is read-only")
                    .contains("flog lanes 3 and 4 both hold block " + (G.externalNlba() + 3));
            MemorySegment buf = arena.allocate(4096, 4096);
            BttTest.fill(buf, 0, 1);
            assertThatThrownBy(() -> btt.write(3, 0, buf)).isInstanceOf(IOException.class).hasMessageContaining("read-only");
            assertThatThrownBy(() -> btt.write(4, 1, buf)).isInstanceOf(IOException.class).hasMessageContaining("read-only");
            btt.read(0, 0, buf); // reads go on
            assertThat(BttTest.verify(buf, 0)).isZero();
        }
    }
}
