package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;

import static io.pmemblk.posix.Errno.EINTR;
import static io.pmemblk.posix.Native.ERRNO;
import static io.pmemblk.posix.Native.libc;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;

/**
 * Sleeps until one of a few eventfds is signalled, without reading their counters: an epoll(7) instance with each
 * eventfd registered edge-triggered (EPOLLET). Every write to an eventfd queues the epoll item as ready
 * ({@code fs/eventfd.c} wakes its wait queue on each write, {@code fs/eventpoll.c} ep_poll_callback), so a wait
 * returns once for whatever signals came since the last one returned, and a wake-up costs one epoll_wait where
 * {@link EventFd#await} + {@link EventFd#drain} cost a poll(2), its wait-queue set-up and tear-down, and a read(2).
 *
 * <p>Why: a vhost-user queue thread sleeps on its kick after each burst of guest requests; on the DMA route, where
 * the engine makes the copy, the sleep and wake-up are most of what the thread spends (bench-vhost with perf: 64% of
 * its CPU in the poll and the switch, 5% in the read that reset the counter).
 *
 * <p>The counters are never reset here: an eventfd's writer would only block (or get EAGAIN) at 2^64 - 2 signals.
 * An fd that is already signalled when it is added makes the first wait return at once. {@link #await} by one
 * thread at a time; {@link #close} by the owner once nothing waits (a closed number may already name another
 * file). The eventfds stay their owners': closing this instance does not close them.
 */
public final class EdgeWait implements AutoCloseable {
    // <sys/epoll.h>
    private static final int EPOLL_CLOEXEC = 02000000, EPOLL_CTL_ADD = 1, EPOLLIN = 0x001, EPOLLET = 1 << 31;
    /**
     * struct epoll_event {u32 events; u64 data;}: packed on x86-64 (glibc's __EPOLL_PACKED, 12 bytes, data at 4),
     * naturally aligned on other 64-bit targets (16 bytes, data at 8).
     */
    static final long EVENT_BYTES = "amd64".equals(System.getProperty("os.arch")) ? 12 : 16;
    private static final long EVENT_DATA = EVENT_BYTES == 12 ? 4 : 8;

    private static final MethodHandle EPOLL_CREATE1 = libc("epoll_create1",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT), ERRNO);
    private static final MethodHandle EPOLL_CTL = libc("epoll_ctl",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS), ERRNO);
    private static final MethodHandle EPOLL_WAIT = libc("epoll_wait",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), ERRNO);

    private final int epfd;
    private final int capacity;
    private final MemorySegment events;
    private int added;
    private final CloseOnce closing;

    private EdgeWait(int epfd, int capacity) {
        this.epfd = epfd;
        this.closing = new CloseOnce(epfd);
        this.capacity = capacity;
        this.events = Arena.ofAuto().allocate(EVENT_BYTES * capacity, 8);
    }

    /**
     * A new epoll instance (close-on-exec) for at most {@code capacity} eventfds.
     * @throws NativeException when epoll_create1 fails (EMFILE, ENOMEM)
     */
    public static EdgeWait create(int capacity) throws NativeException {
        if (capacity < 1 || capacity > 64) {
            throw new IllegalArgumentException("EdgeWait capacity " + capacity + "; allowed: 1..64");
        }
        int fd = (int) Libc.call("epoll_create1", "EPOLL_CLOEXEC",
                state -> (int) EPOLL_CREATE1.invokeExact(state, EPOLL_CLOEXEC));
        return new EdgeWait(fd, capacity);
    }

    /**
     * Registers {@code e} (EPOLLIN, edge-triggered); its next signal, or a pending one, ends the next wait.
     * @throws NativeException when epoll_ctl refuses it (EBADF: not open; EEXIST: added before)
     */
    public void add(EventFd e) throws NativeException {
        if (added == capacity) {
            throw new IllegalStateException("EdgeWait holds " + capacity + " eventfds already; allowed: " + capacity);
        }
        MemorySegment event = Arena.ofAuto().allocate(EVENT_BYTES, 8);
        event.set(JAVA_INT, 0, EPOLLIN | EPOLLET);
        event.set(ValueLayout.JAVA_LONG_UNALIGNED, EVENT_DATA, e.fd());
        Libc.call("epoll_ctl", "epoll " + epfd + ", EPOLL_CTL_ADD " + e,
                state -> (int) EPOLL_CTL.invokeExact(state, epfd, EPOLL_CTL_ADD, e.fd(), event));
        added++;
    }

    /**
     * Sleeps until one of the eventfds is signalled (or was since the last wait returned), at most
     * {@code timeoutMillis} (negative: no limit). Allocates nothing: written out, not through {@link Libc#call}, as
     * it is every sleep of a queue thread.
     * @return true when a signal came; false on timeout or a signal handler's interruption
     * @throws NativeException when epoll_wait fails (EBADF after close)
     */
    public boolean await(long timeoutMillis) throws NativeException {
        int millis = timeoutMillis < 0 ? -1 : (int) Math.min(timeoutMillis, Integer.MAX_VALUE);
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) EPOLL_WAIT.invokeExact(state, epfd, events, capacity, millis);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            int errno = Native.errno(state);
            if (errno == EINTR) {
                return false;
            }
            throw NativeException.of("epoll_wait", errno, "epoll " + epfd);
        }
        return rc > 0;
    }

    /** Closes the epoll instance (not the eventfds). Idempotent. */
    @Override
    public void close() throws NativeException {
        closing.close();
    }

    @Override
    public String toString() {
        return "epoll " + epfd;
    }
}
