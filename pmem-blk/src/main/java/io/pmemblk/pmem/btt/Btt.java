package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.MappingHold;
import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicReference;

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
 *
 * <p>The parts, in this package: {@link BttFormat} lays a pool out, {@link BttOpen} opens, recovers and checks it,
 * {@link Lanes} holds the lanes and their {@link LaneHandle}s (one-block I/O, a lane a caller holds), {@link ReadTracking} the RTT, the
 * device-read table and the map locks, {@link WriteGroup} the lockstep commit; they share one {@link BttState}.
 * The engine reaches the media only through {@link Persistence}, {@link Media} and {@link MappingHold}: it imports
 * nothing of the queueing or DMA layers (BttPackageRuleTest holds it to that).
 */
public final class Btt {
    /** What {@link #beginDeviceRead} answers for a block that reads as zeros (its map entry's zero flag, or initial). */
    public static final long ZEROS = -1;
    /**
     * Block writes a {@link Group} runs in lockstep at most: a QD32 batch of 4 KiB writes in one group. Past a
     * dozen or so the round trips a group saves per block (4 round trips / K) are small beside the block's own
     * copy, and every block of a group holds a lane: 32 lanes per caller is what {@code BttRegion} opens the BTT
     * with (at most 256).
     */
    public static final int GROUP_BLOCKS = 32;

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

    /**
     * Block writes run in lockstep, each on a lane of its own (the class comment of {@link Btt}): a lane's holder adds blocks
     * ({@link #add}, {@link #source}), then {@link #commit}s them, reads what became of each ({@link #failure}) and
     * {@link #clear}s the group for the next ones. Per block the steps and their order are exactly those of
     * {@link Btt#write}, each durable before the block's next step; only the drains are shared:
     * <ol>
     *   <li>read tracking for every free block, then per block the bad-block check (a bad free block the media
     *       cannot clear moves the block's lane to a spare flog pair, {@code BttState.replaceBadFreeBlock}), then
     *       the data copies; one drain;</li>
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
     * <p>Failures: a block refused before its data is stored (arena read-only, writes stopped, its map entry past
     * the data area, a bad free block with no spare flog pair left, its source unreadable) fails alone, and changes nothing of the BTT. A
     * persistence step that fails fails every block of the group not committed yet and stops writes
     * ({@code writeFailure}), as for a single write;
     * the group still releases its locks, and nothing is thrown: each block's fate is its {@link #failure}.
     *
     * <p>Nothing is allocated: the arrays are made with the lane at open; the lanes claimed as the group grows
     * stay held across commits until the lane's {@link LaneHandle#close}.
     *
     * <p>Sealed over its one class, {@link WriteGroup}, on purpose: the request side that drives groups (CPU and
     * DMA writes) programs against this contract, the stages' order and each block's fate, which stays readable
     * here beside the class comment it refines, apart from the lockstep implementation that fills a file of its
     * own. The call costs nothing: with one implementation it is bound statically.
     */
    public sealed interface Group permits WriteGroup {
        /** Blocks a group holds at most. */
        int capacity();

        /** Blocks added since the last {@link #clear}. */
        int size();

        /**
         * Adds a write of external block {@code lba}, whose source the caller gives next ({@link #source}); the
         * slot, or -1 when the group must be committed (and cleared) first: it is full, no other lane is free for
         * another block, or {@code lba} is in it already. An empty group always takes the block.
         *
         * @param tag the caller's, given back by {@link #tag} (which request the block is of)
         * @throws IllegalArgumentException when {@code lba} is out of range
         */
        int add(long lba, int tag);

        /** The slot's data: {@link Btt#blockSize()} bytes of {@code memory} from {@code offset}, read at the commit. */
        void source(int slot, MemorySegment memory, long offset);

        /** Fails the slot before the commit (its source could not be given): it is not written, and reports {@code why}. */
        void fail(int slot, Throwable why);

        /** The lane the slot writes through, to which a caller's per-lane buffers belong while the group holds it. */
        int lane(int slot);

        int tag(int slot);

        /** After {@link #commit}: null when the slot's block is written and durable, else why it is not. */
        Throwable failure(int slot);

        /** Empties the group (its lanes stay held). */
        void clear();

        /** Writes every block added and not failed, in lockstep (the class comment); never throws. */
        void commit();

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
        int prepareStores();

        /** After {@link #prepareStores}: whether the slot is still to be written (no failure so far). */
        boolean live(int slot);

        /** After {@link #prepareStores}: where in the pool mapping the live slot's data goes ({@link #blockSize} bytes). */
        long dataOffset(int slot);

        /**
         * The rest of a commit after {@link #prepareStores}, once a device has stored every live slot's data and
         * reported it: the data is made durable first (on pmem every block's lines written back, then one drain,
         * here, on the calling thread: with DDIO a device's stores sit in the CPU cache, and a drain covers only
         * write-backs this thread issued; elsewhere an msync of each block), then the flog, seq and map stages as
         * in {@link #commit}. Never throws; each slot's fate is its {@link #failure}.
         */
        void commitDeviceStored();

        /**
         * As {@link #commitDeviceStored}, after the device failed to store (some of) the data: every live slot's
         * data is copied by the CPU from its {@link #source} first (the same bytes again where the device had
         * stored them: the blocks are free, nobody reads them).
         */
        void commitByCpu();
    }

    private final BttState state;
    private final ReadTracking tracking;
    /** The lanes and their handles, made at open: claiming a lane allocates nothing. */
    private final Lanes laneSet;
    private final UUID poolsetUuid;
    private final List<String> notes;

    Btt(MemorySegment pool, Persistence persistence, Media media, MappingHold hold, int blockSize, Arena[] arenas,
        int lanes, UUID poolset, List<String> notes) {
        long n = 0;
        for (Arena a : arenas) {
            n += a.externalNlba;
        }
        this.state = new BttState(pool, hold != null ? hold : new MappingHold(pool, lanes), persistence,
                media != null ? media : new Media() {
                    @Override
                    public void read(long poolOffset, MemorySegment dst, long dstOffset, long length) {
                        MemorySegment.copy(pool, poolOffset, dst, dstOffset, length);
                    }

                    @Override
                    public void beforeStore(long poolOffset, long length) {
                    }
                }, persistence.flushesCaches(), blockSize, n, lanes, arenas, new AtomicReference<>());
        this.tracking = new ReadTracking(state);
        this.laneSet = new Lanes(state, tracking);
        this.poolsetUuid = poolset;
        this.notes = List.copyOf(notes);
    }

    /** The external block (sector) size: 512 or 4096. */
    public int blockSize() {
        return state.blockSize();
    }

    /** External blocks: the device's capacity in blocks. */
    public long blocks() {
        return state.blocks();
    }

    public int lanes() {
        return state.lanes();
    }

    public int arenaCount() {
        return state.arenas().length;
    }

    /** Spare blocks over all arenas (nfree each): the capacity a BTT costs beyond its map and flog. */
    public int freeBlocks() {
        int n = 0;
        for (Arena a : state.arenas()) {
            n += a.nfree;
        }
        return n;
    }

    /** The size of a data-area slot (an internal block), the same in every arena pmemblk lays out. */
    public int internalBlockSize() {
        return state.arenas()[0].internalLbaSize;
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
        return BttFormat.format(pool, persistence, sectorSize, lanes);
    }

    /**
     * Throws what {@link #format} would refuse a pool of {@code poolSize} bytes with (the sector size, the size,
     * the architecture) before it writes anything: a caller that records a format before its first byte checks
     * this first, so that a refused format leaves no record of one.
     */
    public static void checkFormat(long poolSize, int sectorSize) throws IOException {
        BttFormat.check(poolSize, sectorSize, 1);
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
        return BttOpen.open(pool, persistence, lanes, media, hold);
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
        return BttOpen.summarize(pool, false);
    }

    /**
     * Why {@code pool} is not a COMPLETE BTT, one that {@link #open} serves without writing any byte outside its
     * own flog recovery: a valid pool header, arena 0 laid out, and every arena's primary info block valid (not
     * restored from a backup, not laid out lazily as for {@code pmempool create blk} without -w); null when it is.
     * For a device nobody recorded as a BTT: only what is wholly a BTT is taken for one on the operator's word,
     * since laying one out or "restoring" an info block would write over what may be a raw device's data.
     */
    public static String incomplete(MemorySegment pool) {
        Summary s = BttOpen.summarize(pool, true);
        return s.problem() != null ? s.problem() : s.arenas() == 0 ? "no BTT is laid out (arena 0's info blocks are zero)" : null;
    }

    /**
     * The pool header's uuid (the pool's identity, which {@link #format} draws at random), or null when {@code
     * pool} does not start with a valid pmemblk pool header.
     */
    public static UUID poolUuid(MemorySegment pool) {
        if (pool.byteSize() < POOL_HDR_SIZE || BttOpen.invalidPoolHeader(pool.asSlice(0, POOL_HDR_SIZE)) != null) {
            return null;
        }
        return getUuid(pool.asSlice(0, POOL_HDR_SIZE), HDR_UUID);
    }

    // ------------------------------------------------------------------------------------------------ the hot path

    /** Copies external block {@code lba} into {@code dst} ({@link #blockSize()} bytes); a ZERO or initial block reads as zeros. */
    public void read(int lane, long lba, MemorySegment dst) throws IOException {
        try (LaneHandle l = laneSet.entered(lane)) {
            l.read(lba, dst);
        }
    }

    /**
     * Writes {@code src} ({@link #blockSize()} bytes) to external block {@code lba}, atomically: after a crash at any
     * point the block reads wholly as before or wholly as {@code src}; once this returns, {@code src} is durable.
     */
    public void write(int lane, long lba, MemorySegment src) throws IOException {
        try (LaneHandle l = laneSet.entered(lane)) {
            l.write(lba, src);
        }
    }

    /**
     * TRIM / WRITE_ZEROES of one block: the map entry gets the ZERO flag (PMDK map_entry_setf), one durable 4-byte
     * store; the block stays mapped, so no flog entry is needed. An already zero (or initial) block is left alone.
     */
    public void zero(int lane, long lba) throws IOException {
        try (LaneHandle l = laneSet.entered(lane)) {
            l.zero(lba);
        }
    }

    /**
     * Claims a free lane, {@code preferred} (mod lanes) first, then those a group's width apart, then the next ones
     * in turn, backing off after each round while all are busy: callers that may dispatch at once on one hardware queue (two NBD connections)
     * each get a lane of their own without a lock, and a caller that keeps its preferred lane (one per thread)
     * finds it free. Never returns a lane another caller holds.
     */
    public LaneHandle claim(int preferred) {
        return laneSet.claim(preferred);
    }

    /**
     * As {@link #claim}, without waiting: a free lane, {@code preferred} (mod lanes) first, or null when every lane
     * is held. For a caller that must do something before it may wait (ring a DMA doorbell for copies whose
     * completion gives lanes back).
     */
    public LaneHandle claimNow(int preferred) {
        return laneSet.claimNow(preferred);
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
        return tracking.beginDeviceRead(lba);
    }

    /** Ends a read {@link #beginDeviceRead} started, once the device has finished it (reported, failed or closed). */
    public void endDeviceRead(long dataOffset) {
        tracking.endDeviceRead(dataOffset);
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
        return BttOpen.check(state.pool(), state.arenas());
    }

    @Override
    public String toString() {
        return "BTT of " + state.blocks() + " blocks of " + state.blockSize() + " bytes in " + state.arenas().length
                + " arena(s), " + state.lanes() + " lanes";
    }
}
