package io.pmemblk.posix;

import java.io.UncheckedIOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

import static io.pmemblk.posix.Errno.EAGAIN;

/**
 * An eventfd(2): a kernel counter that one side adds to ({@link #signal}) and the other reads and resets
 * ({@link #drain}), waking a thread that waits for it ({@link #await}). vhost-user's kick, call and err
 * notifiers are eventfds the front-end created and passed over the socket ({@link #adopt}); the 8-byte value
 * carries no meaning there ({@code docs/interop/vhost-user.rst}, "Support for platforms other than Linux").
 *
 * <p>{@link #signal} may be called from any thread (completions run on the driver's threads); {@link #drain}
 * and {@link #await} by one thread at a time (the queue's). Nothing allocates after construction. Closing is
 * the owner's, once nothing signals or waits any more: a closed number may already name another file.
 */
public final class EventFd implements AutoCloseable {
    /** What {@link #signal} writes, 1 as eventfd_write(fd, 1) does; never written to, so shared by every thread. */
    private final MemorySegment one;
    /** What {@link #drain} reads into: the counter's value. */
    private final MemorySegment value;
    /** The one {@code struct pollfd} of {@link #await}. */
    private final MemorySegment pollfd;
    private final int fd;
    private final CloseOnce closing;

    private EventFd(int fd) {
        this.fd = fd;
        this.closing = new CloseOnce(fd);
        Arena arena = Arena.ofAuto();
        one = arena.allocate(ValueLayout.JAVA_LONG);
        one.set(ValueLayout.JAVA_LONG, 0, 1L);
        value = arena.allocate(ValueLayout.JAVA_LONG);
        pollfd = arena.allocate(Sockets.POLLFD);
        pollfd.set(ValueLayout.JAVA_INT, 0, fd);
        pollfd.set(ValueLayout.JAVA_SHORT, 4, Sockets.POLLIN);
    }

    /** A new eventfd, counter 0, close-on-exec; {@code nonBlocking}: {@link #drain} returns 0 instead of waiting. */
    public static EventFd create(boolean nonBlocking) throws NativeException {
        return new EventFd(FileIo.eventfd(0, nonBlocking ? FileIo.EFD_NONBLOCK : 0));
    }

    /** An eventfd someone else created (one received with SCM_RIGHTS); owned from now on: {@link #close} closes it. */
    public static EventFd adopt(int fd) {
        if (fd < 0) {
            throw new IllegalArgumentException("eventfd descriptor " + fd + " is not allowed; allowed: an open fd >= 0");
        }
        return new EventFd(fd);
    }

    /** What /proc/self/fd names an eventfd as (fs/eventfd.c: anon_inode_getfile("[eventfd]", ...)). */
    public static final String PROC_NAME = "anon_inode:[eventfd]";

    /**
     * A notifier another process passed over a socket (vhost-user's kick, call, err), checked and made safe to
     * signal from any thread, then owned as {@link #adopt}. It must be an eventfd: a pipe, a socket or a file
     * would block a write or a wait in ways an eventfd cannot, and an eventfd's counter is all a front end
     * shares with us. Its open file description is made non-blocking, so {@link #signal} never waits for a
     * reader when the counter is full (at 0xfffffffffffffffe, which anyone holding the fd can write): the
     * description is shared with the sender, for whom this changes nothing that matters, since QEMU creates
     * its notifiers non-blocking itself (util/event_notifier-posix.c: eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC))
     * and the kernel's readers of a call fd (KVM's irqfd) do not read through the file's flags. A sender can
     * clear the flag again; callers keep such writes off threads that serve anyone else.
     * @param what what the descriptor is for, for the error ("vring 0 call fd")
     * @throws IllegalArgumentException when {@code fd} is not an eventfd, naming what it is
     * @throws NativeException when /proc/self/fd cannot be read or fcntl fails
     */
    public static EventFd adoptNotifier(int fd, String what) throws NativeException {
        if (fd < 0) {
            throw new IllegalArgumentException(what + " " + fd + " is not allowed; allowed: an open eventfd");
        }
        String kind = FileCalls.describeFd(fd);
        if (!PROC_NAME.equals(kind)) {
            throw new IllegalArgumentException(what + " is " + kind + ", not an eventfd; allowed: an eventfd(2) ("
                    + PROC_NAME + " in /proc/PID/fd), as QEMU's event notifiers are");
        }
        Libc.setNonBlocking(fd);
        return new EventFd(fd);
    }

    public int fd() {
        return fd;
    }

    /**
     * Adds 1 to the counter, waking whoever waits on it. On a non-blocking eventfd ({@link #create}(true),
     * {@link #adoptNotifier}) a full counter (2^64-2) fails the write with EAGAIN, which is taken as done: the
     * counter is non-zero, so a signal is already pending for the reader (QEMU's event_notifier_set says the
     * same). Allocates nothing. Unchecked on failure: it runs in completions, where the only answer to a
     * descriptor gone bad is to stop the queue that owns it.
     * @throws UncheckedIOException wrapping the NativeException when the write fails (EBADF: not an open eventfd)
     */
    public void signal() {
        long n = FileIo.write(fd, one);
        if (n != 8 && n != -EAGAIN) {
            throw new UncheckedIOException(NativeException.of("write", n < 0 ? (int) -n : Errno.EIO, "eventfd " + fd + ", 1"));
        }
    }

    /**
     * Reads and resets the counter: how many signals came since the last drain; 0 when none are pending and the
     * eventfd is non-blocking (a blocking one waits for the next). Allocates nothing.
     * @throws UncheckedIOException wrapping the NativeException when the read fails (EBADF)
     */
    public long drain() {
        long n = FileIo.read(fd, value);
        if (n == -EAGAIN) {
            return 0;
        }
        if (n != 8) {
            throw new UncheckedIOException(NativeException.of("read", n < 0 ? (int) -n : Errno.EIO, "eventfd " + fd));
        }
        return value.get(ValueLayout.JAVA_LONG, 0);
    }

    /**
     * Waits at most {@code timeoutMillis} (negative: forever) until the counter is non-zero, without reading it.
     * Allocates nothing.
     * @return true when a signal is pending; false on timeout or a signal handler's interruption
     * @throws NativeException when the descriptor is not valid (POLLNVAL) or poll fails
     */
    public boolean await(long timeoutMillis) throws NativeException {
        int millis = timeoutMillis < 0 ? -1 : (int) Math.min(timeoutMillis, Integer.MAX_VALUE);
        int revents = Sockets.pollOne(pollfd, millis);
        if ((revents & Sockets.POLLNVAL) != 0) {
            throw NativeException.of("poll", Errno.EBADF, "eventfd " + fd);
        }
        return (revents & Sockets.POLLIN) != 0;
    }

    /** Closes the descriptor. Idempotent. */
    @Override
    public void close() throws NativeException {
        closing.close();
    }

    @Override
    public String toString() {
        return "eventfd " + fd;
    }
}
