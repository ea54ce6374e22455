package io.pmemblk.settings;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** {@code pmemblk.properties.example} and installable config files, written from the keys' own documentation. */
public final class ExampleFile {
    private ExampleFile() {}

    /** The documented example file: every key, commented, with its default. */
    public static String example() {
        try {
            return example(Map.of());
        } catch (SettingsException e) {
            throw new AssertionError("built-in defaults must be valid", e);
        }
    }

    /**
     * The documented example with the keys of {@code values} set and every other key commented out at its
     * default: a config file to install (the Debian package's /etc/pmemblk/pmemblk.properties), where a key
     * left alone follows the built-in default of the version installed.
     * @throws SettingsException when a key is unknown or a value is not allowed, as for a config file
     */
    public static String example(Map<String, String> values) throws SettingsException {
        List<String> sets = new ArrayList<>();
        values.forEach((k, v) -> sets.add(k + "=" + v));
        Settings.load(null, sets); // the same checks as a file gets
        StringBuilder b = new StringBuilder();
        b.append("# pmemblk settings. Use with: pmemblk serve --config FILE (and --set key=value to override one).\n");
        b.append(values.isEmpty() ? "# Every key is shown with its built-in default; delete a line to keep the default.\n"
                : "# The keys set for this installation are uncommented; every other key is shown commented out at its\n"
                        + "# built-in default (uncomment a line to change it).\n");
        b.append("# Sizes accept K, M, G, T suffixes (binary: 1K = 1024).\n");
        for (Key<?> k : Keys.ALL.values()) {
            b.append("\n# ").append(k.doc()).append("\n");
            b.append("# Allowed: ").append(k.allowed()).append(".\n");
            if (Keys.LIVE.contains(k)) {
                b.append("# A running server applies a change on reload (SIGHUP, systemctl reload), no restart needed.\n");
            }
            if (values.containsKey(k.name())) {
                b.append("# Built-in default: ").append(k.defaultText()).append("\n");
                b.append(k.name()).append('=').append(values.get(k.name())).append("\n");
            } else {
                b.append(values.isEmpty() ? "" : "#").append(k.name()).append('=').append(k.defaultText()).append("\n");
            }
        }
        return b.toString();
    }
}
