package io.pmemblk.pmem;

import io.pmemblk.posix.Libc;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * CPU access to the mapping that survives a fault. A SIGBUS on the mapping (its file truncated under the server,
 * a poisoned pmem line: BUS_MCEERR_AR) inside native code (libc's or libpmem's memcpy) kills the JVM. Inside an
 * Unsafe access, which every {@code MemorySegment} copy, fill and get is, HotSpot skips the access and posts
 * {@code InternalError("a fault occurred in an unsafe memory access operation")} to the thread, thrown at its next
 * safepoint poll: maybe after the request has been answered OK (measured on JDK 25: a try/catch around the copy in
 * a compiled method missed all 36 faults, which surfaced in its caller). So every access here ends with
 * {@link Libc#nativeRoundTrip(int)}, which throws a posted error on the spot, and callers catch it
 * ({@link #isFault}) where the request runs.
 */
final class FaultBarrier {
    /** Copies and fills go in pieces of this size: between two, a safepoint can proceed and a fault is thrown. */
    static final long CHUNK = 64 << 10;
    private static final String HOTSPOT_FAULT = "a fault occurred in an unsafe memory access operation";

    private FaultBarrier() {
    }

    /**
     * MemorySegment.copy in {@link #CHUNK} pieces, each followed by a native round trip. The chunking also keeps
     * safepoints short: one Unsafe copy is a single stub call in the Java thread state, which a safepoint waits
     * for, page faults included (as libc's memcpy does for longer ranges, run "in native").
     */
    static void copy(MemorySegment src, long srcOffset, MemorySegment dst, long dstOffset, long length) {
        while (true) {
            long n = Math.min(length, CHUNK);
            MemorySegment.copy(src, srcOffset, dst, dstOffset, n);
            Libc.nativeRoundTrip(0);
            length -= n;
            if (length == 0) {
                return;
            }
            srcOffset += n;
            dstOffset += n;
        }
    }

    /** MemorySegment.fill in {@link #CHUNK} pieces, each followed by a native round trip (as {@link #copy}). */
    static void fill(MemorySegment dst, byte value) {
        long length = dst.byteSize();
        for (long at = 0; at < length; at += CHUNK) {
            dst.asSlice(at, Math.min(CHUNK, length - at)).fill(value);
            Libc.nativeRoundTrip(0);
        }
    }

    /**
     * Loads the first and the last byte of {@code range}, then a native round trip: a range cut off by a
     * truncated file throws here, before native code or the kernel touches the range, which would otherwise
     * crash the JVM (libpmem's non-temporal copy) or fail the connection mid-reply (EFAULT on a socket write out
     * of it, a read into it). Two loads cover every page: truncation removes a file's tail, so when the range's
     * last page is still inside the file every page before it is too (device DAX cannot be truncated at all). A
     * load per page, as this did first, found nothing more (a punched hole reads as zeros, it does not fault) and
     * cost 64 KiB non-temporal writes about a tenth of their rate: a cache miss per page, on lines the copy evicts.
     * Known bad blocks are the region's list, checked before this; a page truncated after the probe can still
     * reach the copy: the probe narrows that race to the probe-to-copy window, it cannot close it.
     */
    static void probe(MemorySegment range) {
        long length = range.byteSize();
        if (length == 0) {
            return;
        }
        int sum = range.get(ValueLayout.JAVA_BYTE, 0) + range.get(ValueLayout.JAVA_BYTE, length - 1);
        Libc.nativeRoundTrip(sum); // the loaded bytes go to native code, so the JIT keeps the loads
    }

    /** Whether {@code e} is HotSpot's report of a fault in an Unsafe access (and not some other internal error). */
    static boolean isFault(InternalError e) {
        String m = e.getMessage();
        return m != null && m.contains(HOTSPOT_FAULT);
    }
}
