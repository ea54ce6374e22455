package io.pmemblk.posix;

import java.io.IOException;
import java.net.ConnectException;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;

/**
 * A listening unix socket's file, made where a checked directory ({@link TrustedPath#openParentOf}) is held open:
 * NBD's {@code nbd.socket} and vhost-user's {@code vhost.socket} (moved here from the NBD server so both frontends
 * make theirs one way). {@link #remove} takes away the socket this bound and no other that took its name.
 *
 * <p>Mode 0600 and no window where it is reachable with looser permissions: the socket is created inside a fresh
 * 0700 directory made in the held directory (nobody else can reach it there), chmod'ed to 0600, and only then
 * renamed into place (rename is atomic; a bound socket keeps working under its new name because clients find it by
 * inode). Setting the umask would be process-wide and racy. With a group ({@code vhost.socket-group}: a QEMU that
 * runs as another user but in that group), the socket is given to the group and made 0660 while still in the
 * staging directory, so it is never reachable by more than the owner and that group either.
 *
 * <p>Every step goes through descriptors: bind(2) takes only a path, so the binder is given
 * {@code /proc/self/fd/N/s} of the staging directory's descriptor, which the kernel resolves through this process's
 * descriptor table (at most 26 bytes, far below sun_path's 108, whatever the directory's name); fchdir would do it
 * too but changes the working directory of every thread of the JVM at once. The rename into the held directory
 * gives the socket its name, which bind's length limit never applies to. Afterwards the configured path must still
 * lead to that socket (the directory's name not moved to another directory meanwhile), or nobody could connect to
 * what is served: the bind fails and says so.
 */
public final class UnixSocketFile {
    private static final System.Logger LOG = System.getLogger(UnixSocketFile.class.getName());

    /** Binds a socket (and listens) at {@code address}, a path bind(2) can take. */
    @FunctionalInterface
    public interface Binder {
        void bind(String address) throws IOException;
    }

    private final TrustedDirectory dir;
    private final Path path;
    private final String setting;
    private FileStat bound;

    private UnixSocketFile(TrustedDirectory dir, Path path, String setting) {
        this.dir = dir;
        this.path = path;
        this.setting = setting;
    }

    /**
     * Makes the socket {@code path} (absolute) in {@code dir}, its parent held open, with {@code binder}; a socket
     * file nobody listens on is removed first (left over from a crash), a live one refused. {@code setting} names
     * the path in messages ({@code "nbd.socket"}).
     * @throws IOException when the path is taken, or its directory was moved meanwhile (nothing is left behind)
     */
    public static UnixSocketFile bind(TrustedDirectory dir, Path path, String setting, Binder binder) throws IOException {
        return bind(dir, path, setting, null, binder);
    }

    /**
     * As {@link #bind(TrustedDirectory, Path, String, Binder)}, the socket owned by {@code group} and mode 0660
     * (null: 0600). A server that is not root can only give it to a group it is a member of (chown(2)): EPERM is
     * refused with what to do.
     */
    public static UnixSocketFile bind(TrustedDirectory dir, Path path, String setting, GroupPrincipal group,
                                      Binder binder) throws IOException {
        UnixSocketFile f = new UnixSocketFile(dir, path, setting);
        String name = path.getFileName().toString();
        f.removeStale(name);
        String staging = ".sock-" + Long.toHexString(java.util.concurrent.ThreadLocalRandom.current().nextLong());
        FileCalls.mkdirat(dir.fd(), staging, 0700);
        int stagingFd = -1;
        try {
            stagingFd = FileCalls.openat(dir.fd(), staging, FileCalls.O_PATH | FileCalls.O_DIRECTORY | FileCalls.O_NOFOLLOW, 0);
            binder.bind("/proc/self/fd/" + stagingFd + "/s");
            FileCalls.fchmodat(stagingFd, "s", 0600);
            if (group != null) {
                giveToGroup(stagingFd, group, setting, path);
            }
            FileStat st = FileCalls.fstatat(stagingFd, "s", FileCalls.AT_SYMLINK_NOFOLLOW);
            FileCalls.renameat(stagingFd, "s", dir.fd(), name);
            f.bound = st;
            if (!dir.isAt(path.getParent()) || !sameFile(path, st)) {
                throw new IOException(setting + " " + path + ": " + path.getParent() + " is no longer the directory"
                        + " pmemblk checked and bound the socket in (" + dir.path() + " was moved or replaced while"
                        + " the server started), so nobody could connect at " + path + ". Find what moves "
                        + path.getParent() + ", then start again");
            }
            return f;
        } catch (IOException | RuntimeException e) {
            f.remove(); // renamed into place already: not left for clients to find dead
            throw e;
        } finally {
            if (stagingFd >= 0) {
                int fd = stagingFd;
                quietly(() -> FileCalls.unlinkat(fd, "s", 0)); // only there when bind or rename failed
                Libc.closeQuietly(fd);
            }
            quietly(() -> FileCalls.unlinkat(dir.fd(), staging, FileCalls.AT_REMOVEDIR));
        }
    }

    public Path path() {
        return path;
    }

    /**
     * chown(2) of the staged socket to {@code group}, then 0660. Through {@code /proc/self/fd/N/s} as bind is: the
     * staging directory is this process's own (0700), so nothing can be swapped in under that name.
     */
    private static void giveToGroup(int stagingFd, GroupPrincipal group, String setting, Path path) throws IOException {
        Path staged = Path.of("/proc/self/fd/" + stagingFd + "/s");
        try {
            Files.getFileAttributeView(staged, PosixFileAttributeView.class, LinkOption.NOFOLLOW_LINKS).setGroup(group);
        } catch (IOException e) {
            throw new IOException(setting + "-group=" + group.getName() + ": the socket " + path + " cannot be given to"
                    + " group " + group.getName() + " (" + e.getMessage() + "); a server that is not root can only"
                    + " use a group it is a member of. Allowed: such a group, or empty for a socket only its owner"
                    + " reaches", e);
        }
        FileCalls.fchmodat(stagingFd, "s", 0660);
    }

    /** Removes the socket from the held directory if its name still holds the one bound here. Idempotent. */
    public void remove() {
        if (bound == null) {
            return;
        }
        String name = path.getFileName().toString();
        try {
            FileStat now = FileCalls.fstatat(dir.fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW);
            if (now.dev() == bound.dev() && now.ino() == bound.ino()) {
                FileCalls.unlinkat(dir.fd(), name, 0);
            }
        } catch (NativeException e) {
            if (e.errno() != Errno.ENOENT) {
                LOG.log(System.Logger.Level.WARNING, "{0}: could not remove socket {1}: {2}", setting, path,
                        e.getMessage());
            }
        }
        bound = null;
    }

    /** Whether {@code path}, looked up by name without following a final link, is the file of {@code st}. */
    private static boolean sameFile(Path path, FileStat st) {
        try {
            FileStat now = FileCalls.lstat(path.toString());
            return now.dev() == st.dev() && now.ino() == st.ino();
        } catch (NativeException e) {
            return false;
        }
    }

    /** A socket file nobody listens on is left over from a crash: remove it. A live one is refused. */
    private void removeStale(String name) throws IOException {
        FileStat st;
        try {
            st = FileCalls.fstatat(dir.fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW);
        } catch (NativeException e) {
            if (e.errno() == Errno.ENOENT) {
                return;
            }
            throw e;
        }
        if (!st.isSocket()) {
            throw new IOException("cannot listen on " + path + ": it exists and is not a socket (mode 0"
                    + Integer.toOctalString(st.mode()) + "); remove it or choose another path");
        }
        // Probed through the held directory where the address fits sun_path (108 bytes), else by its name.
        String viaFd = dir.procPath() + "/" + name;
        Path probeAt = viaFd.getBytes(java.nio.charset.StandardCharsets.UTF_8).length < 108 ? Path.of(viaFd) : path;
        try (SocketChannel probe = SocketChannel.open(UnixDomainSocketAddress.of(probeAt))) {
            throw new IOException("cannot listen on " + path + ": another server is accepting connections on it");
        } catch (ConnectException stale) {
            LOG.log(System.Logger.Level.INFO, "{0}: removing stale socket {1} (nobody listening)", setting, path);
            FileCalls.unlinkat(dir.fd(), name, 0);
        }
    }

    private interface Step {
        void run() throws NativeException;
    }

    /** Clean-up that may find nothing to do. */
    private static void quietly(Step step) {
        try {
            step.run();
        } catch (NativeException ignored) {
            // nothing there (ENOENT) or already gone
        }
    }
}
