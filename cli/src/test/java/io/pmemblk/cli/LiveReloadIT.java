package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;

import io.pmemblk.nbd.testing.NbdTestClient;
import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * A reload (SIGHUP) changes the live keys of a running server and disturbs nothing: under fio verify load the
 * routes shift with route.dma.min-bytes, both ways, with no error, no verify failure and no dropped connection;
 * a lowered stall timeout cuts a stalled client off; the log level changes what is logged.
 */
class LiveReloadIT {
    private static final Duration WAIT = Duration.ofSeconds(60);
    private static final long MIB = 1 << 20;

    @TempDir
    Path dir;

    private static final String CPU_W = "pmemblk_copy_bytes_total{dir=\"write\",route=\"cpu\"}";
    private static final String DMA_W = "pmemblk_copy_bytes_total{dir=\"write\",route=\"dma\"}";
    private static final String DMA_R = "pmemblk_copy_bytes_total{dir=\"read\",route=\"dma\"}";

    /**
     * Polls {@code condition} until it holds, at most {@code timeout}; fails naming {@code what}, at once if the
     * load it needs ended first.
     */
    private static void await(String what, Duration timeout, Process load, BooleanSupplier condition) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (load != null && !load.isAlive()) {
                throw new AssertionError("fio ended (exit " + load.exitValue() + ") before " + what);
            }
            if (System.nanoTime() > deadline) {
                throw new AssertionError("not within " + timeout + ": " + what);
            }
            LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(50)); // between two scrapes, not a synchronisation
        }
    }

    private static BooleanSupplier atLeast(int port, String series, double value) {
        return () -> {
            try {
                return metric(port, series) >= value;
            } catch (Exception e) {
                throw new AssertionError(e);
            }
        };
    }

    private static void reload(ServerProcess s, NotifyListener systemd, String expectInStatus) throws Exception {
        s.signal("HUP");
        assertThat(systemd.next(WAIT)).startsWith("RELOADING=1\n");
        String ready = systemd.next(WAIT);
        assertThat(ready).startsWith("READY=1\n");
        assertThat(NotifyListener.field(ready, "STATUS")).contains(expectInStatus).doesNotContain("failed");
    }

    @Test
    void sighupUnderFioVerifyLoadShiftsTheRoutesBothWaysAndDropsNothing() throws Exception {
        int port = freeTcpPort();
        Path sock = dir.resolve("nbd.sock");
        Path config = dir.resolve("live.properties");
        String base = "pmem.path=" + dir.resolve("p.img") + "\npmem.size=256M\nnbd.socket=" + sock + "\nnbd.port=0\n"
                + "dma.engine=soft\nroute.dma.bounce=true\nmetrics.port=" + port + "\nqueue.buffer-bytes=32M\n";
        Files.writeString(config, base + "route.dma.min-bytes=off\n");
        Path fioOut = dir.resolve("fio.out");
        try (NotifyListener systemd = new NotifyListener(dir.resolve("notify").toString());
             ServerProcess s = ServerProcess.start(dir, Map.of("NOTIFY_SOCKET", systemd.address),
                     List.of("--config", config.toString()), 1)) {
            assertThat(systemd.next(WAIT)).startsWith("READY=1\n");
            // two connections writing disjoint halves, every block verified (crc32c) while the run goes on
            Process fio = new ProcessBuilder("fio", "--name=live", "--ioengine=nbd", "--uri=" + s.unixUri(),
                    "--rw=randwrite", "--bsrange=4k-1m", "--size=96m", "--offset_increment=96m", "--numjobs=2",
                    "--iodepth=16", "--verify=crc32c", "--verify_backlog=32", "--verify_fatal=1",
                    "--verify_state_save=0", "--time_based", "--runtime=8")
                    .redirectErrorStream(true).redirectOutput(fioOut.toFile()).start();
            try {
                // all by CPU first
                await("64 MiB written by CPU with route.dma.min-bytes=off", WAIT, fio, atLeast(port, CPU_W, 64 * MIB));
                assertThat(metric(port, DMA_W) + metric(port, DMA_R)).as("nothing by DMA while it is off").isZero();

                Files.writeString(config, base + "route.dma.min-bytes=64K\n");
                reload(s, systemd, "route.dma.min-bytes=64K");
                double dmaW = metric(port, DMA_W), dmaR = metric(port, DMA_R);
                await("64 MiB more written and 32 MiB more read (verify) by DMA after the reload to 64K", WAIT, fio,
                        () -> atLeast(port, DMA_W, dmaW + 64 * MIB).getAsBoolean()
                                && atLeast(port, DMA_R, dmaR + 32 * MIB).getAsBoolean());

                Files.writeString(config, base + "route.dma.min-bytes=off\n");
                reload(s, systemd, "route.dma.min-bytes=off");
                double cpuW = metric(port, CPU_W), dmaW2 = metric(port, DMA_W);
                await("64 MiB more written by CPU after the reload back to off", WAIT, fio,
                        atLeast(port, CPU_W, cpuW + 64 * MIB));
                // what was already placed on a DMA ring at the reload may still finish there: at most the
                // requests in flight (2 connections x 16 x 1 MiB); had the reload not applied, nearly all would
                assertThat(metric(port, DMA_W) - dmaW2).as("bytes written by DMA after the reload to off")
                        .isLessThanOrEqualTo(32.0 * MIB);

                // fio opens a connection to learn the size and drops it, then one per job: those two must last
                // the whole run, so no connection that served a request has closed yet
                assertThat(s.stderr().lines().filter(l -> l.matches(".* closed after [1-9].*"))).as(s.stderr()).isEmpty();
                assertThat(fio.waitFor(120, TimeUnit.SECONDS)).as("fio ends by its runtime").isTrue();
            } finally {
                fio.destroyForcibly();
            }
            String out = Files.readString(fioOut);
            assertThat(fio.exitValue()).as(out).isZero();
            assertThat(out.lines().filter(l -> l.contains("err= 0"))).as(out).hasSize(2);
            assertThat(out).doesNotContain("verify failed", "bad magic", "fio: io_u error", "Connection reset");
            assertThat(s.terminate()).isZero();
            String log = s.stderr();
            assertThat(log.lines().filter(l -> l.matches(".* closed after [1-9].*"))).as(log).hasSize(2);
            // fio hangs up without NBD_CMD_DISC, which is logged as a warning; nothing else may be
            assertThat(log.lines().filter(l -> l.contains("WARNING") && !l.contains("without NBD_CMD_DISC"))).as(log)
                    .isEmpty();
        }
    }

    @Test
    void aLoweredStallTimeoutAndTheLogLevelApplyWithoutARestart() throws Exception {
        Path sock = dir.resolve("nbd.sock");
        Path config = dir.resolve("live.properties");
        String base = "pmem.path=" + dir.resolve("p.img") + "\npmem.size=64M\nnbd.socket=" + sock + "\nnbd.port=0\n";
        Files.writeString(config, base + "nbd.stall-timeout=3600\n");
        try (NotifyListener systemd = new NotifyListener(dir.resolve("notify").toString());
             ServerProcess s = ServerProcess.start(dir, Map.of("NOTIFY_SOCKET", systemd.address),
                     List.of("--config", config.toString()), 1)) {
            assertThat(systemd.next(WAIT)).startsWith("READY=1\n");
            try (NbdTestClient before = NbdTestClient.connectGo(sock)) {
                assertThat(s.stderr()).contains("nbd connection 1 from").doesNotContain("transmission (");

                Files.writeString(config, base + "nbd.stall-timeout=1\nlog.level=debug\n");
                reload(s, systemd, "nbd.stall-timeout=1s log.level=debug");
                // the connection made before the reload goes on
                before.roundTrip(1 << 20);
                // debug: the handshake's outcome is logged for a new connection
                try (NbdTestClient stalled = NbdTestClient.connectGo(sock)) {
                    await("the debug line of connection 2", WAIT, null, () -> stderr(s).contains("nbd connection 2 from")
                            && stderr(s).contains("transmission ("));
                    // half a WRITE payload, then nothing: cut off after about 1 s instead of an hour
                    stalled.send(NbdTestClient.header(0, NbdTestClient.WRITE, 7, 0, MIB));
                    stalled.send(ByteBuffer.wrap(NbdTestClient.fill((int) MIB / 2, (byte) 0x5a)));
                    long t0 = System.nanoTime();
                    stalled.drainToEof(15);
                    assertThat(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0)).isBetween(500L, 15_000L);
                }
                // logged as its reader ends, just after the hang-up the client saw
                await("the stall logged", WAIT, null,
                        () -> stderr(s).contains("client stalled in the middle of a WRITE payload for more than 1 s"));

                Files.writeString(config, base + "nbd.stall-timeout=1\nlog.level=warning\n");
                reload(s, systemd, "log.level=warning");
                long opened = stderr(s).lines().filter(l -> l.contains(" opened")).count();
                try (NbdTestClient quiet = NbdTestClient.connectGo(sock)) {
                    quiet.roundTrip(2 << 20);
                }
                // the "opened" line is logged at accept, before the handshake that connectGo waited for
                assertThat(stderr(s).lines().filter(l -> l.contains(" opened")).count()).isEqualTo(opened);
            }
            assertThat(s.terminate()).isZero();
        }
    }

    private static String stderr(ServerProcess s) {
        try {
            return s.stderr();
        } catch (IOException e) {
            throw new AssertionError(e);
        }
    }
}
