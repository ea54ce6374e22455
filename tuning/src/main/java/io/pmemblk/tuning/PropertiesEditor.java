package io.pmemblk.tuning;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

/**
 * Sets one key in a properties file, keeping every other line and comment as it was. The key's line is
 * replaced in place (or appended); a comment line saying how the value was measured goes right above it,
 * replacing the one a previous run left. The file is replaced atomically (write to a sibling, then rename).
 */
public final class PropertiesEditor {
    static final String MARK = "# measured by pmemblk tune";

    private PropertiesEditor() {}

    public static void set(Path file, String key, String value, String how) throws IOException {
        List<String> lines = Files.exists(file) ? Files.readAllLines(file, StandardCharsets.UTF_8) : new ArrayList<>();
        List<String> out = new ArrayList<>(lines.size() + 2);
        Pattern keyLine = Pattern.compile("^\\s*" + Pattern.quote(key) + "\\s*[=:\\s].*$|^\\s*" + Pattern.quote(key) + "$");
        String comment = MARK + " " + how;
        boolean done = false;
        for (int i = 0; i < lines.size(); i++) {
            String line = lines.get(i);
            if (keyLine.matcher(line).matches()) {
                if (!out.isEmpty() && out.get(out.size() - 1).startsWith(MARK)) {
                    out.remove(out.size() - 1);
                }
                if (!done) {
                    out.add(comment);
                    out.add(key + "=" + value);
                    done = true;
                }
                // a second definition of the key would override ours when loaded: drop it
                continue;
            }
            out.add(line);
        }
        if (!done) {
            if (!out.isEmpty() && !out.get(out.size() - 1).isBlank()) {
                out.add("");
            }
            out.add(comment);
            out.add(key + "=" + value);
        }
        Path tmp = file.resolveSibling(file.getFileName() + ".tune-tmp");
        Files.write(tmp, out, StandardCharsets.UTF_8);
        Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }
}
