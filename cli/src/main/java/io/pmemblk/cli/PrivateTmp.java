package io.pmemblk.cli;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

/**
 * systemd's {@code PrivateTmp=yes} (the unit sets it) gives a service its own /tmp and /var/tmp: directories
 * {@code /tmp/systemd-private-<boot>-<unit>-<random>/tmp} bind-mounted over them in the service's mount namespace,
 * which systemd deletes when the service stops. A backing file there is gone at the next start, and that start
 * serves a new empty device: every write acknowledged before is lost. So serve refuses such a pmem.path, rather
 * than warn: a warning scrolls by in the journal while the device works fine, until the first restart.
 *
 * <p>Detected from what this process's mount table says, not guessed from the path alone: running under systemd
 * ({@code $INVOCATION_ID} or {@code $NOTIFY_SOCKET}), pmem.path under /tmp or /var/tmp, and the mount holding it
 * not the one PID 1 sees there, or (when PID 1's table cannot be read, as under the unit's
 * {@code ProtectProc=invisible} without CAP_SYS_PTRACE) a bind of a {@code systemd-private-} directory.
 */
final class PrivateTmp {
    private PrivateTmp() {}

    private static final List<Path> TMP = List.of(Path.of("/tmp"), Path.of("/var/tmp"));

    /** The refusal for {@code pmemPath}, or null when it is not in a private tmp of systemd's. */
    static String refusal(Path pmemPath, Map<String, String> env) throws IOException {
        return refusal(pmemPath, env, Path.of("/proc/self/mountinfo"), Path.of("/proc/1/mountinfo"));
    }

    static String refusal(Path pmemPath, Map<String, String> env, Path ownMounts, Path initMounts) throws IOException {
        if (env.get("INVOCATION_ID") == null && env.get("NOTIFY_SOCKET") == null) {
            return null;
        }
        Path abs = pmemPath.toAbsolutePath().normalize();
        Path tmp = TMP.stream().filter(abs::startsWith).findFirst().orElse(null);
        if (tmp == null) {
            return null;
        }
        Mount own = Mount.holding(abs, Files.readAllLines(ownMounts));
        Mount init = null;
        try {
            init = Mount.holding(abs, Files.readAllLines(initMounts));
        } catch (IOException | SecurityException unreadable) {
            // judged by the systemd-private- bind alone
        }
        boolean isPrivate = own != null && (own.root().contains("/systemd-private-")
                || (init != null && !own.sameAs(init)));
        if (!isPrivate) {
            return null;
        }
        return "pmem.path " + abs + " is in " + tmp + ", which is private to this service (systemd's PrivateTmp=yes:"
                + " mounted from " + own.root() + ") and deleted by systemd when the service stops: the next start"
                + " would serve a new, empty device. Put the device where it persists, e.g. the default"
                + " pmem.path=auto (/var/lib/pmemblk/pmem0.img) or a directory given to the unit with"
                + " ReadWritePaths= in a drop-in (systemctl edit pmemblk@NAME)";
    }

    /**
     * One line of /proc/PID/mountinfo (proc(5)): the mount's id, its device, the directory of that filesystem it
     * shows ({@code root}) and where ({@code mountPoint}); paths with octal escapes for space, tab, newline, backslash.
     */
    record Mount(String device, String root, Path mountPoint) {
        boolean sameAs(Mount o) {
            return device.equals(o.device) && root.equals(o.root) && mountPoint.equals(o.mountPoint);
        }

        /** The mount {@code path} is on: the deepest mount point above it, the last one mounted there. */
        static Mount holding(Path path, List<String> lines) {
            Mount best = null;
            for (String line : lines) {
                String[] f = line.split(" ");
                if (f.length < 5) {
                    continue;
                }
                Mount m = new Mount(f[2], unescape(f[3]), Path.of(unescape(f[4])));
                if (path.startsWith(m.mountPoint)
                        && (best == null || m.mountPoint.getNameCount() >= best.mountPoint.getNameCount())) {
                    best = m;
                }
            }
            return best;
        }

        private static String unescape(String s) {
            StringBuilder b = new StringBuilder(s.length());
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                if (c == '\\' && i + 3 < s.length()) {
                    try {
                        b.append((char) Integer.parseInt(s.substring(i + 1, i + 4), 8));
                        i += 3;
                        continue;
                    } catch (NumberFormatException notOctal) {
                        // kept as it is
                    }
                }
                b.append(c);
            }
            return b.toString();
        }
    }
}
