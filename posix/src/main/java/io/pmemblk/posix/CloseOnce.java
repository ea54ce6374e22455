package io.pmemblk.posix;

/**
 * The close of a descriptor a class owns, made once however often it is asked for: a second close(2) of the number
 * could close another file that has been given the same number since. Shared by {@link EventFd} and
 * {@link EdgeWait}, whose close may be called by their owner and by a teardown path both.
 */
final class CloseOnce {
    private final int fd;
    private boolean closed;

    CloseOnce(int fd) {
        this.fd = fd;
    }

    synchronized void close() throws NativeException {
        if (!closed) {
            closed = true;
            Libc.close(fd);
        }
    }
}
