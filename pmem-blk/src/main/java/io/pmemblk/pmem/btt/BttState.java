package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.MappingHold;
import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.concurrent.atomic.AtomicReference;

import static io.pmemblk.pmem.btt.BttLayout.*;

/**
 * What the parts of one open BTT share ({@link Btt}, its {@link Lanes}, {@link LaneHandle}s, {@link ReadTracking}
 * and {@link WriteGroup}s), made once at open and handed to each by its constructor. None of them owns the mapping.
 *
 * @param pool         the whole pool file, mapped
 * @param hold         held by a group for its copies and write-backs ({@link WriteGroup}): one acquire of the
 *                     mapping a group, not two a native call, which on x86 would wait for every write-back before it
 *                     and undo their overlap
 * @param pmem         whether the persistence port writes back caches (pmem), or msyncs (elsewhere)
 * @param blocks       external blocks over all arenas: the device's capacity in blocks
 * @param lanes        callers that may run at once, each on a lane of its own
 * @param writeFailure set when a persistence step of a write failed: its lane's state on the media is unknown, so
 *                     writes stop
 */
record BttState(MemorySegment pool, MappingHold hold, Persistence persistence, Btt.Media media, boolean pmem,
                int blockSize, long blocks, int lanes, Arena[] arenas, AtomicReference<String> writeFailure) {
    /** The int arrays the parts share between threads: RTT slots, lane busy flags, device-read buckets, map locks. */
    static final VarHandle ARRAY = MethodHandles.arrayElementVarHandle(int[].class);
    private static final System.Logger LOG = System.getLogger(Btt.class.getName());

    Arena arenaOf(long lba) {
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
    static IOException markedBad(long lba) {
        return new IOException("block " + lba + " is marked bad (its map entry has the ERROR flag): EIO until it is"
                + " written again");
    }

    /**
     * Why a write of {@code lba} must not start: as {@link #refuseIfReadOnly}, or its map entry names a block past
     * the data area (a damaged or foreign image; Linux btt_write_pg answers -EIO). The write would log that block
     * as its lane's free one, and the lane's next write store its data there: over the map, the flog, or past the
     * pool. Read without the map lock: every entry this engine stores names a block in range (a lane's free block
     * or a flog entry checked at open), so one found in range stays in range until the write takes the lock.
     */
    void refuseWrite(Arena a, long lba) throws IOException {
        refuseIfReadOnly(a, lba);
        int block = (int) INT.getVolatile(pool, a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE) & MAP_LBA_MASK;
        if (block >= a.internalNlba) {
            throw new IOException("block " + lba + " maps to internal block " + block + ", beyond the arena's "
                    + a.internalNlba + ": the map is corrupt, and the write is refused so the block is never reused"
                    + " (`pmempool check -r` may repair it)");
        }
    }

    void refuseIfReadOnly(Arena a, long lba) throws IOException {
        String failed = writeFailure.get();
        if (failed != null) {
            throw new IOException("writes are refused: " + failed);
        }
        String why = a.error;
        if (why != null) {
            throw new IOException("block " + lba + " is in arena " + a.index + ", which is read-only: " + why);
        }
    }

    /**
     * The free block of {@code lane}'s flog pair in {@code a} cannot take a store ({@code fault}: a known bad block
     * the media could not clear; a block it can clear it clears in {@link Btt.Media#beforeStore} and never gets
     * here). Linux btt_write_pg clears such a block and retries (arena_clear_freelist_error) and fails the write
     * when it cannot; here the lane moves to one of the arena's spare flog pairs (the nfree pairs beyond the
     * lanes in use, written through by no lane), and the bad block stays the free block of the pair given up, so
     * the BTT on the media is as consistent as before: every block still referenced once, no flog entry written.
     * The lane's new pair, whose free block the caller checks in turn.
     *
     * @throws IOException when no spare pair is left: the write fails, and so will the lane's writes to this arena
     *                     until the bad range is cleared
     */
    int replaceBadFreeBlock(Arena a, int lane, long lba, RuntimeException fault) throws IOException {
        int old = a.pairOf[lane];
        int block = a.free[old] & MAP_LBA_MASK;
        int pair = a.replacePair(lane);
        if (pair < 0) {
            throw new IOException("block " + lba + " cannot be written through lane " + lane + ": its free block "
                    + block + " in arena " + a.index + " is bad and could not be cleared (" + fault.getMessage()
                    + "), and the arena has no spare flog lane left to write through instead (" + lanes + " lanes of "
                    + a.nfree + " in use, " + a.retiredPairs() + " flog lanes given up to bad blocks): this lane's"
                    + " writes to the arena fail until the bad range is cleared (`ndctl clear-errors`, then restart),"
                    + " or the BTT is served with fewer lanes", fault);
        }
        LOG.log(System.Logger.Level.WARNING, "arena " + a.index + ": free block " + block + " of flog lane " + old
                + " is bad and could not be cleared (" + fault.getMessage() + "); lane " + lane + " now writes"
                + " through flog lane " + pair + " (" + a.spares() + " spare flog lanes left). The block stays"
                + " free on the media; after a restart it is found bad again at its lane's first write");
        return pair;
    }
}
