package io.pmemblk.dma.vfiouser.client;

import java.io.IOException;

/**
 * A vfio-user exchange failed: the device refused a command (an error reply: {@link #errno} is the server's), or
 * the connection is gone (the socket closed or broke, a reply did not come in time, the server broke the
 * protocol: {@link #connectionLost} is true, and every later request fails the same way).
 */
public final class VfioUserException extends IOException {
    private static final long serialVersionUID = 1L;
    private final int errno;
    private final boolean connectionLost;

    VfioUserException(String message, int errno, boolean connectionLost) {
        super(message);
        this.errno = errno;
        this.connectionLost = connectionLost;
    }

    VfioUserException(String message, Throwable cause) {
        super(message, cause);
        this.errno = 0;
        this.connectionLost = true;
    }

    /** The errno the server put in its error reply; 0 when it gave none or the connection was lost. */
    public int errno() {
        return errno;
    }

    /** Whether the connection is gone (not just this command refused). */
    public boolean connectionLost() {
        return connectionLost;
    }
}
