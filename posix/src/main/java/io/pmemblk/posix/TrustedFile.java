package io.pmemblk.posix;

import java.nio.file.Path;

/**
 * A file opened read-write by {@link TrustedPath#openFile}: checked as opened ({@code fstat} of {@link #fd()}), or
 * created just now with {@code O_CREAT|O_EXCL|O_NOFOLLOW} in a checked directory. Whoever maps, locks, resizes or
 * syncs it uses {@link #fd()}, never the name again. Owns the descriptor and its {@link #directory()}.
 *
 * @param path      the file as checked (a device-DAX node, where a udev link led to one)
 * @param fd        open O_RDWR
 * @param stat      fstat of {@code fd} when it was opened
 * @param created   made by this call (empty, mode 0600)
 * @param directory the directory holding it, held open (for {@link TrustedDirectory#sync()} after creation)
 */
public record TrustedFile(Path path, int fd, FileStat stat, boolean created, TrustedDirectory directory)
        implements AutoCloseable {

    /** {@code /proc/self/fd/N}: this file for a library that opens by path (libpmem), the same inode whatever its name leads to now. */
    public String procPath() {
        return "/proc/self/fd/" + fd;
    }

    /** The file's current fstat (size after a resize). */
    public FileStat restat() throws NativeException {
        return FileCalls.fstat(fd);
    }

    /** Closes the file and its directory. Call once (the owner's close). */
    @Override
    public void close() throws NativeException {
        try {
            Libc.close(fd);
        } finally {
            directory.close();
        }
    }
}
