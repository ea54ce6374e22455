package io.pmemblk.dma.vfio;

import io.pmemblk.dma.Interrupt;
import io.pmemblk.posix.FileIo;
import io.pmemblk.posix.Libc;
import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One MSI/MSI-X vector delivered through an eventfd that VFIO_DEVICE_SET_IRQS handed to the kernel: the device's
 * interrupt adds 1 to the eventfd's counter; {@link #await} polls it and reads (resets) the counter, which also
 * counts how many interrupts the device raised. {@link #signal} (a driver waking its own completion thread) adds
 * to the same counter, and is subtracted from {@link #deviceInterrupts}. One waiter at a time.
 */
public final class EventfdInterrupt implements Interrupt, AutoCloseable {
    private final int fd;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment readBuf = arena.allocate(ValueLayout.JAVA_LONG);
    private final MemorySegment one = arena.allocate(ValueLayout.JAVA_LONG);
    /** The struct pollfd of {@link #await}'s wait: POLLIN on {@link #fd}, reused (one waiter at a time). */
    private final MemorySegment pollfd = arena.allocate(Sockets.POLLFD);
    private final AtomicLong signals = new AtomicLong();
    private final AtomicLong total = new AtomicLong();
    private volatile boolean closed;

    public EventfdInterrupt() throws NativeException {
        this.fd = FileIo.eventfd(0, FileIo.EFD_NONBLOCK);
        one.set(ValueLayout.JAVA_LONG, 0, 1L);
        pollfd.set(ValueLayout.JAVA_INT, 0, fd);
        pollfd.set(ValueLayout.JAVA_SHORT, 4, Sockets.POLLIN);
    }

    /** The eventfd the kernel signals. */
    @Override
    public int fd() {
        return fd;
    }

    @Override
    public void signal() {
        if (closed) {
            return;
        }
        signals.incrementAndGet();
        FileIo.write(fd, one); // never blocks: the counter cannot reach its 2^64-2 limit here
    }

    @Override
    public boolean await(long timeout, TimeUnit unit) throws InterruptedException {
        long deadline = System.nanoTime() + unit.toNanos(timeout);
        while (true) {
            if (Thread.interrupted()) {
                throw new InterruptedException();
            }
            if (closed) {
                return false;
            }
            if (FileIo.read(fd, readBuf) == 8) {
                total.addAndGet(readBuf.get(ValueLayout.JAVA_LONG, 0));
                return true;
            }
            long left = deadline - System.nanoTime();
            if (left <= 0) {
                return false;
            }
            try {
                // Slices of at most 100 ms, so that close and interruption are noticed.
                Sockets.pollOne(pollfd, (int) Math.max(1, Math.min(100, TimeUnit.NANOSECONDS.toMillis(left))));
            } catch (NativeException e) {
                throw new IllegalStateException("waiting for an interrupt: " + e.getMessage(), e);
            }
        }
    }

    /** Interrupts the device raised that {@link #await} has consumed so far. */
    public long deviceInterrupts() {
        return Math.max(0, total.get() - signals.get());
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        try {
            Libc.close(fd);
        } catch (NativeException e) {
            throw new IllegalStateException(e.getMessage(), e);
        } finally {
            arena.close();
        }
    }
}
