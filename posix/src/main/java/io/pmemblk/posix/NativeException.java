package io.pmemblk.posix;

import java.io.IOException;

/** A failed C call: which function, what it was asked, errno and errno's text. */
public final class NativeException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int errno;

    public NativeException(String message, int errno) {
        super(message);
        this.errno = errno;
    }

    /** {@code function(what) failed: <strerror> (errno N, ENAME)}: the call, what it was asked, and why it failed. */
    public static NativeException of(String function, int errno, String what) {
        return new NativeException(function + "(" + what + ") failed: " + Libc.strerror(errno) + " (errno " + errno
                + ", " + Errno.name(errno) + ")", errno);
    }

    public int errno() {
        return errno;
    }
}
