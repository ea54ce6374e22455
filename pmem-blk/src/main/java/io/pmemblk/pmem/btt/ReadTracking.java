package io.pmemblk.pmem.btt;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

import static io.pmemblk.pmem.btt.BttLayout.*;
import static io.pmemblk.pmem.btt.BttState.ARRAY;
import static io.pmemblk.pmem.btt.Lanes.PAD;
import static io.pmemblk.pmem.btt.Lanes.backOff;

/**
 * Who may still be reading a block a writer is about to reuse, and the map locks that order writers of one LBA.
 * A lane's reader publishes the block it copies in its arena's read-tracking table (RTT, one slot a lane; note §2,
 * "why the RTT exists"); a read a device copies after its caller has gone on publishes in the arena's device-read
 * table ({@link #beginDeviceRead}), which needs no lane. A writer waits on both before it stores into its free block.
 */
final class ReadTracking {
    /** An RTT slot that names no block: a normal map entry always has both flag bits set. */
    static final int RTT_EMPTY = 0;
    /**
     * Buckets of an arena's device-read table ({@link #beginDeviceRead}): a power of two. A writer whose free block
     * shares a bucket with a block a device is still reading waits for that read too (a false positive costs a
     * wait of one copy, never a wrong result); with 64 Ki buckets, a thousand blocks in flight leave a bucket busy
     * 1.5% of the time. 256 KiB an arena.
     */
    static final int DEVICE_READ_BUCKETS = 1 << 16;
    /**
     * Map locks per arena: a power of two, a lock word each (not padded), LBAs taking them in turn. Linux and PMDK
     * have nfree (256) locks, one per map cache line: two groups of 32 random blocks would then share a lock
     * nearly always (1 - (224/256)^32 = 98%), and the second waits out the first's three drains, so two
     * submitters wrote no faster than one. With 64 Ki locks two such groups meet 1.5% of the time. 256 KiB an
     * arena; a lock only orders writers of one LBA, so sharing one (LBAs 64 Ki apart) costs a wait, never a
     * wrong result.
     */
    static final int MAP_LOCKS = 1 << 16;

    private final MemorySegment pool;
    private final int lanes;
    private final Arena[] arenas;
    private final BttState state;
    /**
     * Set (for good) by the first {@link #beginDeviceRead}, before it publishes: until then writers skip the
     * device-read tables (a miss in a 256 KiB table per block, for nothing, on a BTT served without an engine). A
     * writer that reads it unset took its map store before the reader set it, so the reader's re-read of the map
     * (after the flag and its publish) sees the map changed and never copies the block.
     */
    private volatile boolean deviceReads;

    ReadTracking(BttState state) {
        this.pool = state.pool();
        this.lanes = state.lanes();
        this.arenas = state.arenas();
        this.state = state;
    }

    /** Waits while any lane's reader still copies {@code entry}'s block, which this write is about to overwrite. */
    void waitForReaders(Arena a, int entry) {
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
     * Waits while a reader still copies one of the free blocks (the single write's waitForReaders for all of
     * them): each lane's RTT slot is loaded once per arena and compared with every block. One look at a
     * slot suffices, as in the single write: a reader that publishes a block after its map entry changed
     * finds the map changed on its re-read and never copies it. A group's slot s (of size) is live while
     * {@code failure[s]} is null; its free block is {@code freeEntry[s]}, in {@code arena[s]}.
     */
    void waitForReaders(int size, Throwable[] failure, Arena[] arena, int[] freeEntry) {
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

    /**
     * Waits while a device may still read {@code entry}'s block ({@link #beginDeviceRead}): its bucket's count is
     * zero. The caller must not hold a read of its own in flight unsubmitted (it would wait for itself); the
     * device's completions never wait here (they run no writer's read tracking).
     */
    static void waitForDeviceReads(Arena a, int entry) {
        int bucket = deviceReadBucket(entry & MAP_LBA_MASK);
        for (int spins = 0; (int) ARRAY.getVolatile(a.deviceReads, bucket) != 0; spins++) {
            backOff(spins);
        }
    }

    private static int deviceReadBucket(int block) {
        return (block * 0x9E3779B9) >>> (32 - Integer.numberOfTrailingZeros(DEVICE_READ_BUCKETS));
    }

    /** {@link Btt#beginDeviceRead}. */
    long beginDeviceRead(long lba) throws IOException {
        if (!deviceReads) {
            deviceReads = true;
        }
        Arena a = state.arenaOf(lba);
        long mapAt = a.mapOff + (lba - a.firstLba) * MAP_ENTRY_SIZE;
        int entry = (int) INT.getVolatile(pool, mapAt);
        while (true) {
            if (isError(entry)) {
                throw BttState.markedBad(lba);
            }
            if (isZeroOrInitial(entry)) {
                return Btt.ZEROS;
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

    /** {@link Btt#endDeviceRead}. */
    void endDeviceRead(long dataOffset) {
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
    static int lockMap(Arena a, int premap) {
        int lock = lockIndex(a, premap);
        lock(a, lock);
        return lock;
    }

    /** Where the map lock of {@code premap} is in {@code a.mapLocks}. */
    static int lockIndex(Arena a, int premap) {
        return premap & (MAP_LOCKS - 1);
    }

    static void lock(Arena a, int lock) {
        for (int spins = 0; !ARRAY.compareAndSet(a.mapLocks, lock, 0, 1); spins++) {
            backOff(spins);
        }
    }
}
