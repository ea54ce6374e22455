package io.pmemblk.pmem.btt;

import java.lang.foreign.MemorySegment;

import static io.pmemblk.pmem.btt.BttLayout.*;
import static io.pmemblk.pmem.btt.Lanes.PAD;
import static io.pmemblk.pmem.btt.ReadTracking.DEVICE_READ_BUCKETS;
import static io.pmemblk.pmem.btt.ReadTracking.MAP_LOCKS;

/** One arena's offsets (absolute in the pool mapping) and its run-time state. */
final class Arena {
    final int index;
    final long start, dataOff, mapOff, flogOff;
    final int internalLbaSize, internalNlba, externalNlba, nfree;
    final long firstLba;
    /** Per flog lane (all nfree, in use or not): the current entry's old_map (the lane's free block), seq, next slot. */
    final int[] free, seq, next;
    final int[] rtt;
    /**
     * The device-read table: per bucket of internal blocks, the reads of them a device has in flight
     * ({@link Btt#beginDeviceRead}). A lane's RTT slot holds one block, for a read its holder copies now; a
     * device read is in flight after its caller has gone on, and a READ has many sectors, so it would need
     * a lane per sector to use the RTT.
     */
    final int[] deviceReads;
    final int[] mapLocks;
    /** Why the arena is read-only (the info block's ERROR flag, an invalid flog pair), or null. */
    volatile String error;
    /**
     * Per lane: the flog pair it writes through, whose current entry's old_map is its free block. Lane i's own
     * pair i, until its free block turns out bad and cannot be cleared ({@link BttState#replaceBadFreeBlock}).
     * Only the lane's holder reads or changes its entry (the lane's claim orders it, as {@link #free}).
     */
    final int[] pairOf;
    /** Flog pairs no lane writes through, lowest first: [lanes, nfree) at open. Guarded by this. */
    private final int[] spare;
    private int spareFrom;
    /** Flog pairs given up this open because their free block is bad: written through by no lane. Guarded by this. */
    private int retired;

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
        this.pairOf = new int[lanes];
        for (int i = 0; i < lanes; i++) {
            pairOf[i] = i;
        }
        this.spare = new int[Math.max(0, nfree - lanes)];
        for (int i = 0; i < spare.length; i++) {
            spare[i] = lanes + i;
        }
        if ((info.get(U32, INFO_FLAGS) & INFO_FLAG_ERROR) != 0) {
            error = "its info block has the ERROR flag set (a write to it failed earlier)";
        }
    }

    long pairAt(int pair) {
        return flogOff + (long) pair * FLOG_PAIR_SIZE;
    }

    /**
     * Gives up {@code lane}'s flog pair (its free block is bad) and moves the lane to a spare one; the spare pair,
     * or -1 when none is left (the lane keeps its pair). The pair given up is used by no lane again until the
     * BTT is opened again, when its lane takes it back, finds the block bad at its next write, and moves again.
     */
    synchronized int replacePair(int lane) {
        if (spareFrom == spare.length) {
            return -1;
        }
        retired++;
        return pairOf[lane] = spare[spareFrom++];
    }

    /** Spare pairs left, for messages. */
    synchronized int spares() {
        return spare.length - spareFrom;
    }

    /** Pairs given up, for messages. */
    synchronized int retiredPairs() {
        return retired;
    }
}
