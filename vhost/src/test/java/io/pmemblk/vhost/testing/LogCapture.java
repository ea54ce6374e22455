package io.pmemblk.vhost.testing;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;

/**
 * The formatted lines a logger (and those below it) writes while {@link #start started}: what the vhost tests
 * assert a refusal or a fault said. One per test; {@link #stop} in its tear-down.
 */
public final class LogCapture {
    private final Logger logger;
    private final List<String> lines = new CopyOnWriteArrayList<>();
    private final Handler handler = new Handler() {
        @Override
        public void publish(LogRecord r) {
            lines.add(new SimpleFormatter().formatMessage(r));
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}
    };

    public LogCapture(String logger) {
        this.logger = Logger.getLogger(logger);
    }

    /** The lines captured so far, and those to come (a live, thread-safe view). */
    public List<String> lines() {
        return lines;
    }

    /** Captures every level from now on. */
    public LogCapture start() {
        logger.addHandler(handler);
        logger.setLevel(Level.ALL);
        return this;
    }

    public void stop() {
        logger.removeHandler(handler);
    }
}
