package io.pmemblk.posix;

import java.nio.file.Path;
import java.util.List;

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
            FileStat now = Libc.stat(p.toString());
            return now.dev() == stat.dev() && now.ino() == stat.ino();
        } catch (NativeException e) {
            return false;
        }
    }

    /** fsync of the directory: the entries created in it (a file's name, a subdirectory) survive a crash. */
    public void sync() throws NativeException {
        // fsync needs a descriptor opened for reading; an O_PATH one answers EBADF
        int d = Libc.openat(fd, ".", Libc.O_RDONLY | Libc.O_DIRECTORY, 0);
        try {
            Libc.fsync(d, path.toString());
        } finally {
            Libc.close(d);
        }
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
