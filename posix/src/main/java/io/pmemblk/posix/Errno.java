package io.pmemblk.posix;

/**
 * The Linux errno values pmemblk names, once: what C calls fail with ({@link NativeException#errno()}), what
 * io_uring and ublk completions carry negated ({@code cqe.res == -EINVAL}), and what NBD replies carry. Values from
 * {@code include/uapi/asm-generic/errno-base.h} and {@code errno.h}, the same on x86-64 and arm64.
 */
public final class Errno {
    private Errno() {}

    public static final int EPERM = 1;
    public static final int ENOENT = 2;
    public static final int EINTR = 4;
    public static final int EIO = 5;
    public static final int ENXIO = 6;
    public static final int EBADF = 9;
    public static final int EAGAIN = 11;
    public static final int ENOMEM = 12;
    public static final int EACCES = 13;
    public static final int EFAULT = 14;
    public static final int EBUSY = 16;
    public static final int EEXIST = 17;
    public static final int ENODEV = 19;
    public static final int ENOTDIR = 20;
    public static final int EISDIR = 21;
    public static final int EINVAL = 22;
    public static final int ENOTTY = 25;
    public static final int ENOSPC = 28;
    public static final int ESPIPE = 29;
    public static final int EPIPE = 32;
    public static final int ELOOP = 40;
    public static final int EOVERFLOW = 75;
    public static final int EOPNOTSUPP = 95;
    /** Linux's ENOTSUP is EOPNOTSUPP; NBD's spec names it ENOTSUP. */
    public static final int ENOTSUP = EOPNOTSUPP;
    public static final int ECONNRESET = 104;
    public static final int ESHUTDOWN = 108;

    /**
     * The symbolic name of {@code errno} ({@code "EINVAL"}), for messages; {@code "errno N"} for one not named
     * here. A negated value (a completion's result) is named as its errno.
     */
    public static String name(int errno) {
        return switch (Math.abs(errno)) {
            case EPERM -> "EPERM";
            case ENOENT -> "ENOENT";
            case EINTR -> "EINTR";
            case EIO -> "EIO";
            case ENXIO -> "ENXIO";
            case EBADF -> "EBADF";
            case EAGAIN -> "EAGAIN";
            case ENOMEM -> "ENOMEM";
            case EACCES -> "EACCES";
            case EFAULT -> "EFAULT";
            case EBUSY -> "EBUSY";
            case EEXIST -> "EEXIST";
            case ENODEV -> "ENODEV";
            case ENOTDIR -> "ENOTDIR";
            case EISDIR -> "EISDIR";
            case EINVAL -> "EINVAL";
            case ENOTTY -> "ENOTTY";
            case ENOSPC -> "ENOSPC";
            case ESPIPE -> "ESPIPE";
            case EPIPE -> "EPIPE";
            case ELOOP -> "ELOOP";
            case EOVERFLOW -> "EOVERFLOW";
            case EOPNOTSUPP -> "EOPNOTSUPP";
            case ECONNRESET -> "ECONNRESET";
            case ESHUTDOWN -> "ESHUTDOWN";
            default -> "errno " + Math.abs(errno);
        };
    }
}
