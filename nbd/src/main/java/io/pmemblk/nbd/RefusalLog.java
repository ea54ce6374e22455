package io.pmemblk.nbd;

import java.lang.System.Logger.Level;

/**
 * Refused requests and options at DEBUG, by command or option name, as nbdkit logs each refused request. A
 * hostile client can send refusals as fast as its socket carries them, so lines are limited server-wide to
 * {@value #LINES_PER_SECOND} a second; the next line written says how many were left out. With DEBUG off a refusal
 * costs one level check: nothing is built, nothing is locked.
 */
final class RefusalLog {
    static final int LINES_PER_SECOND = 20;
    private static final long SECOND_NANOS = 1_000_000_000L;
    private static final System.Logger LOG = System.getLogger(RefusalLog.class.getName());

    /** The one every connection of every server in this process logs through: the limit is the process's. */
    static final RefusalLog SERVER = new RefusalLog();

    private long windowStart = System.nanoTime() - SECOND_NANOS;
    private int lines;
    private long leftOut;

    /** A request answered {@code error} without reaching the driver. */
    void request(int command, int flags, long offset, long length, int error) {
        if (!LOG.isLoggable(Level.DEBUG)) {
            return;
        }
        long skipped = admit();
        if (skipped >= 0) {
            LOG.log(Level.DEBUG, "refused {0} (flags 0x{1}, offset {2}, length {3}): {4}{5}",
                    NbdProtocol.commandName(command), Integer.toHexString(flags), Long.toUnsignedString(offset),
                    length, NbdProtocol.errorName(error), leftOut(skipped));
        }
    }

    /** An option answered with the error reply {@code reply} and its UTF-8 {@code message} (or null). */
    void option(int option, int reply, byte[] message) {
        if (!LOG.isLoggable(Level.DEBUG)) {
            return;
        }
        long skipped = admit();
        if (skipped >= 0) {
            LOG.log(Level.DEBUG, "refused {0}: reply 0x{1} {2}{3}", NbdProtocol.optionName(option),
                    Integer.toHexString(reply),
                    message == null ? "" : new String(message, java.nio.charset.StandardCharsets.UTF_8),
                    leftOut(skipped));
        }
    }

    private static String leftOut(long skipped) {
        return skipped == 0 ? "" : " (" + skipped + " refusals before this one left out of the log)";
    }

    /** -1: over this second's lines, count it; else the refusals left out since the last line written. */
    private synchronized long admit() {
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
