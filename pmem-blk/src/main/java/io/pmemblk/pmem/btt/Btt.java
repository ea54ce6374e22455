package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.MappingHold;
import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.UUID;

import static io.pmemblk.pmem.btt.BttLayout.*;

/**
 * A Block Translation Table over a mapped PMDK pmemblk pool: sector-atomic block writes on memory that tears at 8
 * bytes. A write goes to a free block, then a flog entry names the swap, then one aligned 4-byte map store commits
 * it; each step is durable (through the {@link Persistence} port) before the next, so a crash leaves every block
 * wholly old or wholly new, and {@link #open} finishes a swap whose flog entry is durable but whose map store is not
 * (PMDK btt.c btt_write/read_flog_pair, Linux btt.c btt_write_pg/btt_freelist_init; note §2-§3).
 *
 * <p>Lanes: the caller's queue index. Each lane owns one free block and one flog pair per arena, so writers on
 * different lanes share nothing but the map lock of the LBA (two writers of one LBA must not both free
 * its old block) and the read-tracking table. A lane must be used by one thread at a time: a second caller on a
 * busy lane is refused ({@link IllegalStateException}) rather than left to corrupt the lane's free block. A group
 * claims whichever lanes are free, so callers that name their lane ({@link #write(int, long, MemorySegment)})
 * and callers that {@link #claim} lanes do not share one BTT.
 *
 * <p>Reads publish the block they copy in the read-tracking table (RTT) and re-read the map, so a writer about to
 * reuse a block waits while a reader still copies it (note §2, "why the RTT exists"). A read a device copies
 * after its caller has gone on (a DMA engine's, {@link #beginDeviceRead}) publishes in the arena's device-read
 * table instead, which needs no lane; writers wait on both.
 *
 * <p>Groups ({@link Group}): the four durability round trips of a block write (data, flog first half, flog seq half,
 * map; each a write-back and a drain on pmem) must stay serial for each block, but nothing orders them between
 * blocks of different lanes. A group runs up to {@link #GROUP_BLOCKS} block writes, each on its own lane, in
 * lockstep: all data copies then one drain, all first halves then one drain, all seq halves then one drain, all
 * map stores then one drain. The write-backs of different lines overlap, so the group costs about what one block
 * costs alone ("one batch, one doorbell"). A group's data may be stored by a device instead of this thread
 * ({@link Group#prepareStores}, then {@link Group#commitDeviceStored} on whichever thread hears that it is done):
 * the blocks' lines are written back and drained there before the flog stage.
 *
 * <p>The hot path (read, write, zero of one block, a group's commit) allocates nothing; this object does not own the mapping.
 */
public final class Btt {
    private static final System.Logger LOG = System.getLogger(Btt.class.getName());
    /** Ints per RTT slot and lane busy flag: 64 bytes, so two lanes never share a cache line. */
    private static final int PAD = 16;
    /** An RTT slot that names no block: a normal map entry always has both flag bits set. */
    private static final int RTT_EMPTY = 0;
    /**
     * Buckets of an arena's device-read table ({@link #beginDeviceRead}): a power of two. A writer whose free block
     * shares a bucket with a block a device is still reading waits for that read too (a false positive costs a
     * wait of one copy, never a wrong result); with 64 Ki buckets, a thousand blocks in flight leave a bucket busy
     * 1.5% of the time. 256 KiB an arena.
     */
    private static final int DEVICE_READ_BUCKETS = 1 << 16;
    /**
     * Map locks per arena: a power of two, a lock word each (not padded), LBAs taking them in turn. Linux and PMDK
     * have nfree (256) locks, one per map cache line: two groups of 32 random blocks would then share a lock
     * nearly always (1 - (224/256)^32 = 98%), and the second waits out the first's three drains, so two
     * submitters wrote no faster than one. With 64 Ki locks two such groups meet 1.5% of the time. 256 KiB an
     * arena; a lock only orders writers of one LBA, so sharing one (LBAs 64 Ki apart) costs a wait, never a
     * wrong result.
     */
    private static final int MAP_LOCKS = 1 << 16;
    /** What {@link #beginDeviceRead} answers for a block that reads as zeros (its map entry's zero flag, or initial). */
    public static final long ZEROS = -1;
    private static final VarHandle ARRAY = MethodHandles.arrayElementVarHandle(int[].class);
    /**
     * Block writes a {@link Group} runs in lockstep at most: a QD32 batch of 4 KiB writes in one group. Past a
     * dozen or so the round trips a group saves per block (4 round trips / K) are small beside the block's own
     * copy, and every block of a group holds a lane: 32 lanes per caller is what {@code BttRegion} opens the BTT
     * with (at most 256).
     */
    public static final int GROUP_BLOCKS = 32;
    /** The widest flog range a group writes back in one call (lanes' pairs in between included): 64 lanes' pairs. */
    private static final long FLOG_RANGE_MAX = 64L * FLOG_PAIR_SIZE;

    /**
     * The media under the data blocks: how one is copied out of the pool, and what must happen before one is
     * stored. A server's port is its region's (known bad blocks, and a fault on the mapping, become one request's
     * error instead of the JVM's; a bad range a store covers is cleared first where it can be); tests and tools
     * that own a plain segment copy directly (the default of {@link #open(MemorySegment, Persistence, int)}).
     */
    public interface Media {
        /** Copies [poolOffset, poolOffset+length) of the pool into {@code dst}; a fault throws (unchecked) here, not later. */
        void read(long poolOffset, MemorySegment dst, long dstOffset, long length);

        /** Before a data block is stored at [poolOffset, poolOffset+length): throws (unchecked) if it cannot take it. */
        void beforeStore(long poolOffset, long length);
    }

    private final MemorySegment pool;
    /**
     * Held by a group for its copies and write-backs ({@link Group}): one acquire of the mapping a group, not two
     * a native call, which on x86 would wait for every write-back before it and undo their overlap.
     */
    private final MappingHold hold;
    private final Persistence persistence;
    private final Media media;
    /** One per lane, made at open: claiming a lane allocates nothing. */
    private final Lane[] laneHandles;
    private final boolean pmem;
    private final int blockSize;
    private final long blocks;
    private final int lanes;
    private final Arena[] arenas;
    private final int[] laneBusy;
    private final UUID poolsetUuid;
    private final List<String> notes;
    /** Set when a persistence step of a write failed: its lane's state on the media is unknown, so writes stop. */
    private volatile String writeFailure;
    /**
     * Set (for good) by the first {@link #beginDeviceRead}, before it publishes: until then writers skip the
     * device-read tables (a miss in a 256 KiB table per block, for nothing, on a BTT served without an engine). A
     * writer that reads it unset took its map store before the reader set it, so the reader's re-read of the map
     * (after the flag and its publish) sees the map changed and never copies the block.
     */
    private volatile boolean deviceReads;

    /** One arena's offsets (absolute in the pool mapping) and its run-time state. */
    private static final class Arena {
        final int index;
        final long start, dataOff, mapOff, flogOff;
        final int internalLbaSize, internalNlba, externalNlba, nfree;
        final long firstLba;
        /** Per flog lane (all nfree, in use or not): the current entry's old_map (the lane's free block), seq, next slot. */
        final int[] free, seq, next;
        final int[] rtt;
        /**
         * The device-read table: per bucket of internal blocks, the reads of them a device has in flight
         * ({@link #beginDeviceRead}). A lane's RTT slot holds one block, for a read its holder copies now; a
         * device read is in flight after its caller has gone on, and a READ has many sectors, so it would need
         * a lane per sector to use the RTT.
         */
        final int[] deviceReads;
        final int[] mapLocks;
        /** Why the arena is read-only (the info block's ERROR flag, an invalid flog pair), or null. */
        volatile String error;

        Arena(int index, long start, MemorySegment info, long firstLba, int lanes) {
            this.index = index;
            this.start = start;
            this.dataOff = start + info.get(U64, INFO_DATAOFF);
            this.mapOff = start + info.get(U64, INFO_MAPOFF);
            this.flogOff = start + info.get(U64, INFO_FLOGOFF);
            this.internalLbaSize = info.get(U32, INFO_INTERNAL_LBASIZE);
            this.internalNlba = info.get(U32, INFO_INTERNAL_NLBA);
            this.externalNlba = info.get(U32, INFO_EXTERNAL_NLBA);
            this.nfree = info.get(U32, INFO_NFREE);
            this.firstLba = firstLba;
            this.free = new int[nfree];
            this.seq = new int[nfree];
            this.next = new int[nfree];
            this.rtt = new int[lanes * PAD];
            this.deviceReads = new int[DEVICE_READ_BUCKETS];
            this.mapLocks = new int[MAP_LOCKS];
            if ((info.get(U32, INFO_FLAGS) & INFO_FLAG_ERROR) != 0) {
                error = "its info block has the ERROR flag set (a write to it failed earlier)";
            }
        }

        long pairAt(int lane) {
            return flogOff + (long) lane * FLOG_PAIR_SIZE;
        }
    }

    private Btt(MemorySegment pool, Persistence persistence, Media media, MappingHold hold, int blockSize,
                Arena[] arenas, int lanes, UUID poolset, List<String> notes) {
        this.pool = pool;
        this.hold = hold != null ? hold : new MappingHold(pool, lanes);
        this.persistence = persistence;
        this.media = media != null ? media : new Media() {
            @Override
            public void read(long poolOffset, MemorySegment dst, long dstOffset, long length) {
                MemorySegment.copy(pool, poolOffset, dst, dstOffset, length);
            }

            @Override
            public void beforeStore(long poolOffset, long length) {
            }
        };
        this.pmem = persistence.flushesCaches();
        this.blockSize = blockSize;
        this.arenas = arenas;
        long n = 0;
        for (Arena a : arenas) {
            n += a.externalNlba;
        }
        this.blocks = n;
        this.lanes = lanes;
        this.laneBusy = new int[lanes * PAD];
        this.poolsetUuid = poolset;
        this.notes = List.copyOf(notes);
        this.laneHandles = new Lane[lanes];
        for (int i = 0; i < lanes; i++) {
            laneHandles[i] = new Lane(i);
        }
    }

    /** The external block (sector) size: 512 or 4096. */
    public int blockSize() {
        return blockSize;
    }

    /** External blocks: the device's capacity in blocks. */
    public long blocks() {
        return blocks;
    }

    public int lanes() {
        return lanes;
    }

    public int arenaCount() {
        return arenas.length;
    }

    /** Spare blocks over all arenas (nfree each): the capacity a BTT costs beyond its map and flog. */
    public int freeBlocks() {
        int n = 0;
        for (Arena a : arenas) {
            n += a.nfree;
        }
        return n;
    }

    /** The size of a data-area slot (an internal block), the same in every arena pmemblk lays out. */
    public int internalBlockSize() {
        return arenas[0].internalLbaSize;
    }

    /** The pool's poolset UUID, which every arena's parent_uuid repeats. */
    public UUID poolsetUuid() {
        return poolsetUuid;
    }

    /** What {@link #open} repaired or found (a primary info block restored from its backup, a flog rolled forward). */
    public List<String> notes() {
        return notes;
    }

    // ------------------------------------------------------------------------------------------------ format/open

    /**
     * Lays out a fresh PMDK pmemblk pool with one BTT over all of {@code pool} (the whole pool file, mapped), as
     * {@code pmempool create -w blk SIZE} would, then opens it. Whatever the pool held is gone (blocks read as
     * zeros). The pool header goes last and durably: a crash while formatting leaves no pool, never half of one.
     *
     * @param sectorSize 512 or 4096
     * @param lanes      1..256: callers that may run at once, each with its own lane (queue index)
     */
    public static Btt format(MemorySegment pool, Persistence persistence, int sectorSize, int lanes) throws IOException {
        if (!SECTOR_SIZES.contains(sectorSize)) {
            throw new IllegalArgumentException("pmem.sector-size " + sectorSize + " is not supported; allowed: "
                    + SECTOR_SIZES);
        }
        checkLanes(lanes, NFREE);
        String arch = System.getProperty("os.arch");
        if (!"amd64".equals(arch) && !"x86_64".equals(arch)) {
            throw new IOException("a PMDK pool is laid out here only for x86-64 (PMEM_PAGESIZE 4096, the arch_flags"
                    + " of PMDK 1.12 on x86-64), not for " + arch);
        }
        long size = pool.byteSize();
        if (size < BTT_OFFSET + ARENA_MIN_SIZE || (size - BTT_OFFSET) % ALIGNMENT != 0) {
            throw new IOException("a pmemblk pool of " + size + " bytes cannot hold a BTT: the size must be at least "
                    + (BTT_OFFSET + ARENA_MIN_SIZE) + " (8 KiB of pool header + a 16 MiB arena) and a multiple of "
                    + ALIGNMENT);
        }
        UUID poolset = UUID.randomUUID(), uuid = UUID.randomUUID();
        MemorySegment hdr = pool.asSlice(0, POOL_HDR_SIZE);
        // First the old header goes, durably: from here until the new one is written nothing is a pool.
        hdr.fill((byte) 0);
        persistRange(persistence, hdr);
        writeLayout(pool, persistence, sectorSize, poolset);

        MemorySegment blk = pool.asSlice(POOL_HDR_SIZE, BTT_OFFSET - POOL_HDR_SIZE);
        blk.fill((byte) 0); // is_zeroed 0: the data area was not zeroed, which only PMDK's lazy layout would use
        blk.set(U32, BLK_BSIZE - POOL_HDR_SIZE, sectorSize);
        persistRange(persistence, blk);

        hdr.asSlice(HDR_SIGNATURE).copyFrom(MemorySegment.ofArray(HDR_SIGNATURE_BYTES));
        hdr.set(U32, HDR_MAJOR, BLK_FORMAT_MAJOR);
        // PMDK 1.12's defaults on x86-64 (pool_hdr.h POOL_FEAT_*_DEFAULT), as pmempool create writes them.
        hdr.set(U32, HDR_COMPAT, FEAT_CHECK_BAD_BLOCKS);
        hdr.set(U32, HDR_INCOMPAT, FEAT_CKSUM_2K | FEAT_SDS);
        hdr.set(U32, HDR_RO_COMPAT, 0);
        putUuid(hdr, HDR_POOLSET_UUID, poolset);
        // One part, one replica: every link points to the part itself (set.c util_header_create).
        for (int at : new int[]{HDR_UUID, HDR_PREV_PART_UUID, HDR_NEXT_PART_UUID, HDR_PREV_REPL_UUID, HDR_NEXT_REPL_UUID}) {
            putUuid(hdr, at, uuid);
        }
        hdr.set(U64, HDR_CRTIME, System.currentTimeMillis() / 1000);
        hdr.set(U64, HDR_ARCH_FLAGS, ARCH_ALIGNMENT_DESC);
        hdr.set(ValueLayout.JAVA_BYTE, HDR_ARCH_FLAGS + ARCH_CLASS_AT, (byte) ARCH_MACHINE_CLASS);
        hdr.set(ValueLayout.JAVA_BYTE, HDR_ARCH_FLAGS + ARCH_DATA_AT, (byte) ARCH_DATA_LE);
        hdr.set(U16, HDR_ARCH_FLAGS + ARCH_MACHINE_AT, (short) ARCH_MACHINE_X86_64);
        // sds stays zero: PMDK reads a zeroed shutdown state as "clean, initialise" (shutdown_state_check).
        hdr.set(U64, HDR_CHECKSUM, checksum(hdr, 0, POOL_HDR_SIZE, HDR_CHECKSUM, HDR_UNUSED2));
        persistRange(persistence, hdr);
        return open(pool, persistence, lanes);
    }

    /**
     * The BTT layout PMDK write_layout writes: per arena a zeroed map (every entry initial), the initial flog
     * (lane i holds block external_nlba+i, with the ZERO flag as PMDK writes it), then the info block and its backup.
     */
    private static void writeLayout(MemorySegment pool, Persistence persistence, int sectorSize, UUID poolset)
            throws IOException {
        UUID uuid = UUID.randomUUID();
        long at = BTT_OFFSET;
        for (BttLayout.Arena g : arenas(pool.byteSize() - BTT_OFFSET, sectorSize)) {
            MemorySegment map = pool.asSlice(at + g.mapOff(), mapSize(g.externalNlba()));
            map.fill((byte) 0);
            persistRange(persistence, map);
            MemorySegment flog = pool.asSlice(at + g.flogOff(), flogSize(g.nfree()));
            flog.fill((byte) 0);
            for (int i = 0; i < g.nfree(); i++) {
                long p = (long) i * FLOG_PAIR_SIZE;
                flog.set(U32, p + FLOG_LBA, i);
                flog.set(U32, p + FLOG_OLD_MAP, (g.externalNlba() + i) | MAP_ZERO);
                flog.set(U32, p + FLOG_NEW_MAP, (g.externalNlba() + i) | MAP_ZERO);
                flog.set(U32, p + FLOG_SEQ, 1);
            }
            persistRange(persistence, flog);
            MemorySegment info = pool.asSlice(at, INFO_SIZE);
            info.fill((byte) 0);
            info.asSlice(INFO_SIG).copyFrom(MemorySegment.ofArray(INFO_SIGNATURE));
            putUuid(info, INFO_UUID, uuid);
            putUuid(info, INFO_PARENT_UUID, poolset);
            info.set(U16, INFO_MAJOR, (short) MAJOR);
            info.set(U16, INFO_MINOR, (short) MINOR);
            info.set(U32, INFO_EXTERNAL_LBASIZE, g.externalLbaSize());
            info.set(U32, INFO_EXTERNAL_NLBA, g.externalNlba());
            info.set(U32, INFO_INTERNAL_LBASIZE, g.internalLbaSize());
            info.set(U32, INFO_INTERNAL_NLBA, g.internalNlba());
            info.set(U32, INFO_NFREE, g.nfree());
            info.set(U32, INFO_INFOSIZE, INFO_SIZE);
            info.set(U64, INFO_NEXTOFF, g.nextOff());
            info.set(U64, INFO_DATAOFF, g.dataOff());
            info.set(U64, INFO_MAPOFF, g.mapOff());
            info.set(U64, INFO_FLOGOFF, g.flogOff());
            info.set(U64, INFO_INFOOFF, g.infoOff());
            info.set(U64, INFO_CHECKSUM, checksum(info, 0, INFO_SIZE, INFO_CHECKSUM, INFO_SIZE));
            // PMDK writes the primary first; either order works, as a reader needs only one valid copy.
            persistRange(persistence, info);
            MemorySegment backup = pool.asSlice(at + g.infoOff(), INFO_SIZE);
            backup.copyFrom(info);
            persistRange(persistence, backup);
            at += g.size();
        }
    }

    /**
     * Opens the BTT of a PMDK pmemblk pool ({@code pool} is the whole pool file, mapped): checks the pool header
     * and every arena's info block (a damaged primary is restored from its backup), then recovers every flog lane:
     * a swap whose flog entry is durable and whose map store is not is completed. A pool with no BTT laid out yet
     * ({@code pmempool create blk} without {@code -w}) is laid out here, as PMDK does at the first write.
     *
     * @throws IOException naming what is wrong with the pool and what is served
     */
    public static Btt open(MemorySegment pool, Persistence persistence, int lanes) throws IOException {
        return open(pool, persistence, lanes, null);
    }

    /**
     * As {@link #open(MemorySegment, Persistence, int)}, with data blocks read and stored through {@code media} (a
     * served region's guarded accesses; null: plain copies).
     */
    public static Btt open(MemorySegment pool, Persistence persistence, int lanes, Media media) throws IOException {
        return open(pool, persistence, lanes, media, null);
    }

    /**
     * As {@link #open(MemorySegment, Persistence, int, Media)}, with groups holding the mapping through its
     * owner's {@code hold} (null: a hold of this BTT's own, for a mapping whose owner closes it only after this).
     */
    public static Btt open(MemorySegment pool, Persistence persistence, int lanes, Media media, MappingHold hold)
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
                info.copyFrom(copy);
                persistRange(persistence, info);
                notes.add("arena " + arenas.size() + ": the info block " + why + "; restored from its backup at pool"
                        + " offset " + backup);
                LOG.log(System.Logger.Level.WARNING, notes.getLast());
            }
            checkLanes(lanes, info.get(U32, INFO_NFREE));
            Arena a = new Arena(arenas.size(), primary, info, firstLba, lanes);
            recover(pool, persistence, a, notes);
            arenas.add(a);
            firstLba += a.externalNlba;
            long nextOff = info.get(U64, INFO_NEXTOFF);
            if (nextOff == 0) {
                break;
            }
            off += nextOff;
            left -= nextOff;
        }
        return new Btt(pool, persistence, media, hold, bsize, arenas.toArray(Arena[]::new), lanes, poolset, notes);
    }

    /**
     * What a pool holds, read without writing a byte (no recovery, no repair, no lazy layout): for {@code pmemblk
     * info}, which may look at a pool a server has open.
     *
     * @param blockSize  the pool's block size (0 when its header is not a pmemblk pool's)
     * @param blocks     external blocks of the arenas read (the capacity in blocks)
     * @param arenas     arenas whose info block (or its backup) is valid
     * @param freeBlocks spare blocks (nfree) over those arenas
     * @param problem    why the pool cannot be served as it is, null when it can; a pool without a BTT laid out yet
     *                   is servable (the first open lays it out)
     */
    public record Summary(int blockSize, long blocks, int arenas, int freeBlocks, int internalBlockSize, String problem) {}

    /** Reads {@code pool}'s header and arena info blocks ({@link Summary}). */
    public static Summary summarize(MemorySegment pool) {
        return summarize(pool, false);
    }

    /**
     * Why {@code pool} is not a COMPLETE BTT, one that {@link #open} serves without writing any byte outside its
     * own flog recovery: a valid pool header, arena 0 laid out, and every arena's primary info block valid (not
     * restored from a backup, not laid out lazily as for {@code pmempool create blk} without -w); null when it is.
     * For a device nobody recorded as a BTT: only what is wholly a BTT is taken for one on the operator's word,
     * since laying one out or "restoring" an info block would write over what may be a raw device's data.
     */
    public static String incomplete(MemorySegment pool) {
        Summary s = summarize(pool, true);
        return s.problem() != null ? s.problem() : s.arenas() == 0 ? "no BTT is laid out (arena 0's info blocks are zero)" : null;
    }

    /**
     * The pool header's uuid (the pool's identity, which {@link #format} draws at random), or null when {@code
     * pool} does not start with a valid pmemblk pool header.
     */
    public static UUID poolUuid(MemorySegment pool) {
        if (pool.byteSize() < POOL_HDR_SIZE || invalidPoolHeader(pool.asSlice(0, POOL_HDR_SIZE)) != null) {
            return null;
        }
        return getUuid(pool.asSlice(0, POOL_HDR_SIZE), HDR_UUID);
    }

    /** {@link #summarize(MemorySegment)}; {@code strict}: an invalid primary info block is a problem even with a valid backup. */
    private static Summary summarize(MemorySegment pool, boolean strict) {
        if (pool.byteSize() < BTT_OFFSET + ARENA_MIN_SIZE) {
            return new Summary(0, 0, 0, 0, 0, pool.byteSize() + " bytes, too small for a BTT");
        }
        MemorySegment hdr = pool.asSlice(0, POOL_HDR_SIZE);
        String bad = invalidPoolHeader(hdr);
        if (bad != null) {
            return new Summary(0, 0, 0, 0, 0, "pool header: " + bad);
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
                    return new Summary(bsize, 0, 0, 0, 0, null); // laid out at the first open
                }
                if (invalidInfo(backup, left, poolset, bsize) != null) {
                    return new Summary(bsize, blocks, arenas, free, internal, "arena " + arenas + ": the info block "
                            + why + ", and so does its backup");
                }
                if (strict) {
                    return new Summary(bsize, blocks, arenas, free, internal, "arena " + arenas + ": the info block "
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
        return new Summary(bsize, blocks, arenas, free, internal, null);
    }

    /**
     * Where the backup info block of the arena at BTT offset {@code off} is, in the pool: pmempool check's rule
     * (check_btt_info.c), trusted even when the primary is not.
     */
    private static long backupAt(long off, long rawSize) {
        return BTT_OFFSET + Math.min(off + ARENA_MAX_SIZE, rawSize & ~(long) (ALIGNMENT - 1)) - INFO_SIZE;
    }

    private static void checkLanes(int lanes, int nfree) {
        if (lanes < 1 || lanes > nfree) {
            throw new IllegalArgumentException("lanes " + lanes + " is out of range: 1.." + nfree
                    + " (one per queue; the BTT has " + nfree + " free blocks per arena)");
        }
    }

    /** Why {@code hdr} is not a single-file PMDK pmemblk pool header served here, or null. */
    private static String invalidPoolHeader(MemorySegment hdr) {
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
        long arenaEnd = next != 0 ? next : room;
        boolean inside = data >= INFO_SIZE && map >= data + internalNlba * in && flog >= map + externalNlba * MAP_ENTRY_SIZE
                && backup >= flog + nfree * FLOG_PAIR_SIZE && backup + INFO_SIZE <= arenaEnd;
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
     * flog (no flags) recovers too. An invalid seq pair makes the arena read-only, as PMDK does.
     */
    private static void recover(MemorySegment pool, Persistence persistence, Arena a, List<String> notes)
            throws IOException {
        for (int lane = 0; lane < a.nfree; lane++) {
            long pair = a.pairAt(lane);
            int seq0 = pool.get(U32, pair + FLOG_SEQ), seq1 = pool.get(U32, pair + FLOG_ENTRY_SIZE + FLOG_SEQ);
            int slot = currentSlot(seq0, seq1);
            if (slot < 0) {
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
            a.free[lane] = oldMap;
            a.seq[lane] = slot == 0 ? seq0 : seq1;
            a.next[lane] = 1 - slot;
            if (oldMap == newMap) {
                continue; // the initial entry: nothing was swapped
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

    // ------------------------------------------------------------------------------------------------ the hot path

    /** Copies external block {@code lba} into {@code dst} ({@link #blockSize()} bytes); a ZERO or initial block reads as zeros. */
    public void read(int lane, long lba, MemorySegment dst) throws IOException {
        try (Lane l = entered(lane)) {
            l.read(lba, dst);
        }
    }

    private void readOn(int lane, long lba, MemorySegment dst) throws IOException {
        Arena a = arenaOf(lba);
        long mapAt = a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE;
        int entry = (int) INT.getVolatile(pool, mapAt);
        int slot = lane * PAD;
        while (true) {
            if (isError(entry)) {
                throw markedBad(lba);
            }
            if (isZeroOrInitial(entry)) {
                dst.fill((byte) 0);
                return;
            }
            if ((entry & MAP_LBA_MASK) >= a.internalNlba) { // a corrupt map must not read the map or flog as data
                throw new IOException("block " + lba + " maps to internal block " + (entry & MAP_LBA_MASK)
                        + ", beyond the arena's " + a.internalNlba + ": the map is corrupt (`pmempool check`)");
            }
            // Publish, then look again: a writer that remapped the LBA before it saw this slot may reuse the
            // block, so only a map entry still unchanged after the publish makes the copy safe (volatile: the
            // store must not pass the load).
            ARRAY.setVolatile(a.rtt, slot, entry);
            int again = (int) INT.getVolatile(pool, mapAt);
            if (again != entry) {
                entry = again;
                continue;
            }
            try {
                media.read(a.dataOff + (long) (entry & MAP_LBA_MASK) * a.internalLbaSize, dst, 0, blockSize);
            } finally {
                ARRAY.setRelease(a.rtt, slot, RTT_EMPTY);
            }
            return;
        }
    }

    /**
     * Writes {@code src} ({@link #blockSize()} bytes) to external block {@code lba}, atomically: after a crash at any
     * point the block reads wholly as before or wholly as {@code src}; once this returns, {@code src} is durable.
     */
    public void write(int lane, long lba, MemorySegment src) throws IOException {
        try (Lane l = entered(lane)) {
            l.write(lba, src);
        }
    }

    private void writeOn(int lane, long lba, MemorySegment src) throws IOException {
        Arena a = arenaOf(lba);
        refuseIfReadOnly(a, lba);
        int premap = (int) (lba - a.firstLba);
        int freeBlock = a.free[lane] & MAP_LBA_MASK;
        int freeEntry = freeBlock | MAP_NORMAL;
        waitForReaders(a, freeEntry);
        long dataAt = a.dataOff + (long) freeBlock * a.internalLbaSize;
        media.beforeStore(dataAt, blockSize); // a bad free block: this write fails, nothing of the BTT changed
        MemorySegment dst = pool.asSlice(dataAt, blockSize);
        persistence.copy(src, dst);
        try {
            if (pmem) {
                persistence.drain();
            } else {
                persistence.sync(dst);
            }
            long mapAt = a.mapOff + (long) premap * MAP_ENTRY_SIZE;
            int lock = lockMap(a, premap);
            try {
                int old = (int) INT.getVolatile(pool, mapAt);
                if (isInitial(old)) {
                    old = premap | MAP_NORMAL; // as PMDK map_lock: an initial entry maps the LBA to itself
                }
                logSwap(a, lane, premap, old, freeEntry);
                INT.setVolatile(pool, mapAt, freeEntry);
                persist(mapAt, MAP_ENTRY_SIZE);
            } finally {
                ARRAY.setRelease(a.mapLocks, lock, 0);
            }
        } catch (IOException | RuntimeException e) {
            writeFailure = "a persistence step of a write to block " + lba + " failed (" + e.getMessage() + ")";
            throw e;
        }
    }

    /**
     * TRIM / WRITE_ZEROES of one block: the map entry gets the ZERO flag (PMDK map_entry_setf), one durable 4-byte
     * store; the block stays mapped, so no flog entry is needed. An already zero (or initial) block is left alone.
     */
    public void zero(int lane, long lba) throws IOException {
        try (Lane l = entered(lane)) {
            l.zero(lba);
        }
    }

    private void zeroOn(int lane, long lba) throws IOException {
        Arena a = arenaOf(lba);
        refuseIfReadOnly(a, lba);
        int premap = (int) (lba - a.firstLba);
        long mapAt = a.mapOff + (long) premap * MAP_ENTRY_SIZE;
        int lock = lockMap(a, premap);
        try {
            int old = (int) INT.getVolatile(pool, mapAt);
            if (isZeroOrInitial(old)) {
                return;
            }
            INT.setVolatile(pool, mapAt, (old & MAP_LBA_MASK) | MAP_ZERO);
            persist(mapAt, MAP_ENTRY_SIZE);
        } catch (IOException | RuntimeException e) {
            writeFailure = "a persistence step of a zeroing of block " + lba + " failed (" + e.getMessage() + ")";
            throw e;
        } finally {
            ARRAY.setRelease(a.mapLocks, lock, 0);
        }
    }

    /**
     * A lane held by one caller ({@link #claim}) until {@link #close}: its reads, writes and zeroings, as the
     * methods of the same names on {@link Btt} without entering the lane for each block.
     */
    public final class Lane implements AutoCloseable {
        private final int index;
        /** Made with the lane at open, so a caller's group allocates nothing: only the lane's holder uses it. */
        private final Group group;

        private Lane(int index) {
            this.index = index;
            this.group = new Group(index);
        }

        /**
         * This lane's group: block writes run in lockstep on this lane and on lanes the group claims as it grows
         * ({@link Group#add}), given back when this lane is closed.
         */
        public Group group() {
            return group;
        }

        public int index() {
            return index;
        }

        public void read(long lba, MemorySegment dst) throws IOException {
            checkBuffer(dst);
            readOn(index, lba, dst);
        }

        /**
         * Loads block {@code lba}'s map entry with a plain load and returns it (meaningless, but the caller keeps
         * it so the load stays): a caller about to read several random blocks loads all their entries first, so
         * that their cache misses overlap instead of each stalling its own read. Out of range: 0, nothing loaded.
         */
        public int touchMap(long lba) {
            if (lba < 0 || lba >= blocks) {
                return 0;
            }
            Arena a = arenaOf(lba);
            return (int) INT.get(pool, a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE);
        }

        public void write(long lba, MemorySegment src) throws IOException {
            checkBuffer(src);
            writeOn(index, lba, src);
        }

        public void zero(long lba) throws IOException {
            zeroOn(index, lba);
        }

        /** Gives the lane back, and the lanes its group claimed; blocks added to the group and not committed are dropped. */
        @Override
        public void close() {
            group.clear();
            group.releaseLanes();
            leave(index);
        }
    }

    /**
     * Block writes run in lockstep, each on a lane of its own (the class comment of {@link Btt}): a lane's holder adds blocks
     * ({@link #add}, {@link #source}), then {@link #commit}s them, reads what became of each ({@link #failure}) and
     * {@link #clear}s the group for the next ones. Per block the steps and their order are exactly those of
     * {@link Btt#write}, each durable before the block's next step; only the drains are shared:
     * <ol>
     *   <li>read tracking for every free block, then per block the bad-block check and the data copy; one drain;</li>
     *   <li>the map locks of all blocks, sorted by (arena, lock) and taken once each, so two groups (or a group and
     *       a single write) never wait on each other in a cycle; held from reading the old map entries to the
     *       map stores' drain, as a single write holds its one;</li>
     *   <li>every flog entry's first half {lba, old_map}, each written back; one drain;</li>
     *   <li>every seq half {new_map, seq}, each written back; one drain;</li>
     *   <li>every map entry, each written back; one drain. Only now is any block of the group committed.</li>
     * </ol>
     * Elsewhere than pmem each step's ranges are msynced instead of the drain, one msync each.
     *
     * <p>Two blocks of one LBA are never in one group ({@link #add} refuses the second): the later must read the
     * earlier's map entry as its old entry, so it goes in the next group. Blocks of different LBAs that share a map
     * lock (LBAs {@code MAP_LOCKS} apart) take it once.
     *
     * <p>Failures: a block refused before its data is stored (arena read-only, writes stopped, a bad free block,
     * its source unreadable) fails alone, and changes nothing of the BTT. A persistence step that fails fails
     * every block of the group not committed yet and stops writes ({@code writeFailure}), as for a single write;
     * the group still releases its locks, and nothing is thrown: each block's fate is its {@link #failure}.
     *
     * <p>Nothing is allocated: the arrays are made with the lane at open; the lanes claimed as the group grows
     * stay held across commits until the lane's {@link Lane#close}.
     */
    public final class Group {
        private final int capacity;
        /** Per slot: the lane it writes through; slot 0's is the owner's lane, the next ones claimed by {@link #add}. */
        private final int[] lane;
        /** Lanes held: lane[0..held). */
        private int held = 1;
        private int size;
        /** Set when a lane could not be claimed: this group grows no more until it is cleared (no rescans of busy lanes). */
        private boolean starved;
        private final long[] lba;
        private final int[] tag;
        private final MemorySegment[] src;
        private final long[] srcOff;
        private final Arena[] arena;
        private final int[] premap, freeEntry, oldEntry;
        private final long[] dataAt, flogAt, mapAt;
        /** The mapping as the group's copies and write-backs see it while it holds it ({@link #enter}), else null. */
        private MemorySegment view;
        /** The map locks to take: (arena index << 32 | lock index), sorted and without repeats. */
        private final long[] lockKey;
        private final Throwable[] failure;

        private Group(int ownerLane) {
            this.capacity = Math.min(GROUP_BLOCKS, lanes);
            this.lane = new int[capacity];
            this.lane[0] = ownerLane;
            this.lba = new long[capacity];
            this.tag = new int[capacity];
            this.src = new MemorySegment[capacity];
            this.srcOff = new long[capacity];
            this.arena = new Arena[capacity];
            this.premap = new int[capacity];
            this.freeEntry = new int[capacity];
            this.oldEntry = new int[capacity];
            this.dataAt = new long[capacity];
            this.flogAt = new long[capacity];
            this.mapAt = new long[capacity];
            this.lockKey = new long[capacity];
            this.failure = new Throwable[capacity];
        }

        /** Blocks a group holds at most. */
        public int capacity() {
            return capacity;
        }

        /** Blocks added since the last {@link #clear}. */
        public int size() {
            return size;
        }

        /**
         * Adds a write of external block {@code lba}, whose source the caller gives next ({@link #source}); the
         * slot, or -1 when the group must be committed (and cleared) first: it is full, no other lane is free for
         * another block, or {@code lba} is in it already. An empty group always takes the block.
         *
         * @param tag the caller's, given back by {@link #tag} (which request the block is of)
         * @throws IllegalArgumentException when {@code lba} is out of range
         */
        public int add(long lba, int tag) {
            if (size == capacity) {
                return -1;
            }
            for (int s = 0; s < size; s++) {
                if (this.lba[s] == lba) {
                    return -1; // its order with the earlier block matters: the next group
                }
            }
            Arena a = arenaOf(lba);
            if (size == held) {
                if (starved) {
                    return -1;
                }
                int l = tryClaim(lane[held - 1] + 1, false);
                if (l < 0) {
                    starved = true; // smaller than asked: every other lane is held by another caller
                    return -1;
                }
                lane[held++] = l;
            }
            int s = size++;
            this.lba[s] = lba;
            this.tag[s] = tag;
            arena[s] = a;
            premap[s] = (int) (lba - a.firstLba);
            failure[s] = null;
            src[s] = null;
            return s;
        }

        /** The slot's data: {@link Btt#blockSize()} bytes of {@code memory} from {@code offset}, read at the commit. */
        public void source(int slot, MemorySegment memory, long offset) {
            check(slot);
            src[slot] = memory;
            srcOff[slot] = offset;
        }

        /** Fails the slot before the commit (its source could not be given): it is not written, and reports {@code why}. */
        public void fail(int slot, Throwable why) {
            check(slot);
            failure[slot] = why;
        }

        /** The lane the slot writes through, to which a caller's per-lane buffers belong while the group holds it. */
        public int lane(int slot) {
            check(slot);
            return lane[slot];
        }

        public int tag(int slot) {
            check(slot);
            return tag[slot];
        }

        /** After {@link #commit}: null when the slot's block is written and durable, else why it is not. */
        public Throwable failure(int slot) {
            check(slot);
            return failure[slot];
        }

        /** Empties the group (its lanes stay held). */
        public void clear() {
            for (int s = 0; s < size; s++) {
                src[s] = null; // the caller's memory is not kept past its request
                failure[s] = null;
                arena[s] = null;
            }
            size = 0;
            starved = false;
        }

        /** Gives back the lanes claimed as the group grew (not the owner's). */
        private void releaseLanes() {
            for (int i = 1; i < held; i++) {
                leave(lane[i]);
            }
            held = 1;
        }

        private void check(int slot) {
            if (slot < 0 || slot >= size) {
                throw new IndexOutOfBoundsException("slot " + slot + " of a group of " + size);
            }
        }

        /** Writes every block added and not failed, in lockstep (the class comment); never throws. */
        public void commit() {
            if (begin() == 0) {
                return;
            }
            // Stage 1: the data, each block's checks before its store as in writeOn; a block refused here fails
            // alone, its lane's free block unchanged.
            storeByCpuThenCommit(true);
        }

        /**
         * The first half of a commit whose data someone else stores (a DMA engine): the checks, the read tracking
         * and each block's bad-block check, exactly as {@link #commit} before its copies. Then every slot still
         * {@link #live} has its free block chosen, at {@link #dataOffset}; the caller has the data stored there
         * and calls {@link #commitDeviceStored} (or, when the device failed, {@link #commitByCpu}). Nothing of the
         * BTT changes before that: a slot's free block belongs to its lane, which the group holds until its lane
         * is closed, so no other writer stores into it meanwhile, and no reader reads it (it is mapped nowhere).
         * Blocks may not be added between this and the commit.
         *
         * @return the slots still live (0: nothing to store, and no commit is needed)
         */
        public int prepareStores() {
            int n = size;
            int live = begin();
            if (live == 0) {
                return 0;
            }
            for (int s = 0; s < n; s++) {
                if (failure[s] != null) {
                    continue;
                }
                try {
                    media.beforeStore(dataAt[s], blockSize);
                } catch (Throwable t) {
                    failure[s] = t;
                    live--;
                }
            }
            return live;
        }

        /** After {@link #prepareStores}: whether the slot is still to be written (no failure so far). */
        public boolean live(int slot) {
            check(slot);
            return failure[slot] == null;
        }

        /** After {@link #prepareStores}: where in the pool mapping the live slot's data goes ({@link #blockSize} bytes). */
        public long dataOffset(int slot) {
            check(slot);
            return dataAt[slot];
        }

        /**
         * The rest of a commit after {@link #prepareStores}, once a device has stored every live slot's data and
         * reported it: the data is made durable first (on pmem every block's lines written back, then one drain,
         * here, on the calling thread: with DDIO a device's stores sit in the CPU cache, and a drain covers only
         * write-backs this thread issued; elsewhere an msync of each block), then the flog, seq and map stages as
         * in {@link #commit}. Never throws; each slot's fate is its {@link #failure}.
         */
        public void commitDeviceStored() {
            if (enter()) {
                try {
                    commitStored(size, true);
                } finally {
                    exit();
                }
            }
        }

        /**
         * As {@link #commitDeviceStored}, after the device failed to store (some of) the data: every live slot's
         * data is copied by the CPU from its {@link #source} first (the same bytes again where the device had
         * stored them: the blocks are free, nobody reads them).
         */
        public void commitByCpu() {
            storeByCpuThenCommit(false); // the bad-block checks ran when the group was placed
        }

        /**
         * Stage 1 by the CPU: every live slot's data copied from its source into its free block, after the
         * bad-block check when {@code check}; a slot whose store fails fails alone. Then the durable stages, when
         * any slot is left.
         */
        private void storeByCpuThenCommit(boolean check) {
            if (!enter()) {
                return;
            }
            try {
                storeByCpuThenCommitHeld(check);
            } finally {
                exit();
            }
        }

        private void storeByCpuThenCommitHeld(boolean check) {
            int n = size;
            int live = 0;
            // On pmem one check for the group's copies, not one a copy (Persistence.beginRun). Elsewhere each copy
            // keeps its own round trip, so that a fault fails its block alone; msync dominates there anyway.
            boolean run = pmem && persistence.beginRun();
            for (int s = 0; s < n; s++) {
                if (failure[s] != null) {
                    continue;
                }
                try {
                    if (check) {
                        media.beforeStore(dataAt[s], blockSize);
                    }
                    MemorySegment from = src[s].asSlice(srcOff[s], blockSize), to = view.asSlice(dataAt[s], blockSize);
                    if (run) {
                        persistence.copyInRun(from, to);
                    } else {
                        persistence.copy(from, to);
                    }
                    live++;
                } catch (Throwable t) {
                    failure[s] = t;
                }
            }
            if (run) {
                try {
                    persistence.endRun();
                } catch (Throwable t) { // a fault in one of the run's copies, not known which: all of them fail
                    for (int s = 0; s < n; s++) {
                        if (failure[s] == null) {
                            failure[s] = t;
                        }
                    }
                    live = 0;
                }
            }
            if (live > 0) {
                commitStored(n, false);
            }
        }

        /**
         * The checks before stage 1: a slot without a source, or in a read-only arena, fails; the others get their
         * lane's free block, and their map entry's place; then the read tracking. The live slots.
         */
        private int begin() {
            int n = size;
            int live = 0;
            for (int s = 0; s < n; s++) {
                if (failure[s] != null) {
                    continue;
                }
                if (src[s] == null) {
                    failure[s] = new IllegalStateException("block " + lba[s] + " was added without its source");
                    continue;
                }
                Arena a = arena[s];
                try {
                    refuseIfReadOnly(a, lba[s]);
                } catch (IOException e) {
                    failure[s] = e;
                    continue;
                }
                int freeBlock = a.free[lane[s]] & MAP_LBA_MASK;
                freeEntry[s] = freeBlock | MAP_NORMAL;
                dataAt[s] = a.dataOff + (long) freeBlock * a.internalLbaSize;
                mapAt[s] = a.mapOff + (long) premap[s] * MAP_ENTRY_SIZE;
                live++;
            }
            if (live > 0) {
                waitForReaders();
            }
            return live;
        }

        /**
         * Stages 1 (its durability) to 4 for the live slots, whose data is stored: by this thread's copies, or by a
         * device ({@code deviceStored}: its lines are written back here first, on pmem).
         */
        private void commitStored(int n, boolean deviceStored) {
            int locked = 0;
            try {
                if (deviceStored && pmem) {
                    // A device's stores are not this thread's: without these write-backs the drain below would
                    // not cover them, and a crash could keep the map entry and lose the data it points at.
                    for (int s = 0; s < n; s++) {
                        if (failure[s] == null) {
                            writeBack(dataAt[s], blockSize);
                        }
                    }
                }
                durable(dataAt, 0, blockSize);
                int keys = lockKeys();
                for (; locked < keys; locked++) {
                    lock(arenas[(int) (lockKey[locked] >>> 32)], (int) lockKey[locked]);
                }
                // Each stage stores all its words first, then writes all their lines back, then drains once. The
                // order matters on x86: a write-back (clwb/clflushopt) is ordered by any later locked instruction
                // or MFENCE, which waits for it to complete, and a volatile store is one. Interleaved with volatile
                // stores the write-backs would not overlap and each would cost a round trip. So the stores here
                // are release stores (ordered after what came before, no fence), and the loads of all old map
                // entries come first, so their cache misses overlap too.
                // Stage 2: the flog entries' first halves {lba, old_map}, in each lane's non-current slot.
                for (int s = 0; s < n; s++) {
                    if (failure[s] != null) {
                        continue;
                    }
                    Arena a = arena[s];
                    int l = lane[s];
                    int old = (int) INT.getVolatile(pool, mapAt[s]);
                    if (isInitial(old)) {
                        old = premap[s] | MAP_NORMAL; // as writeOn
                    }
                    oldEntry[s] = old;
                    flogAt[s] = a.pairAt(l) + (long) a.next[l] * FLOG_ENTRY_SIZE;
                }
                for (int s = 0; s < n; s++) {
                    if (failure[s] == null) {
                        LONG.setRelease(pool, flogAt[s] + FLOG_LBA, (premap[s] & 0xFFFF_FFFFL) | ((long) oldEntry[s] << 32));
                    }
                }
                writeBackFlog(FLOG_LBA);
                durable(flogAt, FLOG_LBA, 8);
                // Stage 3: the seq halves {new_map, seq}: each makes its lane's entry current.
                for (int s = 0; s < n; s++) {
                    if (failure[s] == null) {
                        int seq = nextSeq(arena[s].seq[lane[s]]);
                        LONG.setRelease(pool, flogAt[s] + FLOG_NEW_MAP, (freeEntry[s] & 0xFFFF_FFFFL) | ((long) seq << 32));
                    }
                }
                writeBackFlog(FLOG_NEW_MAP);
                durable(flogAt, FLOG_NEW_MAP, 8);
                for (int s = 0; s < n; s++) {
                    if (failure[s] != null) {
                        continue;
                    }
                    Arena a = arena[s];
                    int l = lane[s];
                    a.next[l] = 1 - a.next[l];
                    a.seq[l] = nextSeq(a.seq[l]);
                    a.free[l] = oldEntry[s];
                }
                // Stage 4: the map entries, the commit of each block. One full fence after all of them gives what
                // the single write's volatile map store gives: the store is seen before this thread's later loads
                // of the read-tracking table (a reader that published the old block re-reads the map).
                for (int s = 0; s < n; s++) {
                    if (failure[s] == null) {
                        INT.setRelease(pool, mapAt[s], freeEntry[s]);
                    }
                }
                VarHandle.fullFence();
                for (int s = 0; s < n; s++) {
                    if (failure[s] == null) {
                        writeBack(mapAt[s], MAP_ENTRY_SIZE);
                    }
                }
                durable(mapAt, 0, MAP_ENTRY_SIZE);
            } catch (Throwable t) {
                // Whatever was thrown (an Error too): a lane's flog state on the media is not known any more, so
                // writes stop, as after a single write's failed step. No block of the group is committed.
                long first = -1;
                int live = 0;
                for (int s = 0; s < n; s++) {
                    if (failure[s] == null) {
                        first = first < 0 ? lba[s] : first;
                        failure[s] = t;
                        live++;
                    }
                }
                writeFailure = "a persistence step of a write to block " + first + " (one of " + live + " written"
                        + " together) failed (" + t.getMessage() + ")";
            } finally {
                for (int i = 0; i < locked; i++) {
                    ARRAY.setRelease(arenas[(int) (lockKey[i] >>> 32)].mapLocks, (int) lockKey[i], 0);
                }
            }
        }

        /**
         * Waits while a reader still copies one of the free blocks (the single write's waitForReaders for all of
         * them): each lane's RTT slot is loaded once per arena and compared with every block. One look at a
         * slot suffices, as in the single write: a reader that publishes a block after its map entry changed
         * finds the map changed on its re-read and never copies it.
         */
        private void waitForReaders() {
            Arena only = null; // the one arena of every live block, or null when they span arenas
            for (int s = 0; s < size; s++) {
                if (failure[s] == null) {
                    if (only == null) {
                        only = arena[s];
                    } else if (only != arena[s]) {
                        only = null;
                        break;
                    }
                }
            }
            for (int r = 0; r < lanes; r++) {
                // The common case: all in one arena, and most lanes read nothing now: one load a lane.
                if (only != null && (int) ARRAY.getVolatile(only.rtt, r * PAD) == RTT_EMPTY) {
                    continue;
                }
                Arena seen = null;
                int v = RTT_EMPTY;
                for (int s = 0; s < size; s++) {
                    if (failure[s] != null) {
                        continue;
                    }
                    Arena a = arena[s];
                    if (a != seen) {
                        seen = a;
                        v = (int) ARRAY.getVolatile(a.rtt, r * PAD);
                    }
                    if (v == freeEntry[s]) {
                        for (int spins = 0; (int) ARRAY.getVolatile(a.rtt, r * PAD) == freeEntry[s]; spins++) {
                            backOff(spins);
                        }
                        v = (int) ARRAY.getVolatile(a.rtt, r * PAD);
                    }
                }
            }
            if (deviceReads) {
                for (int s = 0; s < size; s++) {
                    if (failure[s] == null) {
                        waitForDeviceReads(arena[s], freeEntry[s]);
                    }
                }
            }
        }

        /** Sorts the live blocks' map locks by (arena, lock) without repeats into lockKey; how many. */
        private int lockKeys() {
            int keys = 0;
            for (int s = 0; s < size; s++) {
                if (failure[s] != null) {
                    continue;
                }
                long k = ((long) arena[s].index << 32) | lockIndex(arena[s], premap[s]);
                int at = keys;
                while (at > 0 && lockKey[at - 1] > k) {
                    at--;
                }
                if (at > 0 && lockKey[at - 1] == k) {
                    continue; // a line another block of the group locks already
                }
                for (int i = keys; i > at; i--) { // a few elements: a loop, not an arraycopy call
                    lockKey[i] = lockKey[i - 1];
                }
                lockKey[at] = k;
                keys++;
            }
            return keys;
        }

        /**
         * On pmem, starts the write-back of the live blocks' flog words at {@code delta} in their entries: the
         * lanes of a group are mostly neighbours, so their flog pairs (64 bytes a lane) are one short range, written
         * back in one call; lines of lanes not in the group that it covers are written back too, which is harmless
         * (any BTT store may become durable early: each is made only once what it depends on is durable).
         * Scattered lanes are written back one by one.
         */
        private void writeBackFlog(int delta) {
            if (!pmem) {
                return;
            }
            long lo = Long.MAX_VALUE, hi = Long.MIN_VALUE;
            Arena first = null;
            boolean oneArena = true;
            for (int s = 0; s < size; s++) {
                if (failure[s] == null) {
                    first = first == null ? arena[s] : first;
                    oneArena &= arena[s] == first;
                    lo = Math.min(lo, flogAt[s] + delta);
                    hi = Math.max(hi, flogAt[s] + delta + 8);
                }
            }
            if (first == null) {
                return;
            }
            if (oneArena && hi - lo <= FLOG_RANGE_MAX) {
                persistence.writeBack(view.asSlice(lo, hi - lo));
                return;
            }
            for (int s = 0; s < size; s++) {
                if (failure[s] == null) {
                    writeBack(flogAt[s] + delta, 8);
                }
            }
        }

        /** On pmem, starts the write-back of a line of the stage (durable at the stage's drain); elsewhere nothing yet. */
        private void writeBack(long offset, int length) {
            if (pmem) {
                persistence.writeBack(view.asSlice(offset, length));
            }
        }

        /**
         * Holds the mapping for this group's copies and write-backs ({@link MappingHold}; its view is {@link #view}
         * until {@link #exit}). If its owner has closed it, every live slot fails with why, nothing stored.
         */
        private boolean enter() {
            try {
                view = hold.enter(lane[0]);
                return true;
            } catch (IllegalStateException e) {
                for (int s = 0; s < size; s++) {
                    if (failure[s] == null) {
                        failure[s] = e;
                    }
                }
                return false;
            }
        }

        private void exit() {
            view = null;
            hold.exit(lane[0]);
        }

        /**
         * Makes the stage durable for every live block: on pmem one drain (each range was written back, or stored
         * non-temporally, by this thread); elsewhere an msync of each block's range ({@code at[s] + delta}).
         */
        private void durable(long[] at, int delta, int length) throws IOException {
            if (pmem) {
                persistence.drain();
                return;
            }
            for (int s = 0; s < size; s++) {
                if (failure[s] == null) {
                    persistence.sync(pool.asSlice(at[s] + delta, length));
                }
            }
        }
    }

    /**
     * Claims a free lane, {@code preferred} (mod lanes) first, then those a group's width apart, then the next ones
     * in turn, backing off after each round while all are busy: callers that may dispatch at once on one hardware queue (two NBD connections)
     * each get a lane of their own without a lock, and a caller that keeps its preferred lane (one per thread)
     * finds it free. Never returns a lane another caller holds.
     */
    public Lane claim(int preferred) {
        for (int spins = 0; ; spins++) {
            int lane = tryClaim(preferred, true);
            if (lane >= 0) {
                return laneHandles[lane];
            }
            backOff(spins);
        }
    }

    /**
     * As {@link #claim}, without waiting: a free lane, {@code preferred} (mod lanes) first, or null when every lane
     * is held. For a caller that must do something before it may wait (ring a DMA doorbell for copies whose
     * completion gives lanes back).
     */
    public Lane claimNow(int preferred) {
        int lane = tryClaim(preferred, true);
        return lane < 0 ? null : laneHandles[lane];
    }

    /**
     * A free lane, {@code from} (mod lanes) first, claimed without waiting; -1 when every lane is held. For a
     * {@code newGroup}'s first lane, see {@link #claim}; a group grows into the next free lane. A group grows by these: it never waits for a lane while it holds others (a caller waiting in {@link #claim} holds
     * none), so lanes cannot deadlock.
     */
    private int tryClaim(int from, boolean newGroup) {
        int first = Math.floorMod(from, lanes);
        // For a new group, a group's width apart first: a caller whose preferred lane another holds (two threads
        // preferring one lane, two connections on one queue) starts where a whole group of free lanes may follow,
        // not on the next lane, where the holder's group grows: interleaved, each would get half a group, and
        // their groups' flog ranges would cover each other's lines.
        for (int i = 0; newGroup && i < lanes; i += GROUP_BLOCKS) {
            int lane = first + i < lanes ? first + i : first + i - lanes;
            if (free(lane)) {
                return lane;
            }
        }
        for (int i = 0; i < lanes; i++) {
            int lane = first + i < lanes ? first + i : first + i - lanes;
            if (free(lane)) {
                return lane;
            }
        }
        return -1;
    }

    /** Claims {@code lane} if nobody holds it. */
    private boolean free(int lane) {
        return (int) ARRAY.get(laneBusy, lane * PAD) == 0 && ARRAY.compareAndSet(laneBusy, lane * PAD, 0, 1);
    }

    /**
     * The flog entry naming the swap, in the lane's non-current slot, as two 8-byte stores each durable before the
     * next: {lba, old_map}, then {new_map, seq}. The seq store makes the entry current (PMDK flog_update, Linux
     * __btt_log_write), so a crash between the two leaves the previous entry current and the new block free.
     */
    private void logSwap(Arena a, int lane, int premap, int oldEntry, int newEntry) throws IOException {
        int seq = nextSeq(a.seq[lane]);
        int slot = a.next[lane];
        long at = a.pairAt(lane) + (long) slot * FLOG_ENTRY_SIZE;
        LONG.setVolatile(pool, at + FLOG_LBA, (premap & 0xFFFF_FFFFL) | ((long) oldEntry << 32));
        persist(at + FLOG_LBA, 8);
        LONG.setVolatile(pool, at + FLOG_NEW_MAP, (newEntry & 0xFFFF_FFFFL) | ((long) seq << 32));
        persist(at + FLOG_NEW_MAP, 8);
        a.next[lane] = 1 - slot;
        a.seq[lane] = seq;
        a.free[lane] = oldEntry;
    }

    /** Waits while any lane's reader still copies {@code entry}'s block, which this write is about to overwrite. */
    private void waitForReaders(Arena a, int entry) {
        for (int i = 0; i < lanes; i++) {
            for (int spins = 0; (int) ARRAY.getVolatile(a.rtt, i * PAD) == entry; spins++) {
                backOff(spins);
            }
        }
        if (deviceReads) {
            waitForDeviceReads(a, entry);
        }
    }

    /**
     * Waits while a device may still read {@code entry}'s block ({@link #beginDeviceRead}): its bucket's count is
     * zero. The caller must not hold a read of its own in flight unsubmitted (it would wait for itself); the
     * device's completions never wait here (they run no writer's read tracking).
     */
    private static void waitForDeviceReads(Arena a, int entry) {
        int bucket = deviceReadBucket(entry & MAP_LBA_MASK);
        for (int spins = 0; (int) ARRAY.getVolatile(a.deviceReads, bucket) != 0; spins++) {
            backOff(spins);
        }
    }

    private static int deviceReadBucket(int block) {
        return (block * 0x9E3779B9) >>> (32 - Integer.numberOfTrailingZeros(DEVICE_READ_BUCKETS));
    }

    /**
     * The start of a read of external block {@code lba} that a device (a DMA engine) copies later, after the
     * caller has gone on: the block is published in the arena's device-read table, then the map is read again,
     * as {@link #read} publishes in its lane's RTT slot; from then until {@link #endDeviceRead} no writer reuses
     * the block (a writer about to store into a free block waits while its bucket is busy). Needs no lane.
     *
     * @return the pool offset of the block's data ({@link #blockSize} bytes), which the caller must end with
     *         {@link #endDeviceRead} once the device has reported its copy; or {@link #ZEROS} (nothing published)
     * @throws IOException when the block is marked bad or the map is corrupt (as {@link #read})
     */
    public long beginDeviceRead(long lba) throws IOException {
        if (!deviceReads) {
            deviceReads = true;
        }
        Arena a = arenaOf(lba);
        long mapAt = a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE;
        int entry = (int) INT.getVolatile(pool, mapAt);
        while (true) {
            if (isError(entry)) {
                throw markedBad(lba);
            }
            if (isZeroOrInitial(entry)) {
                return ZEROS;
            }
            int block = entry & MAP_LBA_MASK;
            if (block >= a.internalNlba) {
                throw new IOException("block " + lba + " maps to internal block " + block + ", beyond the arena's "
                        + a.internalNlba + ": the map is corrupt (`pmempool check`)");
            }
            // Publish, then look again (a full fence between: the add is a locked instruction), as readOn.
            int bucket = deviceReadBucket(block);
            int unused = (int) ARRAY.getAndAdd(a.deviceReads, bucket, 1);
            int again = (int) INT.getVolatile(pool, mapAt);
            if (again != entry) {
                unused = (int) ARRAY.getAndAdd(a.deviceReads, bucket, -1);
                entry = again;
                continue;
            }
            return a.dataOff + (long) block * a.internalLbaSize;
        }
    }

    /** Ends a read {@link #beginDeviceRead} started, once the device has finished it (reported, failed or closed). */
    public void endDeviceRead(long dataOffset) {
        for (Arena a : arenas) {
            if (dataOffset >= a.dataOff && dataOffset < a.mapOff) {
                int block = (int) ((dataOffset - a.dataOff) / a.internalLbaSize);
                int unused = (int) ARRAY.getAndAdd(a.deviceReads, deviceReadBucket(block), -1);
                return;
            }
        }
        throw new IllegalArgumentException("pool offset " + dataOffset + " is no arena's data block");
    }

    /**
     * The map lock of the LBA (PMDK get_map_lock_num, Linux lock_map: theirs is per map cache line, nfree of them):
     * a CAS spin lock, held over 3 persists.
     */
    private static int lockMap(Arena a, int premap) {
        int lock = lockIndex(a, premap);
        lock(a, lock);
        return lock;
    }

    /** Where the map lock of {@code premap} is in {@code a.mapLocks}. */
    private static int lockIndex(Arena a, int premap) {
        return premap & (MAP_LOCKS - 1);
    }

    private static void lock(Arena a, int lock) {
        for (int spins = 0; !ARRAY.compareAndSet(a.mapLocks, lock, 0, 1); spins++) {
            backOff(spins);
        }
    }

    /** Spin briefly, then yield: the holder may be a descheduled thread on a host with few CPUs. */
    private static void backOff(int spins) {
        if (spins < 100) {
            Thread.onSpinWait();
        } else {
            Thread.yield();
        }
    }

    /** Lane {@code lane}, entered ({@link #enter}): the one-block calls above hold it for one call. */
    private Lane entered(int lane) {
        enter(lane);
        return laneHandles[lane];
    }

    private void enter(int lane) {
        if (lane < 0 || lane >= lanes) {
            throw new IllegalArgumentException("lane " + lane + " is out of range: 0.." + (lanes - 1));
        }
        if (!ARRAY.compareAndSet(laneBusy, lane * PAD, 0, 1)) {
            throw new IllegalStateException("lane " + lane + " is in use by another caller: one lane per queue, used by"
                    + " one thread at a time");
        }
    }

    private void leave(int lane) {
        ARRAY.setRelease(laneBusy, lane * PAD, 0);
    }

    private Arena arenaOf(long lba) {
        if (lba < 0 || lba >= blocks) {
            throw new IllegalArgumentException("block " + lba + " is out of range: 0.." + (blocks - 1));
        }
        for (Arena a : arenas) {
            if (lba < a.firstLba + a.externalNlba) {
                return a;
            }
        }
        throw new AssertionError("unreachable: " + lba + " < " + blocks);
    }

    /** A read of a block whose map entry has the ERROR flag. */
    private static IOException markedBad(long lba) {
        return new IOException("block " + lba + " is marked bad (its map entry has the ERROR flag): EIO until it is"
                + " written again");
    }

    private void refuseIfReadOnly(Arena a, long lba) throws IOException {
        if (writeFailure != null) {
            throw new IOException("writes are refused: " + writeFailure);
        }
        String why = a.error;
        if (why != null) {
            throw new IOException("block " + lba + " is in arena " + a.index + ", which is read-only: " + why);
        }
    }

    private void checkBuffer(MemorySegment buf) {
        if (buf.byteSize() != blockSize) {
            throw new IllegalArgumentException("a block buffer must hold exactly " + blockSize + " bytes, got "
                    + buf.byteSize());
        }
    }

    /** Makes [offset, offset+length) of the pool durable: write-back and drain on pmem, msync of its pages elsewhere. */
    private void persist(long offset, long length) throws IOException {
        MemorySegment r = pool.asSlice(offset, length);
        if (pmem) {
            persistence.writeBack(r);
            persistence.drain();
        } else {
            persistence.sync(r);
        }
    }

    private static void persistRange(Persistence persistence, MemorySegment r) throws IOException {
        if (persistence.flushesCaches()) {
            persistence.writeBack(r);
            persistence.drain();
        } else {
            persistence.sync(r);
        }
    }

    // ------------------------------------------------------------------------------------------------ checking

    /**
     * The consistency check of PMDK btt_check / pmempool check (note §3): in every arena each internal block is
     * referenced exactly once by the map (an initial entry maps its LBA to itself) and the nfree flog lanes' free
     * blocks; map entries and flog blocks are in range; every flog pair names a current entry. Run it with no
     * reads or writes in flight.
     *
     * @return the problems found, empty when consistent
     */
    public List<String> check() {
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

    @Override
    public String toString() {
        return "BTT of " + blocks + " blocks of " + blockSize + " bytes in " + arenas.length + " arena(s), " + lanes
                + " lanes";
    }
}
