package io.pmemblk.queueing.log;

import java.lang.System.Logger;
import java.lang.System.Logger.Level;

/**
 * Log lines that something outside the server can cause as fast as it likes, limited to a number a second per
 * limit: a frontend's refusals of what a client or guest sent (an NBD request or option, a virtio-blk request, a
 * vhost-user message), as nbdkit logs each refused request, and the driver's faults (a DMA halt fails every copy
 * behind it, a truncated file every access). The next refusal written says how many were left out. With the level
 * off a line costs one level check (callers check {@link #enabled} before building arguments): nothing is built,
 * nothing is locked.
 *
 * <p>One implementation for every such line: nbd, vhost and the pmem driver log through it.
 */
public final class RateLimitedLog {
    /** The lines a second of {@link #to} and {@link #withOwnLimit(Logger, Level)}. */
    public static final int LINES_PER_SECOND = 20;
    private static final long SECOND_NANOS = 1_000_000_000L;
    /** The process's limit: every log made with {@link #to} counts against it. */
    private static final Limit PROCESS = new Limit(LINES_PER_SECOND);

    private final Logger logger;
    private final Level level;
    private final Limit limit;

    private RateLimitedLog(Logger logger, Level level, Limit limit) {
        this.logger = logger;
        this.level = level;
        this.limit = limit;
    }

    /** Lines to {@code logger} at {@code level}, within the process's {@value #LINES_PER_SECOND} lines a second. */
    public static RateLimitedLog to(Logger logger, Level level) {
        return new RateLimitedLog(logger, level, PROCESS);
    }

    /**
     * Lines with a limit of their own: one server's (what a client of another server refused does not count
     * against it), or one test's.
     */
    public static RateLimitedLog withOwnLimit(Logger logger, Level level) {
        return withOwnLimit(logger, level, LINES_PER_SECOND);
    }

    /** Lines with a limit of their own of {@code linesPerSecond} (at least 1). */
    public static RateLimitedLog withOwnLimit(Logger logger, Level level, int linesPerSecond) {
        if (linesPerSecond < 1) {
            throw new IllegalArgumentException("linesPerSecond is " + linesPerSecond + "; allowed: 1 or more");
        }
        return new RateLimitedLog(logger, level, new Limit(linesPerSecond));
    }

    /** Whether a line would be written at all: check it before building the line's arguments. */
    public boolean enabled() {
        return logger.isLoggable(level);
    }

    /**
     * One refusal: {@code pattern} ({@link java.text.MessageFormat}, as System.Logger formats) with {@code args},
     * written unless this second's lines are used up (then counted, and said on the next refusal written).
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

    /**
     * For a line the caller builds itself, with its own count of what was left out where it keeps one: whether
     * it may be written now. True takes one of this second's lines: build the line, then {@link #write} it. False:
     * it is left out. Nothing is built before the answer, so a flood costs a clock read and a lock per line.
     */
    public boolean due() {
        return enabled() && limit.admit() >= 0;
    }

    /**
     * Writes a line {@link #due} allowed, at {@code level} (this log's, or one more severe: one limit may serve
     * a fault's warning and its error), with {@code thrown}'s stack (null: none). The line is not a pattern.
     */
    public void write(Level level, String line, Throwable thrown) {
        if (thrown == null) {
            logger.log(level, line);
        } else {
            logger.log(level, line, thrown);
        }
    }

    /** Lines written in the current second, and lines left out since the last one. */
    private static final class Limit {
        private final int linesPerSecond;
        private long windowStart = System.nanoTime() - SECOND_NANOS;
        private int lines;
        private long leftOut;

        Limit(int linesPerSecond) {
            this.linesPerSecond = linesPerSecond;
        }

        /** -1: over this second's lines, count it; else the lines left out since the last line written. */
        synchronized long admit() {
            long now = System.nanoTime();
            if (now - windowStart >= SECOND_NANOS) {
                windowStart = now;
                lines = 0;
            }
            if (lines == linesPerSecond) {
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
