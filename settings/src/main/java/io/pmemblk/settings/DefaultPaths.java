package io.pmemblk.settings;

import java.nio.file.Path;
import java.util.Map;

/**
 * Where {@code pmem.path=auto} and {@code nbd.socket=auto} lead: directories nobody else can create first. As
 * root, the ones the systemd unit makes ({@code StateDirectory=pmemblk}: /var/lib/pmemblk,
 * {@code RuntimeDirectory=pmemblk}: /run/pmemblk); as another user, the XDG base directories
 * (XDG_DATA_HOME, default ~/.local/share, for the device image, which is user data like a VM image;
 * XDG_RUNTIME_DIR for the socket, or beside the image when that is not set, as without a login session).
 * Earlier versions put both defaults in world-writable /var/tmp and /tmp, where another user could create
 * {@code pmemblk/} first.
 */
public final class DefaultPaths {
    private DefaultPaths() {}

    public static final Path ROOT_STATE = Path.of("/var/lib/pmemblk");
    public static final Path ROOT_RUNTIME = Path.of("/run/pmemblk");
    /** The default pmem.path of earlier versions: an existing image there is not silently replaced by a new one. */
    public static final Path OLD_PMEM_PATH = Path.of("/var/tmp/pmemblk/pmem0.img");
    static final String IMAGE = "pmem0.img";
    static final String SOCKET = "nbd.sock";

    public static Path pmemPath(int euid, Map<String, String> env) {
        return (euid == 0 ? ROOT_STATE : dataHome(env).resolve("pmemblk")).resolve(IMAGE);
    }

    public static Path socketPath(int euid, Map<String, String> env) {
        if (euid == 0) {
            return ROOT_RUNTIME.resolve(SOCKET);
        }
        Path runtime = absolute(env.get("XDG_RUNTIME_DIR"));
        return (runtime != null ? runtime.resolve("pmemblk") : dataHome(env).resolve("pmemblk")).resolve(SOCKET);
    }

    private static Path dataHome(Map<String, String> env) {
        Path d = absolute(env.get("XDG_DATA_HOME")); // the spec says to ignore a relative one
        if (d != null) {
            return d;
        }
        Path home = absolute(env.get("HOME"));
        if (home == null) {
            home = Path.of(System.getProperty("user.home"));
        }
        return home.resolve(".local/share");
    }

    private static Path absolute(String s) {
        return s == null || s.isBlank() || !s.startsWith("/") ? null : Path.of(s);
    }
}
