package io.pmemblk.pmem.btt;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.List;
import java.util.UUID;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** The format's arithmetic against the worked examples of the note (btt.md §1) and the PMDK rules it cites. */
class BttLayoutTest {
    /** The note's two worked examples of a 16 MiB arena (btt.md section 1), computed from the formulas there. */
    @ParameterizedTest(name = "16 MiB arena at {0} bytes")
    @CsvSource({"4096, 4085, 3829, 0xFF7000", "512, 32458, 32202, 0xFDB000"})
    void sixteenMibArenaMatchesTheNote(int sector, int internalNlba, int externalNlba, String mapOff) {
        BttLayout.Arena a = BttLayout.arena(16L << 20, sector, 0);
        assertThat(a.internalLbaSize()).isEqualTo(sector);
        assertThat(a.internalNlba()).isEqualTo(internalNlba);
        assertThat(a.externalNlba()).isEqualTo(externalNlba);
        assertThat(a.nfree()).isEqualTo(256);
        assertThat(a.dataOff()).isEqualTo(0x1000);
        assertThat(a.mapOff()).isEqualTo(Long.decode(mapOff));
        assertThat(a.flogOff()).isEqualTo(0xFFB000);
        assertThat(a.infoOff()).isEqualTo(0xFFF000);
        assertThat(a.nextOff()).isZero();
        // The data area ends at or before the map (PMDK asserts this in btt_info_set_params).
        assertThat(a.dataOff() + (long) a.internalNlba() * a.internalLbaSize()).isLessThanOrEqualTo(a.mapOff());
    }

    @Test
    void internalLbaSizeFollowsPmdkRounding() {
        assertThat(BttLayout.internalLbaSize(512)).isEqualTo(512);
        assertThat(BttLayout.internalLbaSize(4096)).isEqualTo(4096);
        assertThat(BttLayout.internalLbaSize(520)).isEqualTo(768); // Linux would say 576: the note's §1 difference
        assertThat(BttLayout.internalLbaSize(100)).isEqualTo(512);
    }

    @Test
    void fullArenasThenATailOfAtLeast16Mib() {
        long max = BttLayout.ARENA_MAX_SIZE;
        List<BttLayout.Arena> two = BttLayout.arenas(max + (16L << 20), 4096);
        assertThat(two).hasSize(2);
        assertThat(two.get(0).nextOff()).isEqualTo(max);
        assertThat(two.get(0).size()).isEqualTo(max);
        assertThat(two.get(1).nextOff()).isZero();
        assertThat(two.get(1).size()).isEqualTo(16L << 20);
        List<BttLayout.Arena> one = BttLayout.arenas(max + (16L << 20) - 4096, 4096); // the tail is too small
        assertThat(one).hasSize(1);
        assertThat(one.getFirst().nextOff()).isZero();
        assertThatThrownBy(() -> BttLayout.arenas((16L << 20) - 4096, 4096))
                .hasMessageContaining("at least 16777216 bytes");
    }

    @Test
    void seqCyclesAndTheCurrentSlotIsTheLaterOne() {
        assertThat(BttLayout.nextSeq(1)).isEqualTo(2);
        assertThat(BttLayout.nextSeq(2)).isEqualTo(3);
        assertThat(BttLayout.nextSeq(3)).isEqualTo(1);
        assertThat(BttLayout.currentSlot(1, 0)).isEqualTo(0); // the initial flog
        assertThat(BttLayout.currentSlot(0, 1)).isEqualTo(1);
        assertThat(BttLayout.currentSlot(1, 2)).isEqualTo(1);
        assertThat(BttLayout.currentSlot(3, 2)).isEqualTo(0);
        assertThat(BttLayout.currentSlot(3, 1)).isEqualTo(1); // wraps: 1 follows 3
        assertThat(BttLayout.currentSlot(1, 3)).isEqualTo(0);
        assertThat(BttLayout.currentSlot(2, 2)).isEqualTo(-1);
        assertThat(BttLayout.currentSlot(0, 0)).isEqualTo(-1);
        assertThat(BttLayout.currentSlot(5, 1)).isEqualTo(-1);
    }

    @Test
    void mapFlags() {
        assertThat(BttLayout.isInitial(17)).isTrue();
        assertThat(BttLayout.isZeroOrInitial(17 | BttLayout.MAP_ZERO)).isTrue();
        assertThat(BttLayout.isZeroOrInitial(17 | BttLayout.MAP_NORMAL)).isFalse();
        assertThat(BttLayout.isError(17 | BttLayout.MAP_ERROR)).isTrue();
        assertThat(BttLayout.isError(17 | BttLayout.MAP_NORMAL)).isFalse();
    }

    /**
     * The checksum against hand-computed sums: words 1, 2, 3 give lo 6, hi 1+3+6 = 10; the skipped checksum field
     * still adds lo to hi once per word.
     */
    @Test
    void checksumIsPmdkFletcher64() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(24, 8);
            s.set(BttLayout.U32, 0, 1);
            s.set(BttLayout.U32, 4, 2);
            s.set(BttLayout.U32, 8, 3);
            s.set(BttLayout.U64, 16, -1L); // the checksum field: counted as zero
            // lo: 1, 3, 6, 6, 6, 6; hi: 1, 4, 10, 16, 22, 28
            assertThat(BttLayout.checksum(s, 0, 24, 16, 24)).isEqualTo((28L << 32) | 6);
            // with words from byte 8 on skipped (the pool header's CKSUM_2K rule): lo 3; hi 1, 4, 7, 10, 13, 16
            assertThat(BttLayout.checksum(s, 0, 24, 16, 8)).isEqualTo((16L << 32) | 3);
            s.set(BttLayout.U32, 0, -1); // sums wrap mod 2^32: lo 0xFFFFFFFF then 1; hi 0xFFFFFFFF then 0
            s.set(BttLayout.U32, 4, 2);
            assertThat(BttLayout.checksum(s, 0, 8, 8, 8)).isEqualTo(1L);
        }
    }

    @Test
    void uuidsAreStoredAsPmdkStructUuid() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(16, 8);
            UUID u = UUID.fromString("f83a269f-b71d-4fb0-890e-9bed66d41694");
            BttLayout.putUuid(s, 0, u);
            // the bytes of the reference pool made by `pmempool create` (its pmempool info printed this uuid)
            assertThat(s.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE)).containsExactly(
                    0x9f, 0x26, 0x3a, 0xf8, 0x1d, 0xb7, 0xb0, 0x4f, 0x89, 0x0e, 0x9b, 0xed, 0x66, 0xd4, 0x16, 0x94);
            assertThat(BttLayout.getUuid(s, 0)).isEqualTo(u);
        }
    }
}
