package io.pmemblk.bench.vhostload;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * What verify mode writes in every 512-byte sector, so that data read back names where it belongs and which write
 * put it there: the sector's own number (u64 @0), the write's generation (u64 @8), and the rest filled with a
 * byte derived from both. A sector of all zeros is one nobody wrote.
 */
final class SectorStamp {
    static final int SECTOR = 512;

    private SectorStamp() {}

    private static long fill(long sector, long gen) {
        long b = (sector * 131 + gen * 7 + 1) & 0xff;
        return b * 0x0101010101010101L;
    }

    /** Stamps the {@code bytes} at {@code from} in {@code data} as sectors from {@code sector} on, of generation {@code gen}. */
    static void stamp(MemorySegment data, long from, long bytes, long sector, long gen) {
        for (long at = from; at < from + bytes; at += SECTOR, sector++) {
            long f = fill(sector, gen);
            data.set(ValueLayout.JAVA_LONG_UNALIGNED, at, sector);
            data.set(ValueLayout.JAVA_LONG_UNALIGNED, at + 8, gen);
            for (long w = 16; w < SECTOR; w += 8) {
                data.set(ValueLayout.JAVA_LONG_UNALIGNED, at + w, f);
            }
        }
    }

    /**
     * Null when every sector of the {@code bytes} at {@code from} in {@code data} is stamped for its own number, of generation {@code gen} (any
     * generation when negative, and then a never-written sector of zeros passes too); else what is wrong.
     */
    static String check(MemorySegment data, long from, long bytes, long sector, long gen) {
        for (long at = from; at < from + bytes; at += SECTOR, sector++) {
            long s = data.get(ValueLayout.JAVA_LONG_UNALIGNED, at), g = data.get(ValueLayout.JAVA_LONG_UNALIGNED, at + 8);
            if (gen < 0 && s == 0 && g == 0 && zeros(data, at)) {
                continue;
            }
            if (s != sector || (gen >= 0 && g != gen)) {
                return "sector " + sector + " holds the stamp of sector " + s + " generation " + g
                        + (gen >= 0 ? ", generation " + gen + " was written" : "");
            }
            long f = fill(sector, g);
            for (long w = 16; w < SECTOR; w += 8) {
                if (data.get(ValueLayout.JAVA_LONG_UNALIGNED, at + w) != f) {
                    return "sector " + sector + " generation " + g + ": byte " + w + " differs from what was written";
                }
            }
        }
        return null;
    }

    private static boolean zeros(MemorySegment data, long at) {
        for (long w = 0; w < SECTOR; w += 8) {
            if (data.get(ValueLayout.JAVA_LONG_UNALIGNED, at + w) != 0) {
                return false;
            }
        }
        return true;
    }
}
