package io.pmemblk.pmem.btt;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

/**
 * The BTT on-media format and the PMDK pmemblk pool around it, written once. Every integer is little-endian.
 *
 * <p>Sources (as read for /work/shared/notes/btt.md; PMDK at tag 1.12.1, Linux drivers/nvdimm at the commits the
 * note names): the info block is {@code struct btt_info} in PMDK src/libpmemblk/btt_layout.h, the same bytes as
 * Linux {@code struct btt_sb} in drivers/nvdimm/btt.h; the flog is {@code struct btt_flog} (PMDK) /
 * {@code struct log_entry} (Linux); the geometry is PMDK btt.c {@code btt_info_set_params}/{@code btt_info_set_offs}
 * (Linux {@code alloc_arena} gives the same offsets for arenas that are a multiple of 4 KiB); the pool header is
 * PMDK src/common/pool_hdr.h {@code struct pool_hdr}, and {@code struct pmemblk} is src/libpmemblk/blk.h.
 */
public final class BttLayout {
    private BttLayout() {
    }

    // ---- accessors (aligned, so a 4- or 8-byte store is one store: the map and flog commit points rely on it) ----
    static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    /** Coordinates (segment, offset): the map entry store and the RTT-ordering loads. */
    static final VarHandle INT = U32.varHandle();
    /** Coordinates (segment, offset): each half of a flog entry is one 8-byte store. */
    static final VarHandle LONG = U64.varHandle();

    // ---- BTT constants (PMDK btt_layout.h; Linux btt.h) ----
    /** BTT_ALIGNMENT: the info block, map and flog sizes round up to it. */
    public static final int ALIGNMENT = 4096;
    /** BTT_MIN_SIZE / ARENA_MIN_SIZE: smaller arenas (and tails) are not laid out. */
    public static final long ARENA_MIN_SIZE = 1L << 24;
    /** BTT_MAX_ARENA / ARENA_MAX_SIZE. PMDK accepts only nextoff 0 or exactly this (btt.c read_layout). */
    public static final long ARENA_MAX_SIZE = 1L << 39;
    /** BTT_DEFAULT_NFREE (PMDK) = ND_MAX_LANES (Linux): free blocks, hence flog lanes, per arena. */
    public static final int NFREE = 256;
    /** BTT_MIN_LBA_SIZE and BTT_INTERNAL_LBA_ALIGNMENT (PMDK): internal = roundup(max(external, 512), 256). */
    static final int MIN_LBA_SIZE = 512, INTERNAL_LBA_ALIGNMENT = 256;
    /** BTTINFO_MAJOR_VERSION / BTTINFO_MINOR_VERSION as PMDK writes them (Linux v1.1 is the same pair). */
    static final int MAJOR = 1, MINOR = 1;
    /** The external block sizes served here: what a Linux BTT and PMDK lay out identically (note §1). */
    public static final List<Integer> SECTOR_SIZES = List.of(512, 4096);

    // ---- info block: struct btt_info (PMDK) = struct btt_sb (Linux), 4096 bytes ----
    public static final int INFO_SIZE = 4096;
    static final int INFO_SIG = 0, INFO_UUID = 16, INFO_PARENT_UUID = 32, INFO_FLAGS = 48, INFO_MAJOR = 52,
            INFO_MINOR = 54, INFO_EXTERNAL_LBASIZE = 56, INFO_EXTERNAL_NLBA = 60, INFO_INTERNAL_LBASIZE = 64,
            INFO_INTERNAL_NLBA = 68, INFO_NFREE = 72, INFO_INFOSIZE = 76, INFO_NEXTOFF = 80, INFO_DATAOFF = 88,
            INFO_MAPOFF = 96, INFO_FLOGOFF = 104, INFO_INFOOFF = 112, INFO_UNUSED = 120, INFO_CHECKSUM = 4088;
    /** BTTINFO_SIG: "BTT_ARENA_INFO" and two NULs. */
    static final byte[] INFO_SIGNATURE = "BTT_ARENA_INFO\0\0".getBytes(StandardCharsets.US_ASCII);
    /** BTTINFO_FLAG_ERROR (PMDK) / IB_FLAG_ERROR (Linux): the arena is read-only. */
    static final int INFO_FLAG_ERROR = 0x1;

    // ---- map: one u32 per external LBA of the arena ----
    static final int MAP_ENTRY_SIZE = 4;
    /** BTT_MAP_ENTRY_LBA_MASK: bits 29..0 are the postmap block. */
    public static final int MAP_LBA_MASK = 0x3FFF_FFFF;
    /** BTT_MAP_ENTRY_ZERO (bit 31, Linux MAP_TRIM_SHIFT): reads return zeros. */
    public static final int MAP_ZERO = 0x8000_0000;
    /** BTT_MAP_ENTRY_ERROR (bit 30, Linux MAP_ERR_SHIFT): reads fail. */
    public static final int MAP_ERROR = 0x4000_0000;
    /** Both flags: a normal mapping. Neither: the initial state, postmap = premap, which PMDK reads as zeros. */
    public static final int MAP_NORMAL = 0xC000_0000;

    static boolean isInitial(int entry) {
        return (entry & ~MAP_LBA_MASK) == 0;
    }

    static boolean isZeroOrInitial(int entry) {
        int f = entry & ~MAP_LBA_MASK;
        return f == 0 || f == MAP_ZERO;
    }

    static boolean isError(int entry) {
        return (entry & ~MAP_LBA_MASK) == MAP_ERROR;
    }

    // ---- flog: per lane a 64-byte pair of 16-byte entries {lba, old_map, new_map, seq}, bytes 32..63 zero ----
    /** BTT_FLOG_PAIR_ALIGN: lane i's pair is at flogoff + 64*i (slots (0,1): Linux since 4.15 and PMDK). */
    static final int FLOG_PAIR_SIZE = 64, FLOG_ENTRY_SIZE = 16;
    static final int FLOG_LBA = 0, FLOG_OLD_MAP = 4, FLOG_NEW_MAP = 8, FLOG_SEQ = 12;

    /** The next sequence number: 01 -> 10 -> 11 -> 01; 00 is "never written" (PMDK NSEQ, Linux nd_inc_seq). */
    static int nextSeq(int seq) {
        return switch (seq & 3) {
            case 0 -> 1; // not reached for a valid entry; keeps the function total
            case 1 -> 2;
            case 2 -> 3;
            default -> 1;
        };
    }

    /**
     * Which slot of a pair is current (PMDK btt_flog_get_valid, Linux btt_log_get_old agree): equal seqs are a
     * layout error (-1); a zero seq makes the other slot current; otherwise slot 1 is current iff it follows slot 0.
     */
    static int currentSlot(int seq0, int seq1) {
        if (seq0 == seq1 || (seq0 & ~3) != 0 || (seq1 & ~3) != 0) {
            return -1;
        }
        if (seq0 == 0) {
            return 1;
        }
        if (seq1 == 0) {
            return 0;
        }
        return nextSeq(seq0) == seq1 ? 1 : 0;
    }

    // ---- geometry ----
    static long roundUp(long v, long to) {
        return (v + to - 1) / to * to;
    }

    /** PMDK internal_lbasize(): roundup(max(external, 512), 256); 512 and 4096 stay as they are. */
    static int internalLbaSize(int external) {
        return (int) roundUp(Math.max(external, MIN_LBA_SIZE), INTERNAL_LBA_ALIGNMENT);
    }

    /** PMDK btt_flog_size(): nfree pairs of 64 bytes, rounded to 4 KiB. */
    static long flogSize(int nfree) {
        return roundUp((long) nfree * FLOG_PAIR_SIZE, ALIGNMENT);
    }

    /** PMDK btt_map_size(): 4 bytes per external LBA, rounded to 4 KiB. */
    static long mapSize(long externalNlba) {
        return roundUp(externalNlba * MAP_ENTRY_SIZE, ALIGNMENT);
    }

    /**
     * One arena as laid out, offsets relative to the arena's start (its info block).
     *
     * @param nextOff the next arena's offset from this one, 0 for the last
     */
    public record Arena(long size, int externalLbaSize, int internalLbaSize, int internalNlba, int externalNlba,
                        int nfree, long nextOff, long dataOff, long mapOff, long flogOff, long infoOff) {
    }

    /**
     * The arena geometry PMDK btt_info_set_params/_offs computes for an arena of {@code size} bytes, with
     * {@code spaceLeft} bytes of the BTT after it (another arena follows when at least 16 MiB are left).
     */
    public static Arena arena(long size, int externalLbaSize, long spaceLeft) {
        int internal = internalLbaSize(externalLbaSize);
        long dataSize = size - 2L * INFO_SIZE - flogSize(NFREE); // btt_arena_datasize
        long internalNlba = (dataSize - ALIGNMENT) / (internal + MAP_ENTRY_SIZE); // ALIGNMENT: map padding
        if (internalNlba < 2L * NFREE) {
            throw new IllegalArgumentException("an arena of " + size + " bytes holds " + internalNlba + " blocks of "
                    + internal + " bytes; at least " + 2 * NFREE + " are needed (arenas are at least "
                    + ARENA_MIN_SIZE + " bytes)");
        }
        int externalNlba = (int) internalNlba - NFREE;
        long infoOff = size - INFO_SIZE;
        long flogOff = infoOff - flogSize(NFREE);
        long mapOff = flogOff - mapSize(externalNlba);
        long nextOff = spaceLeft >= ARENA_MIN_SIZE ? size : 0;
        return new Arena(size, externalLbaSize, internal, (int) internalNlba, externalNlba, NFREE, nextOff,
                INFO_SIZE, mapOff, flogOff, infoOff);
    }

    /**
     * The arenas of a BTT of {@code rawSize} bytes (PMDK write_layout, Linux create_arenas): full 512 GiB arenas,
     * then one more if at least 16 MiB remain; a smaller tail is left unused.
     */
    public static List<Arena> arenas(long rawSize, int externalLbaSize) {
        if (rawSize < ARENA_MIN_SIZE) {
            throw new IllegalArgumentException("a BTT needs at least " + ARENA_MIN_SIZE + " bytes (16 MiB), got "
                    + rawSize);
        }
        List<Arena> l = new ArrayList<>();
        long left = rawSize;
        while (left >= ARENA_MIN_SIZE) {
            long size = Math.min(left, ARENA_MAX_SIZE);
            left -= size;
            l.add(arena(size, externalLbaSize, left));
        }
        return l;
    }

    // ---- checksum ----
    /**
     * PMDK util_checksum_compute (= Linux nd_fletcher64 for the info block): a Fletcher-style sum of the LE u32
     * words of [offset, offset+length), where the 8-byte field at {@code checksumAt} and every word from
     * {@code skipFrom} on count as zero (both relative to {@code offset}); {@code hi += lo} still runs per word.
     */
    static long checksum(MemorySegment s, long offset, int length, int checksumAt, int skipFrom) {
        int lo = 0, hi = 0;
        for (int i = 0; i < length; i += 4) {
            if (i < skipFrom && (i < checksumAt || i >= checksumAt + 8)) {
                lo += s.get(U32.withByteAlignment(1), offset + i);
            }
            hi += lo;
        }
        return ((long) hi << 32) | (lo & 0xFFFF_FFFFL);
    }

    // ---- the PMDK pool around the BTT (x86-64: PMEM_PAGESIZE 4096) ----
    /** struct pool_hdr, 4096 bytes at file offset 0. */
    public static final int POOL_HDR_SIZE = 4096;
    static final int HDR_SIGNATURE = 0, HDR_MAJOR = 8, HDR_COMPAT = 12, HDR_INCOMPAT = 16, HDR_RO_COMPAT = 20,
            HDR_POOLSET_UUID = 24, HDR_UUID = 40, HDR_PREV_PART_UUID = 56, HDR_NEXT_PART_UUID = 72,
            HDR_PREV_REPL_UUID = 88, HDR_NEXT_REPL_UUID = 104, HDR_CRTIME = 120, HDR_ARCH_FLAGS = 128,
            HDR_UNUSED2 = 2048, HDR_SDS = 4024, HDR_CHECKSUM = 4088;
    /** BLK_HDR_SIG "PMEMBLK" and a NUL (blk.h). */
    static final byte[] HDR_SIGNATURE_BYTES = "PMEMBLK\0".getBytes(StandardCharsets.US_ASCII);
    /** BLK_FORMAT_MAJOR (blk.h). */
    static final int BLK_FORMAT_MAJOR = 1;
    /** POOL_FEAT_CHECK_BAD_BLOCKS: compat default (pool_hdr.h POOL_FEAT_COMPAT_DEFAULT). */
    static final int FEAT_CHECK_BAD_BLOCKS = 0x1;
    /** Incompat features: SINGLEHDR, CKSUM_2K (only the first 2 KiB checksummed), SDS (shutdown state). */
    static final int FEAT_SINGLEHDR = 0x1, FEAT_CKSUM_2K = 0x2, FEAT_SDS = 0x4;
    static final int FEAT_INCOMPAT_VALID = FEAT_SINGLEHDR | FEAT_CKSUM_2K | FEAT_SDS;
    /**
     * struct arch_flags at 128, as PMDK 1.12.1 on x86-64 writes it (util_get_arch_flags; the bytes of a pool made by
     * Debian's pmempool create on this project's VM): alignment_desc u64, machine_class ELFCLASS64 (2), data
     * ELFDATA2LSB (1), 4 reserved, machine EM_X86_64 (62) u16.
     */
    static final long ARCH_ALIGNMENT_DESC = 0x0000_07f7_3777_7310L;
    static final int ARCH_MACHINE_CLASS = 2, ARCH_DATA_LE = 1, ARCH_MACHINE_X86_64 = 62;
    static final int ARCH_CLASS_AT = 8, ARCH_DATA_AT = 9, ARCH_MACHINE_AT = 14;
    /** struct pmemblk after the header: bsize u32 at 4096, is_zeroed at 4100; the rest is runtime state. */
    static final int BLK_BSIZE = 4096, BLK_IS_ZEROED = 4100;
    /** The BTT namespace starts at roundup(sizeof(struct pmemblk), PMEM_PAGESIZE) (blk.c blk_runtime_init). */
    public static final int BTT_OFFSET = 8192;

    /** A UUID as PMDK stores struct uuid: time_low, time_mid, time_hi_and_ver little-endian, then bytes 8..15. */
    static void putUuid(MemorySegment s, long at, UUID u) {
        long msb = u.getMostSignificantBits(), lsb = u.getLeastSignificantBits();
        s.set(U32.withByteAlignment(1), at, (int) (msb >>> 32));
        s.set(U16, at + 4, (short) (msb >>> 16));
        s.set(U16, at + 6, (short) msb);
        for (int i = 0; i < 8; i++) {
            s.set(ValueLayout.JAVA_BYTE, at + 8 + i, (byte) (lsb >>> (56 - 8 * i)));
        }
    }

    static UUID getUuid(MemorySegment s, long at) {
        long msb = ((long) s.get(U32.withByteAlignment(1), at) << 32)
                | ((s.get(U16, at + 4) & 0xFFFFL) << 16) | (s.get(U16, at + 6) & 0xFFFFL);
        long lsb = 0;
        for (int i = 0; i < 8; i++) {
            lsb = (lsb << 8) | (s.get(ValueLayout.JAVA_BYTE, at + 8 + i) & 0xFF);
        }
        return new UUID(msb, lsb);
    }

    static boolean bytesEqual(MemorySegment s, long at, byte[] expected) {
        return MemorySegment.mismatch(s, at, at + expected.length, MemorySegment.ofArray(expected), 0,
                expected.length) < 0;
    }
}
