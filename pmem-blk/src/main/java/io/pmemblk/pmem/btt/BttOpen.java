package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.MappingHold;
import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import static io.pmemblk.pmem.btt.BttFormat.persistRange;
import static io.pmemblk.pmem.btt.BttFormat.writeLayout;
import static io.pmemblk.pmem.btt.BttLayout.*;

/**
 * A pool's BTT read and checked: the pool header and every arena's info block validated (a damaged primary restored
 * from its backup), every flog lane recovered ({@link Btt#open}); the same read without a write ({@link
 * Btt#summarize}); and the consistency check of a BTT at rest ({@link Btt#check}).
 */
final class BttOpen {
    private static final System.Logger LOG = System.getLogger(Btt.class.getName());

    private BttOpen() {
    }

    /** {@link Btt#open(MemorySegment, Persistence, int, Btt.Media, MappingHold)}. */
    static Btt open(MemorySegment pool, Persistence persistence, int lanes, Btt.Media media, MappingHold hold)
            throws IOException {
        List<String> notes = new ArrayList<>();
        if (pool.byteSize() < BTT_OFFSET + ARENA_MIN_SIZE) {
            throw new IOException("not a pmemblk pool with a BTT: " + pool.byteSize() + " bytes, at least "
                    + (BTT_OFFSET + ARENA_MIN_SIZE) + " needed");
        }
        if ((pool.address() & (ALIGNMENT - 1)) != 0) {
            throw new IllegalArgumentException("the pool mapping must be page-aligned (at 0x"
                    + Long.toHexString(pool.address()) + ")");
        }
        MemorySegment hdr = pool.asSlice(0, POOL_HDR_SIZE);
        String bad = invalidPoolHeader(hdr);
        if (bad != null) {
            throw new IOException("not a pmemblk pool this BTT serves: " + bad + "; served: a single-file pool made by"
                    + " `pmempool create [-w] blk 512|4096 FILE` (PMDK 1.x, x86-64) or by pmemblk's BTT format");
        }
        int bsize = pool.get(U32, BLK_BSIZE);
        if (!SECTOR_SIZES.contains(bsize)) {
            throw new IOException("the pmemblk pool's block size is " + bsize + "; served: " + SECTOR_SIZES);
        }
        UUID poolset = getUuid(hdr, HDR_POOLSET_UUID);
        long rawSize = pool.byteSize() - BTT_OFFSET;

        List<Arena> arenas = new ArrayList<>();
        // Primary info blocks to restore from their backups: written, as the roll-forwards, only once every arena
        // and flog lane has passed, so an image refused below is left exactly as it was found.
        List<Restore> restores = new ArrayList<>();
        long off = 0, left = rawSize, firstLba = 0;
        while (left >= ARENA_MIN_SIZE) {
            long primary = BTT_OFFSET + off;
            long backup = backupAt(off, rawSize);
            MemorySegment info = pool.asSlice(primary, INFO_SIZE);
            String why = invalidInfo(info, left, poolset, bsize);
            if (why != null) {
                MemorySegment copy = pool.asSlice(backup, INFO_SIZE);
                if (arenas.isEmpty() && isZero(info) && isZero(copy)) {
                    writeLayout(pool, persistence, bsize, poolset);
                    notes.add("no BTT was laid out yet (pmempool create without -w): laid out " + bsize + "-byte blocks");
                    continue; // read it again, now laid out
                }
                String backupWhy = invalidInfo(copy, left, poolset, bsize);
                if (backupWhy != null) {
                    throw new IOException("arena " + arenas.size() + " at pool offset " + primary + ": the info block "
                            + why + ", and its backup at " + backup + " " + backupWhy + "; `pmempool check -r` may"
                            + " repair it, or format the pool again (which loses its data)");
                }
                notes.add("arena " + arenas.size() + ": the info block " + why + "; restored from its backup at pool"
                        + " offset " + backup);
                restores.add(new Restore(info, copy, notes.getLast()));
                info = copy; // what the primary will hold
            }
            checkLanes(lanes, info.get(U32, INFO_NFREE));
            Arena a = new Arena(arenas.size(), primary, info, firstLba, lanes);
            recover(pool, persistence, a, notes, false);
            arenas.add(a);
            firstLba += a.externalNlba;
            long nextOff = info.get(U64, INFO_NEXTOFF);
            if (nextOff == 0) {
                break;
            }
            off += nextOff;
            left -= nextOff;
        }
        for (Restore r : restores) {
            r.primary.copyFrom(r.backup);
            persistRange(persistence, r.primary);
            LOG.log(System.Logger.Level.WARNING, r.note);
        }
        for (Arena a : arenas) {
            recover(pool, persistence, a, notes, true);
        }
        return new Btt(pool, persistence, media, hold, bsize, arenas.toArray(Arena[]::new), lanes, poolset, notes);
    }

    private record Restore(MemorySegment primary, MemorySegment backup, String note) {
    }

    /** {@link Btt#summarize(MemorySegment)}; {@code strict}: an invalid primary info block is a problem even with a valid backup. */
    static Btt.Summary summarize(MemorySegment pool, boolean strict) {
        if (pool.byteSize() < BTT_OFFSET + ARENA_MIN_SIZE) {
            return new Btt.Summary(0, 0, 0, 0, 0, pool.byteSize() + " bytes, too small for a BTT");
        }
        MemorySegment hdr = pool.asSlice(0, POOL_HDR_SIZE);
        String bad = invalidPoolHeader(hdr);
        if (bad != null) {
            return new Btt.Summary(0, 0, 0, 0, 0, "pool header: " + bad);
        }
        int bsize = pool.get(U32, BLK_BSIZE);
        UUID poolset = getUuid(hdr, HDR_POOLSET_UUID);
        long rawSize = pool.byteSize() - BTT_OFFSET, off = 0, left = rawSize, blocks = 0;
        int arenas = 0, free = 0, internal = 0;
        while (left >= ARENA_MIN_SIZE) {
            MemorySegment info = pool.asSlice(BTT_OFFSET + off, INFO_SIZE);
            String why = invalidInfo(info, left, poolset, bsize);
            if (why != null) {
                MemorySegment backup = pool.asSlice(backupAt(off, rawSize), INFO_SIZE);
                if (arenas == 0 && isZero(info) && isZero(backup)) {
                    return new Btt.Summary(bsize, 0, 0, 0, 0, null); // laid out at the first open
                }
                if (invalidInfo(backup, left, poolset, bsize) != null) {
                    return new Btt.Summary(bsize, blocks, arenas, free, internal, "arena " + arenas + ": the info block "
                            + why + ", and so does its backup");
                }
                if (strict) {
                    return new Btt.Summary(bsize, blocks, arenas, free, internal, "arena " + arenas + ": the info block "
                            + why + " (its backup is valid: opening would restore it, a write)");
                }
                info = backup; // open restores the primary from it
            }
            arenas++;
            blocks += info.get(U32, INFO_EXTERNAL_NLBA) & 0xFFFF_FFFFL;
            free += info.get(U32, INFO_NFREE);
            internal = info.get(U32, INFO_INTERNAL_LBASIZE);
            long next = info.get(U64, INFO_NEXTOFF);
            if (next == 0) {
                break;
            }
            off += next;
            left -= next;
        }
        return new Btt.Summary(bsize, blocks, arenas, free, internal, null);
    }

    /**
     * Where the backup info block of the arena at BTT offset {@code off} is, in the pool: pmempool check's rule
     * (check_btt_info.c), trusted even when the primary is not.
     */
    private static long backupAt(long off, long rawSize) {
        return BTT_OFFSET + Math.min(off + ARENA_MAX_SIZE, rawSize & ~(long) (ALIGNMENT - 1)) - INFO_SIZE;
    }

    static void checkLanes(int lanes, int nfree) {
        if (lanes < 1 || lanes > nfree) {
            throw new IllegalArgumentException("lanes " + lanes + " is out of range: 1.." + nfree
                    + " (one per queue; the BTT has " + nfree + " free blocks per arena)");
        }
    }

    /** Why {@code hdr} is not a single-file PMDK pmemblk pool header served here, or null. */
    static String invalidPoolHeader(MemorySegment hdr) {
        if (!bytesEqual(hdr, HDR_SIGNATURE, HDR_SIGNATURE_BYTES)) {
            return isZero(hdr.asSlice(0, 64)) ? "no pool header (the first 4 KiB are zero)" : "no PMEMBLK signature";
        }
        int incompat = hdr.get(U32, HDR_INCOMPAT);
        int skip = (incompat & FEAT_CKSUM_2K) != 0 ? HDR_UNUSED2 : HDR_CHECKSUM;
        long stored = hdr.get(U64, HDR_CHECKSUM), computed = checksum(hdr, 0, POOL_HDR_SIZE, HDR_CHECKSUM, skip);
        if (stored != computed) {
            return "the pool header checksum is 0x" + Long.toHexString(stored) + ", computed 0x"
                    + Long.toHexString(computed);
        }
        int major = hdr.get(U32, HDR_MAJOR);
        if (major != BLK_FORMAT_MAJOR) {
            return "pmemblk format major version " + major + " (served: " + BLK_FORMAT_MAJOR + ")";
        }
        if ((incompat & ~FEAT_INCOMPAT_VALID) != 0) {
            return "unknown incompatible features 0x" + Integer.toHexString(incompat & ~FEAT_INCOMPAT_VALID);
        }
        if (hdr.get(ValueLayout.JAVA_BYTE, HDR_ARCH_FLAGS + ARCH_DATA_AT) != ARCH_DATA_LE
                || hdr.get(U16, HDR_ARCH_FLAGS + ARCH_MACHINE_AT) != ARCH_MACHINE_X86_64) {
            return "made on another architecture (arch_flags machine " + hdr.get(U16, HDR_ARCH_FLAGS + ARCH_MACHINE_AT)
                    + "; served: x86-64, 62)";
        }
        UUID self = getUuid(hdr, HDR_UUID);
        for (int at : new int[]{HDR_PREV_PART_UUID, HDR_NEXT_PART_UUID, HDR_PREV_REPL_UUID, HDR_NEXT_REPL_UUID}) {
            if (!getUuid(hdr, at).equals(self)) {
                return "a part of a pool set with several parts or replicas (its part/replica links name other files)";
            }
        }
        return null;
    }

    /**
     * Why {@code info} is not a valid arena info block (for an arena with {@code room} bytes of BTT from its start),
     * or null. The checks PMDK read_info does (signature, parent_uuid, checksum, major), then the bounds the engine
     * relies on: every structure inside the arena and aligned, nfree at most 256, the sizes this engine serves.
     */
    private static String invalidInfo(MemorySegment info, long room, UUID poolset, int bsize) {
        if (!bytesEqual(info, INFO_SIG, INFO_SIGNATURE)) {
            return isZero(info) ? "is all zeros" : "has no BTT_ARENA_INFO signature";
        }
        long stored = info.get(U64, INFO_CHECKSUM), computed = checksum(info, 0, INFO_SIZE, INFO_CHECKSUM, INFO_SIZE);
        if (stored != computed) {
            return "has checksum 0x" + Long.toHexString(stored) + " but its bytes sum to 0x" + Long.toHexString(computed);
        }
        if (!getUuid(info, INFO_PARENT_UUID).equals(poolset)) {
            return "belongs to another pool (parent_uuid " + getUuid(info, INFO_PARENT_UUID) + ", the pool's poolset"
                    + " uuid is " + poolset + ")";
        }
        int major = info.get(U16, INFO_MAJOR);
        if (major == 0) {
            return "has major version 0 (at least 1 is valid)";
        }
        int ext = info.get(U32, INFO_EXTERNAL_LBASIZE), in = info.get(U32, INFO_INTERNAL_LBASIZE);
        if (ext != bsize) {
            return "has external_lbasize " + ext + " but the pool's bsize is " + bsize + " (they must match)";
        }
        if (in < ext || in % 4 != 0) {
            return "has internal_lbasize " + in + " (at least external_lbasize " + ext + ", a multiple of 4)";
        }
        long nfree = info.get(U32, INFO_NFREE) & 0xFFFF_FFFFL;
        long internalNlba = info.get(U32, INFO_INTERNAL_NLBA) & 0xFFFF_FFFFL;
        long externalNlba = info.get(U32, INFO_EXTERNAL_NLBA) & 0xFFFF_FFFFL;
        if (nfree < 1 || nfree > NFREE) {
            return "has nfree " + nfree + " (1.." + NFREE + " served)";
        }
        if (externalNlba != internalNlba - nfree || internalNlba > MAP_LBA_MASK + 1L) {
            return "has external_nlba " + externalNlba + ", internal_nlba " + internalNlba + ", nfree " + nfree
                    + " (external = internal - nfree, internal at most 2^30)";
        }
        if (info.get(U32, INFO_INFOSIZE) != INFO_SIZE) {
            return "has infosize " + info.get(U32, INFO_INFOSIZE) + " (" + INFO_SIZE + " expected)";
        }
        long next = info.get(U64, INFO_NEXTOFF), data = info.get(U64, INFO_DATAOFF), map = info.get(U64, INFO_MAPOFF),
                flog = info.get(U64, INFO_FLOGOFF), backup = info.get(U64, INFO_INFOOFF);
        if (next != 0 && next != ARENA_MAX_SIZE) {
            return "has nextoff " + next + " (0 or " + ARENA_MAX_SIZE + ")";
        }
        if (next > room) { // PMDK read_layout: "invalid next arena offset"
            return "has nextoff " + next + ", past the end of the pool (" + room + " bytes from this arena on): the"
                    + " pool file was cut short, or the block is not this pool's (nextoff must stay within the pool)";
        }
        long arenaEnd = next != 0 ? next : room;
        // Each offset is bounded by the arena on its own, before the sums: they are u64s, and one near 2^63 wrapped
        // a sum below, passed, and sent the engine outside the pool (with these bounds no sum can wrap).
        boolean inside = data >= INFO_SIZE && data <= arenaEnd && map <= arenaEnd && flog <= arenaEnd
                && map >= data + internalNlba * in && flog >= map + externalNlba * MAP_ENTRY_SIZE
                && backup >= flog + nfree * FLOG_PAIR_SIZE && backup <= arenaEnd - INFO_SIZE;
        if (!inside || map % MAP_ENTRY_SIZE != 0 || flog % FLOG_PAIR_SIZE != 0 || data % 8 != 0) {
            return "has offsets outside its arena of " + arenaEnd + " bytes or misaligned: dataoff " + data + ", mapoff "
                    + map + ", flogoff " + flog + ", infooff " + backup;
        }
        return null;
    }

    private static boolean isZero(MemorySegment s) {
        for (long i = 0; i < s.byteSize(); i += 8) {
            if (s.get(ValueLayout.JAVA_LONG_UNALIGNED, i) != 0) {
                return false;
            }
        }
        return true;
    }

    /**
     * Open-time recovery of every flog lane of {@code a} (PMDK read_flog_pair, Linux btt_freelist_init): the current
     * entry's old_map is the lane's free block; if its swap reached the flog but not the map (map still == old),
     * the map store is done now. Blocks are compared without their flag bits, as Linux does, so a kernel-written
     * flog (no flags) recovers too. An invalid seq pair makes the arena read-only, as PMDK does. Run first with
     * {@code write} false over every arena, which checks and writes nothing, then with {@code write} true.
     */
    private static void recover(MemorySegment pool, Persistence persistence, Arena a, List<String> notes,
                                boolean write) throws IOException {
        Map<Integer, Integer> freeLane = new HashMap<>(); // free block -> the first lane holding it
        for (int lane = 0; lane < a.nfree; lane++) {
            long pair = a.pairAt(lane);
            int seq0 = pool.get(U32, pair + FLOG_SEQ), seq1 = pool.get(U32, pair + FLOG_ENTRY_SIZE + FLOG_SEQ);
            int slot = currentSlot(seq0, seq1);
            if (slot < 0) {
                if (write) {
                    continue; // found, and noted, by the first run
                }
                a.error = "flog lane " + lane + " has seq numbers " + seq0 + " and " + seq1 + ", which name no current"
                        + " entry (`pmempool check` reports it; -r repairs)";
                notes.add("arena " + a.index + " is read-only: " + a.error);
                continue;
            }
            long e = pair + (long) slot * FLOG_ENTRY_SIZE;
            int lba = pool.get(U32, e + FLOG_LBA), oldMap = pool.get(U32, e + FLOG_OLD_MAP),
                    newMap = pool.get(U32, e + FLOG_NEW_MAP);
            if (Integer.compareUnsigned(lba, a.externalNlba) >= 0 || (oldMap & MAP_LBA_MASK) >= a.internalNlba
                    || (newMap & MAP_LBA_MASK) >= a.internalNlba) {
                throw new IOException("arena " + a.index + " flog lane " + lane + " is out of range: lba "
                        + Integer.toUnsignedString(lba) + " (< " + a.externalNlba + "), old block " + (oldMap & MAP_LBA_MASK)
                        + ", new block " + (newMap & MAP_LBA_MASK) + " (< " + a.internalNlba + "); `pmempool check -r`"
                        + " may repair it");
            }
            // Two lanes holding one free block would each write into it and map an LBA to it (pmempool check: a
            // duplicate flog entry). A free block the map also names is left to check(): finding it reads the map.
            Integer other = freeLane.putIfAbsent(oldMap & MAP_LBA_MASK, lane);
            if (other != null && !write) {
                a.error = "flog lanes " + other + " and " + lane + " both hold block " + (oldMap & MAP_LBA_MASK)
                        + " as their free block, which two writes would store into (`pmempool check` reports it;"
                        + " -r repairs)";
                notes.add("arena " + a.index + " is read-only: " + a.error);
            }
            a.free[lane] = oldMap;
            a.seq[lane] = slot == 0 ? seq0 : seq1;
            a.next[lane] = 1 - slot;
            if (oldMap == newMap || !write) {
                continue; // the initial entry (nothing was swapped), or the checking run
            }
            long mapAt = a.mapOff + (long) lba * MAP_ENTRY_SIZE;
            int entry = pool.get(U32, mapAt);
            int mapped = isInitial(entry) ? lba : entry & MAP_LBA_MASK;
            if (mapped != (newMap & MAP_LBA_MASK) && mapped == (oldMap & MAP_LBA_MASK)) {
                INT.setVolatile(pool, mapAt, (newMap & MAP_LBA_MASK) | MAP_NORMAL);
                persistRange(persistence, pool.asSlice(mapAt, MAP_ENTRY_SIZE));
                notes.add("arena " + a.index + " lane " + lane + ": completed the interrupted write of block " + lba
                        + " (map " + (oldMap & MAP_LBA_MASK) + " -> " + (newMap & MAP_LBA_MASK) + ")");
            }
        }
    }

    /** {@link Btt#check}. */
    static List<String> check(MemorySegment pool, Arena[] arenas) {
        List<String> problems = new ArrayList<>();
        for (Arena a : arenas) {
            BitSet seen = new BitSet(a.internalNlba);
            for (int p = 0; p < a.externalNlba; p++) {
                int e = pool.get(U32, a.mapOff + (long) p * MAP_ENTRY_SIZE);
                int block = isInitial(e) ? p : e & MAP_LBA_MASK;
                claim(a, seen, block, "map entry " + p, problems);
            }
            for (int lane = 0; lane < a.nfree; lane++) {
                long pair = a.pairAt(lane);
                int slot = currentSlot(pool.get(U32, pair + FLOG_SEQ), pool.get(U32, pair + FLOG_ENTRY_SIZE + FLOG_SEQ));
                if (slot < 0) {
                    problems.add("arena " + a.index + " flog lane " + lane + ": no current entry");
                    continue;
                }
                int old = pool.get(U32, pair + (long) slot * FLOG_ENTRY_SIZE + FLOG_OLD_MAP);
                claim(a, seen, old & MAP_LBA_MASK, "flog lane " + lane + "'s free block", problems);
            }
            int unreferenced = a.internalNlba - seen.cardinality();
            if (unreferenced > 0) {
                problems.add("arena " + a.index + ": " + unreferenced + " blocks referenced by nothing, the first "
                        + seen.nextClearBit(0));
            }
        }
        return problems;
    }

    private static void claim(Arena a, BitSet seen, int block, String by, List<String> problems) {
        if (block >= a.internalNlba) {
            problems.add("arena " + a.index + " " + by + " names block " + block + ", beyond " + a.internalNlba);
        } else if (seen.get(block)) {
            problems.add("arena " + a.index + " " + by + " names block " + block + ", already referenced");
        } else {
            seen.set(block);
        }
    }
}
