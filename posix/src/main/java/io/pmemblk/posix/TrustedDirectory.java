package io.pmemblk.posix;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;

/**
 * A directory reached through directories {@link TrustedPath} checked, held open ({@code O_PATH}) so that what is
 * created in it later lands in the directory that was checked, whatever its name leads to by then: every use goes
 * through {@link #fd()} ({@code openat}, {@code mkdirat}, {@code renameat}) or {@link #procPath()}, never through
 * the name again. Owns the descriptor; {@link #close()} is idempotent.
 */
public final class TrustedDirectory implements AutoCloseable {
    private final int fd;
    private final Path path;
    private final FileStat stat;
    /** The directories the walk to this one made, deepest first, each with its parent held open to sync the entry. */
    private final List<Made> made;
    private boolean closed;

    /** A directory the walk made, and the directory its entry is in. */
    record Made(Path directory, TrustedDirectory parent) {}

    TrustedDirectory(int fd, Path path, FileStat stat, List<Made> made) {
        this.fd = fd;
        this.path = path;
        this.stat = stat;
        this.made = List.copyOf(made);
    }

    /** The directories made on the way here (by this process, mode 0755 less the umask), deepest first. */
    public List<Path> madeDirectories() {
        return made.stream().map(Made::directory).toList();
    }

    /** fsync of the parent of each directory made on the way here, deepest first: their names survive a crash. */
    public void syncMadeDirectories() throws NativeException {
        for (Made m : made) {
            m.parent().sync();
        }
    }

    /** The O_PATH descriptor, for the *at() calls. */
    public int fd() {
        return fd;
    }

    /** Where the directory was found (links on the way resolved), for messages. */
    public Path path() {
        return path;
    }

    /** fstat of the held descriptor when it was checked. */
    public FileStat stat() {
        return stat;
    }

    /**
     * {@code /proc/self/fd/N}: this directory for a call that takes only a path (bind(2) of a unix socket,
     * libpmem's pmem_map_file). The kernel resolves it through this process's descriptor table, not by name, and
     * it is at most 24 bytes, so a socket address built on it fits sun_path whatever the directory's real name.
     */
    public String procPath() {
        return "/proc/self/fd/" + fd;
    }

    /** Whether {@code p}, looked up by name now, is still this directory (same device and inode). */
    public boolean isAt(Path p) {
        try {
            FileStat now = FileCalls.stat(p.toString());
            return now.dev() == stat.dev() && now.ino() == stat.ino();
        } catch (NativeException e) {
            return false;
        }
    }

    /** fsync of the directory: the entries created in it (a file's name, a subdirectory) survive a crash. */
    public void sync() throws NativeException {
        // fsync needs a descriptor opened for reading; an O_PATH one answers EBADF
        int d = FileCalls.openat(fd, ".", FileCalls.O_RDONLY | FileCalls.O_DIRECTORY, 0);
        try {
            FileCalls.fsync(d, path.toString());
        } finally {
            Libc.close(d);
        }
    }

    /**
     * Replaces the file {@code name} in this directory by one holding {@code bytes}, atomically and durably: a
     * new file (mode 0600 less the umask, {@code O_CREAT|O_EXCL|O_NOFOLLOW}) is written under a temporary name,
     * fsync'd, renamed over {@code name} and the directory fsync'd. A crash or a failure leaves the old file or
     * the new one at {@code name}, never a torn one; a reader that opened the old file keeps reading it. A
     * symbolic link at {@code name} is replaced, not followed (rename replaces the entry itself).
     *
     * <p>The temporary name ({@code name.tmp-PID-RANDOM}) is this call's alone: a concurrent writer of the same
     * name never opens, truncates or renames it (the last rename wins, whole), and a failure removes it. Only a
     * crash between its creation and the rename leaves it behind; nothing reads it.
     *
     * @param name a file name in this directory (no {@code /})
     * @throws IOException naming the file and the step that failed; {@code name} is then as it was, unless what
     *                     failed is the directory's fsync after the rename (then the new file may not survive a crash)
     */
    public void replaceDurably(String name, byte[] bytes) throws IOException {
        if (name.isEmpty() || name.equals(".") || name.equals("..") || name.indexOf('/') >= 0 || name.indexOf(0) >= 0) {
            throw new IllegalArgumentException("not a file name in " + path + ": '" + name + "'");
        }
        String tmp = null;
        try {
            int fd = -1;
            // O_EXCL makes the name ours; a clash (a random one, or a pid reused in another pid namespace) is retried
            for (int attempt = 0; fd < 0; attempt++) {
                String candidate = temporaryName(name);
                try {
                    fd = FileCalls.openat(this.fd, candidate,
                            FileCalls.O_WRONLY | FileCalls.O_CREAT | FileCalls.O_EXCL | FileCalls.O_NOFOLLOW, 0600);
                    tmp = candidate;
                } catch (NativeException e) {
                    if (e.errno() != Errno.EEXIST || attempt >= 3) {
                        throw e;
                    }
                }
            }
            try (Arena a = Arena.ofConfined()) {
                MemorySegment src = a.allocateFrom(ValueLayout.JAVA_BYTE, bytes);
                for (long done = 0; done < bytes.length; ) {
                    long n = FileIo.pwrite(fd, src.asSlice(done), done);
                    if (n < 0) {
                        throw NativeException.of("pwrite", (int) -n,
                                tmp + ", " + (bytes.length - done) + " bytes at " + done);
                    }
                    if (n == 0) {
                        throw new IOException("pwrite(" + tmp + ") wrote nothing of the " + (bytes.length - done)
                                + " bytes at " + done);
                    }
                    done += n;
                }
                FileCalls.fsync(fd, tmp);
            } finally {
                Libc.close(fd);
            }
            FileCalls.renameat(this.fd, tmp, this.fd, name);
            tmp = null; // renamed: nothing to remove whatever follows
            sync();
        } catch (IOException e) {
            if (tmp != null) {
                try {
                    FileCalls.unlinkat(this.fd, tmp, 0); // ours alone (O_EXCL): no other writer's file is removed
                } catch (NativeException suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            throw new IOException("cannot replace " + path.resolve(name) + ": " + e.getMessage(), e);
        }
    }

    /**
     * {@code name.tmp-PID-RANDOM}, within NAME_MAX (255 bytes): a longer name's own part is left out, so that
     * any name that fits can be replaced.
     */
    private static String temporaryName(String name) {
        String unique = ".tmp-" + ProcessHandle.current().pid() + "-"
                + HexFormat.of().toHexDigits(ThreadLocalRandom.current().nextLong());
        return name.getBytes(StandardCharsets.UTF_8).length + unique.length() <= 255 ? name + unique : "pmemblk" + unique;
    }

    @Override
    public synchronized void close() throws NativeException {
        if (!closed) {
            closed = true;
            try {
                Libc.close(fd);
            } finally {
                for (Made m : made) {
                    m.parent().close();
                }
            }
        }
    }

    @Override
    public String toString() {
        return "TrustedDirectory[" + path + ", fd " + fd + "]";
    }
}
