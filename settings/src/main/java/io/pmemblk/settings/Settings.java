package io.pmemblk.settings;

import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.Set;

/**
 * pmemblk's settings: built-in defaults, then a properties file ({@code --config FILE}), then
 * {@code --set key=value} overrides, in that order. Every key is declared once in {@link Keys#ALL} with its
 * default, what it allows and a line of documentation ({@code pmemblk.properties.example} is written from
 * the same facts). An unknown key or a bad value is a {@link SettingsException} naming the key, the value and
 * what is allowed.
 */
public final class Settings {
    private final Map<String, Object> values;
    private final Map<String, String> texts;
    private final Map<String, String> sources;

    private Settings(Map<String, Object> values, Map<String, String> texts, Map<String, String> sources) {
        this.values = values;
        this.texts = texts;
        this.sources = sources;
    }

    public static Settings defaults() {
        try {
            return load(null, List.of());
        } catch (SettingsException e) {
            throw new AssertionError("built-in defaults must be valid", e);
        }
    }

    /**
     * Defaults, then {@code file} (may be null), then {@code overrides} ("key=value" each).
     */
    public static Settings load(Path file, List<String> overrides) throws SettingsException {
        Map<String, String> texts = new LinkedHashMap<>();
        Map<String, String> sources = new LinkedHashMap<>();
        for (Key<?> k : Keys.ALL.values()) {
            texts.put(k.name(), k.defaultText());
            sources.put(k.name(), "default");
        }
        if (file != null) {
            Properties p = new Properties();
            try (BufferedReader r = Files.newBufferedReader(file, StandardCharsets.UTF_8)) {
                // A byte order mark (Windows editors write one) says the file is UTF-8; Java's decoder keeps it as a
                // character, which made it part of the first key: refused as unknown, printed like a known one.
                r.mark(1);
                if (r.read() != '\uFEFF') {
                    r.reset();
                }
                p.load(r);
            } catch (NoSuchFileException e) {
                throw new SettingsException("--config " + file + ": no such file");
            } catch (IOException | IllegalArgumentException e) {
                throw new SettingsException("--config " + file + ": cannot be read: " + e.getMessage());
            }
            for (String name : p.stringPropertyNames()) {
                put(texts, sources, name, p.getProperty(name), file.toString());
            }
        }
        for (String o : overrides) {
            int eq = o.indexOf('=');
            if (eq <= 0) {
                throw new SettingsException("--set " + o + ": expected key=value, e.g. --set pmem.size=4G");
            }
            put(texts, sources, o.substring(0, eq).trim(), o.substring(eq + 1), "--set");
        }
        Map<String, Object> values = new LinkedHashMap<>();
        for (Key<?> k : Keys.ALL.values()) {
            String text = texts.get(k.name()).trim();
            try {
                Object v = k.parser().parse(text);
                values.put(k.name(), v == null ? NULL : v);
            } catch (RuntimeException e) {
                throw new SettingsException(k.name() + ": '" + text + "' is not allowed (from "
                        + sources.get(k.name()) + "); allowed: " + k.allowed());
            }
        }
        Settings s = new Settings(values, texts, sources);
        CrossChecks.check(s);
        return s;
    }

    private static final Object NULL = new Object();

    private static void put(Map<String, String> texts, Map<String, String> sources, String name, String value, String from)
            throws SettingsException {
        if (!Keys.ALL.containsKey(name)) {
            String near = nearestKey(name);
            throw new SettingsException("unknown setting '" + name + "' (from " + from + "); "
                    + (near == null ? "" : "did you mean '" + near + "'? ")
                    + "known keys: " + String.join(", ", Keys.ALL.keySet()));
        }
        texts.put(name, value);
        sources.put(name, from);
    }

    /**
     * The known key a mistyped one most likely meant, as git and cargo suggest a command: the fewest single-character
     * edits (insert, delete, replace, swap two neighbours), at most a third of the name's length and never more than 3,
     * so that a name unlike every key gets no suggestion; null when none is that close, or two are equally close.
     */
    static String nearestKey(String name) {
        String typed = name.toLowerCase(java.util.Locale.ROOT); // keys are lower case: NBD.Port meant nbd.port
        int limit = Math.min(3, name.length() / 3);
        String best = null;
        int bestDistance = limit + 1;
        boolean tie = false;
        for (String key : Keys.ALL.keySet()) {
            int d = editDistance(typed, key);
            if (d < bestDistance) {
                best = key;
                bestDistance = d;
                tie = false;
            } else if (d == bestDistance) {
                tie = true;
            }
        }
        return tie ? null : best;
    }

    /** Optimal string alignment distance: Levenshtein's, with a swap of two neighbouring characters as one edit. */
    private static int editDistance(String a, String b) {
        int[][] d = new int[a.length() + 1][b.length() + 1];
        for (int i = 0; i <= a.length(); i++) {
            d[i][0] = i;
        }
        for (int j = 0; j <= b.length(); j++) {
            d[0][j] = j;
        }
        for (int i = 1; i <= a.length(); i++) {
            for (int j = 1; j <= b.length(); j++) {
                int cost = a.charAt(i - 1) == b.charAt(j - 1) ? 0 : 1;
                d[i][j] = Math.min(Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1), d[i - 1][j - 1] + cost);
                if (i > 1 && j > 1 && a.charAt(i - 1) == b.charAt(j - 2) && a.charAt(i - 2) == b.charAt(j - 1)) {
                    d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
                }
            }
        }
        return d[a.length()][b.length()];
    }

    /** ublk.queues with auto resolved (= queues). */
    public int ublkQueues() {
        int q = get(Keys.UBLK_QUEUES);
        return q == 0 ? get(Keys.QUEUES) : q;
    }

    /** ublk.depth with auto resolved (= queue.depth). */
    public int ublkDepth() {
        int d = get(Keys.UBLK_DEPTH);
        return d == 0 ? get(Keys.QUEUE_DEPTH) : d;
    }

    /**
     * The bitmap directory, null when bitmap.dir=off: auto is FILE.bitmaps beside pmem.path, or NODE.bitmaps in
     * {@code stateDirectory} for a device-DAX node. bitmap.names without a directory is refused.
     */
    public Path bitmapDir(Path stateDirectory) {
        Path dir = get(Keys.BITMAP_DIR);
        if (dir == null) {
            if (!get(Keys.BITMAP_NAMES).isEmpty()) {
                throw new IllegalArgumentException("bitmap.names=" + text(Keys.BITMAP_NAMES) + " needs a place for the"
                        + " bitmaps; allowed: bitmap.dir=auto (beside pmem.path) or a directory");
            }
            return null;
        }
        if (!dir.equals(Keys.AUTO_PATH)) {
            return dir;
        }
        Path image = get(Keys.PMEM_PATH);
        String name = image.getFileName() + ".bitmaps";
        return image.toString().startsWith("/dev/dax") ? stateDirectory.resolve(name) : image.resolveSibling(name);
    }

    @SuppressWarnings("unchecked")
    public <T> T get(Key<T> key) {
        Object v = values.get(key.name());
        return v == NULL ? null : (T) v;
    }

    /** The text a key's value came from, as given (for `pmemblk info`). */
    public String text(Key<?> key) {
        return texts.get(key.name()).trim();
    }

    /** Where a key's value came from: "default", "--set" or the config file. */
    public String source(Key<?> key) {
        return sources.get(key.name());
    }

    public Set<String> names() {
        return Keys.ALL.keySet();
    }

    /** The keys whose values differ between this and {@code other}, in {@link Keys#ALL} order (values, not texts: 256K = 262144). */
    public List<Key<?>> changed(Settings other) {
        List<Key<?>> out = new ArrayList<>();
        for (Key<?> k : Keys.ALL.values()) {
            if (!Objects.equals(values.get(k.name()), other.values.get(k.name()))) {
                out.add(k);
            }
        }
        return out;
    }
}
