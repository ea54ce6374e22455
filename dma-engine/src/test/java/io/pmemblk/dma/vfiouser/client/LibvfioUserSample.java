package io.pmemblk.dma.vfiouser.client;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/**
 * libvfio-user's sample devices, built by {@code ../shared/peers/build-libvfio-user.sh} (into
 * {@code ~/.cache/libvfio-user-efd091b}, or {@code $LIBVFIO_USER_DIR}): a device this project did not write.
 * Missing ones are built with that script; when the script is missing too, {@link #binary} fails naming what is
 * missing (a test that needs a peer never passes by skipping it).
 */
final class LibvfioUserSample implements AutoCloseable {
    /** ../shared/peers beside the checkout (tests run in dma-engine/), as scripts/vm finds the peers' QEMU. */
    static final Path PEERS = Path.of(System.getProperty("pmemblk.peers",
            Path.of("..", "..", "shared", "peers").toAbsolutePath().normalize().toString()));
    static final Path BUILD_SCRIPT = PEERS.resolve("build-libvfio-user.sh");

    private final Process process;
    private final Path socket;

    private LibvfioUserSample(Process process, Path socket) {
        this.process = process;
        this.socket = socket;
    }

    static Path dir() {
        String env = System.getenv("LIBVFIO_USER_DIR");
        return env != null ? Path.of(env) : Path.of(System.getProperty("user.home"), ".cache", "libvfio-user-efd091b");
    }

    /** The sample {@code name}'s binary, built when missing. */
    static synchronized Path binary(String name) throws IOException, InterruptedException {
        Path bin = dir().resolve("bin").resolve(name);
        if (Files.isExecutable(bin)) {
            return bin;
        }
        if (!Files.isRegularFile(BUILD_SCRIPT)) {
            throw new AssertionError("libvfio-user's sample " + bin + " is missing, and so is " + BUILD_SCRIPT
                    + " that builds it (the peers directory, ../shared/peers); set -Dpmemblk.peers=DIR or"
                    + " LIBVFIO_USER_DIR to where they are");
        }
        Process p = new ProcessBuilder("bash", BUILD_SCRIPT.toString(), dir().toString()).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        if (!p.waitFor(10, TimeUnit.MINUTES) || p.exitValue() != 0) {
            p.destroyForcibly();
            throw new AssertionError(BUILD_SCRIPT + " failed (exit " + (p.isAlive() ? "none: timed out" : p.exitValue())
                    + "); run it by hand to see why");
        }
        if (!Files.isExecutable(bin)) {
            throw new AssertionError(BUILD_SCRIPT + " ran but " + bin + " is still missing");
        }
        return bin;
    }

    /**
     * Starts sample {@code name} serving {@code socket}, and waits (bounded) until it listens there: the socket file
     * exists from its bind(2) on, and a connect(2) between that and its listen(2) is refused (ECONNREFUSED).
     */
    static LibvfioUserSample start(String name, Path socket, Path log) throws IOException, InterruptedException {
        Path bin = binary(name);
        Files.deleteIfExists(socket);
        Process p = new ProcessBuilder(bin.toString(), "-v", socket.toString()).redirectErrorStream(true)
                .redirectOutput(log.toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!listening(socket)) {
            if (!p.isAlive() || System.nanoTime() - deadline > 0) {
                p.destroyForcibly();
                throw new AssertionError(bin + " did not listen on its socket " + socket + " within 10 s (alive: "
                        + p.isAlive() + "); its output: " + Files.readString(log));
            }
            Thread.sleep(10); // polling for a socket another process listens on
        }
        return new LibvfioUserSample(p, socket);
    }

    /**
     * Whether a unix socket bound at {@code socket} listens: its line of /proc/net/unix (Num RefCount Protocol
     * Flags Type St Inode Path) has __SO_ACCEPTCON (0x10000) in Flags. Asked without connecting, which would take
     * the one connection the sample accepts.
     */
    private static boolean listening(Path socket) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/net/unix"))) {
            String[] f = line.trim().split("\\s+");
            if (f.length >= 8 && f[7].equals(socket.toString()) && f[3].matches("[0-9A-Fa-f]+")
                    && (Long.parseLong(f[3], 16) & 0x10000) != 0) {
                return true;
            }
        }
        return false;
    }

    Path socket() {
        return socket;
    }

    Process process() {
        return process;
    }

    @Override
    public void close() throws IOException {
        process.destroyForcibly();
        try {
            process.waitFor(5, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        Files.deleteIfExists(socket);
    }
}
