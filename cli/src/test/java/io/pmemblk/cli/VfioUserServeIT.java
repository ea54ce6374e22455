package io.pmemblk.cli;

import static io.pmemblk.cli.ServerProcess.metrics;
import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The real serve with {@code dma.engine=vfio-user} against a real {@code pmemblk dma-device} process: fio's nbd
 * engine with crc32c verification writes and reads through the device; the device process is SIGKILLed in the
 * middle of the run and fio still ends clean (copies it held redone by the CPU, new ones on the CPU); started
 * again, the channels come back and the DMA route's bytes grow again. Needs libvfio-user for the device process
 * (built by ../shared/peers/build-libvfio-user.sh; the device fails naming it otherwise, and so does this test).
 */
class VfioUserServeIT {
    private static final String DMA_WRITES = "pmemblk_copy_bytes_total{dir=\"write\",route=\"dma\"}";
    private static final String DMA_READS = "pmemblk_copy_bytes_total{dir=\"read\",route=\"dma\"}";

    @TempDir
    Path dir;

    /** A dma-device process on {@code socket}, waited for (bounded) until its socket exists. */
    private Process startDevice(Path socket, Path log) throws Exception {
        Process p = new ProcessBuilder(ServerProcess.command("dma-device", List.of("--socket", socket.toString(),
                "--channels", "2", "--metrics-interval", "0"))).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile())).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (!Files.exists(socket)) {
            if (!p.isAlive() || System.nanoTime() - deadline > 0) {
                p.destroyForcibly();
                throw new AssertionError("pmemblk dma-device did not make " + socket + " within 60 s (alive: " + p.isAlive()
                        + "); its output:\n" + Files.readString(log));
            }
            Thread.sleep(20); // polling for a file another process makes
        }
        return p;
    }

    private static ServerProcess.Run fio(ServerProcess s, String name, String size, int loops) throws Exception {
        return ServerProcess.run(List.of("fio", "--name=" + name, "--ioengine=nbd", "--uri=" + s.unixUri(),
                "--rw=randwrite", "--bsrange=4k-1m", "--size=" + size, "--iodepth=16", "--verify=crc32c",
                "--verify_backlog=64", "--verify_state_save=0", "--verify_fatal=1", "--do_verify=1",
                "--loops=" + loops), 600);
    }

    /** Waits (bounded) until the metric {@code series} exceeds {@code above}; returns its value. */
    private static double awaitMetric(int port, String series, double above, String what) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        while (true) {
            double v = metric(port, series);
            if (v > above) {
                return v;
            }
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after 120 s waiting for " + what + " (" + series + " = " + v + ")");
            }
            Thread.sleep(20); // polling another process's counters
        }
    }

    private static void awaitLog(ServerProcess s, String text) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (!s.stderr().contains(text)) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("serve did not log '" + text + "' within 60 s; its log:\n" + s.stderr());
            }
            Thread.sleep(20); // polling another process's log
        }
    }

    @Test
    void nbdThroughTheDeviceProcessSurvivesItsSigkillAndGetsTheDmaRouteBack() throws Exception {
        Path socket = dir.resolve("ioat.sock");
        Path deviceLog = dir.resolve("dma-device.log");
        Process device = startDevice(socket, deviceLog);
        int port = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=128M",
                "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "dma.engine=vfio-user", "dma.vfio-user.socket=" + socket,
                "route.dma.bounce=true", "route.dma.min-bytes=65536", "metrics.port=" + port, "queue.buffer-bytes=32M")) {
            assertThat(s.stderr()).contains("vfio-user: 2 DMA channel(s) on the I/OAT device at " + socket);

            // 1: a verified run, the device killed with SIGKILL once the DMA route carries data
            AtomicReference<ServerProcess.Run> run = new AtomicReference<>();
            AtomicReference<Throwable> runFailure = new AtomicReference<>();
            Thread fio = Thread.ofPlatform().start(() -> {
                try {
                    run.set(fio(s, "through-a-kill", "96m", 3));
                } catch (Throwable t) {
                    runFailure.set(t);
                }
            });
            awaitMetric(port, DMA_WRITES, 8 << 20, "8 MiB written by the device before the kill");
            device.destroyForcibly(); // SIGKILL, fio still running
            assertThat(device.waitFor(30, TimeUnit.SECONDS)).isTrue();
            awaitLog(s, "is gone");
            fio.join(TimeUnit.MINUTES.toMillis(10));
            assertThat(runFailure.get()).isNull();
            ServerProcess.Run r = run.get();
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).contains("err= 0").doesNotContain("verify failed", "bad magic");
            String m = metrics(port);
            double writesAtKill = metric(m, DMA_WRITES);
            double readsAtKill = metric(m, DMA_READS);
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"write\",route=\"cpu\"}"))
                    .as("the CPU took the copies while the device was gone").isPositive();
            assertThat(s.stderr()).contains("new copies go to the CPU until it is back");

            // 2: the device again on the same socket: the channels come back, the DMA route grows again
            device = startDevice(socket, deviceLog);
            awaitLog(s, "is back after");
            ServerProcess.Run again = fio(s, "after-the-return", "64m", 1);
            assertThat(again.exit()).as(again.out()).isZero();
            assertThat(again.out()).contains("err= 0").doesNotContain("verify failed", "bad magic");
            m = metrics(port);
            assertThat(metric(m, DMA_WRITES)).as("DMA writes after the return").isGreaterThan(writesAtKill);
            assertThat(metric(m, DMA_READS)).as("DMA reads after the return").isGreaterThan(readsAtKill);
            // what an operator sees: the transitions, once each
            s.stderr().lines().filter(l -> l.contains("vfio-user:")).forEach(l -> System.out.println("serve: " + l));
            System.out.println("metrics: " + m.lines().filter(l -> l.startsWith("pmemblk_copy_bytes_total")
                    || l.startsWith("pmemblk_dma_")).toList());
            assertThat(s.stderr().lines().filter(l -> l.contains("is gone (")).count()).isEqualTo(1);
            assertThat(s.terminate()).isZero();
        } finally {
            device.destroyForcibly();
            device.waitFor(30, TimeUnit.SECONDS);
        }
        assertThat(Files.readString(deviceLog)).contains("client 1 attached");
    }
}
