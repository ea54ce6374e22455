package io.pmemblk.dma.vfiouser.client;

import static io.pmemblk.dma.vfiouser.client.VfioUserSpec.*;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;

/**
 * The watcher thread of one vfio-user connection: while no request is out, it answers the commands the server
 * sends on its own (DMA_READ/DMA_WRITE) and sees the socket close (a device process that died while our copies
 * were in its hands sends nothing more, and only the watcher would notice).
 */
final class VfioUserWatcher {
    private static final System.Logger LOG = System.getLogger("io.pmemblk.dma.vfiouser");
    /** How long the watcher waits before it looks again at a socket a requester is reading (not synchronisation). */
    private static final long WATCH_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(1);

    private final VfioUserWire wire;
    private final String path;
    private final long timeoutNanos;
    private final ReentrantLock lock;
    private final MemorySegment in;
    private final MemorySegment pollfd;
    private volatile Consumer<String> onLoss = reason -> { };
    private Thread watcher;

    VfioUserWatcher(VfioUserWire wire) {
        this.wire = wire;
        this.path = wire.path;
        this.timeoutNanos = wire.timeoutNanos;
        this.lock = wire.lock;
        this.in = wire.in;
        this.pollfd = wire.arena.allocate(Sockets.POLLFD);
        pollfd.set(ValueLayout.JAVA_INT, 0, wire.fd);
        pollfd.set(ValueLayout.JAVA_SHORT, 4, Sockets.POLLIN);
    }

    /** Runs {@code listener} once, on the watcher thread, when the connection is lost (not when closed). */
    void onLoss(Consumer<String> listener) {
        this.onLoss = listener;
    }

    /** Starts the watcher thread; {@code name} names it. */
    synchronized void start(String name) {
        if (watcher == null) {
            watcher = Thread.ofPlatform().daemon().name(name).start(this::watch);
        }
    }

    /** The thread, or null before {@link #start}. */
    synchronized Thread thread() {
        return watcher;
    }

    /**
     * The watcher: while no request is out, reads what the server sends on its own (DMA_READ/WRITE) and sees the
     * socket close. Ends when the connection is lost (then runs the loss listener) or closed.
     */
    private void watch() {
        while (!wire.closed() && wire.lostReason() == null) {
            int revents;
            try {
                revents = Sockets.pollOne(pollfd, VfioUserWire.SLICE_MILLIS);
            } catch (NativeException e) {
                wire.lose("polling the socket failed: " + e.getMessage());
                break;
            }
            if (revents == 0) {
                continue;
            }
            // Never queue for the lock: a requester holding it reads what came (its reply, most often), and one
            // that found the watcher queued behind it would pay a wait-queue node per request (an allocation on
            // the register path) and a hand-off. So try, and if it is held, look again a little later.
            if (!lock.tryLock()) {
                LockSupport.parkNanos(WATCH_BACKOFF_NANOS);
                continue;
            }
            try {
                if (wire.closed() || wire.lostReason() != null) {
                    break;
                }
                if (Sockets.pollOne(pollfd, 0) == 0) {
                    continue; // a requester read it meanwhile
                }
                int payload = wire.receive(System.nanoTime() + timeoutNanos, false, "the device's next message");
                int flags = in.get(JAVA_INT_UNALIGNED, H_FLAGS);
                int command = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_COMMAND));
                int id = Short.toUnsignedInt(in.get(JAVA_SHORT_UNALIGNED, H_MSG_ID));
                if ((flags & FLAG_TYPE_MASK) != TYPE_COMMAND) {
                    throw wire.lose("the device sent a reply to " + commandName(command) + " (msg_id " + id
                            + ") while no request was outstanding");
                }
                wire.serve(id, command, payload, System.nanoTime() + timeoutNanos);
            } catch (VfioUserException | NativeException e) {
                if (wire.lostReason() == null && !wire.closed()) {
                    wire.lose(e.getMessage());
                }
            } finally {
                lock.unlock();
            }
        }
        if (wire.closed()) {
            wire.freeBuffers(); // close() ran on this thread (from the loss listener) or could not wait for it
        }
        String reason = wire.lostReason();
        if (reason != null && !wire.closed()) {
            LOG.log(System.Logger.Level.DEBUG, () -> "vfio-user " + path + ": connection lost: " + reason);
            try {
                onLoss.accept(reason);
            } catch (RuntimeException e) {
                Thread me = Thread.currentThread();
                me.getUncaughtExceptionHandler().uncaughtException(me, e);
            }
        }
    }
}
