package io.pmemblk.dma.vfiouser.device;

import io.pmemblk.posix.NativeException;
import io.pmemblk.posix.Sockets;

import java.lang.System.Logger.Level;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.time.Duration;
import java.util.function.BooleanSupplier;

/**
 * The run loop's guard against a client that blocks it. With LIBVFIO_USER_FLAG_ATTACH_NB only the listening socket
 * is non-blocking: the VERSION negotiation and every receive and reply on the client's socket block, so a client
 * that connects and says nothing, or sends a header and not the body it announces, or stops reading replies, would
 * hold the one thread every client needs. The loop enters and leaves each attach or message here; when one lasts
 * past {@link #CALL_LIMIT}, or the device is closing, this thread shuts the client's socket down, which fails the
 * blocked receive or send: libvfio-user drops the client and the loop serves the next.
 */
final class ClientWatchdog {
    private static final System.Logger LOG = System.getLogger(IoatVfioUserDevice.class.getName());
    /**
     * How long one attach or one message may hold the run loop before the client is dropped. No message of ours
     * takes near this long (the longest, a DMA_UNMAP, waits out one descriptor).
     */
    static final Duration CALL_LIMIT = Duration.ofSeconds(5);
    /** How often the watchdog looks at the call in progress: a stuck one is dropped within CALL_LIMIT plus this. */
    private static final long WATCH_MILLIS = 500;

    private final LibVfioUser lib;
    private final MemorySegment ctx;
    private final Path socket;
    /** Whether a client is attached (the loop's own state, read for the message only). */
    private final BooleanSupplier attached;
    /** The socket libvfio-user listens on: never shut down (it is the next client's way in). */
    private final int listenFd;
    private final Thread thread;
    /**
     * Guards the call in progress: the loop enters and leaves attach/run under it, and a client's socket is shut
     * down only under it while the loop is inside the call, so never after the call has returned (when
     * libvfio-user may have closed that fd and the number may be another file's).
     */
    private final Object lock = new Object();
    /** Under lock: the loop is inside attach or run, since callSince (System.nanoTime()). */
    private boolean inCall;
    private long callSince;
    /** Under lock: the client of the call in progress was shut down already. */
    private boolean callDropped;
    /** Under lock: the device is closing (no call begins); the loop has stopped (this thread ends). */
    private boolean closing, ended;

    /** Before any client attached: {@code ctx}'s poll fd is then the listening socket. */
    ClientWatchdog(LibVfioUser lib, MemorySegment ctx, Path socket, BooleanSupplier attached) {
        this.lib = lib;
        this.ctx = ctx;
        this.socket = socket;
        this.attached = attached;
        this.listenFd = lib.pollFd(ctx);
        this.thread = Thread.ofPlatform().daemon().name("vfio-user-device-watchdog").unstarted(this::watch);
    }

    void start() {
        thread.start();
    }

    /** The loop is about to attach or run one message; false when closing: no call is begun then. */
    boolean enterCall() {
        synchronized (lock) {
            if (closing) {
                return false;
            }
            inCall = true;
            callSince = System.nanoTime();
            callDropped = false;
            return true;
        }
    }

    void leaveCall() {
        synchronized (lock) {
            inCall = false;
        }
    }

    /** No call begins from now on, and a client blocking the loop is dropped at once (or at the next turn). */
    void closing() {
        synchronized (lock) {
            closing = true;
            if (inCall && !callDropped) {
                dropClient(Level.INFO, "the device is closing"); // it must not hold up the close
            }
        }
    }

    /** Once the loop has stopped: this thread ends. */
    void stop() throws InterruptedException {
        synchronized (lock) {
            ended = true;
            lock.notifyAll();
        }
        thread.join(CALL_LIMIT.toMillis());
    }

    private void watch() {
        long limit = CALL_LIMIT.toNanos();
        synchronized (lock) {
            while (!ended) {
                if (inCall && !callDropped && closing) {
                    // closing() found the call before its accept had a client to drop: try again now
                    dropClient(Level.INFO, "the device is closing");
                } else if (inCall && !callDropped && System.nanoTime() - callSince > limit) {
                    dropClient(Level.WARNING, attached.getAsBoolean() ? "a message took longer than "
                            + CALL_LIMIT.toSeconds() + " s (a body announced and not sent, or replies not read)"
                            : "it sent no VERSION in " + CALL_LIMIT.toSeconds() + " s");
                }
                try {
                    lock.wait(WATCH_MILLIS);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }
    }

    /**
     * Shuts down the socket of the client the loop is blocked on. shutdown, not close: the fd stays libvfio-user's
     * to close. Caller holds lock, with the loop inside a call.
     */
    private void dropClient(Level level, String why) {
        // the one call made off the run loop: vfu_get_poll_fd only reads the transport's conn_fd (the client's
        // socket once accepted), which the loop, blocked on that socket, is not changing
        int fd = lib.pollFd(ctx);
        if (fd < 0 || fd == listenFd) {
            // not accepted yet (the loop is on its way into the accept, which does not block, and may then block
            // in the VERSION negotiation): not dropped, so the watchdog looks again at its next turn
            return;
        }
        callDropped = true;
        try {
            Sockets.shutdown(fd, Sockets.SHUT_RDWR);
            LOG.log(level, "dma-device: dropping the client on {0}: {1}", socket, why);
        } catch (NativeException e) {
            LOG.log(Level.WARNING, "dma-device: could not drop the client on {0} ({1}): {2}", socket, why,
                    e.getMessage());
        }
    }
}
