package io.pmemblk.posix;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;

/**
 * OpenSSH's rule for the files it trusts (its {@code safe_path()} for authorized_keys), applied to the backing
 * file and the socket directory: every directory from {@code /} down to the file, and the file itself, must be
 * owned by root or by the user pmemblk runs as, and a directory must not be writable by group or others unless
 * its sticky bit is set (as on {@code /tmp}: there nobody can rename or remove another user's entries).
 *
 * <p>Checking and using are one walk, so nothing changes between them: each directory is opened ({@code O_PATH |
 * O_NOFOLLOW}) relative to the one above it, which is held open, and judged by {@code fstat} of what was opened;
 * a missing one is made with {@code mkdirat} in its checked parent and then opened and judged like any other
 * (whoever won a race to create it); the file is created with {@code O_CREAT | O_EXCL | O_NOFOLLOW} in the
 * held directory, or opened there without following a final link and judged by {@code fstat}. The caller gets
 * the descriptors ({@link TrustedDirectory}, {@link TrustedFile}) and never uses the names again.
 *
 * <p>A final symbolic link is not followed: whoever could write the directory it sits in chose where it points.
 * One exception, for device DAX: under {@code /dev} a link owned by root (udev's names, such as
 * {@code /dev/char/252:0}) may lead to a {@code /dev/daxX.Y} node; the node itself is opened. Directory links on
 * the way (e.g. {@code /var/run -> /run}) are followed when owned by root or this user, and the directories they
 * lead to are judged as well (the walk follows them itself, component by component).
 */
public final class TrustedPath {
    /** As the kernel's limit on links followed in one lookup (MAXSYMLINKS). */
    private static final int MAX_LINKS = 40;
    /** A directory for *at() calls and fstat; needs search permission only; a link is not followed (ENOTDIR). */
    private static final int DIRECTORY = FileCalls.O_PATH | FileCalls.O_DIRECTORY | FileCalls.O_NOFOLLOW;
    /**
     * Directories pmemblk creates: 0755 less the umask, never wider, so the check after creation passes whatever
     * the umask; clients of the socket need to search the socket's directory.
     */
    private static final int DIRECTORY_MODE = 0755;

    private final int euid;

    public TrustedPath(int euid) {
        this.euid = euid;
    }

    /** Trusting root and the process's effective user. */
    public static TrustedPath ofThisProcess() {
        return new TrustedPath(Libc.geteuid());
    }

    /**
     * Opens {@code dir}, checking it and every directory above it and creating the missing ones (each checked
     * after it is made).
     * @param setting the setting the path comes from, named in the refusal
     */
    public TrustedDirectory openDirectory(Path dir, String setting) throws IOException {
        Path abs = dir.toAbsolutePath();
        return walk(abs, abs, setting, true);
    }

    /** As {@link #openDirectory} for the directory {@code file} is to be created in (a socket); refusals name {@code file}. */
    public TrustedDirectory openParentOf(Path file, String setting) throws IOException {
        Path abs = file.toAbsolutePath();
        if (abs.getParent() == null) {
            throw new UnsafePathException(setting + " " + abs + " is not a file in a directory");
        }
        return walk(abs.getParent(), abs, setting, true);
    }

    /**
     * Opens {@code file} read-write through checked directories: an existing file opened without following a
     * final link, owned by root or this user, and a regular file not writable by group or others, or a character
     * device (device DAX; its mode is the administrator's access policy and is not judged here). With
     * {@code create}, a missing file is created (mode 0600, {@code O_EXCL}) and so are missing directories.
     */
    public TrustedFile openFile(Path file, String setting, boolean create) throws IOException {
        Path abs = file.toAbsolutePath();
        if (abs.getParent() == null) {
            throw new UnsafePathException(setting + " " + abs + " is a directory; allowed: a regular file, or a"
                    + " device-DAX node /dev/daxX.Y");
        }
        String name = abs.getFileName().toString();
        TrustedDirectory dir = walk(abs.getParent(), abs, setting, create);
        try {
            // Twice at most: a file that appears between our ENOENT and our O_EXCL is opened and judged instead.
            for (int attempt = 0; ; attempt++) {
                FileStat found;
                try {
                    found = FileCalls.fstatat(dir.fd(), name, FileCalls.AT_SYMLINK_NOFOLLOW);
                } catch (NativeException e) {
                    if (e.errno() != Errno.ENOENT || !create) {
                        throw e;
                    }
                    try {
                        int fd = FileCalls.openat(dir.fd(), name,
                                FileCalls.O_RDWR | FileCalls.O_CREAT | FileCalls.O_EXCL | FileCalls.O_NOFOLLOW, 0600);
                        return new TrustedFile(abs, fd, FileCalls.fstat(fd), true, dir);
                    } catch (NativeException x) {
                        if (x.errno() == Errno.EEXIST && attempt == 0) {
                            continue;
                        }
                        throw x;
                    }
                }
                if (found.isSymbolicLink()) {
                    Path target = deviceLinkTarget(dir, name, abs, found, setting);
                    dir.close();
                    return openFile(target, setting, false);
                }
                judgeFileType(found, abs, setting); // before open: a FIFO or socket is never opened
                int fd;
                try {
                    // O_NONBLOCK: should a FIFO replace the file since the fstatat, open must not hang on it
                    fd = FileCalls.openat(dir.fd(), name, FileCalls.O_RDWR | FileCalls.O_NOFOLLOW | FileCalls.O_NONBLOCK, 0);
                } catch (NativeException e) {
                    if (e.errno() == Errno.ELOOP) { // replaced by a link since the fstatat
                        throw new UnsafePathException(setting + " " + abs + " is a symbolic link; set " + setting
                                + " to the file itself");
                    }
                    throw e;
                }
                try {
                    FileStat st = FileCalls.fstat(fd); // what was opened, whatever the name leads to now
                    judgeFile(st, abs, setting);
                    return new TrustedFile(abs, fd, st, false, dir);
                } catch (IOException | RuntimeException e) {
                    Libc.close(fd);
                    throw e;
                }
            }
        } catch (IOException | RuntimeException e) {
            dir.close();
            throw e;
        }
    }

    private Path deviceLinkTarget(TrustedDirectory dir, String name, Path abs, FileStat link, String setting)
            throws IOException {
        Path target = null;
        if (abs.startsWith("/dev/") && link.uid() == 0) {
            try {
                // /dev and its links are root's (checked on the way here): resolving them by name is safe
                Path real = abs.toRealPath();
                FileStat t = FileCalls.stat(real.toString());
                if (t.isCharacterDevice() && real.getParent().equals(Path.of("/dev"))
                        && real.getFileName().toString().matches("dax\\d+\\.\\d+")) {
                    target = real;
                }
            } catch (IOException dangling) {
                // refused below like any other link
            }
        }
        if (target == null) {
            throw new UnsafePathException(setting + " " + abs + " is a symbolic link (to "
                    + FileCalls.readlinkat(dir.fd(), name) + "), and pmemblk does not follow a final symbolic link: whoever"
                    + " can write " + abs.getParent() + " decides where it points. Set " + setting
                    + " to the file itself (only root's links under /dev to a /dev/daxX.Y node are followed)");
        }
        return target;
    }

    private void judgeFileType(FileStat st, Path abs, String setting) throws UnsafePathException {
        if (!st.isRegularFile() && !st.isCharacterDevice()) {
            throw new UnsafePathException(setting + " " + abs + " is a " + st.typeName()
                    + "; allowed: a regular file, or a device-DAX node /dev/daxX.Y");
        }
    }

    private void judgeFile(FileStat st, Path abs, String setting) throws UnsafePathException {
        if (!trusted(st.uid())) {
            throw new UnsafePathException(setting + " " + abs + " is owned by " + owner(abs, st)
                    + ", not by root or by the user pmemblk runs as (" + who() + "): that user can read and change"
                    + " everything served from it. Use a file of your own (e.g. the default location), or take it"
                    + " over if it is meant to be yours: chown " + euid + " " + abs);
        }
        judgeFileType(st, abs, setting);
        if (st.isRegularFile() && st.groupOrOtherWritable()) {
            throw new UnsafePathException(setting + " " + abs + " is writable by group or others (mode "
                    + st.permissions() + "): they can change the device's data under it. Fix: chmod go-w " + abs);
        }
    }

    /**
     * Walks {@code dir} from {@code /}, one component at a time relative to the directory held open above it,
     * judging each directory by fstat of its descriptor and each link by its owner; follows links itself.
     * @param named what refusals name as the setting's value
     * @param create make missing directories (mkdirat in the checked parent, then opened and judged)
     */
    private TrustedDirectory walk(Path dir, Path named, String setting, boolean create) throws IOException {
        Deque<String> todo = new ArrayDeque<>();
        for (Path c : dir) {
            todo.add(c.toString());
        }
        Path root = Path.of("/");
        Path at = root;
        List<TrustedDirectory.Made> made = new ArrayList<>();
        int fd = FileCalls.open("/", DIRECTORY, 0);
        try {
            FileStat st = FileCalls.fstat(fd);
            judgeDirectory(st, at, named, setting);
            int links = 0;
            while (!todo.isEmpty()) {
                String c = todo.removeFirst();
                if (c.isEmpty() || c.equals(".")) {
                    continue;
                }
                Path next = c.equals("..") ? (at.getParent() == null ? at : at.getParent()) : at.resolve(c);
                int child;
                try {
                    child = FileCalls.openat(fd, c, DIRECTORY, 0);
                } catch (NativeException e) {
                    if (e.errno() == Errno.ENOENT && create) {
                        if (makeDirectory(fd, c)) { // its parent held, to sync the new entry with the file
                            made.addFirst(new TrustedDirectory.Made(next,
                                    new TrustedDirectory(FileCalls.openat(fd, ".", DIRECTORY, 0), at, st, List.of())));
                        }
                        todo.addFirst(c); // opened and judged as any directory found there, whoever made it
                        continue;
                    }
                    if (e.errno() != Errno.ENOTDIR && e.errno() != Errno.ELOOP) {
                        throw e;
                    }
                    FileStat link = FileCalls.fstatat(fd, c, FileCalls.AT_SYMLINK_NOFOLLOW);
                    if (!link.isSymbolicLink()) {
                        throw new UnsafePathException(setting + " " + named + ": " + next + " is a "
                                + link.typeName() + ", not a directory");
                    }
                    judgeOwner(link, next, named, setting, false);
                    if (++links > MAX_LINKS) {
                        throw new UnsafePathException(setting + " " + named + ": more than " + MAX_LINKS
                                + " symbolic links on the way (a loop?) at " + next);
                    }
                    String target = FileCalls.readlinkat(fd, c);
                    List<String> parts = new ArrayList<>();
                    for (Path p : Path.of(target)) {
                        parts.add(p.toString());
                    }
                    for (int i = parts.size() - 1; i >= 0; i--) {
                        todo.addFirst(parts.get(i));
                    }
                    if (target.startsWith("/")) { // root was judged first; start there again
                        int r = FileCalls.open("/", DIRECTORY, 0);
                        Libc.close(fd);
                        fd = r;
                        at = root;
                    }
                    continue;
                }
                try {
                    st = FileCalls.fstat(child);
                    judgeDirectory(st, next, named, setting);
                } catch (IOException | RuntimeException e) {
                    Libc.close(child);
                    throw e;
                }
                Libc.close(fd);
                fd = child;
                at = next;
            }
            return new TrustedDirectory(fd, at, st, made);
        } catch (IOException | RuntimeException e) {
            Libc.close(fd);
            for (TrustedDirectory.Made m : made) {
                m.parent().close();
            }
            throw e;
        }
    }

    /** @return true when this call made it; false when someone else did first (EEXIST) */
    private static boolean makeDirectory(int parent, String name) throws NativeException {
        try {
            FileCalls.mkdirat(parent, name, DIRECTORY_MODE);
            return true;
        } catch (NativeException e) {
            if (e.errno() == Errno.EEXIST) {
                return false;
            }
            throw e;
        }
    }

    private void judgeDirectory(FileStat st, Path p, Path named, String setting) throws UnsafePathException {
        judgeOwner(st, p, named, setting, true);
        if (st.groupOrOtherWritable() && !st.sticky()) {
            throw new UnsafePathException(setting + " " + named + ": directory " + p
                    + " is writable by group or others without the sticky bit (mode " + st.permissions()
                    + "): they can rename or replace what pmemblk creates there. Fix: chmod go-w " + p
                    + " (or chmod +t " + p + " for a shared directory like /tmp), or use another directory");
        }
    }

    private void judgeOwner(FileStat st, Path p, Path named, String setting, boolean directory)
            throws UnsafePathException {
        if (!trusted(st.uid())) {
            throw new UnsafePathException(setting + " " + named + ": " + (directory ? "directory " : "")
                    + p + " is owned by " + owner(p, st) + ", not by root or by the user pmemblk runs as ("
                    + who() + "): that user can replace anything below it. Use a directory owned by "
                    + (euid == 0 ? "root" : "root or " + who()) + " (e.g. the default location), or, if it is meant"
                    + " to be yours: chown " + euid + " " + p);
        }
    }

    private boolean trusted(int uid) {
        return uid == 0 || uid == euid;
    }

    private String who() {
        return euid == 0 ? "root" : "uid " + euid;
    }

    /** The owner's name for a message (looked up by name: only words, nothing is decided on it). */
    private static String owner(Path p, FileStat st) {
        try {
            String name = Files.getOwner(p, LinkOption.NOFOLLOW_LINKS).getName();
            return name.equals(Integer.toString(st.uid())) ? "uid " + st.uid() : "uid " + st.uid() + " (" + name + ")";
        } catch (IOException | RuntimeException e) {
            return "uid " + st.uid();
        }
    }
}
