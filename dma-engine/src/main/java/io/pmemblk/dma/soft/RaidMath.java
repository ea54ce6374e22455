package io.pmemblk.dma.soft;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * The arithmetic of the I/OAT RAID operations, as the hardware does it for Linux's async_tx: P is the XOR of the
 * sources; Q is the sum in GF(2^8) (polynomial x^8+x^4+x^3+x^2+1, 0x11d, the one lib/raid6 uses) of each source
 * multiplied by its coefficient. No allocation per call: the sources come in an array the engine keeps.
 */
final class RaidMath {
    private RaidMath() {}

    private static final ValueLayout.OfLong WORD = ValueLayout.JAVA_LONG_UNALIGNED;
    private static final ValueLayout.OfByte BYTE = ValueLayout.JAVA_BYTE;
    /** MUL[a << 8 | b] = a * b in GF(2^8) mod 0x11d. */
    private static final byte[] MUL = new byte[256 * 256];

    static {
        for (int a = 0; a < 256; a++) {
            for (int b = 0; b < 256; b++) {
                MUL[a << 8 | b] = (byte) gfMul(a, b);
            }
        }
    }

    /** a * b in GF(2^8) modulo 0x11d, bit by bit (the table above is built from this). */
    static int gfMul(int a, int b) {
        int p = 0;
        for (int i = 0; i < 8; i++) {
            if ((b & 1) != 0) {
                p ^= a;
            }
            boolean carry = (a & 0x80) != 0;
            a = (a << 1) & 0xFF;
            if (carry) {
                a ^= 0x1d;
            }
            b >>= 1;
        }
        return p;
    }

    /**
     * {@code out} = XOR of {@code n} sources, or with {@code validate} whether {@code out} XOR the sources is all
     * zero (nothing written).
     * @return true when validating found a non-zero result
     */
    static boolean xor(MemorySegment[] sources, int n, MemorySegment out, long size, boolean validate) {
        long words = size & ~7L;
        boolean nonZero = false;
        for (long i = 0; i < words; i += 8) {
            long acc = validate ? out.get(WORD, i) : 0;
            for (int s = 0; s < n; s++) {
                acc ^= sources[s].get(WORD, i);
            }
            if (validate) {
                nonZero |= acc != 0;
            } else {
                out.set(WORD, i, acc);
            }
        }
        for (long i = words; i < size; i++) {
            int acc = validate ? out.get(BYTE, i) : 0;
            for (int s = 0; s < n; s++) {
                acc ^= sources[s].get(BYTE, i);
            }
            if (validate) {
                nonZero |= (acc & 0xFF) != 0;
            } else {
                out.set(BYTE, i, (byte) acc);
            }
        }
        return nonZero;
    }

    /**
     * {@code q} = sum of coef[s] * source s in GF(2^8), or with {@code validate} whether q plus that sum is non-zero
     * (nothing written). {@code coefs[s]} is source s's coefficient.
     */
    static boolean q(MemorySegment[] sources, int[] coefs, int n, MemorySegment q, long size, boolean validate) {
        boolean nonZero = false;
        for (long i = 0; i < size; i++) {
            int acc = validate ? q.get(BYTE, i) & 0xFF : 0;
            for (int s = 0; s < n; s++) {
                acc ^= MUL[coefs[s] << 8 | (sources[s].get(BYTE, i) & 0xFF)] & 0xFF;
            }
            if (validate) {
                nonZero |= acc != 0;
            } else {
                q.set(BYTE, i, (byte) acc);
            }
        }
        return nonZero;
    }
}
