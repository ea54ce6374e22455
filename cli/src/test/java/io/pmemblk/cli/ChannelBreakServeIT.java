package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.fail;

/**
 * The real serve with a soft DMA channel that the device breaks for good under load: once the driver's
 * placeAll() throws (the channel could not recover), SIGTERM with fio still writing must stop the server with
 * exit 0 within the drain deadline, every in-flight request answered (none left holding its tag).
 */
class ChannelBreakServeIT {
    /** serve's drain deadline (ServeCommand: device.close(30_000)); a leaked tag makes it wait all of it. */
    static final long DRAIN_DEADLINE_MILLIS = 30_000;

    @TempDir
    Path dir;

    /** Waits (bounded) until serve's stderr contains {@code text}. */
    private static void awaitLog(ServerProcess s, String text, Process fio) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (!s.stderr().contains(text)) {
            if (System.nanoTime() > deadline) {
                fail("serve did not log \"" + text + "\" within 60 s (fio alive: " + fio.isAlive() + "); stderr:\n" + s.stderr());
            }
            if (!s.process.isAlive()) {
                fail("serve exited " + s.process.exitValue() + " before logging \"" + text + "\"; stderr:\n" + s.stderr());
            }
            Thread.sleep(50); // polling a log file with a deadline, not sleeping for synchronisation
        }
    }

    @Test
    void sigtermAfterTheChannelBreaksMidBatchExitsZeroWithinTheDeadline() throws Exception {
        int port = freeTcpPort();
        // The 300th descriptor of each channel breaks it for good: a provider of faults on serve's class path.
        try (ServerProcess s = DmaServeIT.startWithFaults(dir, "break-after=300", port)) {
            Path fioLog = Files.createTempFile(dir, "fio", ".log");
            Process fio = new ProcessBuilder("fio", "--name=break", "--ioengine=nbd", "--uri=" + s.unixUri(),
                    "--rw=randwrite", "--bsrange=64k-1m", "--size=96m", "--iodepth=32", "--numjobs=2",
                    "--time_based", "--runtime=120").redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(fioLog.toFile())).start();
            try {
                // The channel's own words, logged by whoever it threw at: it broke mid-run, its
                // recovery timed out, and every placement from then on throws. fio keeps writing through it.
                awaitLog(s, "could not recover from a halt", fio);
                boolean fioAliveAtBreak = fio.isAlive();
                long t0 = System.nanoTime();
                s.process.destroy(); // SIGTERM
                boolean exited = s.process.waitFor(DRAIN_DEADLINE_MILLIS + 20_000, TimeUnit.MILLISECONDS);
                long tookMillis = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
                assertThat(exited).as("serve stopped after SIGTERM; stderr:%n%s", s.stderr()).isTrue();
                assertThat(s.process.exitValue()).as("exit code; stderr:%n%s", s.stderr()).isZero();
                assertThat(s.stderr()).as("no request left holding its tag at the deadline")
                        .contains("stopped; data persisted")
                        .doesNotContain("still in flight at the deadline");
                assertThat(tookMillis).as("SIGTERM to exit, ms (drain deadline %d)", DRAIN_DEADLINE_MILLIS)
                        .isLessThan(DRAIN_DEADLINE_MILLIS);
                assertThat(fioAliveAtBreak).as("fio was still writing when the channel broke (no connection dropped);"
                        + " its output:%n%s", Files.readString(fioLog)).isTrue();
            } finally {
                fio.destroyForcibly();
                fio.waitFor(30, TimeUnit.SECONDS);
            }
        }
    }
}
