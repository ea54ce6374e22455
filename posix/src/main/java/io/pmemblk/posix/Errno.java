package io.pmemblk.posix;

/**
 * The Linux errno values pmemblk names, once: what C calls fail with ({@link NativeException#errno()}), what
 * io_uring and ublk completions carry negated ({@code cqe.res == -EINVAL}), and what NBD replies carry. Values from
 * {@code include/uapi/asm-generic/errno-base.h} and {@code errno.h}, the same on x86-64 and arm64.
 */
public final class Errno {
    private Errno() {}

    // errno-base.h
    public static final int EPERM = 1, ENOENT = 2, ESRCH = 3, EINTR = 4, EIO = 5, ENXIO = 6, E2BIG = 7, EBADF = 9,
            EAGAIN = 11, ENOMEM = 12, EACCES = 13, EFAULT = 14, EBUSY = 16, EEXIST = 17, EXDEV = 18, ENODEV = 19,
            ENOTDIR = 20, EISDIR = 21, EINVAL = 22, ENFILE = 23, EMFILE = 24, ENOTTY = 25, EFBIG = 27, ENOSPC = 28,
            ESPIPE = 29, EROFS = 30, EPIPE = 32, ERANGE = 34;
    // errno.h
    public static final int ENAMETOOLONG = 36, ENOSYS = 38, ELOOP = 40, EOVERFLOW = 75, EOPNOTSUPP = 95,
            EADDRINUSE = 98, ECONNRESET = 104, ENOTCONN = 107, ESHUTDOWN = 108, ETIMEDOUT = 110, ECONNREFUSED = 111;
    /** Linux's ENOTSUP is EOPNOTSUPP; NBD's spec names it ENOTSUP. */
    public static final int ENOTSUP = EOPNOTSUPP;

    /**
     * The symbolic name of {@code errno} ({@code "EINVAL"}), for messages; {@code "errno N"} for one not named
     * here. A negated value (a completion's result) is named as its errno.
     */
    public static String name(int errno) {
        return switch (Math.abs(errno)) {
            case EPERM -> "EPERM";
            case ENOENT -> "ENOENT";
            case ESRCH -> "ESRCH";
            case EINTR -> "EINTR";
            case EIO -> "EIO";
            case ENXIO -> "ENXIO";
            case E2BIG -> "E2BIG";
            case EBADF -> "EBADF";
            case EAGAIN -> "EAGAIN";
            case ENOMEM -> "ENOMEM";
            case EACCES -> "EACCES";
            case EFAULT -> "EFAULT";
            case EBUSY -> "EBUSY";
            case EEXIST -> "EEXIST";
            case EXDEV -> "EXDEV";
            case ENODEV -> "ENODEV";
            case ENOTDIR -> "ENOTDIR";
            case EISDIR -> "EISDIR";
            case EINVAL -> "EINVAL";
            case ENFILE -> "ENFILE";
            case EMFILE -> "EMFILE";
            case ENOTTY -> "ENOTTY";
            case EFBIG -> "EFBIG";
            case ENOSPC -> "ENOSPC";
            case ESPIPE -> "ESPIPE";
            case EROFS -> "EROFS";
            case EPIPE -> "EPIPE";
            case ERANGE -> "ERANGE";
            case ENAMETOOLONG -> "ENAMETOOLONG";
            case ENOSYS -> "ENOSYS";
            case ELOOP -> "ELOOP";
            case EOVERFLOW -> "EOVERFLOW";
            case EOPNOTSUPP -> "EOPNOTSUPP";
            case EADDRINUSE -> "EADDRINUSE";
            case ECONNRESET -> "ECONNRESET";
            case ENOTCONN -> "ENOTCONN";
            case ESHUTDOWN -> "ESHUTDOWN";
            case ETIMEDOUT -> "ETIMEDOUT";
            case ECONNREFUSED -> "ECONNREFUSED";
            default -> "errno " + Math.abs(errno);
        };
    }
}
