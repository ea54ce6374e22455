package io.pmemblk.pmem;

import io.pmemblk.posix.TrustedFile;

import java.io.IOException;
import java.lang.foreign.MemorySegment;

/**
 * The operations that make stores to the mapping durable, as one small port: the region calls nothing else to
 * persist, so a recording implementation in the tests sees every step and can check that each acknowledgement
 * came after the steps covering the bytes it promises. Ranges are slices of the mapping (bounds checked by
 * {@code asSlice}, liveness by the linker, or by a {@link MappingHold} for a run of calls). Two families, chosen by {@link #flushesCaches()}:
 * <ul>
 *   <li>real pmem (libpmem, is_pmem): {@link #copy}/{@link #fill} store with non-temporal stores or
 *       flushes and {@link #writeBack} writes back cache lines; each is durable after a {@link #drain()}
 *       <em>on the same thread</em>;</li>
 *   <li>page cache (java mapper, or libpmem on a file that is not pmem): stores are ordinary and become durable
 *       by {@link #sync} of their pages, whichever thread stored them (the pages are the kernel's).</li>
 * </ul>
 */
public interface Persistence {
    /** True when durability comes from cache flushes and drains; false when it comes from msync. */
    boolean flushesCaches();

    /**
     * Stores all of {@code src} into {@code dst} (same size). Durable after a drain on this thread, or after a sync.
     * A fault on the mapping (a page gone with its truncated file, a poisoned line) throws HotSpot's
     * {@code InternalError} out of this call, never later and never as a JVM crash: Java copies end with a native
     * round trip, native ones probe {@code dst} first ({@link FaultBarrier}).
     */
    void copy(MemorySegment src, MemorySegment dst);

    /**
     * Begins a run of copies into the mapping (a BTT group's blocks, a request's pieces of guest memory): checks
     * once what each {@link #copy} checks. True: the run's copies may be {@link #copyInRun}, and the caller ends
     * the run with {@link #endRun} before it reports any of them stored. False: they must be {@link #copy} (on
     * pmem once the file's tail is gone, so each range is probed itself; or this port has no run). Per copy, the
     * check ends with a native round trip whose return waits for the stores of the copies before it, so a run of
     * short copies went one at a time instead of overlapping.
     */
    default boolean beginRun() {
        return false;
    }

    /**
     * As {@link #copy}, inside a run {@link #beginRun} began on this thread. A fault is thrown here or at
     * {@link #endRun}. On pmem a truncation of the file during the run can fault inside native code, as it can
     * between any check and its copy (a window of a run's copies, microseconds, instead of one copy's).
     */
    default void copyInRun(MemorySegment src, MemorySegment dst) {
        copy(src, dst);
    }

    /** Ends a run: throws a fault its copies met (HotSpot's InternalError, as {@link #copy}), if not thrown yet. */
    default void endRun() {
    }

    /** Stores {@code value} into all of {@code dst}; durable, and failing on a fault, as {@link #copy}. */
    void fill(MemorySegment dst, byte value);

    /**
     * Writes back the cache lines of {@code range}, whoever stored there (the write-back is cache-coherent, so a
     * device's or another core's stores too). Pmem only.
     */
    void writeBack(MemorySegment range);

    /** Waits for this thread's earlier {@link #copy}, {@link #fill}, {@link #writeBack} to reach the persistence domain. */
    void drain();

    /** msync(MS_SYNC) of the pages under {@code range}; fails with the errno when the kernel could not write them back. */
    void sync(MemorySegment range) throws IOException;

    /** Makes the creation of {@code file} durable: fsync of it (size, blocks) and of its directory (its name), by descriptor. */
    void syncCreated(TrustedFile file) throws IOException;
}
