package io.pmemblk.cli;

import io.pmemblk.cli.faults.FaultJar;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.List;

import static io.pmemblk.cli.ServerProcess.metrics;
import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * End to end through the real serve with the software I/OAT device: fio's nbd engine with mixed block sizes and
 * crc32c verification, the Prometheus metrics showing bytes on both routes, and a flaky channel losing nothing.
 */
class DmaServeIT {
    @TempDir
    Path dir;

    private ServerProcess.Run fio(ServerProcess s, String name) throws Exception {
        return ServerProcess.run(List.of("fio", "--name=" + name, "--ioengine=nbd", "--uri=" + s.unixUri(),
                "--rw=randwrite", "--bsrange=4k-1m", "--size=96m", "--iodepth=16", "--verify=crc32c", "--verify_state_save=0",
                "--verify_fatal=1", "--do_verify=1"), 300);
    }

    /**
     * The settings of a server whose copies of 64K and more go by the soft engine, served NBD ones too (bounced):
     * a 128M file in {@code dir}, its socket {@code dir/s}, metrics on {@code metricsPort}.
     */
    static String[] softDma(Path dir, int metricsPort) {
        return new String[] {"pmem.path=" + dir.resolve("p.img"), "pmem.size=128M", "nbd.socket=" + dir.resolve("s"),
                "nbd.port=0", "dma.engine=soft", "route.dma.bounce=true", "route.dma.min-bytes=65536",
                "metrics.port=" + metricsPort, "queue.buffer-bytes=32M"};
    }

    /** That server with the faults of {@code spec} ({@link FaultJar#environment}) injected in its soft device. */
    static ServerProcess startWithFaults(Path dir, String spec, int metricsPort) throws Exception {
        return ServerProcess.start(dir, FaultJar.environment(dir, spec), ServerProcess.sets(softDma(dir, metricsPort)), 1);
    }

    @Test
    void mixedSizesVerifyWithBothRoutesInTheMetrics() throws Exception {
        int port = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, softDma(dir, port))) {
            assertThat(s.stdout).contains("metrics: http://127.0.0.1:" + port + "/metrics");
            ServerProcess.Run r = fio(s, "mixed");
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).contains("err= 0").doesNotContain("verify failed", "bad magic");
            String m = metrics(port);
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"write\",route=\"cpu\"}")).isPositive();
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"write\",route=\"dma\"}")).isPositive();
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"read\",route=\"cpu\"}")).isPositive();
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"read\",route=\"dma\"}")).isPositive();
            assertThat(metric(m, "pmemblk_dma_errors_total")).isZero();
            assertThat(s.terminate()).isZero();
        }
    }

    @Test
    void aFlakyChannelDuringTheRunLosesNothing() throws Exception {
        int port = freeTcpPort();
        // Every 40th descriptor of each channel halts it: a provider of faults on serve's class path (test code).
        try (ServerProcess s = startWithFaults(dir, "fail-every=40", port)) {
            ServerProcess.Run r = fio(s, "faults");
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).contains("err= 0").doesNotContain("verify failed", "bad magic");
            String m = metrics(port);
            assertThat(metric(m, "pmemblk_dma_errors_total")).as("faults were injected").isPositive();
            assertThat(metric(m, "pmemblk_dma_fallbacks_total")).isPositive();
            assertThat(metric(m, "pmemblk_copy_bytes_total{dir=\"write\",route=\"dma\"}")).as("the channel recovered")
                    .isPositive();
            assertThat(s.terminate()).isZero();
        }
    }
}
