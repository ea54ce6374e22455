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

    public static NativeException of(String function, int errno, String what) {
        return new NativeException(function + "(" + what + ") failed: " + Libc.strerror(errno) + " (errno " + errno + ")", errno);
    }

    public int errno() {
        return errno;
    }
}
