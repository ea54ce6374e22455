package io.pmemblk.posix;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * CPU copies that survive a fault in the memory they touch: a page of a file truncated under its mapping (SIGBUS),
 * a poisoned line. Inside native code (libc's or libpmem's memcpy) such a fault kills the JVM. Inside an Unsafe
 * access, which every {@code MemorySegment} copy and get is, HotSpot skips the access and posts
 * {@code InternalError("a fault occurred in an unsafe memory access operation")} to the thread, thrown at its next
 * safepoint poll: maybe long after the copy (measured on JDK 25: a try/catch around the copy in a compiled method
 * missed all 36 faults, which surfaced in its caller). So every copy here ends with {@link Mman#nativeRoundTrip},
 * which throws a posted error on the spot, and callers catch it ({@link #isFault}) where the copy was asked for.
 * One mechanism for every place that copies memory another party can take away (pmem-blk's FaultBarrier for the
 * pmem mapping, the software DMA engine for whatever its descriptors name).
 */
public final class MemoryFaults {
    /** Copies go in pieces of this size: between two, a safepoint can proceed and a fault is thrown. */
    public static final long CHUNK = 64 << 10;
    private static final String HOTSPOT_FAULT = "a fault occurred in an unsafe memory access operation";

    private MemoryFaults() {
    }

    /**
     * MemorySegment.copy in {@link #CHUNK} pieces, each followed by a native round trip. The chunking also keeps
     * safepoints short: one Unsafe copy is a single stub call in the Java thread state, which a safepoint waits
     * for, page faults included.
     * @throws InternalError HotSpot's fault error ({@link #isFault}) when a page of either side faulted
     */
    public static void copy(MemorySegment src, long srcOffset, MemorySegment dst, long dstOffset, long length) {
        while (true) {
            long n = Math.min(length, CHUNK);
            MemorySegment.copy(src, srcOffset, dst, dstOffset, n);
            Mman.nativeRoundTrip(0);
            length -= n;
            if (length <= 0) {
                return;
            }
            srcOffset += n;
            dstOffset += n;
        }
    }

    /**
     * Whether the first and the last byte of {@code range} load now (true for an empty range): after a fault, which
     * side of a copy it was in. Truncation removes a file's tail, so the last byte answers for the pages before it.
     */
    public static boolean loads(MemorySegment range) {
        long length = range.byteSize();
        if (length == 0) {
            return true;
        }
        try {
            int sum = range.get(ValueLayout.JAVA_BYTE, 0) + range.get(ValueLayout.JAVA_BYTE, length - 1);
            Mman.nativeRoundTrip(sum); // the loaded bytes go to native code, so the JIT keeps the loads
            return true;
        } catch (InternalError e) {
            if (!isFault(e)) {
                throw e;
            }
            return false;
        }
    }

    /** Whether {@code e} is HotSpot's report of a fault in an Unsafe access (and not some other internal error). */
    public static boolean isFault(InternalError e) {
        String m = e.getMessage();
        return m != null && m.contains(HOTSPOT_FAULT);
    }
}
