package io.pmemblk.nvme;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * NQN fields as Connect's data carries them (NVMe-oF 1.1 3.3 figure 20: SUBNQN and HOSTNQN, 256 bytes each, UTF-8,
 * NUL terminated), compared where they lie against names encoded once: a Connect decodes no string. A field with
 * no NUL counts whole.
 */
final class Nqn {
    private Nqn() {}

    /** The well-known discovery NQN, encoded. */
    private static final byte[] DISCOVERY = encode(Nvme.DISCOVERY_NQN);

    static byte[] encode(String nqn) {
        return nqn.getBytes(StandardCharsets.UTF_8);
    }

    /** The bytes of the field at {@code at} before its NUL. */
    static int length(ByteBuffer d, int at) {
        int n = 0;
        while (n < Nvme.NQN_FIELD && d.get(at + n) != 0) {
            n++;
        }
        return n;
    }

    /** Whether the field at {@code at} holds exactly {@code nqn}. */
    static boolean equals(ByteBuffer d, int at, byte[] nqn) {
        if (length(d, at) != nqn.length) {
            return false;
        }
        for (int i = 0; i < nqn.length; i++) {
            if (d.get(at + i) != nqn[i]) {
                return false;
            }
        }
        return true;
    }

    static boolean isDiscovery(ByteBuffer d, int at) {
        return equals(d, at, DISCOVERY);
    }

    /** The length of a field copied whole into {@code field}: the bytes before its NUL. */
    static int length(byte[] field) {
        int n = 0;
        while (n < field.length && field[n] != 0) {
            n++;
        }
        return n;
    }

    /** Whether two fields copied whole hold the same NQN (what follows the NUL does not count). */
    static boolean same(byte[] a, byte[] b) {
        return Arrays.equals(a, 0, length(a), b, 0, length(b));
    }

    /** Whether the field copied whole into {@code field} holds exactly the encoded {@code nqn}. */
    static boolean holds(byte[] field, byte[] nqn) {
        return Arrays.equals(field, 0, length(field), nqn, 0, nqn.length);
    }

    /** A field's text, for log lines only. */
    static String text(byte[] field) {
        return new String(field, 0, length(field), StandardCharsets.UTF_8);
    }

    /** The text of the field at {@code at}, for log lines only. */
    static String text(ByteBuffer d, int at) {
        byte[] b = new byte[length(d, at)];
        d.get(at, b);
        return new String(b, StandardCharsets.UTF_8);
    }
}
