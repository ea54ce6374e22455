package io.pmemblk.queueing.log;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Refusals are logged at their level with their words, and a flood of them is cut to a few lines a second. */
class RateLimitedLogTest {
    static final String NAME = "io.pmemblk.queueing.log.test";
    final Logger jul = Logger.getLogger(NAME);
    final List<LogRecord> records = new CopyOnWriteArrayList<>();
    /** Its own limit: what other tests in this JVM refused does not count against it. */
    final RateLimitedLog log = RateLimitedLog.withOwnLimit(System.getLogger(NAME), System.Logger.Level.DEBUG);
    final Handler handler = new Handler() {
        @Override public void publish(LogRecord r) { records.add(r); }
        @Override public void flush() { }
        @Override public void close() { }
    };

    @BeforeEach
    void capture() {
        jul.addHandler(handler);
    }

    @AfterEach
    void release() {
        jul.removeHandler(handler);
        jul.setLevel(null);
    }

    static String text(LogRecord r) {
        return java.text.MessageFormat.format(r.getMessage(), r.getParameters());
    }

    @Test
    void aRefusalIsOneLineAtItsLevelWithItsArguments() {
        jul.setLevel(Level.FINE); // System.Logger's DEBUG
        log.refused("refused {0} (offset {1}, length {2}): {3}", "NBD_CMD_TRIM", "4096", 512, "NBD_EINVAL");
        assertThat(records).hasSize(1);
        assertThat(text(records.get(0))).isEqualTo("refused NBD_CMD_TRIM (offset 4096, length 512): NBD_EINVAL");
        assertThat(records.get(0).getLevel()).isEqualTo(Level.FINE);
    }

    @Test
    void aFloodIsCutToTheLinesOfASecondAndTheNextLineSaysHowManyWereLeftOut() {
        jul.setLevel(Level.FINE);
        for (int i = 0; i < 10_000; i++) {
            log.refused("refused {0}", "NBD_CMD_WRITE");
        }
        assertThat(records.size()).isBetween(1, 2 * RateLimitedLog.LINES_PER_SECOND); // a second may turn over once
        // Refusing on until the second turns over: its first line says how many were cut, so the cut is not silent.
        org.assertj.core.api.Assertions.assertThatCode(() -> io.pmemblk.queueing.testing.Waits.await(
                "a line saying how many refusals were left out", () -> {
                    log.refused("refused {0}", "NBD_CMD_WRITE");
                    return records.stream().anyMatch(r -> text(r).contains("refusals before this one left out of the log"));
                })).doesNotThrowAnyException();
    }

    @Test
    void withTheLevelOffNothingIsLogged() {
        jul.setLevel(Level.INFO);
        assertThat(log.enabled()).isFalse();
        log.refused("refused {0}", "NBD_CMD_TRIM");
        assertThat(records).isEmpty();
    }

    @Test
    void aBuiltLineIsWrittenOnlyWhenDueAtItsOwnLevelWithItsStack() {
        jul.setLevel(Level.FINE);
        RateLimitedLog once = RateLimitedLog.withOwnLimit(System.getLogger(NAME), System.Logger.Level.WARNING, 1);
        IllegalStateException cause = new IllegalStateException("channel closed");
        int written = 0;
        for (int i = 0; i < 1000; i++) {
            if (once.due()) {
                once.write(System.Logger.Level.ERROR, "copy " + i + " failed", cause);
                written++;
            }
        }
        assertThat(written).as("lines a limit of one a second let through").isBetween(1, 2);
        assertThat(records).hasSize(written);
        assertThat(records.get(0).getMessage()).isEqualTo("copy 0 failed");
        assertThat(records.get(0).getLevel()).isEqualTo(Level.SEVERE);
        assertThat(records.get(0).getThrown()).isSameAs(cause);
    }

    @Test
    void aLimitBelowOneLineASecondIsRefusedByName() {
        org.assertj.core.api.Assertions.assertThatThrownBy(() -> RateLimitedLog.withOwnLimit(
                System.getLogger(NAME), System.Logger.Level.WARNING, 0))
                .isInstanceOf(IllegalArgumentException.class).hasMessageContaining("linesPerSecond is 0");
    }
}
