package io.pmemblk.settings;

import java.net.InetSocketAddress;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * The parsers the keys share: each turns a value's text into the value, or throws IllegalArgumentException (the
 * caller names the key, the text and what is allowed).
 */
final class ValueParsers {
    private ValueParsers() {}

    static Path path(String t) {
        if (t.isBlank() || t.indexOf('\0') >= 0) {
            throw new IllegalArgumentException();
        }
        return Path.of(t);
    }

    static boolean bool(String t) {
        return switch (t.toLowerCase(Locale.ROOT)) {
            case "true", "yes", "on" -> true;
            case "false", "no", "off" -> false;
            default -> throw new IllegalArgumentException();
        };
    }

    static <E extends Enum<E>> E choice(String t, Class<E> type) {
        return Enum.valueOf(type, t.toUpperCase(Locale.ROOT).replace('-', '_')); // vfio-user: VFIO_USER
    }

    /** bitmap.names: distinct names of A-Z a-z 0-9 _ -, 1 to 64 each; empty is none. */
    static List<String> bitmapNames(String t) {
        List<String> names = new ArrayList<>();
        for (String n : t.split(",")) {
            n = n.trim();
            if (n.isEmpty()) {
                continue;
            }
            if (!n.matches("[A-Za-z0-9_-]{1,64}") || names.contains(n)) {
                throw new IllegalArgumentException();
            }
            names.add(n);
        }
        return List.copyOf(names);
    }

    /** "auto" is the empty list. */
    static List<String> pciAddresses(String t) {
        if (t.trim().equalsIgnoreCase("auto")) {
            return List.of();
        }
        List<String> out = new ArrayList<>();
        for (String a : t.split(",")) {
            String x = a.trim().toLowerCase(Locale.ROOT);
            if (!x.matches("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]") || out.contains(x)) {
                throw new IllegalArgumentException();
            }
            out.add(x);
        }
        return List.copyOf(out);
    }

    static int intRange(String t, int min, int max) {
        long v = Long.parseLong(t);
        if (v < min || v > max) {
            throw new IllegalArgumentException();
        }
        return (int) v;
    }

    /** {@link #intRange} that also takes only multiples of {@code multiple}. */
    static int intRange(String t, int min, int max, int multiple) {
        int v = intRange(t, min, max);
        if (v % multiple != 0) {
            throw new IllegalArgumentException();
        }
        return v;
    }

    /** A logical block size, the unit a device writes atomically: 512 or 4096. */
    static int blockSize(String t) {
        int v = Integer.parseInt(t);
        if (v != 512 && v != 4096) {
            throw new IllegalArgumentException();
        }
        return v;
    }

    static int powerOfTwo(int v) {
        if (Integer.bitCount(v) != 1) {
            throw new IllegalArgumentException();
        }
        return v;
    }

    static long powerOfTwo(long v) {
        if (Long.bitCount(v) != 1) {
            throw new IllegalArgumentException();
        }
        return v;
    }

    static long range(long v, long min, long max, long multiple) {
        if (v < min || v > max || v % multiple != 0) {
            throw new IllegalArgumentException();
        }
        return v;
    }

    /** ADDRESS:PORT, [IPv6]:PORT; the address is checked as nbd.bind's is. */
    static InetSocketAddress listen(String t) {
        int colon = t.lastIndexOf(':');
        if (colon <= 0) {
            throw new IllegalArgumentException();
        }
        String h = t.substring(0, colon);
        if (h.startsWith("[") && h.endsWith("]")) {
            h = h.substring(1, h.length() - 1);
        }
        return InetSocketAddress.createUnresolved(host(h), intRange(t.substring(colon + 1), 1, 65535));
    }

    /** An NQN as NVMe base 1.3 7.9 has it: "nqn." then at most 223 bytes in all, printable. */
    static String nqn(String t) {
        if (!t.startsWith("nqn.") || t.length() > 223 || !t.chars().allMatch(c -> c > 32 && c < 127)) {
            throw new IllegalArgumentException();
        }
        return t;
    }

    static String host(String t) {
        if (t.isBlank() || t.chars().anyMatch(c -> c <= ' ' || c == '/')) {
            throw new IllegalArgumentException();
        }
        return t;
    }

    static String exportName(String t) {
        if (t.isEmpty() || t.length() > 256 || t.chars().anyMatch(c -> c <= ' ' || c == 0x7f)) {
            throw new IllegalArgumentException();
        }
        return t;
    }
}
