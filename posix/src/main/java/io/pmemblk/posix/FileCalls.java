package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.nio.charset.StandardCharsets;

import static io.pmemblk.posix.Errno.EACCES;
import static io.pmemblk.posix.Errno.EAGAIN;
import static io.pmemblk.posix.Libc.call;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static io.pmemblk.posix.Native.variadicFrom;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The file calls: open and the *at() calls, stat, fsync, ftruncate, fallocate, lseek and the open file
 * description lock, each bound once through {@link Native}, beside {@link FileStat} (what the stat calls read)
 * and {@link TrustedPath} (their main caller).
 */
public final class FileCalls {
    private FileCalls() {}

    // <fcntl.h>
    public static final int O_RDONLY = 0, O_WRONLY = 01, O_RDWR = 02, O_CREAT = 0100, O_CLOEXEC = 02000000;
    /** A final symbolic link fails the open with ELOOP instead of being followed. */
    public static final int O_NOFOLLOW = 0400000, O_NONBLOCK = 04000, O_EXCL = 0200;
    /** A directory only (ENOTDIR otherwise); O_PATH: a handle for *at() calls and fstat, needing only search permission. */
    public static final int O_DIRECTORY = 0200000, O_PATH = 010000000;
    /** {@code <fcntl.h>} for the *at() calls: the descriptor itself (fstatat), a final link not followed. */
    public static final int AT_EMPTY_PATH = 0x1000, AT_SYMLINK_NOFOLLOW = 0x100, AT_REMOVEDIR = 0x200;
    /** {@code <asm-generic/fcntl.h>}: open file description locks (Linux 3.15), and struct flock's l_type. */
    public static final int F_OFD_SETLK = 37, F_WRLCK = 1;
    /** int open(const char *path, int flags, ...): the mode is the variadic argument. */
    private static final MethodHandle OPEN = libc("open",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), ERRNO, variadicFrom(2));
    /** int openat(int dirfd, const char *path, int flags, ...): the mode is the variadic argument. */
    private static final MethodHandle OPENAT = libc("openat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), ERRNO, variadicFrom(3));
    private static final MethodHandle MKDIRAT = libc("mkdirat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle FSTATAT = libc("fstatat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle READLINKAT = libc("readlinkat",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, ADDRESS, JAVA_LONG), ERRNO);
    private static final MethodHandle UNLINKAT = libc("unlinkat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle RENAMEAT = libc("renameat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, ADDRESS), ERRNO);
    private static final MethodHandle FCHMODAT = libc("fchmodat",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle FSYNC = libc("fsync", FunctionDescriptor.of(JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle FTRUNCATE = libc("ftruncate",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG), ERRNO);
    /** int fcntl(int fd, int cmd, ...): here always with a struct flock pointer as the variadic argument. */
    private static final MethodHandle FCNTL_PTR = libc("fcntl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS), ERRNO, variadicFrom(2));
    /**
     * {@code struct flock} on x86-64 ({@code <bits/fcntl.h>}, the kernel's {@code struct flock} in
     * {@code include/uapi/asm-generic/fcntl.h} with 64-bit off_t): 32 bytes.
     */
    private static final StructLayout FLOCK = MemoryLayout.structLayout(
            ValueLayout.JAVA_SHORT.withName("l_type"), ValueLayout.JAVA_SHORT.withName("l_whence"),
            MemoryLayout.paddingLayout(4), JAVA_LONG.withName("l_start"), JAVA_LONG.withName("l_len"),
            JAVA_INT.withName("l_pid"), MemoryLayout.paddingLayout(4));
    private static final MethodHandle POSIX_FALLOCATE = libc("posix_fallocate",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG));
    /** fallocate(2) with a mode (punching holes), unlike posix_fallocate(3). */
    private static final MethodHandle FALLOCATE = libc("fallocate",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG), ERRNO);
    private static final MethodHandle LSEEK = libc("lseek",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, JAVA_LONG, JAVA_INT), ERRNO);
    /** {@code <unistd.h>} (Linux 3.1): the next offset that holds data, the next hole (ENXIO: none past it). */
    public static final int SEEK_DATA = 3, SEEK_HOLE = 4;
    /** {@code <linux/falloc.h>}: FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE (which needs KEEP_SIZE). */
    public static final int FALLOC_FL_KEEP_SIZE = 0x01, FALLOC_FL_PUNCH_HOLE = 0x02;
    // stat, lstat and fstat are real symbols since glibc 2.33 (before, only __xstat and friends); Debian 12 has 2.36.
    private static final MethodHandle LSTAT = libc("lstat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), ERRNO);
    private static final MethodHandle STAT = libc("stat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), ERRNO);
    private static final MethodHandle FSTAT = libc("fstat", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS), ERRNO);
    /** int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf): glibc >= 2.28. */
    private static final MethodHandle STATX = libc("statx",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT, ADDRESS), ERRNO);
    // <linux/stat.h>, <fcntl.h>; struct statx: stx_mask u32 at 0, stx_btime (i64 tv_sec, u32 tv_nsec) at 80, 256 bytes.
    private static final int AT_FDCWD = -100, STATX_BTIME = 0x800;
    private static final long STATX_SIZE = 256, STX_MASK = 0, STX_BTIME_SEC = 80, STX_BTIME_NSEC = 88;

    /** lstat(2): the file itself, a symbolic link included (not followed). */
    public static FileStat lstat(String path) throws NativeException {
        return stat("lstat", path, (a, state, buf) -> (int) LSTAT.invokeExact(state, a.allocateFrom(path), buf));
    }

    /** stat(2): symbolic links followed. */
    public static FileStat stat(String path) throws NativeException {
        return stat("stat", path, (a, state, buf) -> (int) STAT.invokeExact(state, a.allocateFrom(path), buf));
    }

    /** fstat(2) of an open descriptor: what was opened, whatever its path names now. */
    public static FileStat fstat(int fd) throws NativeException {
        return stat("fstat", "fd " + fd, (a, state, buf) -> (int) FSTAT.invokeExact(state, fd, buf));
    }

    /**
     * The birth time of the file open as {@code fd}, in nanoseconds since the epoch, or -1 when its filesystem does
     * not record one: statx(2) of the descriptor itself (AT_EMPTY_PATH) with STATX_BTIME, which, unlike the JDK's
     * creationTime, says so instead of answering the modification time. The file that was opened, whatever its
     * name leads to now; opens nothing (a close of another descriptor of a file would drop this process's POSIX
     * locks on it).
     */
    public static long birthTime(int fd) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(STATX_SIZE, 8);
            MemorySegment empty = a.allocateFrom("");
            call("statx", "fd " + fd, state -> (int) STATX.invokeExact(state, fd, empty, AT_EMPTY_PATH, STATX_BTIME, buf));
            if ((buf.get(JAVA_INT, STX_MASK) & STATX_BTIME) == 0) {
                return -1;
            }
            return buf.get(JAVA_LONG, STX_BTIME_SEC) * 1_000_000_000L + Integer.toUnsignedLong(buf.get(JAVA_INT, STX_BTIME_NSEC));
        }
    }

    /** One of the stat calls, into a struct stat of its own arena (not a per-request path: allocation is fine). */
    @FunctionalInterface
    private interface StatCall {
        int call(Arena a, MemorySegment state, MemorySegment buf) throws Throwable;
    }

    private static FileStat stat(String function, String what, StatCall call) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(FileStat.LAYOUT);
            call(function, what, state -> call.call(a, state, buf));
            return FileStat.read(buf);
        }
    }

    /** open(2) with O_CLOEXEC added. */
    public static int open(String path, int flags, int mode) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            return (int) call("open", path, state -> (int) OPEN.invokeExact(state, a.allocateFrom(path), flags | O_CLOEXEC, mode));
        }
    }

    /**
     * openat(2) with O_CLOEXEC added: {@code path} looked up from the directory {@code dirFd}, not from the
     * current directory or by a name another process could change above it.
     */
    public static int openat(int dirFd, String path, int flags, int mode) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            return (int) call("openat", "fd " + dirFd + ", " + path + ", flags 0" + Integer.toOctalString(flags),
                    state -> (int) OPENAT.invokeExact(state, dirFd, a.allocateFrom(path), flags | O_CLOEXEC, mode));
        }
    }

    /** mkdirat(2): a directory {@code name} in {@code dirFd}, {@code mode} less the umask. */
    public static void mkdirat(int dirFd, String name, int mode) throws NativeException {
        pathCall("mkdirat", dirFd, name, (a, state, p) -> (int) MKDIRAT.invokeExact(state, dirFd, p, mode));
    }

    /** unlinkat(2) of {@code name} in {@code dirFd}; {@link #AT_REMOVEDIR} for an empty directory. */
    public static void unlinkat(int dirFd, String name, int flags) throws NativeException {
        pathCall("unlinkat", dirFd, name, (a, state, p) -> (int) UNLINKAT.invokeExact(state, dirFd, p, flags));
    }

    /** renameat(2): atomically replaces {@code to} in {@code toDirFd} by {@code from} of {@code fromDirFd}. */
    public static void renameat(int fromDirFd, String from, int toDirFd, String to) throws NativeException {
        pathCall("renameat", fromDirFd, from + " -> fd " + toDirFd + ", " + to, (a, state, p) ->
                (int) RENAMEAT.invokeExact(state, fromDirFd, a.allocateFrom(from), toDirFd, a.allocateFrom(to)));
    }

    /** fchmodat(2) of {@code name} in {@code dirFd} (links followed: only for entries this process made). */
    public static void fchmodat(int dirFd, String name, int mode) throws NativeException {
        pathCall("fchmodat", dirFd, name, (a, state, p) -> (int) FCHMODAT.invokeExact(state, dirFd, p, mode, 0));
    }

    /** fstatat(2) of {@code name} in {@code dirFd}; {@link #AT_SYMLINK_NOFOLLOW}: a link itself. */
    public static FileStat fstatat(int dirFd, String name, int flags) throws NativeException {
        return stat("fstatat", "fd " + dirFd + ", " + name,
                (a, state, buf) -> (int) FSTATAT.invokeExact(state, dirFd, a.allocateFrom(name), buf, flags));
    }

    /** readlinkat(2): where the symbolic link {@code name} in {@code dirFd} points. */
    public static String readlinkat(int dirFd, String name) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment buf = a.allocate(4096); // PATH_MAX
            long n = call("readlinkat", "fd " + dirFd + ", " + name,
                    state -> (long) READLINKAT.invokeExact(state, dirFd, a.allocateFrom(name), buf, buf.byteSize()));
            return new String(buf.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), StandardCharsets.UTF_8);
        }
    }

    /** fsync(2): the file's data and metadata (a directory's: its entries) on stable storage. */
    public static void fsync(int fd, String what) throws NativeException {
        call("fsync", "fd " + fd + ", " + what, state -> (int) FSYNC.invokeExact(state, fd));
    }

    /** ftruncate(2) to {@code length} bytes. */
    public static void ftruncate(int fd, long length) throws NativeException {
        call("ftruncate", "fd " + fd + ", length " + length, state -> (int) FTRUNCATE.invokeExact(state, fd, length));
    }

    /**
     * An exclusive open-file-description lock on all of {@code fd}'s file (fcntl F_OFD_SETLK, without waiting).
     * Unlike a classic POSIX lock (what {@code FileChannel.tryLock} takes) it belongs to this open file, not to
     * the process, so closing another descriptor of the same file does not drop it; the two kinds still
     * conflict with each other, so an older server's (or any JDK program's) lock on the file is respected.
     * @return false when another open file holds a conflicting lock (EAGAIN or EACCES)
     */
    public static boolean lockExclusive(int fd) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment fl = a.allocate(FLOCK); // zeroed: SEEK_SET, start 0, length 0 = to the end, l_pid 0 (OFD)
            fl.set(ValueLayout.JAVA_SHORT, 0, (short) F_WRLCK);
            call("fcntl", "fd " + fd + ", F_OFD_SETLK F_WRLCK", state -> (int) FCNTL_PTR.invokeExact(state, fd, F_OFD_SETLK, fl));
            return true;
        } catch (NativeException e) {
            if (e.errno() == EAGAIN || e.errno() == EACCES) {
                return false;
            }
            throw e;
        }
    }

    /** A call that takes a C string and returns 0 or -1 with errno. */
    @FunctionalInterface
    private interface PathCall {
        int call(Arena a, MemorySegment state, MemorySegment path) throws Throwable;
    }

    private static void pathCall(String function, int fd, String what, PathCall call) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment path = a.allocateFrom(what);
            call(function, "fd " + fd + ", " + what, state -> call.call(a, state, path));
        }
    }

    /**
     * fallocate(2) of [offset, offset+length) with {@code mode} ({@link #FALLOC_FL_PUNCH_HOLE} |
     * {@link #FALLOC_FL_KEEP_SIZE} frees the blocks; 0 allocates them).
     */
    public static void fallocate(int fd, int mode, long offset, long length, String what) throws NativeException {
        call("fallocate", what + ", mode 0x" + Integer.toHexString(mode) + ", offset " + offset + ", length " + length,
                state -> (int) FALLOCATE.invokeExact(state, fd, mode, offset, length));
    }

    /**
     * lseek(2) with {@link #SEEK_DATA} or {@link #SEEK_HOLE}: where the next data or hole starts at or after
     * {@code offset}, reading no byte (a sparse file's holes are skipped by the file system). A file system
     * without holes answers as if all were data; past the last data, SEEK_DATA fails with ENXIO.
     */
    public static long lseek(int fd, long offset, int whence) throws NativeException {
        return call("lseek", "fd " + fd + ", offset " + offset + ", whence " + whence,
                state -> (long) LSEEK.invokeExact(state, fd, offset, whence));
    }

    /**
     * posix_fallocate(3): reserves the blocks of [offset, offset+length) so that stores through a shared
     * mapping can never hit an unallocated hole (which would raise SIGBUS when the filesystem is full).
     */
    public static void fallocate(int fd, long offset, long length, String what) throws NativeException {
        int rc;
        try {
            rc = (int) POSIX_FALLOCATE.invokeExact(fd, offset, length);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc != 0) { // returns the error number itself, not -1/errno
            throw NativeException.of("posix_fallocate", rc, what + ", offset " + offset + ", length " + length);
        }
    }

    /** What /proc/self/fd/{@code fd} names: a path, or the kind of an anonymous file ({@code anon_inode:[eventfd]}). */
    public static String describeFd(int fd) throws NativeException {
        return readlinkat(AT_FDCWD, "/proc/self/fd/" + fd);
    }
}
