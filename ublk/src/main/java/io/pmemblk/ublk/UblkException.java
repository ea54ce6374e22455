package io.pmemblk.ublk;

import java.io.IOException;

/**
 * A ublk step the kernel refused, or a setup the user must change, with the message saying which and how to fix
 * it. {@link #errno()} is the kernel's answer (0 when the refusal is ours).
 */
public final class UblkException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int errno;

    UblkException(String message, int errno) {
        super(message);
        this.errno = errno;
    }

    UblkException(String message, int errno, Throwable cause) {
        super(message, cause);
        this.errno = errno;
    }

    public int errno() {
        return errno;
    }
}
