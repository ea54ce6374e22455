package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.Persistence;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.RegionPorts;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The BTT engine over a mapped pool file: format, open, read, write, zero, recovery of damaged info blocks, lanes. */
class BttTest {
    static final long ARENA0 = BttLayout.BTT_OFFSET;

    @TempDir
    Path dir;

    /** A block whose every byte derives from (lba, version): a torn or misplaced block cannot pass {@link #verify}. */
    static void fill(MemorySegment block, long lba, long version) {
        block.set(ValueLayout.JAVA_LONG_UNALIGNED, 0, lba);
        block.set(ValueLayout.JAVA_LONG_UNALIGNED, 8, version);
        for (long i = 16; i < block.byteSize(); i++) {
            block.set(ValueLayout.JAVA_BYTE, i, pattern(lba, version, i));
        }
    }

    static byte pattern(long lba, long version, long i) {
        return (byte) ((lba * 0x9E3779B97F4A7C15L + version * 0xC2B2AE3D27D4EB4FL + i * 0x165667B19E3779F9L) >>> 56);
    }

    /** The version a block holds (0 for all zeros), or an AssertionError if it is torn or belongs to another LBA. */
    static long verify(MemorySegment block, long lba) {
        long l = block.get(ValueLayout.JAVA_LONG_UNALIGNED, 0), v = block.get(ValueLayout.JAVA_LONG_UNALIGNED, 8);
        if (l == 0 && v == 0) {
            for (long i = 16; i < block.byteSize(); i++) {
                if (block.get(ValueLayout.JAVA_BYTE, i) != 0) {
                    throw new AssertionError("block " + lba + " starts as zeros but byte " + i + " is not");
                }
            }
            return 0;
        }
        if (l != lba) {
            throw new AssertionError("block " + lba + " holds the data of block " + l + " version " + v);
        }
        for (long i = 16; i < block.byteSize(); i++) {
            if (block.get(ValueLayout.JAVA_BYTE, i) != pattern(lba, v, i)) {
                throw new AssertionError("block " + lba + " version " + v + " is torn at byte " + i);
            }
        }
        return v;
    }

    @ParameterizedTest(name = "sector {0}")
    @ValueSource(ints = {512, 4096})
    void formatWriteReopenRead(int sector) throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), sector, 4);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, sector, 0);
            assertThat(btt.blockSize()).isEqualTo(sector);
            assertThat(btt.blocks()).isEqualTo(g.externalNlba());
            assertThat(btt.check()).isEmpty();
            MemorySegment buf = arena.allocate(sector, 4096);
            btt.read(0, 5, buf);
            assertThat(verify(buf, 5)).as("a fresh block reads as zeros").isZero();
            long last = btt.blocks() - 1;
            for (long lba : new long[]{0, 5, last}) {
                fill(buf, lba, 1);
                btt.write((int) (lba % 4), lba, buf);
            }
            fill(buf, 5, 2);
            btt.write(1, 5, buf); // an overwrite through another lane: the map lock and old block handover
            assertThat(btt.check()).isEmpty();

            Btt again = Btt.open(m.memory(), Pools.pageCache(), 2);
            assertThat(again.notes()).isEmpty();
            assertThat(again.poolsetUuid()).isEqualTo(btt.poolsetUuid());
            for (long[] expect : new long[][]{{0, 1}, {5, 2}, {last, 1}, {7, 0}}) {
                again.read(1, expect[0], buf);
                assertThat(verify(buf, expect[0])).as("block " + expect[0]).isEqualTo(expect[1]);
            }
            assertThat(m.memory().get(BttLayout.U32, BttLayout.BLK_BSIZE)).isEqualTo(sector);
            assertThat(again.check()).isEmpty();
        }
    }

    /** Over a region mapped as the server maps it, through the port it chose (libpmem's or the JDK mapper's). */
    @ParameterizedTest(name = "{0}")
    @org.junit.jupiter.params.provider.EnumSource(value = PmemRegion.Mapper.class, names = {"JAVA", "LIBPMEM"})
    void overTheRegionsOwnPort(PmemRegion.Mapper mapper) throws Exception {
        if (mapper == PmemRegion.Mapper.LIBPMEM) {
            org.junit.jupiter.api.Assumptions.assumeTrue(RegionPorts.libpmemLoads(), "libpmem not installed");
        }
        Path file = dir.resolve("region.blk");
        RegionPorts.Opened<Persistence> o = RegionPorts.open(file, Pools.MIN_POOL, mapper);
        try (PmemRegion region = o.region(); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(region.memory(), o.port(), 4096, 2);
            MemorySegment buf = arena.allocate(4096, 4096);
            for (long lba = 0; lba < 8; lba++) {
                fill(buf, lba, lba + 1);
                btt.write((int) (lba % 2), lba, buf);
            }
            btt.zero(1, 3);
            assertThat(btt.check()).isEmpty();
        }
        RegionPorts.Opened<Persistence> again = RegionPorts.open(file, Pools.MIN_POOL, mapper);
        try (PmemRegion region = again.region(); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.open(region.memory(), again.port(), 1);
            MemorySegment buf = arena.allocate(4096, 4096);
            for (long lba = 0; lba < 8; lba++) {
                btt.read(0, lba, buf);
                assertThat(verify(buf, lba)).as("block " + lba).isEqualTo(lba == 3 ? 0 : lba + 1);
            }
            assertThat(btt.check()).isEmpty();
        }
    }

    @Test
    void everyWriteMovesTheBlockAndFreesTheOldOne() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            long mapAt = ARENA0 + g.mapOff() + 3 * 4;
            MemorySegment buf = arena.allocate(4096, 4096);
            fill(buf, 3, 1);
            btt.write(0, 3, buf);
            // lane 0's first free block is external_nlba + 0 (the initial flog)
            assertThat(m.memory().get(BttLayout.U32, mapAt)).isEqualTo(g.externalNlba() | BttLayout.MAP_NORMAL);
            fill(buf, 3, 2);
            btt.write(0, 3, buf);
            // the second write went to the block the first one freed: the initial mapping of LBA 3, block 3
            assertThat(m.memory().get(BttLayout.U32, mapAt)).isEqualTo(3 | BttLayout.MAP_NORMAL);
            // lane 0's flog: the first write took slot 1 (seq 2), the second slot 0 (seq 3):
            // {lba 3, old external_nlba|NORMAL, new 3|NORMAL}
            long pair = ARENA0 + g.flogOff();
            assertThat(m.memory().get(BttLayout.U32, pair + 12)).isEqualTo(3);
            assertThat(m.memory().get(BttLayout.U32, pair + 16 + 12)).isEqualTo(2);
            assertThat(m.memory().get(BttLayout.U32, pair)).isEqualTo(3);
            assertThat(m.memory().get(BttLayout.U32, pair + 4)).isEqualTo(g.externalNlba() | BttLayout.MAP_NORMAL);
            assertThat(m.memory().get(BttLayout.U32, pair + 8)).isEqualTo(3 | BttLayout.MAP_NORMAL);
            btt.read(0, 3, buf);
            assertThat(verify(buf, 3)).isEqualTo(2);
            assertThat(btt.check()).isEmpty();
        }
    }

    @Test
    void zeroSetsTheZeroFlagAndKeepsTheBlock() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 512, 2);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 512, 0);
            long mapAt = ARENA0 + g.mapOff() + 9 * 4;
            MemorySegment buf = arena.allocate(512, 512);
            fill(buf, 9, 1);
            btt.write(0, 9, buf);
            int mapped = m.memory().get(BttLayout.U32, mapAt);
            btt.zero(1, 9);
            assertThat(m.memory().get(BttLayout.U32, mapAt)).isEqualTo((mapped & BttLayout.MAP_LBA_MASK) | BttLayout.MAP_ZERO);
            btt.read(0, 9, buf);
            assertThat(verify(buf, 9)).isZero();
            btt.zero(1, 10); // an initial entry stays initial: it reads as zeros already
            assertThat(m.memory().get(BttLayout.U32, mapAt + 4)).isZero();
            assertThat(btt.check()).isEmpty();
            fill(buf, 9, 2);
            btt.write(1, 9, buf); // a zeroed block is freed by the next write like any other
            btt.read(0, 9, buf);
            assertThat(verify(buf, 9)).isEqualTo(2);
            assertThat(btt.check()).isEmpty();
        }
    }

    @Test
    void aDamagedInfoBlockIsRestoredFromItsBackup() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            MemorySegment buf = arena.allocate(4096, 4096);
            fill(buf, 1, 7);
            btt.write(0, 1, buf);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            MemorySegment primary = m.memory().asSlice(ARENA0, BttLayout.INFO_SIZE);
            MemorySegment backup = m.memory().asSlice(ARENA0 + g.infoOff(), BttLayout.INFO_SIZE);
            primary.set(ValueLayout.JAVA_BYTE, 200, (byte) 1); // in the unused part: only the checksum sees it
            Btt opened = Btt.open(m.memory(), Pools.pageCache(), 1);
            assertThat(opened.notes()).singleElement().asString()
                    .contains("arena 0").contains("checksum").contains("restored from its backup");
            assertThat(MemorySegment.mismatch(primary, 0, 4096, backup, 0, 4096)).isEqualTo(-1);
            opened.read(0, 1, buf);
            assertThat(verify(buf, 1)).isEqualTo(7);
            assertThat(Btt.open(m.memory(), Pools.pageCache(), 1).notes()).as("repaired for good").isEmpty();
        }
    }

    @Test
    void bothInfoBlocksBadIsRefusedNamingBoth() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            m.memory().set(ValueLayout.JAVA_BYTE, ARENA0, (byte) 'X'); // the primary's signature
            m.memory().set(BttLayout.U32, ARENA0 + g.infoOff() + BttLayout.INFO_NFREE, 300); // the backup's checksum breaks
            assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1))
                    .isInstanceOf(IOException.class)
                    .hasMessageContaining("arena 0 at pool offset 8192")
                    .hasMessageContaining("has no BTT_ARENA_INFO signature")
                    .hasMessageContaining("its backup at " + (ARENA0 + g.infoOff()) + " has checksum")
                    .hasMessageContaining("pmempool check -r");
        }
    }

    @Test
    void badInfoFieldsAreRefusedWithWhatIsAllowed() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            for (long at : new long[]{ARENA0, ARENA0 + g.infoOff()}) { // both copies, with valid checksums
                MemorySegment info = m.memory().asSlice(at, BttLayout.INFO_SIZE);
                info.set(BttLayout.U32, BttLayout.INFO_NFREE, 300);
                info.set(BttLayout.U64, BttLayout.INFO_CHECKSUM,
                        BttLayout.checksum(info, 0, 4096, BttLayout.INFO_CHECKSUM, 4096));
            }
            assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1))
                    .hasMessageContaining("has nfree 300 (1..256 served)");
        }
    }

    @Test
    void aPoolHeaderThatIsNotPmemblkIsRefused() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1))
                    .hasMessageContaining("no pool header (the first 4 KiB are zero)")
                    .hasMessageContaining("pmempool create [-w] blk 512|4096 FILE");
            Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            m.memory().set(ValueLayout.JAVA_BYTE, 40, (byte) (m.memory().get(ValueLayout.JAVA_BYTE, 40) ^ 1)); // uuid
            assertThatThrownBy(() -> Btt.open(m.memory(), Pools.pageCache(), 1))
                    .hasMessageContaining("the pool header checksum is");
        }
    }

    @Test
    void badArgumentsAreRefusedWithTheRange() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            assertThatThrownBy(() -> Btt.format(m.memory(), Pools.pageCache(), 1024, 1))
                    .hasMessageContaining("pmem.sector-size 1024 is not supported; allowed: [512, 4096]");
            assertThatThrownBy(() -> Btt.format(m.memory(), Pools.pageCache(), 4096, 257))
                    .hasMessageContaining("lanes 257 is out of range: 1..256");
            assertThatThrownBy(() -> Btt.format(m.memory().asSlice(0, Pools.MIN_POOL - 4096), Pools.pageCache(), 4096, 1))
                    .hasMessageContaining("at least 16785408");
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 2);
            MemorySegment buf = arena.allocate(4096, 4096);
            assertThatThrownBy(() -> btt.read(0, btt.blocks(), buf))
                    .hasMessageContaining("block 3829 is out of range: 0..3828");
            assertThatThrownBy(() -> btt.write(2, 0, buf)).hasMessageContaining("lane 2 is out of range: 0..1");
            assertThatThrownBy(() -> btt.write(0, 0, buf.asSlice(0, 512)))
                    .hasMessageContaining("exactly 4096 bytes, got 512");
        }
    }

    /** Media whose data blocks at {@code bad} (pool offsets) cannot take a store and cannot be cleared. */
    private static Btt.Media badAt(MemorySegment pool, long... bad) {
        return new Btt.Media() {
            @Override
            public void read(long poolOffset, MemorySegment dst, long dstOffset, long length) {
                MemorySegment.copy(pool, poolOffset, dst, dstOffset, length);
            }

            @Override
            public void beforeStore(long poolOffset, long length) {
                for (long b : bad) {
                    if (b == poolOffset) {
                        throw new IllegalStateException("test: bad block at " + b);
                    }
                }
            }
        };
    }

    /**
     * A lane whose free block is bad moves to a spare flog lane, past a spare that is bad too; when no spare is
     * left (as many lanes as nfree) its write fails with a message naming the cause, and nothing changes; other
     * lanes write on, and the bad blocks are never stored into, before or after a reopen.
     */
    @Test
    void aBadFreeBlockMovesItsLaneToASpareFlogLaneOrFailsClearlyWhenNoneIsLeft() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            int nfree = BttLayout.NFREE;
            long lane0 = ARENA0 + g.dataOff() + (long) g.externalNlba() * g.internalLbaSize(); // lane i's: + i blocks
            long spare254 = lane0 + (nfree - 2L) * g.internalLbaSize();
            MemorySegment buf = arena.allocate(4096, 4096);

            Btt all = Btt.open(m.memory(), Pools.pageCache(), nfree, badAt(m.memory(), lane0));
            fill(buf, 3, 1);
            assertThatThrownBy(() -> all.write(0, 3, buf)).isInstanceOf(IOException.class)
                    .hasMessageContaining("free block " + g.externalNlba() + " in arena 0 is bad")
                    .hasMessageContaining("no spare flog lane left");
            all.read(1, 3, buf);
            assertThat(verify(buf, 3)).as("the failed write changed nothing").isZero();
            fill(buf, 3, 2);
            all.write(1, 3, buf);
            assertThat(all.check()).isEmpty();

            for (int open = 0; open < 2; open++) {
                Btt btt = Btt.open(m.memory(), Pools.pageCache(), nfree - 2, badAt(m.memory(), lane0, spare254));
                for (int v = 3; v < 6; v++) {
                    fill(buf, 7, 10L * open + v);
                    btt.write(0, 7, buf);
                    btt.read(1, 7, buf);
                    assertThat(verify(buf, 7)).isEqualTo(10L * open + v);
                }
                assertThat(btt.check()).isEmpty();
            }
            assertThat(m.memory().asSlice(lane0, 4096).toArray(ValueLayout.JAVA_BYTE)).containsOnly(0);
            assertThat(m.memory().asSlice(spare254, 4096).toArray(ValueLayout.JAVA_BYTE)).containsOnly(0);
        }
    }

    @Test
    void aPoolWithoutLayoutIsLaidOutAtOpen() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt.format(m.memory(), Pools.pageCache(), 512, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 512, 0);
            // what `pmempool create blk 512` without -w leaves: a pool header, bsize, and no BTT yet
            m.memory().asSlice(ARENA0, BttLayout.INFO_SIZE).fill((byte) 0);
            m.memory().asSlice(ARENA0 + g.infoOff(), BttLayout.INFO_SIZE).fill((byte) 0);
            Btt btt = Btt.open(m.memory(), Pools.pageCache(), 1);
            assertThat(btt.notes()).singleElement().asString().contains("no BTT was laid out yet");
            assertThat(btt.blocks()).isEqualTo(g.externalNlba());
            MemorySegment buf = arena.allocate(512, 512);
            fill(buf, 0, 3);
            btt.write(0, 0, buf);
            btt.read(0, 0, buf);
            assertThat(verify(buf, 0)).isEqualTo(3);
        }
    }

    @Test
    void anInvalidFlogPairMakesTheArenaReadOnly() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            long pair = ARENA0 + g.flogOff() + 7 * 64;
            m.memory().set(BttLayout.U32, pair + 16 + 12, 1); // both slots seq 1
            Btt btt = Btt.open(m.memory(), Pools.pageCache(), 1);
            assertThat(btt.notes()).singleElement().asString().contains("read-only").contains("flog lane 7");
            MemorySegment buf = arena.allocate(4096, 4096);
            btt.read(0, 0, buf); // reads still work
            assertThatThrownBy(() -> btt.write(0, 0, buf)).isInstanceOf(IOException.class)
                    .hasMessageContaining("read-only").hasMessageContaining("flog lane 7");
        }
    }

    @Test
    void aCorruptMapEntryIsAnErrorNotARead() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            MemorySegment buf = arena.allocate(4096, 4096);
            m.memory().set(BttLayout.U32, ARENA0 + g.mapOff() + 2 * 4, (g.internalNlba() + 5) | BttLayout.MAP_NORMAL);
            assertThatThrownBy(() -> btt.read(0, 2, buf)).isInstanceOf(IOException.class)
                    .hasMessageContaining("block 2 maps to internal block 4090, beyond the arena's 4085");
            m.memory().set(BttLayout.U32, ARENA0 + g.mapOff() + 2 * 4, 2 | BttLayout.MAP_ERROR);
            assertThatThrownBy(() -> btt.read(0, 2, buf)).isInstanceOf(IOException.class)
                    .hasMessageContaining("ERROR flag");
            assertThat(btt.check()).isEmpty(); // E with block 2: still block 2's own, referenced once
        }
    }

    /**
     * A write torn after its flog entry (durable) and before its map store: open completes it. Torn one step
     * earlier (the flog entry's first half only, no seq): the old data stays and the lane's free block too.
     */
    @Test
    void openCompletesAWriteWhoseFlogEntryIsDurableAndLeavesAHalfLoggedOne() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            MemorySegment pool = m.memory();
            Btt btt = Btt.format(pool, Pools.pageCache(), 4096, 1);
            BttLayout.Arena g = BttLayout.arena(BttLayout.ARENA_MIN_SIZE, 4096, 0);
            MemorySegment buf = arena.allocate(4096, 4096);
            fill(buf, 4, 1);
            btt.write(0, 4, buf); // lane 0: slot 1 current (seq 2), its free block is LBA 4's initial block, 4
            long mapAt = ARENA0 + g.mapOff() + 4 * 4, pair = ARENA0 + g.flogOff();
            int mapped = pool.get(BttLayout.U32, mapAt);
            int free = pool.get(BttLayout.U32, pair + 16 + 4) & BttLayout.MAP_LBA_MASK;
            assertThat(free).isEqualTo(4);

            // what write() does up to the map store: the data into the free block, the flog entry into slot 0
            fill(buf, 4, 2);
            MemorySegment.copy(buf, 0, pool, ARENA0 + g.dataOff() + (long) free * 4096, 4096);
            pool.set(BttLayout.U32, pair, 4);
            pool.set(BttLayout.U32, pair + 4, mapped);
            pool.set(BttLayout.U32, pair + 8, free | BttLayout.MAP_NORMAL);
            pool.set(BttLayout.U32, pair + 12, 3);
            Btt recovered = Btt.open(pool, Pools.pageCache(), 1);
            assertThat(recovered.notes()).singleElement().asString().contains("completed the interrupted write of block 4");
            assertThat(pool.get(BttLayout.U32, mapAt)).isEqualTo(free | BttLayout.MAP_NORMAL);
            recovered.read(0, 4, buf);
            assertThat(verify(buf, 4)).isEqualTo(2);
            assertThat(recovered.check()).isEmpty();

            // torn before the seq: slot 1 gets {lba, old_map} of a new swap but keeps its old seq 2
            int now = pool.get(BttLayout.U32, mapAt);
            int lane0Free = pool.get(BttLayout.U32, pair + 4) & BttLayout.MAP_LBA_MASK; // slot 0 is current: old_map
            fill(buf, 4, 3);
            MemorySegment.copy(buf, 0, pool, ARENA0 + g.dataOff() + (long) lane0Free * 4096, 4096);
            pool.set(BttLayout.U32, pair + 16, 4);
            pool.set(BttLayout.U32, pair + 16 + 4, now);
            Btt untouched = Btt.open(pool, Pools.pageCache(), 1);
            assertThat(untouched.notes()).isEmpty();
            untouched.read(0, 4, buf);
            assertThat(verify(buf, 4)).as("the half-logged write never happened").isEqualTo(2);
            assertThat(untouched.check()).isEmpty();
            fill(buf, 4, 4);
            untouched.write(0, 4, buf); // the lane goes on from the entry that is current
            untouched.read(0, 4, buf);
            assertThat(verify(buf, 4)).isEqualTo(4);
            assertThat(untouched.check()).isEmpty();
        }
    }

    /**
     * A group takes one block per lane, growing only into free lanes (a lane held by another caller is skipped,
     * and when none is left the group is full), never two blocks of one LBA; its commit writes them all, and
     * closing the owner's lane gives back the lanes the group claimed.
     */
    @Test
    void aGroupGrowsIntoFreeLanesOnlyAndNeverHoldsOneLbaTwice() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.none(), 4096, 4);
            MemorySegment[] bufs = new MemorySegment[4];
            for (int i = 0; i < bufs.length; i++) {
                bufs[i] = arena.allocate(4096, 4096);
            }
            LaneHandle other = btt.claim(2); // another caller's
            assertThat(other.index()).isEqualTo(2);
            try (LaneHandle lane = btt.claim(0)) {
                Btt.Group g = lane.group();
                assertThat(g.capacity()).isEqualTo(4);
                int s0 = g.add(7, 70), s1 = g.add(8, 80);
                assertThat(g.add(7, 71)).as("LBA 7 again: the next group").isEqualTo(-1);
                int s2 = g.add(9, 90);
                assertThat(g.add(10, 100)).as("no lane left: lane 2 is held").isEqualTo(-1);
                assertThat(new int[]{g.lane(s0), g.lane(s1), g.lane(s2)}).containsExactly(0, 1, 3);
                assertThat(g.tag(s1)).isEqualTo(80);
                for (int s : new int[]{s0, s1, s2}) {
                    fill(bufs[s], 7 + s, 1);
                    g.source(s, bufs[s], 0);
                }
                g.commit();
                for (int s : new int[]{s0, s1, s2}) {
                    assertThat(g.failure(s)).isNull();
                }
                g.clear();
                int again = g.add(7, 72); // LBA 7 again, now over the committed entry
                fill(bufs[0], 7, 2);
                g.source(again, bufs[0], 0);
                int failed = g.add(11, 110);
                g.fail(failed, new IOException("its source could not be read"));
                g.commit();
                assertThat(g.failure(again)).isNull();
                assertThat(g.failure(failed)).hasMessage("its source could not be read");
                g.clear();
            }
            other.close();
            // every lane is free again: four callers each get one
            List<LaneHandle> all = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                all.add(btt.claim(0));
            }
            assertThat(all).extracting(LaneHandle::index).containsExactlyInAnyOrder(0, 1, 2, 3);
            all.forEach(LaneHandle::close);
            MemorySegment out = arena.allocate(4096, 4096);
            for (long[] expect : new long[][]{{7, 2}, {8, 1}, {9, 1}, {11, 0}}) {
                btt.read(0, expect[0], out);
                assertThat(verify(out, expect[0])).as("block " + expect[0]).isEqualTo(expect[1]);
            }
            assertThat(btt.check()).isEmpty();
        }
    }

    /**
     * Two callers that prefer one lane (two threads whose ids map there, two connections on one queue) get lanes a
     * group's width apart, so each group grows into a whole run of its own lanes: claimed on the next lane
     * instead, they would interleave and each get half a group.
     */
    @Test
    void callersPreferringOneLaneStartAGroupApart() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt btt = Btt.format(m.memory(), Pools.none(), 4096, 3 * Btt.GROUP_BLOCKS);
            try (LaneHandle a = btt.claim(5); LaneHandle b = btt.claim(5); LaneHandle c = btt.claimNow(5)) {
                assertThat(new int[]{a.index(), b.index(), c.index()})
                        .containsExactly(5, 5 + Btt.GROUP_BLOCKS, 5 + 2 * Btt.GROUP_BLOCKS);
                Btt.Group g = a.group();
                for (int i = 0; i < Btt.GROUP_BLOCKS; i++) {
                    int s = g.add(i, i);
                    assertThat(s).as("block " + i).isEqualTo(i);
                    assertThat(g.lane(s)).as("block " + i + "'s lane").isEqualTo(5 + i);
                }
                g.clear();
            }
        }
    }

    /**
     * The point of a group: on pmem its blocks share their four drains (data, flog first halves, seq halves,
     * map), where written one by one each block pays four.
     */
    @Test
    void aGroupOfBlocksCostsTheDrainsOfOne() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt.format(m.memory(), Pools.none(), 4096, 16);
            AtomicLong drains = new AtomicLong(), writeBacks = new AtomicLong();
            io.pmemblk.pmem.Persistence counting = new io.pmemblk.pmem.ForwardingPersistence(Pools.modelledPmem()) {
                @Override public void writeBack(MemorySegment range) { writeBacks.incrementAndGet(); }
                @Override public void drain() { drains.incrementAndGet(); }
                @Override public void sync(MemorySegment range) { throw new AssertionError("pmem: no msync"); }
                @Override public void syncCreated(io.pmemblk.posix.TrustedFile f) { }
            };
            Btt btt = Btt.open(m.memory(), counting, 16);
            MemorySegment buf = arena.allocate(4096L * 16, 4096);
            for (int i = 0; i < 16; i++) {
                fill(buf.asSlice(4096L * i, 4096), i, 1);
            }
            try (LaneHandle lane = btt.claim(0)) {
                Btt.Group g = lane.group();
                for (int i = 0; i < 16; i++) {
                    g.source(g.add(i, i), buf, 4096L * i);
                }
                g.commit();
                for (int i = 0; i < 16; i++) {
                    assertThat(g.failure(i)).isNull();
                }
                g.clear();
            }
            assertThat(drains.get()).as("drains of a group of 16").isEqualTo(4);
            assertThat(writeBacks.get()).as("one of the neighbouring lanes' flog range per flog stage, one a map entry")
                    .isEqualTo(2 + 16);
            drains.set(0);
            try (LaneHandle lane = btt.claim(0)) {
                for (int i = 0; i < 16; i++) {
                    lane.write(i, buf.asSlice(4096L * i, 4096));
                }
            }
            assertThat(drains.get()).as("drains of 16 single writes").isEqualTo(4 * 16);
            MemorySegment out = arena.allocate(4096, 4096);
            for (int i = 0; i < 16; i++) {
                btt.read(0, i, out);
                assertThat(verify(out, i)).isEqualTo(1);
            }
            assertThat(btt.check()).isEmpty();
        }
    }

    /** A lane entered while it is busy (here: from inside its own write's persistence step) is refused, not shared. */
    @Test
    void aBusyLaneIsRefused() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofConfined()) {
            Btt.format(m.memory(), Pools.pageCache(), 4096, 2);
            MemorySegment other = arena.allocate(4096, 4096);
            Btt[] btt = new Btt[1];
            List<Throwable> inside = new ArrayList<>();
            io.pmemblk.pmem.Persistence reentering = new io.pmemblk.pmem.ForwardingPersistence(Pools.none()) {
                @Override public void syncCreated(io.pmemblk.posix.TrustedFile f) { }

                @Override
                public void sync(MemorySegment range) throws IOException {
                    if (btt[0] != null && inside.isEmpty()) {
                        try {
                            btt[0].read(0, 1, other);
                        } catch (Throwable t) {
                            inside.add(t);
                        }
                        btt[0].read(1, 1, other); // another lane is free to go
                    }
                }
            };
            btt[0] = Btt.open(m.memory(), reentering, 2);
            MemorySegment buf = arena.allocate(4096, 4096);
            fill(buf, 1, 1);
            btt[0].write(0, 1, buf);
            assertThat(inside).singleElement().isInstanceOf(IllegalStateException.class);
            assertThat(inside.getFirst()).hasMessageContaining("lane 0 is in use by another caller");
            btt[0].read(0, 1, other); // free again once the write returned
            assertThat(verify(other, 1)).isEqualTo(1);
        }
    }

    /**
     * Writers on their own lanes (each LBA has one writer, and a few LBAs are written by all) while readers on
     * other lanes check every block they read is whole: without the read-tracking table a writer reuses a block a
     * reader is still copying, and the reader sees a torn or foreign block. No persistence cost, so blocks are
     * reused as fast as the CPU allows.
     */
    @Test
    void concurrentLanesNeverTearAReadAndStayConsistent() throws Exception {
        int writers = 3, readers = 3, owned = 6, shared = 2;
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL)) {
            Btt btt = Btt.format(m.memory(), Pools.none(), 4096, writers + readers);
            long[][] lastOwned = new long[writers][owned];
            AtomicBoolean stop = new AtomicBoolean();
            AtomicLong reads = new AtomicLong(), nonZeroReads = new AtomicLong();
            ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
            CountDownLatch start = new CountDownLatch(1);
            List<Thread> threads = new ArrayList<>();
            int totalLbas = writers * owned + shared;
            for (int w = 0; w < writers; w++) {
                int lane = w;
                threads.add(Thread.ofPlatform().start(() -> {
                    try (Arena arena = Arena.ofConfined()) {
                        MemorySegment buf = arena.allocate(4096, 4096);
                        Random rnd = new Random(lane);
                        start.await();
                        for (long v = 1; v <= 3000; v++) {
                            int i = rnd.nextInt(owned + shared);
                            long lba = i < owned ? lane * owned + i : writers * owned + (i - owned);
                            long version = v * writers + lane; // unique across writers
                            fill(buf, lba, version);
                            btt.write(lane, lba, buf);
                            if (i < owned) {
                                lastOwned[lane][i] = version;
                            }
                        }
                    } catch (Throwable t) {
                        failures.add(t);
                    }
                }));
            }
            for (int r = 0; r < readers; r++) {
                int lane = writers + r;
                threads.add(Thread.ofPlatform().start(() -> {
                    try (Arena arena = Arena.ofConfined()) {
                        MemorySegment buf = arena.allocate(4096, 4096);
                        Random rnd = new Random(100 + lane);
                        start.await();
                        while (!stop.get()) {
                            long lba = rnd.nextInt(totalLbas);
                            btt.read(lane, lba, buf);
                            if (verify(buf, lba) != 0) {
                                nonZeroReads.incrementAndGet();
                            }
                            reads.incrementAndGet();
                        }
                    } catch (Throwable t) {
                        failures.add(t);
                    }
                }));
            }
            start.countDown();
            for (Thread t : threads.subList(0, writers)) {
                t.join();
            }
            stop.set(true);
            for (Thread t : threads) {
                t.join();
            }
            assertThat(failures).isEmpty();
            assertThat(nonZeroReads.get()).as("reads that saw written data, of " + reads.get()).isPositive();
            assertThat(btt.check()).isEmpty();
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment buf = arena.allocate(4096, 4096);
                for (int w = 0; w < writers; w++) {
                    for (int i = 0; i < owned; i++) {
                        long lba = w * owned + i;
                        btt.read(0, lba, buf);
                        assertThat(verify(buf, lba)).as("block " + lba).isEqualTo(lastOwned[w][i]);
                    }
                }
                for (int s = 0; s < shared; s++) {
                    long lba = writers * owned + s;
                    btt.read(0, lba, buf);
                    assertThat(verify(buf, lba)).as("shared block " + lba).isNotZero();
                }
            }
        }
    }

    /**
     * A read that finds its block zeroed (TRIM, WRITE ZEROES) between publishing it and looking again leaves no
     * reader behind: a stale slot would make every later write whose free block is that block wait for ever. The
     * race is a few instructions wide, so a reader on lane 0 and a writer that writes and zeroes the same block on
     * lane 1 run for 1.5 s (without the fix the writer hung by its third round: a read that returns zeros
     * never empties its slot); then writes on both lanes must finish, whatever block each gets.
     */
    @Test
    void aReadThatMeetsAZeroingLeavesNoReaderBehind() throws Exception {
        try (Pools.Mapped m = Pools.map(dir.resolve("p.blk"), Pools.MIN_POOL); Arena arena = Arena.ofShared()) {
            Btt btt = Btt.format(m.memory(), Pools.pageCache(), 4096, 4);
            MemorySegment rbuf = arena.allocate(4096, 4096);
            MemorySegment wbuf = arena.allocate(4096, 4096);
            AtomicBoolean stop = new AtomicBoolean();
            AtomicLong reads = new AtomicLong();
            AtomicLong rounds = new AtomicLong();
            java.util.concurrent.atomic.AtomicReference<Throwable> failed = new java.util.concurrent.atomic.AtomicReference<>();
            Thread reader = Thread.ofPlatform().start(() -> {
                try {
                    while (!stop.get()) {
                        btt.read(0, 5, rbuf);
                        reads.incrementAndGet();
                    }
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            Thread writer = Thread.ofPlatform().start(() -> {
                try {
                    long end = System.nanoTime() + 1_500_000_000L;
                    for (int round = 1; System.nanoTime() < end && failed.get() == null; round++) {
                        rounds.set(round);
                        fill(wbuf, 5, round);
                        btt.write(1, 5, wbuf);
                        btt.zero(1, 5);
                    }
                } catch (Throwable t) {
                    failed.set(t);
                } finally {
                    stop.set(true);
                }
            });
            writer.join(60_000);
            reader.join(10_000);
            assertThat(writer.isAlive() || reader.isAlive()).as("both threads ended (a live one waits for a reader);"
                    + " writer rounds " + rounds.get() + ", reads " + reads.get()).isFalse();
            assertThat(failed.get()).isNull();
            assertThat(reads.get()).as("reads ran beside the writer").isPositive();
            // Lane 0's next writes take the block LBA 5 held, then lane 1's free block: the blocks a stale slot names.
            Thread after = Thread.ofPlatform().start(() -> {
                try {
                    for (int lane : new int[]{0, 0, 1, 1}) {
                        fill(wbuf, 5, 100_000 + lane);
                        btt.write(lane, 5, wbuf);
                    }
                } catch (Throwable t) {
                    failed.set(t);
                }
            });
            after.join(10_000);
            assertThat(after.isAlive()).as("writes after the reader has gone do not wait for it").isFalse();
            assertThat(failed.get()).isNull();
        }
    }
}
