package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * TEMPORARY stand-in for proto's C3 EventFd (issue 24), so the vhost queues compile and test before it lands:
 * the contract's methods only, on FileIo/Libc. Replaced by proto's class at merge.
 */
public final class EventFd implements AutoCloseable {
    private final int fd;
    private final MemorySegment value = Arena.ofAuto().allocate(8, 8);
    private final MemorySegment pollfd = Arena.ofAuto().allocate(Libc.POLLFD);
    private boolean closed;

    private EventFd(int fd) {
        this.fd = fd;
    }

    public static EventFd create(boolean nonBlocking) throws NativeException {
        return new EventFd(FileIo.eventfd(0, nonBlocking ? FileIo.EFD_NONBLOCK : 0));
    }

    public static EventFd adopt(int fd) {
        return new EventFd(fd);
    }

    public int fd() {
        return fd;
    }

    public void signal() {
        value.set(ValueLayout.JAVA_LONG, 0, 1);
        long rc = FileIo.write(fd, value);
        if (rc != 8) {
            throw new IllegalStateException("eventfd " + fd + " write: " + rc);
        }
    }

    public long drain() {
        long rc = FileIo.read(fd, value);
        if (rc == -Errno.EAGAIN) {
            return 0;
        }
        if (rc != 8) {
            throw new IllegalStateException("eventfd " + fd + " read: " + rc);
        }
        return value.get(ValueLayout.JAVA_LONG, 0);
    }

    public boolean await(long timeoutMillis) throws NativeException {
        pollfd.set(ValueLayout.JAVA_INT, 0, fd);
        pollfd.set(ValueLayout.JAVA_SHORT, 4, Libc.POLLIN);
        pollfd.set(ValueLayout.JAVA_SHORT, 6, (short) 0);
        return (Libc.pollOne(pollfd, (int) Math.min(Integer.MAX_VALUE, timeoutMillis)) & Libc.POLLIN) != 0;
    }

    @Override
    public synchronized void close() throws NativeException {
        if (!closed) {
            closed = true;
            Libc.close(fd);
        }
    }
}
