package io.pmemblk.posix;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;

/**
 * OpenSSH's rule for the files it trusts (its {@code safe_path()} for authorized_keys), applied to the backing
 * file and the socket directory: every directory from {@code /} down to the file, and the file itself, must be
 * owned by root or by the user pmemblk runs as, and a directory must not be writable by group or others unless
 * its sticky bit is set (as on {@code /tmp}: there nobody can rename or remove another user's entries). Then no
 * other user can replace the file, or a directory on its way, between this check and its use: opening by path
 * afterwards is as good as opening what was checked.
 *
 * <p>A final symbolic link is not followed ({@code O_NOFOLLOW}): whoever could write the directory it sits in
 * chose where it points. One exception, for device DAX: under {@code /dev} a link owned by root (udev's names,
 * such as {@code /dev/char/252:0}) may lead to a {@code /dev/daxX.Y} node; the node's own path is returned.
 *
 * <p>Facts come from {@code lstat(2)}/{@code fstat(2)} (the {@code posix} binding), never from guesses of
 * {@code java.nio.file} about links; directory symlinks on the way (e.g. {@code /var/run -> /run}) are allowed
 * when they are owned by root or this user, and the directories they lead to are checked as well.
 */
public final class TrustedPath {
    private final int euid;

    public TrustedPath(int euid) {
        this.euid = euid;
    }

    /** Trusting root and the process's effective user. */
    public static TrustedPath ofThisProcess() {
        return new TrustedPath(Libc.geteuid());
    }

    /**
     * Checks {@code dir} and every directory above it; the part that does not exist yet is not checked (it will
     * be created by this process, as its own).
     * @param setting the setting the path comes from, named in the refusal
     */
    public void checkDirectory(Path dir, String setting) throws IOException {
        checkDirectory(dir.toAbsolutePath(), setting, dir.toAbsolutePath());
    }

    /**
     * Checks the directory {@code file} is to be created in (a socket), and every directory above it; the refusal
     * names {@code file}, the setting's value.
     */
    public void checkParentOf(Path file, String setting) throws IOException {
        Path abs = file.toAbsolutePath();
        checkDirectory(abs.getParent(), setting, abs);
    }

    /** @param named what the refusal names as the setting's value */
    private void checkDirectory(Path abs, String setting, Path named) throws IOException {
        Path deepest = checkChain(abs, named, setting);
        if (deepest != null) {
            Path real = deepest.toRealPath();
            if (!real.equals(deepest)) {
                // A symbolic link on the way: the directories it leads to are where entries really live.
                checkChain(real, named, setting);
            }
        }
    }

    /**
     * Checks the directories above {@code file}, then {@code file} itself if it exists: opened with
     * {@code O_NOFOLLOW}, owned by root or this user, and a regular file not writable by group or others, or a
     * character device (device DAX; its mode is the administrator's access policy and is not judged here).
     * @return the path to open: {@code file}, or the device node a udev link under /dev leads to
     */
    public Path checkFile(Path file, String setting) throws IOException {
        Path abs = file.toAbsolutePath();
        if (abs.getParent() != null) {
            checkDirectory(abs.getParent(), setting, abs);
        }
        FileStat link;
        try {
            link = Libc.lstat(abs.toString());
        } catch (NativeException e) {
            if (e.errno() == Libc.ENOENT) {
                return abs; // created by this process (O_EXCL), in a directory nobody else can write
            }
            throw e;
        }
        if (link.isSymbolicLink()) {
            Path target = deviceLinkTarget(abs, link, setting);
            checkDirectory(target.getParent(), setting, abs);
            checkOpened(target, setting);
            return target;
        }
        checkOpened(abs, setting);
        return abs;
    }

    private Path deviceLinkTarget(Path abs, FileStat link, String setting) throws IOException {
        Path target = null;
        if (abs.startsWith("/dev/") && link.uid() == 0) {
            try {
                Path real = abs.toRealPath();
                FileStat t = Libc.stat(real.toString());
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
                    + Files.readSymbolicLink(abs) + "), and pmemblk does not follow a final symbolic link: whoever"
                    + " can write " + abs.getParent() + " decides where it points. Set " + setting
                    + " to the file itself (only root's links under /dev to a /dev/daxX.Y node are followed)");
        }
        return target;
    }

    /** Opens without following a final link and judges what was opened. */
    private void checkOpened(Path abs, String setting) throws IOException {
        FileStat st;
        int fd;
        try {
            // O_NONBLOCK: a FIFO put there must not hang the check; it is refused below like any non-file.
            fd = Libc.open(abs.toString(), Libc.O_RDONLY | Libc.O_NOFOLLOW | Libc.O_NONBLOCK, 0);
        } catch (NativeException e) {
            if (e.errno() == Libc.ELOOP) { // replaced by a link since the lstat
                throw new UnsafePathException(setting + " " + abs + " is a symbolic link; set " + setting
                        + " to the file itself");
            }
            throw e;
        }
        try {
            st = Libc.fstat(fd);
        } finally {
            Libc.close(fd);
        }
        if (!trusted(st.uid())) {
            throw new UnsafePathException(setting + " " + abs + " is owned by " + owner(abs, st)
                    + ", not by root or by the user pmemblk runs as (" + who() + "): that user can read and change"
                    + " everything served from it. Use a file of your own (e.g. the default location), or take it"
                    + " over if it is meant to be yours: chown " + euid + " " + abs);
        }
        if (st.isRegularFile()) {
            if (st.groupOrOtherWritable()) {
                throw new UnsafePathException(setting + " " + abs + " is writable by group or others (mode "
                        + st.permissions() + "): they can change the device's data under it. Fix: chmod go-w " + abs);
            }
        } else if (!st.isCharacterDevice()) {
            throw new UnsafePathException(setting + " " + abs + " is a " + st.typeName()
                    + "; allowed: a regular file, or a device-DAX node /dev/daxX.Y");
        }
    }

    /**
     * Checks each existing prefix of {@code path} from the root down, with lstat (a link on the way is judged as
     * a link: by its owner; the next component is then looked up through it).
     * @return the deepest existing prefix, or null when not even the root exists
     */
    private Path checkChain(Path path, Path asGiven, String setting) throws IOException {
        Path p = path.getRoot();
        Path deepest = null;
        for (int i = -1; i < path.getNameCount(); i++) {
            if (i >= 0) {
                p = p.resolve(path.getName(i));
            }
            FileStat st;
            try {
                st = Libc.lstat(p.toString());
            } catch (NativeException e) {
                if (e.errno() == Libc.ENOENT) {
                    return deepest;
                }
                throw e;
            }
            deepest = p;
            if (!trusted(st.uid())) {
                throw new UnsafePathException(setting + " " + asGiven + ": " + (st.isDirectory() ? "directory " : "")
                        + p + " is owned by " + owner(p, st) + ", not by root or by the user pmemblk runs as ("
                        + who() + "): that user can replace anything below it. Use a directory owned by "
                        + (euid == 0 ? "root" : "root or " + who()) + " (e.g. the default location), or, if it is meant to be yours: chown " + euid + " "
                        + p);
            }
            if (st.isSymbolicLink()) {
                continue; // owned by a trusted user in a checked directory: nobody else can repoint it
            }
            if (!st.isDirectory()) {
                throw new UnsafePathException(setting + " " + asGiven + ": " + p + " is a " + st.typeName()
                        + ", not a directory");
            }
            if (st.groupOrOtherWritable() && !st.sticky()) {
                throw new UnsafePathException(setting + " " + asGiven + ": directory " + p
                        + " is writable by group or others without the sticky bit (mode " + st.permissions()
                        + "): they can rename or replace what pmemblk creates there. Fix: chmod go-w " + p
                        + " (or chmod +t " + p + " for a shared directory like /tmp), or use another directory");
            }
        }
        return deepest;
    }

    private boolean trusted(int uid) {
        return uid == 0 || uid == euid;
    }

    private String who() {
        return euid == 0 ? "root" : "uid " + euid;
    }

    private static String owner(Path p, FileStat st) {
        try {
            String name = Files.getOwner(p, LinkOption.NOFOLLOW_LINKS).getName();
            return name.equals(Integer.toString(st.uid())) ? "uid " + st.uid() : "uid " + st.uid() + " (" + name + ")";
        } catch (IOException | RuntimeException e) {
            return "uid " + st.uid();
        }
    }
}
