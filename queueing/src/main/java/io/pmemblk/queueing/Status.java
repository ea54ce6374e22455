package io.pmemblk.queueing;

/** Request completion codes: 0 or a Linux errno, which every frontend protocol speaks (NBD, ublk). */
public final class Status {
    private Status() {}

    public static final int OK = 0;
    public static final int EPERM = 1;
    public static final int EIO = 5;
    public static final int ENOMEM = 12;
    public static final int EINVAL = 22;
    public static final int ENOSPC = 28;
    public static final int EOVERFLOW = 75;
    public static final int ENOTSUP = 95;
    public static final int ESHUTDOWN = 108;
}
