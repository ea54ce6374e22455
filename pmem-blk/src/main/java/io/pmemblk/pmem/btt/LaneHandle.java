package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.pmem.btt.BttLayout.*;
import static io.pmemblk.pmem.btt.BttState.ARRAY;
import static io.pmemblk.pmem.btt.Lanes.PAD;
import static io.pmemblk.pmem.btt.ReadTracking.RTT_EMPTY;
import static io.pmemblk.pmem.btt.ReadTracking.lockMap;

/**
 * A lane held by one caller ({@link Btt#claim}) until {@link #close}: its reads, writes and zeroings, as the
 * methods of the same names on {@link Btt} without entering the lane for each block. Made at open, one per lane:
 * the one-block read, write and zero on the lane's free block and flog pair, each step of a write durable before
 * the next (the class comment of {@link Btt}), and the lane's group.
 */
public final class LaneHandle implements AutoCloseable {
    private final int index;
    /** Made with the lane at open, so a caller's group allocates nothing: only the lane's holder uses it. */
    private final WriteGroup group;
    private final BttState state;
    private final ReadTracking tracking;
    private final Lanes laneSet;
    private final MemorySegment pool;
    private final Persistence persistence;
    private final Btt.Media media;
    private final boolean pmem;
    private final int blockSize;
    private final long blocks;

    LaneHandle(int index, BttState state, ReadTracking tracking, Lanes laneSet) {
        this.index = index;
        this.state = state;
        this.tracking = tracking;
        this.laneSet = laneSet;
        this.pool = state.pool();
        this.persistence = state.persistence();
        this.media = state.media();
        this.pmem = state.pmem();
        this.blockSize = state.blockSize();
        this.blocks = state.blocks();
        this.group = new WriteGroup(index, state, tracking, laneSet);
    }

    /**
     * This lane's group: block writes run in lockstep on this lane and on lanes the group claims as it grows
     * ({@link Btt.Group#add}), given back when this lane is closed.
     */
    public Btt.Group group() {
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
        Arena a = state.arenaOf(lba);
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
        laneSet.leave(index);
    }

    private void readOn(int lane, long lba, MemorySegment dst) throws IOException {
        Arena a = state.arenaOf(lba);
        long mapAt = a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE;
        int entry = (int) INT.getVolatile(pool, mapAt);
        int slot = lane * PAD;
        // Whatever way this ends (zeros, an error, the copy), the slot is emptied: a read that published a block
        // and then found the LBA zeroed or marked bad must not be left looking like a reader of it, or every write
        // whose free block that is would wait for ever (ReadTracking.waitForReaders).
        try {
            while (true) {
                if (isError(entry)) {
                    throw BttState.markedBad(lba);
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
                if (again == entry) {
                    media.read(a.dataOff + (long) (entry & MAP_LBA_MASK) * a.internalLbaSize, dst, 0, blockSize);
                    return;
                }
                entry = again;
            }
        } finally {
            ARRAY.setRelease(a.rtt, slot, RTT_EMPTY);
        }
    }

    private void writeOn(int lane, long lba, MemorySegment src) throws IOException {
        Arena a = state.arenaOf(lba);
        state.refuseWrite(a, lba);
        int premap = (int) (lba - a.firstLba);
        int pair = a.pairOf[lane];
        int freeEntry;
        long dataAt;
        while (true) {
            int freeBlock = a.free[pair] & MAP_LBA_MASK;
            freeEntry = freeBlock | MAP_NORMAL;
            tracking.waitForReaders(a, freeEntry); // before the check: clearing a bad block rewrites it
            dataAt = a.dataOff + (long) freeBlock * a.internalLbaSize;
            try {
                media.beforeStore(dataAt, blockSize);
                break;
            } catch (RuntimeException bad) { // nothing of the BTT changed yet: move to a spare pair, or fail
                pair = state.replaceBadFreeBlock(a, lane, lba, bad);
            }
        }
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
                logSwap(a, pair, premap, old, freeEntry);
                INT.setVolatile(pool, mapAt, freeEntry);
                persist(mapAt, MAP_ENTRY_SIZE);
            } finally {
                ARRAY.setRelease(a.mapLocks, lock, 0);
            }
        } catch (IOException | RuntimeException e) {
            state.writeFailure().set("a persistence step of a write to block " + lba + " failed (" + e.getMessage() + ")");
            throw e;
        }
    }

    private void zeroOn(int lane, long lba) throws IOException {
        Arena a = state.arenaOf(lba);
        state.refuseIfReadOnly(a, lba);
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
            state.writeFailure().set("a persistence step of a zeroing of block " + lba + " failed (" + e.getMessage() + ")");
            throw e;
        } finally {
            ARRAY.setRelease(a.mapLocks, lock, 0);
        }
    }

    /**
     * The flog entry naming the swap, in the non-current slot of the lane's flog pair ({@link Arena#pairOf}), as
     * two 8-byte stores each durable before the next: {lba, old_map}, then {new_map, seq}. The seq store makes
     * the entry current (PMDK flog_update, Linux __btt_log_write), so a crash between the two leaves the previous entry current and the new block free.
     */
    private void logSwap(Arena a, int pair, int premap, int oldEntry, int newEntry) throws IOException {
        int seq = nextSeq(a.seq[pair]);
        int slot = a.next[pair];
        long at = a.pairAt(pair) + (long) slot * FLOG_ENTRY_SIZE;
        LONG.setVolatile(pool, at + FLOG_LBA, (premap & 0xFFFF_FFFFL) | ((long) oldEntry << 32));
        persist(at + FLOG_LBA, 8);
        LONG.setVolatile(pool, at + FLOG_NEW_MAP, (newEntry & 0xFFFF_FFFFL) | ((long) seq << 32));
        persist(at + FLOG_NEW_MAP, 8);
        a.next[pair] = 1 - slot;
        a.seq[pair] = seq;
        a.free[pair] = oldEntry;
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
}
