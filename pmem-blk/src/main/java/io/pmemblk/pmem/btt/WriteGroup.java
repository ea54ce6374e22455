package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.MappingHold;
import io.pmemblk.pmem.Persistence;

import java.io.IOException;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.VarHandle;

import static io.pmemblk.pmem.btt.Btt.GROUP_BLOCKS;
import static io.pmemblk.pmem.btt.BttLayout.*;
import static io.pmemblk.pmem.btt.BttState.ARRAY;
import static io.pmemblk.pmem.btt.ReadTracking.lock;
import static io.pmemblk.pmem.btt.ReadTracking.lockIndex;

/**
 * A lane's group ({@link Btt.Group}, whose comment gives the stages and their order), made with the lane at open:
 * the slots' arrays, the lanes it claims as it grows, and the lockstep commit.
 */
final class WriteGroup implements Btt.Group {
    /** The widest flog range a group writes back in one call (lanes' pairs in between included): 64 lanes' pairs. */
    private static final long FLOG_RANGE_MAX = 64L * FLOG_PAIR_SIZE;

    private final BttState state;
    private final ReadTracking tracking;
    private final Lanes laneSet;
    private final MemorySegment pool;
    private final MappingHold hold;
    private final Persistence persistence;
    private final Btt.Media media;
    private final boolean pmem;
    private final int blockSize;
    private final Arena[] arenas;
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
    /** Per slot: the flog pair its lane writes through in the slot's arena ({@link Arena#pairOf}), set by begin. */
    private final int[] pair;
    private final long[] dataAt, flogAt, mapAt;
    /** The mapping as the group's copies and write-backs see it while it holds it ({@link #enter}), else null. */
    private MemorySegment view;
    /** The map locks to take: (arena index << 32 | lock index), sorted and without repeats. */
    private final long[] lockKey;
    private final Throwable[] failure;

    WriteGroup(int ownerLane, BttState state, ReadTracking tracking, Lanes laneSet) {
        this.state = state;
        this.tracking = tracking;
        this.laneSet = laneSet;
        this.pool = state.pool();
        this.hold = state.hold();
        this.persistence = state.persistence();
        this.media = state.media();
        this.pmem = state.pmem();
        this.blockSize = state.blockSize();
        this.arenas = state.arenas();
        this.capacity = Math.min(GROUP_BLOCKS, state.lanes());
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
        this.pair = new int[capacity];
        this.dataAt = new long[capacity];
        this.flogAt = new long[capacity];
        this.mapAt = new long[capacity];
        this.lockKey = new long[capacity];
        this.failure = new Throwable[capacity];
    }

    @Override
    public int capacity() {
        return capacity;
    }

    @Override
    public int size() {
        return size;
    }

    @Override
    public int add(long lba, int tag) {
        if (size == capacity) {
            return -1;
        }
        for (int s = 0; s < size; s++) {
            if (this.lba[s] == lba) {
                return -1; // its order with the earlier block matters: the next group
            }
        }
        Arena a = state.arenaOf(lba);
        if (size == held) {
            if (starved) {
                return -1;
            }
            int l = laneSet.tryClaim(lane[held - 1] + 1, false);
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

    @Override
    public void source(int slot, MemorySegment memory, long offset) {
        check(slot);
        src[slot] = memory;
        srcOff[slot] = offset;
    }

    @Override
    public void fail(int slot, Throwable why) {
        check(slot);
        failure[slot] = why;
    }

    @Override
    public int lane(int slot) {
        check(slot);
        return lane[slot];
    }

    @Override
    public int tag(int slot) {
        check(slot);
        return tag[slot];
    }

    @Override
    public Throwable failure(int slot) {
        check(slot);
        return failure[slot];
    }

    @Override
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
    void releaseLanes() {
        for (int i = 1; i < held; i++) {
            laneSet.leave(lane[i]);
        }
        held = 1;
    }

    private void check(int slot) {
        if (slot < 0 || slot >= size) {
            throw new IndexOutOfBoundsException("slot " + slot + " of a group of " + size);
        }
    }

    @Override
    public void commit() {
        if (begin() == 0) {
            return;
        }
        storeByCpuThenCommit();
    }

    @Override
    public int prepareStores() {
        return begin();
    }

    @Override
    public boolean live(int slot) {
        check(slot);
        return failure[slot] == null;
    }

    @Override
    public long dataOffset(int slot) {
        check(slot);
        return dataAt[slot];
    }

    @Override
    public void commitDeviceStored() {
        if (enter()) {
            try {
                commitStored(size, true);
            } finally {
                exit();
            }
        }
    }

    @Override
    public void commitByCpu() {
        storeByCpuThenCommit(); // the bad-block checks ran when the group was placed
    }

    /**
     * Stage 1 by the CPU: every live slot's data copied from its source into its free block (checked by
     * {@link #begin}); a slot whose store fails fails alone. Then the durable stages, when any slot is left.
     */
    private void storeByCpuThenCommit() {
        if (!enter()) {
            return;
        }
        try {
            storeByCpuThenCommitHeld();
        } finally {
            exit();
        }
    }

    private void storeByCpuThenCommitHeld() {
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
     * lane's free block, and their map entry's place; then the read tracking, then each free block's bad-block
     * check as in writeOn (a bad one the media cannot clear moves the slot's lane to a spare flog pair, or fails
     * the slot alone, nothing of the BTT changed). The live slots.
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
                state.refuseWrite(a, lba[s]); // reads the map: on a region closed under the group, IllegalStateException
            } catch (IOException | IllegalStateException e) {
                failure[s] = e;
                continue;
            }
            pair[s] = a.pairOf[lane[s]];
            freeBlockOf(s);
            mapAt[s] = a.mapOff + (long) premap[s] * MAP_ENTRY_SIZE;
            live++;
        }
        if (live == 0) {
            return 0;
        }
        tracking.waitForReaders(n, failure, arena, freeEntry); // before the checks: clearing a bad block rewrites it
        for (int s = 0; s < n; s++) {
            if (failure[s] != null) {
                continue;
            }
            while (true) {
                try {
                    media.beforeStore(dataAt[s], blockSize);
                    break;
                } catch (RuntimeException bad) {
                    try {
                        pair[s] = state.replaceBadFreeBlock(arena[s], lane[s], lba[s], bad);
                    } catch (IOException e) {
                        failure[s] = e;
                        live--;
                        break;
                    }
                    freeBlockOf(s);
                    tracking.waitForReaders(arena[s], freeEntry[s]);
                }
            }
        }
        return live;
    }

    /** The slot's free block, its pair's: its entry and its place. */
    private void freeBlockOf(int s) {
        Arena a = arena[s];
        int freeBlock = a.free[pair[s]] & MAP_LBA_MASK;
        freeEntry[s] = freeBlock | MAP_NORMAL;
        dataAt[s] = a.dataOff + (long) freeBlock * a.internalLbaSize;
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
            // Stage 2: the flog entries' first halves {lba, old_map}, in each pair's non-current slot.
            for (int s = 0; s < n; s++) {
                if (failure[s] != null) {
                    continue;
                }
                Arena a = arena[s];
                int p = pair[s];
                int old = (int) INT.getVolatile(pool, mapAt[s]);
                if (isInitial(old)) {
                    old = premap[s] | MAP_NORMAL; // as writeOn
                }
                oldEntry[s] = old;
                flogAt[s] = a.pairAt(p) + (long) a.next[p] * FLOG_ENTRY_SIZE;
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
                    int seq = nextSeq(arena[s].seq[pair[s]]);
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
                int p = pair[s];
                a.next[p] = 1 - a.next[p];
                a.seq[p] = nextSeq(a.seq[p]);
                a.free[p] = oldEntry[s];
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
            state.writeFailure().set("a persistence step of a write to block " + first + " (one of " + live
                    + " written together) failed (" + t.getMessage() + ")");
        } finally {
            for (int i = 0; i < locked; i++) {
                ARRAY.setRelease(arenas[(int) (lockKey[i] >>> 32)].mapLocks, (int) lockKey[i], 0);
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
