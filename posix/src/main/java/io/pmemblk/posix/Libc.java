package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Errno.EACCES;
import static io.pmemblk.posix.Errno.EAGAIN;
import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Native.CRITICAL;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static io.pmemblk.posix.Native.variadicFrom;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The libc functions pmemblk needs, each bound once through {@link Native}. Every failing call becomes a
 * {@link NativeException} carrying errno, its text, and the arguments that were asked for.
 */
public final class Libc {
    private Libc() {}

    // <sys/mman.h> on x86-64 Linux
    public static final int PROT_READ = 0x1, PROT_WRITE = 0x2;
    public static final int MAP_SHARED = 0x01, MAP_PRIVATE = 0x02, MAP_ANONYMOUS = 0x20, MAP_POPULATE = 0x8000;
    public static final int MS_ASYNC = 1, MS_SYNC = 4;
    public static final long MAP_FAILED = -1L;
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

    private static final MethodHandle MMAP = libc("mmap",
            FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG), ERRNO);
    private static final MethodHandle MUNMAP = libc("munmap",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG), ERRNO);
    private static final MethodHandle MSYNC = libc("msync",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    /**
     * int ioctl(int fd, unsigned long request, ...): variadic after the request, in the two shapes its callers pass:
     * a pointer (a struct, or an int the kernel writes: FIONREAD) and a value (VFIO_CHECK_EXTENSION's int).
     */
    private static final MethodHandle IOCTL = libc("ioctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS), ERRNO, variadicFrom(2));
    private static final MethodHandle IOCTL_VALUE = libc("ioctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG), ERRNO, variadicFrom(2));
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
    private static final MethodHandle CLOSE = libc("close",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT), ERRNO);
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
    // abs(3): pure computation, no system call. Bound without the critical option on purpose: see nativeRoundTrip.
    private static final MethodHandle ABS = libc("abs", FunctionDescriptor.of(JAVA_INT, JAVA_INT));
    // memcpy/memset of at most CRITICAL_MAX bytes never block long or call back: critical, no thread-state
    // transition. Longer ones take the plain handle, so a safepoint never waits for them (a page fault inside a
    // critical call holds every other thread at the safepoint). Bound as void: the returned dst is not wanted.
    private static final MethodHandle MEMCPY = libc("memcpy",
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG), CRITICAL);
    private static final MethodHandle MEMCPY_LONG = libc("memcpy",
            FunctionDescriptor.ofVoid(ADDRESS, ADDRESS, JAVA_LONG));
    private static final MethodHandle MEMSET = libc("memset",
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG), CRITICAL);
    private static final MethodHandle MEMSET_LONG = libc("memset",
            FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, JAVA_LONG));
    /** Longest range passed to a critical memcpy/memset: at most 16 page faults. */
    public static final long CRITICAL_MAX = 64 << 10;
    private static final MethodHandle STRERROR = libc("strerror", FunctionDescriptor.of(Native.pointerTo(256), JAVA_INT));
    private static final MethodHandle GETPID = libc("getpid", FunctionDescriptor.of(JAVA_INT));
    /** int prctl(int option, ...): variadic after the option, every argument passed as an unsigned long. */
    private static final MethodHandle PRCTL = libc("prctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG),
            ERRNO, variadicFrom(1));
    /** {@code <linux/prctl.h>} PR_SET_IO_FLUSHER (Linux 5.6). */
    public static final int PR_SET_IO_FLUSHER = 57;
    // stat, lstat and fstat are real symbols since glibc 2.33 (before, only __xstat and friends); Debian 12 has 2.36.
    private static final MethodHandle LSTAT = libc("lstat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), ERRNO);
    private static final MethodHandle STAT = libc("stat", FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), ERRNO);
    private static final MethodHandle FSTAT = libc("fstat", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS), ERRNO);
    private static final MethodHandle GETEUID = libc("geteuid", FunctionDescriptor.of(JAVA_INT));
    /** int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf): glibc >= 2.28. */
    private static final MethodHandle STATX = libc("statx",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT, ADDRESS), ERRNO);
    // <linux/stat.h>, <fcntl.h>; struct statx: stx_mask u32 at 0, stx_btime (i64 tv_sec, u32 tv_nsec) at 80, 256 bytes.
    private static final int AT_FDCWD = -100, STATX_BTIME = 0x800;
    private static final long STATX_SIZE = 256, STX_MASK = 0, STX_BTIME_SEC = 80, STX_BTIME_NSEC = 88;
    private static final MethodHandle SYSCONF = libc("sysconf", FunctionDescriptor.of(JAVA_LONG, JAVA_INT));
    /** sighandler_t signal(int signum, sighandler_t handler): bound only to give a signal its default action back. */
    private static final MethodHandle SIGNAL = libc("signal", FunctionDescriptor.of(ADDRESS, JAVA_INT, ADDRESS), ERRNO);
    /** {@code <bits/signum-arch.h>}: SIGHUP. {@code <bits/signum-generic.h>}: SIG_DFL is 0, SIG_IGN 1, SIG_ERR -1. */
    public static final int SIGHUP = 1;
    private static final long SIG_IGN = 1;

    // <sys/socket.h>, <bits/socket_type.h> on x86-64 Linux: the unix datagram socket systemd's notify protocol
    // needs, which java.nio's channels do not offer (they have unix stream sockets only).
    public static final int AF_UNIX = 1, SOCK_STREAM = 1, SOCK_DGRAM = 2, SOCK_CLOEXEC = 02000000;
    public static final int SOL_SOCKET = 1, SO_RCVTIMEO = 20, SO_SNDTIMEO = 21;
    public static final int MSG_DONTWAIT = 0x40, MSG_NOSIGNAL = 0x4000;
    /** {@code <sys/un.h>} struct sockaddr_un: sa_family_t, then 108 bytes of path. */
    public static final StructLayout SOCKADDR_UN = MemoryLayout.structLayout(
            ValueLayout.JAVA_SHORT.withName("sun_family"),
            MemoryLayout.sequenceLayout(108, ValueLayout.JAVA_BYTE).withName("sun_path"));
    private static final long SUN_PATH = SOCKADDR_UN.byteOffset(MemoryLayout.PathElement.groupElement("sun_path"));
    static final MethodHandle SOCKET = libc("socket",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle BIND = libc("bind",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle SENDTO = libc("sendto",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle RECV = libc("recv",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    private static final MethodHandle SETSOCKOPT = libc("setsockopt",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);

    // Stream sockets the JDK opened (an NBD connection): a send that never blocks, a bounded wait for room, and a
    // descriptor of our own that the JDK's close cannot hand to another socket while we still use it.
    static final MethodHandle SENDMSG = libc("sendmsg",
            FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), ERRNO);
    private static final MethodHandle POLL = libc("poll",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), ERRNO);
    /** int fcntl(int fd, int cmd, ...): variadic after cmd; F_DUPFD_CLOEXEC takes an int. */
    static final MethodHandle FCNTL_INT = libc("fcntl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), ERRNO, variadicFrom(2));
    private static final MethodHandle SHUTDOWN = libc("shutdown",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), ERRNO);
    /** {@code <bits/socket.h>} struct msghdr on x86-64 / arm64 (LP64). */
    public static final StructLayout MSGHDR = MemoryLayout.structLayout(
            ADDRESS.withName("msg_name"), JAVA_INT.withName("msg_namelen"), MemoryLayout.paddingLayout(4),
            ADDRESS.withName("msg_iov"), JAVA_LONG.withName("msg_iovlen"),
            ADDRESS.withName("msg_control"), JAVA_LONG.withName("msg_controllen"),
            JAVA_INT.withName("msg_flags"), MemoryLayout.paddingLayout(4));
    public static final long MSGHDR_IOV = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_iov"));
    public static final long MSGHDR_IOVLEN = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_iovlen"));
    public static final long MSGHDR_CONTROL = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_control"));
    public static final long MSGHDR_CONTROLLEN = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_controllen"));
    public static final long MSGHDR_FLAGS = MSGHDR.byteOffset(MemoryLayout.PathElement.groupElement("msg_flags"));
    /** {@code <bits/types/struct_iovec.h>} struct iovec: base, length. */
    public static final StructLayout IOVEC = MemoryLayout.structLayout(ADDRESS.withName("iov_base"),
            JAVA_LONG.withName("iov_len"));
    /** {@code <bits/xopen_lim.h>} IOV_MAX: the most iovecs one sendmsg takes. */
    public static final int IOV_MAX = 1024;
    /** {@code <sys/poll.h>} struct pollfd: fd, events, revents. */
    public static final StructLayout POLLFD = MemoryLayout.structLayout(JAVA_INT.withName("fd"),
            ValueLayout.JAVA_SHORT.withName("events"), ValueLayout.JAVA_SHORT.withName("revents"));
    public static final short POLLIN = 0x1, POLLOUT = 0x4, POLLERR = 0x8, POLLHUP = 0x10, POLLNVAL = 0x20;
    public static final int SHUT_RDWR = 2;
    private static final int F_DUPFD_CLOEXEC = 1030;
    /** {@code <asm-generic/fcntl.h>}: the open file description's status flags (O_NONBLOCK among them). */
    private static final int F_GETFL = 3, F_SETFL = 4;

    /** A call that fails with a negative result and errno, made through {@link #call}. */
    @FunctionalInterface
    interface Call {
        long invoke(MemorySegment state) throws Throwable;
    }

    /**
     * One call that fails with a negative result (-1, MAP_FAILED) and errno: its result, or a NativeException
     * naming {@code function} and {@code what} was asked. For calls off the per-request paths (the lambda may
     * allocate); those on them are written out, each allocation-free.
     */
    static long call(String function, String what, Call call) throws NativeException {
        MemorySegment state = Native.callState();
        long rc;
        try {
            rc = call.invoke(state);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            throw NativeException.of(function, Native.errno(state), what);
        }
        return rc;
    }

    /**
     * memcpy(3) of all of {@code src} into {@code dst} (same size). glibc picks the widest copy loop this CPU has
     * (AVX-512, ERMS), which beats {@code MemorySegment.copy} on long copies. Segments, not addresses: the
     * linker refuses a closed segment (IllegalStateException) and holds its arena open during the call.
     */
    public static void memcpy(MemorySegment dst, MemorySegment src) {
        long n = dst.byteSize();
        if (src.byteSize() != n) {
            throw new IllegalArgumentException("memcpy of " + src.byteSize() + " bytes into " + n + " bytes");
        }
        try {
            if (n <= CRITICAL_MAX) {
                MEMCPY.invokeExact(dst, src, n);
            } else {
                MEMCPY_LONG.invokeExact(dst, src, n);
            }
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * memset(3) of all of {@code dst}. Unlike {@code MemorySegment.fill} (one call in the VM state, which a
     * safepoint waits for), a long memset here runs in native and holds no other thread.
     */
    public static void memset(MemorySegment dst, int value) {
        long n = dst.byteSize();
        try {
            if (n <= CRITICAL_MAX) {
                MEMSET.invokeExact(dst, value, n);
            } else {
                MEMSET_LONG.invokeExact(dst, value, n);
            }
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** The text of an errno value, as strerror(3) gives it. */
    public static String strerror(int errno) {
        try {
            MemorySegment s = (MemorySegment) STRERROR.invokeExact(errno);
            return s.getString(0);
        } catch (Throwable t) {
            return "errno " + errno;
        }
    }

    public static int getpid() {
        try {
            return (int) GETPID.invokeExact();
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * prctl(PR_SET_IO_FLUSHER, 1) for the calling thread: the kernel then reclaims memory for it without
     * starting I/O (PF_MEMALLOC_NOIO) and does not throttle its writeback, so a thread that serves a block device
     * cannot deadlock waiting for writeback through that very device. Needs CAP_SYS_RESOURCE.
     * @return 0, or -errno (EPERM without the capability, EINVAL before Linux 5.6)
     */
    public static int setIoFlusher() {
        try {
            call("prctl", "PR_SET_IO_FLUSHER", state -> (int) PRCTL.invokeExact(state, PR_SET_IO_FLUSHER, 1L, 0L, 0L, 0L));
            return 0;
        } catch (NativeException e) {
            return -e.errno();
        }
    }

    /** geteuid(2): the user whose files and directories pmemblk trusts besides root's. */
    public static int geteuid() {
        try {
            return (int) GETEUID.invokeExact();
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

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

    /**
     * signal(2) with SIG_DFL: {@code signal} gets its default action back, whatever this process was started with
     * (a signal ignored at exec stays ignored: nohup, some supervisors). Before anything else handles it: it
     * replaces whatever handler is installed, the JVM's too.
     * @return whether the signal was ignored until now
     */
    public static boolean defaultSignalAction(int signal) throws NativeException {
        long old = call("signal", "signal " + signal + ", SIG_DFL",
                state -> ((MemorySegment) SIGNAL.invokeExact(state, signal, MemorySegment.NULL)).address());
        return old == SIG_IGN;
    }

    /** sysconf(_SC_PAGESIZE). */
    public static long pageSize() {
        try {
            return (long) SYSCONF.invokeExact(30);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /**
     * Flushes the pages of [offset, offset+length) of {@code mapping} to the backing file (msync(2) with
     * MS_SYNC). The range is widened down to its page, as msync requires a page-aligned start; the mapping
     * itself must start on a page (every mmap does). Allocates nothing.
     */
    public static void msync(MemorySegment mapping, long offset, long length) throws NativeException {
        if (length == 0) {
            return;
        }
        long skew = (mapping.address() + offset) & (PAGE - 1);
        MemorySegment range = mapping.asSlice(offset - skew, length + skew); // bounds checked here
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) MSYNC.invokeExact(state, range, range.byteSize(), MS_SYNC);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc != 0) {
            throw NativeException.of("msync", Native.errno(state),
                    "address 0x" + Long.toHexString(range.address()) + ", length " + range.byteSize());
        }
    }

    private static final long PAGE = pageSize();

    /** mmap(2); returns the mapping as a segment of {@code length} bytes, unbounded to any arena (caller owns it). */
    public static MemorySegment mmap(long length, int prot, int flags, int fd, long offset) throws NativeException {
        // MAP_FAILED is (void *) -1: negative as a long, as call() wants a failure
        long address = call("mmap", "length " + length + ", prot 0x" + Integer.toHexString(prot) + ", flags 0x"
                        + Integer.toHexString(flags) + ", fd " + fd + ", offset " + offset,
                state -> ((MemorySegment) MMAP.invokeExact(state, MemorySegment.NULL, length, prot, flags, fd, offset)).address());
        return Native.sized(MemorySegment.ofAddress(address), length);
    }

    /**
     * mmap(2) of {@code length} bytes of {@code fd} at {@code offset}, owned by {@code owner}: closing the arena
     * unmaps it, and any later access through the segment throws IllegalStateException instead of touching
     * unmapped memory. For kernel-shared areas (io_uring rings, ublk's descriptor arrays): a mapping that leaked
     * would keep the file open in the kernel (ublk's DEL_DEV waits for it forever), so the mapping is undone if
     * it cannot be tied to the arena.
     */
    public static MemorySegment map(int fd, long length, int prot, int flags, long offset, Arena owner) throws NativeException {
        MemorySegment raw = mmap(length, prot, flags, fd, offset);
        try {
            return Native.owned(raw, length, owner, unused -> {
                try {
                    munmap(raw);
                } catch (NativeException e) {
                    throw new IllegalStateException(e.getMessage(), e); // only with a wrong address: a bug here
                }
            });
        } catch (RuntimeException | Error e) {
            try {
                munmap(raw);
            } catch (NativeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
    }

    public static void munmap(MemorySegment mapping) throws NativeException {
        call("munmap", "address 0x" + Long.toHexString(mapping.address()) + ", length " + mapping.byteSize(),
                state -> (int) MUNMAP.invokeExact(state, mapping, mapping.byteSize()));
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
            return new String(buf.asSlice(0, n).toArray(ValueLayout.JAVA_BYTE), java.nio.charset.StandardCharsets.UTF_8);
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

    public static void close(int fd) throws NativeException {
        call("close", "fd " + fd, state -> (int) CLOSE.invokeExact(state, fd));
    }

    /** ioctl(2) with a pointer argument; returns the (non-negative) result. */
    public static int ioctl(int fd, long request, MemorySegment arg) throws NativeException {
        MemorySegment state = Native.callState(); // allocation-free: FIONREAD runs per socket read (bytesQueued)
        int rc;
        try {
            rc = (int) IOCTL.invokeExact(state, fd, request, arg);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            throw NativeException.of("ioctl", Native.errno(state), "fd " + fd + ", request 0x" + Long.toHexString(request));
        }
        return rc;
    }

    /**
     * ioctl(2) {@code request}, named {@code what} in a failure's message, with a pointer to {@code arg} (a
     * struct the kernel reads or fills); returns the non-negative result.
     */
    public static int ioctl(int fd, long request, MemorySegment arg, String what) throws NativeException {
        return (int) call("ioctl " + what, "fd " + fd, state -> (int) IOCTL.invokeExact(state, fd, request, arg));
    }

    /** ioctl(2) {@code request}, named {@code what}, with its argument by value; returns the non-negative result. */
    public static int ioctl(int fd, long request, long value, String what) throws NativeException {
        return (int) call("ioctl " + what, "fd " + fd + ", 0x" + Long.toHexString(value),
                state -> (int) IOCTL_VALUE.invokeExact(state, fd, request, value));
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
     * One call into native code and back, doing nothing there (~10 ns). Its worth is the way back: a thread
     * returning from native code takes the exceptions that were posted to it asynchronously. HotSpot answers a
     * SIGBUS inside an Unsafe access (a {@code MemorySegment} copy, fill or get on a mapping whose file was
     * truncated, or a poisoned pmem line) by skipping the access and posting {@code InternalError} to the
     * thread, which throws it at its next safepoint poll, possibly several calls later. Calling this right
     * after such an access makes it throw here, inside the caller's try, before the caller reports success.
     * {@code value} goes through abs(3) and back: a load made only for its fault, fed in here, cannot be dropped.
     */
    public static int nativeRoundTrip(int value) {
        try {
            return (int) ABS.invokeExact(value);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
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

    /**
     * A {@code struct sockaddr_un} for {@code address} in {@code arena}, sized to exactly the bytes the kernel
     * should read (its {@code byteSize()} is the socklen_t to pass). A leading '@' names a socket in Linux's
     * abstract namespace, as systemd's {@code $NOTIFY_SOCKET} does: the '@' becomes a NUL byte and the name is
     * not NUL-terminated (every byte counts); a path is NUL-terminated.
     * @throws IllegalArgumentException for an empty address, one with a NUL byte, or one longer than sun_path
     */
    public static MemorySegment unixAddress(String address, Arena arena) {
        byte[] name = address.getBytes(java.nio.charset.StandardCharsets.UTF_8);
        boolean abstractName = name.length > 0 && name[0] == '@';
        int pathBytes = abstractName ? name.length : name.length + 1;
        long max = SOCKADDR_UN.byteSize() - SUN_PATH;
        if (name.length == 0 || address.indexOf('\0') >= 0 || (abstractName && name.length < 2) || pathBytes > max) {
            throw new IllegalArgumentException("unix socket address '" + address + "' is not allowed; allowed: a path,"
                    + " or '@' and a name (abstract namespace), of at most " + (max - 1) + " bytes and without NUL");
        }
        MemorySegment sa = arena.allocate(SOCKADDR_UN).asSlice(0, SUN_PATH + pathBytes);
        sa.set(ValueLayout.JAVA_SHORT, 0, (short) AF_UNIX);
        MemorySegment.copy(name, 0, sa, ValueLayout.JAVA_BYTE, SUN_PATH, name.length);
        if (abstractName) {
            sa.set(ValueLayout.JAVA_BYTE, SUN_PATH, (byte) 0);
        } // else the terminating NUL is already there: allocate() zeroes
        return sa;
    }

    /** socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0). */
    public static int unixDatagramSocket() throws NativeException {
        return (int) call("socket", "AF_UNIX, SOCK_DGRAM", state -> (int) SOCKET.invokeExact(state, AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    }

    /** bind(2) of {@code fd} to an address made by {@link #unixAddress}. */
    public static void bind(int fd, MemorySegment address) throws NativeException {
        call("bind", "fd " + fd + ", " + describe(address),
                state -> (int) BIND.invokeExact(state, fd, address, (int) address.byteSize()));
    }

    /**
     * sendto(2) of all of {@code message} as one datagram to {@code address} (made by {@link #unixAddress}), with
     * MSG_NOSIGNAL. Allocates nothing. A datagram is sent whole or not at all.
     */
    public static void sendTo(int fd, MemorySegment message, MemorySegment address) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) SENDTO.invokeExact(state, fd, message, message.byteSize(), MSG_NOSIGNAL, address,
                    (int) address.byteSize());
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            throw NativeException.of("sendto", Native.errno(state), "fd " + fd + ", " + message.byteSize() + " bytes to "
                    + describe(address));
        }
    }

    /**
     * recv(2) of one datagram into {@code buffer}; {@code flags} e.g. {@link #MSG_DONTWAIT}. Allocates nothing.
     * @return the datagram's length (a longer one is cut to the buffer)
     * @throws NativeException with errno EAGAIN when nothing came (MSG_DONTWAIT, or the SO_RCVTIMEO deadline)
     */
    public static int recv(int fd, MemorySegment buffer, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) RECV.invokeExact(state, fd, buffer, buffer.byteSize(), flags);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            throw NativeException.of("recv", Native.errno(state), "fd " + fd + ", " + buffer.byteSize() + " bytes");
        }
        return (int) n;
    }

    /** ioctl FIONREAD (asm-generic/ioctls.h; the same number on x86-64 and arm64). */
    public static final long FIONREAD = 0x541B;

    /**
     * Bytes waiting in {@code fd}'s receive queue (ioctl FIONREAD): whether a read would block, without reading.
     * Allocation-free: {@code out} is the caller's 4-byte segment, reused.
     */
    public static int bytesQueued(int fd, MemorySegment out) throws NativeException {
        ioctl(fd, FIONREAD, out);
        return out.get(ValueLayout.JAVA_INT, 0);
    }

    /** setsockopt(SO_RCVTIMEO): a blocking {@link #recv} on {@code fd} gives up with EAGAIN after {@code millis}. */
    public static void receiveTimeout(int fd, long millis) throws NativeException {
        socketTimeout(fd, SO_RCVTIMEO, "SO_RCVTIMEO", millis);
    }

    /**
     * setsockopt(SO_SNDTIMEO): a blocking send on {@code fd} ({@link #sendWaiting}) returns after {@code millis}
     * with what it sent so far, or EAGAIN (0 there) when nothing.
     */
    public static void sendTimeout(int fd, long millis) throws NativeException {
        socketTimeout(fd, SO_SNDTIMEO, "SO_SNDTIMEO", millis);
    }

    private static void socketTimeout(int fd, int option, String name, long millis) throws NativeException {
        if (millis <= 0) {
            throw new IllegalArgumentException(name + " must be positive, got " + millis + " ms");
        }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment timeval = a.allocate(JAVA_LONG, 2); // struct timeval { time_t tv_sec; suseconds_t tv_usec; }
            timeval.setAtIndex(JAVA_LONG, 0, millis / 1000);
            timeval.setAtIndex(JAVA_LONG, 1, millis % 1000 * 1000);
            call("setsockopt", "fd " + fd + ", " + name + " " + millis + " ms",
                    state -> (int) SETSOCKOPT.invokeExact(state, fd, SOL_SOCKET, option, timeval, (int) timeval.byteSize()));
        }
    }

    /**
     * sendmsg(2) of {@code msghdr}'s iovecs with MSG_DONTWAIT | MSG_NOSIGNAL: never blocks, even on a blocking
     * socket (the flag is per call, unlike O_NONBLOCK, which the JDK's blocking reads on the same socket share).
     * Allocates nothing.
     * @return bytes the socket took; 0 when its send buffer is full (EAGAIN) or a signal came first (EINTR)
     * @throws NativeException for any other error (EPIPE, ECONNRESET: the peer is gone)
     */
    public static long sendNow(int fd, MemorySegment msghdr) throws NativeException {
        return sendmsg(fd, msghdr, MSG_DONTWAIT | MSG_NOSIGNAL);
    }

    /**
     * sendmsg(2) of {@code msghdr}'s iovecs with MSG_NOSIGNAL on a blocking socket: the kernel waits for room
     * itself (one call, not a poll and a send per wake-up), until everything is sent or the socket's SO_SNDTIMEO
     * ({@link #sendTimeout}) passes. Allocates nothing.
     * @return bytes sent; 0 when the timeout passed with nothing sent (EAGAIN) or a signal came first
     */
    public static long sendWaiting(int fd, MemorySegment msghdr) throws NativeException {
        return sendmsg(fd, msghdr, MSG_NOSIGNAL);
    }

    private static long sendmsg(int fd, MemorySegment msghdr, int flags) throws NativeException {
        MemorySegment state = Native.callState();
        long n;
        try {
            n = (long) SENDMSG.invokeExact(state, fd, msghdr, flags);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (n < 0) {
            int errno = Native.errno(state);
            if (errno == EAGAIN || errno == EINTR) {
                return 0;
            }
            throw NativeException.of("sendmsg", errno, "fd " + fd + ", " + msghdr.get(JAVA_LONG, MSGHDR_IOVLEN)
                    + " iovecs");
        }
        return n;
    }

    /**
     * poll(2) of the one {@code struct pollfd} in {@code pollfd} (its fd and events set by the caller), at most
     * {@code millis}. Allocates nothing.
     * @return the revents (POLLERR and POLLHUP included whether asked for or not); 0 on timeout or a signal
     */
    public static int pollOne(MemorySegment pollfd, int millis) throws NativeException {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) POLL.invokeExact(state, pollfd, 1L, millis);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            int errno = Native.errno(state);
            if (errno == EINTR) {
                return 0;
            }
            throw NativeException.of("poll", errno, "fd " + pollfd.get(JAVA_INT, 0));
        }
        return rc == 0 ? 0 : Short.toUnsignedInt(pollfd.get(ValueLayout.JAVA_SHORT, 6));
    }

    /**
     * poll(2) of the {@code count} {@code struct pollfd}s in {@code pollfds} (fds and events set by the caller; each
     * one's revents at offset 6 afterwards), at most {@code millis}. Allocates nothing.
     * @return how many have revents; 0 on timeout or a signal
     */
    public static int poll(MemorySegment pollfds, int count, int millis) throws NativeException {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) POLL.invokeExact(state, pollfds, (long) count, millis);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            int errno = Native.errno(state);
            if (errno == EINTR) {
                return 0;
            }
            throw NativeException.of("poll", errno, count + " fds, the first " + pollfds.get(JAVA_INT, 0));
        }
        return rc;
    }

    /** fcntl(F_DUPFD_CLOEXEC): a second descriptor of the same open socket or file, closed on exec. */
    public static int dupCloexec(int fd) throws NativeException {
        return (int) call("fcntl", "fd " + fd + ", F_DUPFD_CLOEXEC", state -> (int) FCNTL_INT.invokeExact(state, fd, F_DUPFD_CLOEXEC, 0));
    }

    /**
     * fcntl(F_GETFL / F_SETFL): adds O_NONBLOCK to the status flags of {@code fd}'s open file description. The
     * flag belongs to the description, which every process holding a copy of the descriptor shares.
     */
    public static void setNonBlocking(int fd) throws NativeException {
        int flags = (int) call("fcntl", "fd " + fd + ", F_GETFL", state -> (int) FCNTL_INT.invokeExact(state, fd, F_GETFL, 0));
        if ((flags & O_NONBLOCK) == 0) {
            int set = flags | O_NONBLOCK;
            call("fcntl", "fd " + fd + ", F_SETFL O_NONBLOCK", state -> (int) FCNTL_INT.invokeExact(state, fd, F_SETFL, set));
        }
    }

    /** What /proc/self/fd/{@code fd} names: a path, or the kind of an anonymous file ({@code anon_inode:[eventfd]}). */
    public static String describeFd(int fd) throws NativeException {
        return readlinkat(AT_FDCWD, "/proc/self/fd/" + fd);
    }

    /** shutdown(2): wakes every thread blocked on the socket, in any process or descriptor, and fails their calls. */
    public static void shutdown(int fd, int how) throws NativeException {
        call("shutdown", "fd " + fd + ", how " + how, state -> (int) SHUTDOWN.invokeExact(state, fd, how));
    }

    /** ioctl SIOCOUTQ (= TIOCOUTQ, asm-generic/ioctls.h): see {@link #bytesUnsent}. */
    public static final long SIOCOUTQ = 0x5411;

    /**
     * Bytes sent on stream socket {@code fd} that the peer has not taken yet (ioctl SIOCOUTQ: on a unix socket
     * what the peer has not read, on TCP what it has not acknowledged). Falling while a writer waits is the
     * peer making progress. Allocation-free: {@code out} is the caller's 4-byte segment.
     */
    public static int bytesUnsent(int fd, MemorySegment out) throws NativeException {
        ioctl(fd, SIOCOUTQ, out);
        return out.get(ValueLayout.JAVA_INT, 0);
    }

    /** An address made by {@link #unixAddress} as it was written ('@' for the abstract namespace), for messages. */
    private static String describe(MemorySegment address) {
        long n = address.byteSize() - SUN_PATH;
        if (n <= 0) {
            return "unix address (unnamed)";
        }
        byte[] b = address.asSlice(SUN_PATH, n).toArray(ValueLayout.JAVA_BYTE);
        if (b[0] == 0) {
            return "unix address '@" + new String(b, 1, b.length - 1, java.nio.charset.StandardCharsets.UTF_8) + "'";
        }
        int len = 0;
        while (len < b.length && b[len] != 0) {
            len++;
        }
        return "unix address '" + new String(b, 0, len, java.nio.charset.StandardCharsets.UTF_8) + "'";
    }
}
