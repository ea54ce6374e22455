package io.pmemblk.queueing.log;

import java.lang.System.Logger;
import java.lang.System.Logger.Level;
import java.nio.channels.ClosedChannelException;
import java.util.function.BooleanSupplier;
import java.util.function.Consumer;

/**
 * A listener's accept loop, one for every frontend's (NBD, NVMe/TCP, vhost-user, the bitmap control socket): it
 * takes connections until its owner closes the listener, and hands each to the owner.
 *
 * <p>A failed accept on a listener still open is not the listener's end: the process is out of descriptors
 * (EMFILE, ENFILE: a client that opens connections faster than they close can cause it), out of memory, or a
 * connection was reset before it was taken. The loop keeps the listener and tries again, but not at once: with
 * EMFILE the connection stays in the backlog and every accept fails at once, so retrying at once spins a CPU and
 * writes a line a try, and ending the loop stops accepting for good. Netty pauses accepting for a second after
 * such a failure, nginx for half a second; here the pause starts at {@value #FIRST_PAUSE_MILLIS} ms and doubles
 * up to {@value #LONGEST_PAUSE_MILLIS} ms while the failures go on, so a passing shortage costs a new client
 * little and a lasting one costs nothing. The lines go through a rate-limited log of the loop's own, a line a
 * second at most.
 */
public final class AcceptLoop {
    static final long FIRST_PAUSE_MILLIS = 10, LONGEST_PAUSE_MILLIS = 1000;

    /** The listener's accept: a connection, or an exception when none could be taken. */
    @FunctionalInterface
    public interface Accept<T> {
        T accept() throws Exception;
    }

    private AcceptLoop() {}

    /**
     * Accepts until {@code closed} says the owner closed the listener (checked after each failure: closing the
     * listener is how an owner wakes a blocked accept), or the listener reports itself closed, or the thread is
     * interrupted in a pause.
     * @param listener what the lines call it ("nbd: TCP listener")
     * @param admit    takes each connection; what it throws ends the loop, so it handles its own failures
     */
    public static <T> void run(Logger logger, String listener, Accept<T> accept, Consumer<T> admit,
                               BooleanSupplier closed) {
        RateLimitedLog log = RateLimitedLog.withOwnLimit(logger, Level.WARNING, 1);
        long pauseMillis = FIRST_PAUSE_MILLIS;
        while (!closed.getAsBoolean()) {
            T connection;
            try {
                connection = accept.accept();
            } catch (ClosedChannelException e) {
                return;
            } catch (Exception e) {
                if (closed.getAsBoolean()) {
                    return;
                }
                log.refused("{0}: accept failed, next try in {1} ms (the listener stays open): {2}", listener,
                        pauseMillis, String.valueOf(e));
                try {
                    Thread.sleep(pauseMillis);
                } catch (InterruptedException stop) {
                    return;
                }
                pauseMillis = Math.min(pauseMillis * 2, LONGEST_PAUSE_MILLIS);
                continue;
            }
            pauseMillis = FIRST_PAUSE_MILLIS;
            admit.accept(connection);
        }
    }
}
