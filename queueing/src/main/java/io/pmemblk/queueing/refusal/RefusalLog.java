package io.pmemblk.queueing.refusal;

import java.lang.System.Logger;
import java.lang.System.Logger.Level;

/**
 * The lines a frontend writes when it refuses what a client or guest sent (an NBD request or option, a virtio-blk
 * request, a vhost-user message), as nbdkit logs each refused request. Whoever refuses, the other side can send
 * refusals as fast as its socket or ring carries them, so lines are limited to {@value #LINES_PER_SECOND} a second
 * per limit; the next line written says how many were left out. With the level off a refusal costs one level
 * check (callers check {@link #enabled} before building arguments): nothing is built, nothing is locked.
 *
 * <p>One implementation for every frontend: nbd and vhost (and the block layer's other users) log through it.
 */
public final class RefusalLog {
    public static final int LINES_PER_SECOND = 20;
    private static final long SECOND_NANOS = 1_000_000_000L;
    /** The process's limit: every log made with {@link #to} counts against it. */
    private static final Limit PROCESS = new Limit();

    private final Logger logger;
    private final Level level;
    private final Limit limit;

    private RefusalLog(Logger logger, Level level, Limit limit) {
        this.logger = logger;
        this.level = level;
        this.limit = limit;
    }

    /** Refusals to {@code logger} at {@code level}, within the process's {@value #LINES_PER_SECOND} lines a second. */
    public static RefusalLog to(Logger logger, Level level) {
        return new RefusalLog(logger, level, PROCESS);
    }

    /**
     * Refusals with a limit of their own: one server's (what a client of another server refused does not count
     * against it), or one test's.
     */
    public static RefusalLog withOwnLimit(Logger logger, Level level) {
        return new RefusalLog(logger, level, new Limit());
    }

    /** Whether a refusal would be written at all: check it before building the line's arguments. */
    public boolean enabled() {
        return logger.isLoggable(level);
    }

    /**
     * One refusal: {@code pattern} ({@link java.text.MessageFormat}, as System.Logger formats) with {@code args},
     * written unless this second's lines are used up (then counted, and said on the next line written).
     */
    public void refused(String pattern, Object... args) {
        if (!enabled()) {
            return;
        }
        long skipped = limit.admit();
        if (skipped < 0) {
            return;
        }
        if (skipped == 0) {
            logger.log(level, pattern, args);
        } else {
            logger.log(level, pattern + " (" + skipped + " refusals before this one left out of the log)", args);
        }
    }

    /** Lines written in the current second, and refusals left out since the last line. */
    private static final class Limit {
        private long windowStart = System.nanoTime() - SECOND_NANOS;
        private int lines;
        private long leftOut;

        /** -1: over this second's lines, count it; else the refusals left out since the last line written. */
        synchronized long admit() {
            long now = System.nanoTime();
            if (now - windowStart >= SECOND_NANOS) {
                windowStart = now;
                lines = 0;
            }
            if (lines == LINES_PER_SECOND) {
                leftOut++;
                return -1;
            }
            lines++;
            long skipped = leftOut;
            leftOut = 0;
            return skipped;
        }
    }
}
