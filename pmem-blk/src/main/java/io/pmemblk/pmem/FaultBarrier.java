package io.pmemblk.pmem;

import io.pmemblk.posix.MemoryFaults;
import io.pmemblk.posix.Mman;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * CPU access to the mapping that survives a fault. A SIGBUS on the mapping (its file truncated under the server,
 * a poisoned pmem line: BUS_MCEERR_AR) inside native code (libc's or libpmem's memcpy) kills the JVM. Inside an
 * Unsafe access, which every {@code MemorySegment} copy, fill and get is, HotSpot skips the access and posts
 * {@code InternalError("a fault occurred in an unsafe memory access operation")} to the thread, thrown at its next
 * safepoint poll: maybe after the request has been answered OK (measured on JDK 25: a try/catch around the copy in
 * a compiled method missed all 36 faults, which surfaced in its caller). So every access here ends with
 * {@link Mman#nativeRoundTrip(int)}, which throws a posted error on the spot, and callers catch it
 * ({@link #isFault}) where the request runs. The copy and the fault test are {@link MemoryFaults}', shared with
 * the software DMA engine; this class adds the pmem mapping's runs, fills and probes.
 */
final class FaultBarrier {
    /** Copies and fills go in pieces of this size: between two, a safepoint can proceed and a fault is thrown. */
    static final long CHUNK = MemoryFaults.CHUNK;

    private FaultBarrier() {
    }

    /**
     * MemorySegment.copy in {@link #CHUNK} pieces, each followed by a native round trip. The chunking also keeps
     * safepoints short: one Unsafe copy is a single stub call in the Java thread state, which a safepoint waits
     * for, page faults included (as libc's memcpy does for longer ranges, run "in native").
     */
    static void copy(MemorySegment src, long srcOffset, MemorySegment dst, long dstOffset, long length) {
        MemoryFaults.copy(src, srcOffset, dst, dstOffset, length);
    }

    /**
     * One copy of a run the caller ends with {@link #endRun}: MemorySegment.copy without the round trip (a longer
     * one than {@link #CHUNK} as {@link #copy}, for the safepoints). The fault of any copy of the run is thrown at
     * the latest by endRun, still inside the request.
     */
    static void copyInRun(MemorySegment src, MemorySegment dst) {
        long n = dst.byteSize();
        if (n > CHUNK) {
            copy(src, 0, dst, 0, n);
        } else {
            MemorySegment.copy(src, 0, dst, 0, n);
        }
    }

    /** Ends a run of {@link #copyInRun}: its round trip. */
    static void endRun() {
        Mman.nativeRoundTrip(0);
    }

    /** MemorySegment.fill in {@link #CHUNK} pieces, each followed by a native round trip (as {@link #copy}). */
    static void fill(MemorySegment dst, byte value) {
        long length = dst.byteSize();
        for (long at = 0; at < length; at += CHUNK) {
            dst.asSlice(at, Math.min(CHUNK, length - at)).fill(value);
            Mman.nativeRoundTrip(0);
        }
    }

    /**
     * Loads the first and the last byte of {@code range}, then a native round trip: a range cut off by a
     * truncated file throws here, before native code or the kernel touches the range, which would otherwise
     * crash the JVM (libpmem's non-temporal copy) or fail the connection mid-reply (EFAULT on a socket write out
     * of it, a read into it). Two loads cover every page: truncation removes a file's tail, so when the range's
     * last page is still inside the file every page before it is too. A load per page, as this did first, found
     * nothing more (a punched hole reads as zeros, it does not fault) and cost 64 KiB non-temporal writes about a
     * tenth of their rate. Known bad blocks are the region's list, checked before this. The hot path probes
     * through {@link Probe}, which calls this only once the mapping's tail is gone.
     */
    static void probe(MemorySegment range) {
        long length = range.byteSize();
        if (length == 0) {
            return;
        }
        int sum = range.get(ValueLayout.JAVA_BYTE, 0) + range.get(ValueLayout.JAVA_BYTE, length - 1);
        Mman.nativeRoundTrip(sum); // the loaded bytes go to native code, so the JIT keeps the loads
    }

    /**
     * The probe of one mapping, for the hot path. Truncation removes a file's tail, so while the mapping's last
     * byte still loads, every range of the mapping does: one load of a line that stays in cache, where probing the
     * range itself is a cache miss (two, on separate lines) per request on the lines the non-temporal copy is
     * about to write; that miss cost 4 KiB random writes 10-20% of their rate (measured in process, QD32, forced
     * pmem on /dev/shm: 0.98-1.11M IOPS probing the range, 1.13-1.36M probing the tail, 1.11-1.35M with no probe
     * at all). Once the tail has faulted the file is shorter than the mapping for good (the server holds it; a
     * file extended again reads as holes, which do not fault), and every later probe is {@link #probe(MemorySegment)}
     * of the range itself, so requests below the new end are still served.
     *
     * <p>What neither closes: the kernel sets a truncated file's new size, then unmaps the pages past it from the
     * lowest up, so a store into a low page in that window, or between a probe and its copy, still faults inside
     * native code. Closing that takes a SIGBUS handler of our own, which HotSpot's signal chaining does not give
     * to Java code.
     */
    static final class Probe {
        private final MemorySegment tail;
        /** Plain: set once; a thread that has not seen it yet faults on the tail itself and sets it again. */
        private boolean tailGone;

        Probe(MemorySegment mapping) {
            this.tail = mapping.byteSize() == 0 ? mapping : mapping.asSlice(mapping.byteSize() - 1, 1);
        }

        /** Throws HotSpot's fault error (see {@link #isFault}) unless {@code range}, a slice of the mapping, can be loaded now. */
        void probe(MemorySegment range) {
            if (!tailIntact()) {
                FaultBarrier.probe(range);
            }
        }

        /** Whether the mapping's last byte loads now (so every range of it does); false for good once it faulted. */
        boolean tailIntact() {
            if (!tailGone && tail.byteSize() != 0) {
                try {
                    Mman.nativeRoundTrip(tail.get(ValueLayout.JAVA_BYTE, 0));
                    return true;
                } catch (InternalError e) {
                    if (!isFault(e)) {
                        throw e;
                    }
                    tailGone = true;
                }
            }
            return false;
        }
    }

    /** Whether {@code e} is HotSpot's report of a fault in an Unsafe access (and not some other internal error). */
    static boolean isFault(InternalError e) {
        return MemoryFaults.isFault(e);
    }
}
