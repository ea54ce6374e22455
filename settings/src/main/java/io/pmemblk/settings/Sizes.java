package io.pmemblk.settings;

import java.util.Locale;

/** Byte sizes as users write them: 4096, 64K, 1M, 2G, 1T (binary multiples; a trailing B or iB is allowed). */
public final class Sizes {
    private Sizes() {}

    public static long parse(String text) {
        String t = text.trim().toUpperCase(Locale.ROOT);
        if (t.endsWith("IB")) {
            t = t.substring(0, t.length() - 2);
        } else if (t.endsWith("B")) {
            t = t.substring(0, t.length() - 1);
        }
        if (t.isEmpty()) {
            throw new IllegalArgumentException("empty size");
        }
        int shift = switch (t.charAt(t.length() - 1)) {
            case 'K' -> 10;
            case 'M' -> 20;
            case 'G' -> 30;
            case 'T' -> 40;
            default -> 0;
        };
        String digits = shift == 0 ? t : t.substring(0, t.length() - 1);
        if (digits.isEmpty() || !digits.chars().allMatch(Character::isDigit) || digits.length() > 19) {
            throw new IllegalArgumentException("not a size: " + text);
        }
        long n = Long.parseLong(digits);
        if (n > (Long.MAX_VALUE >> shift)) {
            throw new IllegalArgumentException("size too large: " + text);
        }
        return n << shift;
    }

    /** The shortest exact form: 1073741824 -> 1G, 65536 -> 64K, 1000 -> 1000. */
    public static String format(long bytes) {
        String[] units = {"", "K", "M", "G", "T"};
        int u = 0;
        while (u < units.length - 1 && bytes != 0 && bytes % 1024 == 0) {
            bytes /= 1024;
            u++;
        }
        return bytes + units[u];
    }
}
