package io.pmemblk.queueing.log;

import java.lang.System.Logger;
import java.lang.System.Logger.Level;

/**
 * What a frontend's accept loop does when accept fails on a listener that is still open: the process is out of
 * descriptors (EMFILE, ENFILE: a client that opens connections faster than they close can cause it), out of
 * memory, or a connection was reset before it was taken. None of these is the listener's end, so the loop keeps
 * it and tries again, but not at once: a failure that lasts would otherwise spin a CPU and write a line each
 * turn. Netty pauses accepting for a second after such a failure, nginx for half a second; here the pause
 * starts at {@value #FIRST_PAUSE_MILLIS} ms and doubles up to {@value #LONGEST_PAUSE_MILLIS} ms while the
 * failures go on, so a passing shortage costs a new client little and a lasting one costs nothing. The lines go
 * through a rate-limited log of the loop's own. One loop's: not thread-safe.
 */
public final class AcceptFailures {
    static final long FIRST_PAUSE_MILLIS = 10, LONGEST_PAUSE_MILLIS = 1000;

    private final String listener;
    private final RateLimitedLog log;
    private long pauseMillis = FIRST_PAUSE_MILLIS;

    /** @param listener what the lines call the listener ("nbd: unix socket /run/pmemblk/nbd.sock") */
    public AcceptFailures(Logger logger, String listener) {
        this.listener = listener;
        this.log = RateLimitedLog.withOwnLimit(logger, Level.WARNING, 1);
    }

    /**
     * A failed accept on an open listener: logs it (at most a line a second) and pauses before the next accept.
     * @throws InterruptedException when the loop's thread is interrupted in the pause: its owner stops it
     */
    public void failed(Exception e) throws InterruptedException {
        log.refused("{0}: accept failed, next try in {1} ms (the listener stays open): {2}", listener, pauseMillis,
                String.valueOf(e));
        Thread.sleep(pauseMillis);
        pauseMillis = Math.min(pauseMillis * 2, LONGEST_PAUSE_MILLIS);
    }

    /** A connection was accepted: the next failure pauses briefly again. */
    public void accepted() {
        pauseMillis = FIRST_PAUSE_MILLIS;
    }
}
