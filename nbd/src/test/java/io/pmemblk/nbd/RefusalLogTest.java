package io.pmemblk.nbd;

import static io.pmemblk.nbd.NbdProtocol.*;
import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.queueing.Status;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Refusals are logged at DEBUG by name, and a flood of them is cut to a few lines a second. */
class RefusalLogTest {
    final Logger jul = Logger.getLogger(RefusalLog.class.getName());
    final List<LogRecord> records = new CopyOnWriteArrayList<>();
    /** Its own limit: what other tests in this JVM refused does not count against it. */
    final RefusalLog log = new RefusalLog();
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
    void aRefusedRequestIsOneDebugLineWithTheCommandsAndTheErrorsName() {
        jul.setLevel(Level.FINE); // System.Logger's DEBUG
        log.request(CMD_TRIM, 0, 4096, 512, Status.EINVAL);
        log.option(OPT_STARTTLS, REP_ERR_POLICY, "TLS is off".getBytes());
        assertThat(records).hasSize(2);
        assertThat(text(records.get(0))).contains("NBD_CMD_TRIM", "offset 4096", "length 512", "NBD_EINVAL");
        assertThat(text(records.get(1))).contains("NBD_OPT_STARTTLS", "TLS is off");
        assertThat(records.get(0).getLevel()).isEqualTo(Level.FINE);
    }

    @Test
    void aFloodIsCutToTheLinesOfASecond() {
        jul.setLevel(Level.FINE);
        for (int i = 0; i < 10_000; i++) {
            log.request(CMD_WRITE, 0, 0, 4096, Status.EPERM);
        }
        assertThat(records.size()).isBetween(1, 2 * RefusalLog.LINES_PER_SECOND); // a second may turn over once
    }

    @Test
    void withDebugOffNothingIsLogged() {
        jul.setLevel(Level.INFO);
        log.request(CMD_TRIM, 0, 0, 4096, Status.EINVAL);
        assertThat(records).isEmpty();
    }
}
