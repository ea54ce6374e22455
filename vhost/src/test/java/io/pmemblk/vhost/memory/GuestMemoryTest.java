package io.pmemblk.vhost.memory;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The memory table: lookups by either address, splits across adjacent regions, and u64 edge cases. */
class GuestMemoryTest {
    final Arena arena = Arena.ofShared();
    final MemorySegment a = arena.allocate(0xa0000);
    final MemorySegment b = arena.allocate(0x100000);
    final MemorySegment c = arena.allocate(0x100000);
    /** pc-like: [0, 640K) and [768K, 1.75M) with a hole between, then [1.75M, 2.75M) adjacent to the second. */
    final GuestMemory mem = GuestMemory.EMPTY
            .with(new GuestRegion(0, 0xa0000, 0x7000_0000_0000L, a, -1))
            .with(new GuestRegion(0xc0000, 0x100000, 0x7000_000c_0000L, b, 0x10000))
            .with(new GuestRegion(0x1c0000, 0x100000, 0x7100_0000_0000L, c, 0x900000));

    record Piece(MemorySegment mapping, long offset, long length, long iova) {}

    final List<Piece> pieces = new ArrayList<>();
    final ScatterSink sink = (m, o, l, i) -> pieces.add(new Piece(m, o, l, i));

    @AfterEach
    void close() {
        arena.close();
    }

    @Test
    void aRangeInOneRegionIsOnePieceWithItsIova() {
        assertThat(mem.scatter(0xc0000 + 100, 4096, sink)).isEqualTo(1);
        assertThat(pieces).containsExactly(new Piece(b, 100, 4096, 0x10000 + 100));
        assertThat(mem.slice(0xc0000 + 100, 4096).address()).isEqualTo(b.address() + 100);
    }

    @Test
    void aRangeAcrossAdjacentRegionsSplitsAtTheBoundary() {
        assertThat(mem.scatter(0x1c0000 - 10, 30, sink)).isEqualTo(2);
        assertThat(pieces).containsExactly(new Piece(b, 0x100000 - 10, 10, 0x10000 + 0x100000 - 10),
                new Piece(c, 0, 20, 0x900000));
        assertThat(mem.slice(0x1c0000 - 10, 30)).as("slice: one region only").isNull();
    }

    @Test
    void aRangeIntoAHoleOrPastTheEndIsRefusedWholeBeforeAnyPiece() {
        assertThat(mem.scatter(0xa0000 - 10, 20, sink)).as("runs into the 640K hole").isEqualTo(-1);
        assertThat(mem.scatter(0xb0000, 1, sink)).as("inside the hole").isEqualTo(-1);
        assertThat(mem.scatter(0x2c0000 - 1, 2, sink)).as("past the last region").isEqualTo(-1);
        assertThat(pieces).as("nothing handed over for a refused range").isEmpty();
        assertThat(mem.slice(0xb0000, 1)).isNull();
        assertThat(mem.scatter(0x2c0000 - 1, 1, sink)).isEqualTo(1);
    }

    @Test
    void u64EdgesNeitherWrapNorPass() {
        // gpa + len would wrap past 2^64 to an address inside region a: it must not be found there.
        assertThat(mem.scatter(-16L, 32, sink)).isEqualTo(-1);
        assertThat(mem.scatter(0x10, Long.MAX_VALUE, sink)).isEqualTo(-1);
        assertThat(mem.scatter(0x10, -1, sink)).as("negative len").isEqualTo(-1);
        assertThat(mem.scatter(0x10, 0, sink)).as("len 0: no piece").isZero();
        assertThat(mem.slice(-1L, 1)).isNull();
        assertThat(mem.slice(0x10, Long.MAX_VALUE)).isNull();
        assertThat(mem.slice(0x10, 0).byteSize()).isZero();
        assertThat(mem.userSlice(0x7000_0000_0000L - 1, 2)).isNull();
        assertThat(mem.userSlice(-8L, 16)).isNull();
        assertThat(pieces).isEmpty();
        assertThatThrownBy(() -> new GuestRegion(-4096L, 8192, 0, arena.allocate(8192), -1))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("wraps");
        assertThatThrownBy(() -> new GuestRegion(0, 8192, 0, arena.allocate(4096), -1))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("mapping of only 4096");
    }

    @Test
    void qemuAddressesFindTheirRegion() {
        MemorySegment s = mem.userSlice(0x7000_000c_0000L + 8, 64);
        assertThat(s.address()).isEqualTo(b.address() + 8);
        assertThat(mem.userSlice(0x7000_000c_0000L + 0x100000 - 8, 16)).as("past the region's end").isNull();
        assertThat(mem.userSlice(0x7100_0000_0000L, 0x100000).byteSize()).isEqualTo(0x100000);
    }

    @Test
    void overlappingRegionsAreRefusedAndRemovalMatchesAllThree() {
        assertThatThrownBy(() -> mem.with(new GuestRegion(0x1c0000 + 4096, 4096, 0x7200_0000_0000L, a, -1)))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("overlaps");
        assertThatThrownBy(() -> mem.with(new GuestRegion(0x4000_0000L, 4096, 0x7000_0000_0000L + 4096, a, -1)))
                .as("same QEMU addresses").isInstanceOf(IllegalArgumentException.class);
        assertThatThrownBy(() -> mem.without(0xc0000, 0x7000_000c_0000L, 4096))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("no guest memory region");
        GuestMemory less = mem.without(0xc0000, 0x7000_000c_0000L, 0x100000);
        assertThat(less.regionCount()).isEqualTo(2);
        assertThat(less.slice(0xc0000, 1)).isNull();
        assertThat(less.scatter(0x1c0000, 10, sink)).isEqualTo(1);
        assertThat(mem.regionCount()).as("the old table is unchanged").isEqualTo(3);
    }
}
