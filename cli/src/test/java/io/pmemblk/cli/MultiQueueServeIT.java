package io.pmemblk.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.List;

import static io.pmemblk.cli.ServerProcess.metrics;
import static io.pmemblk.cli.ServerProcess.metric;
import static io.pmemblk.queueing.testing.Ports.freeTcpPort;
import static org.assertj.core.api.Assertions.assertThat;

/** The multi-queue block layer through the real serve: connections spread over queues, FLUSH across queues. */
class MultiQueueServeIT {
    @TempDir
    Path dir;

    @Test
    void twoFioJobsOnTwoQueuesVerifyAndBothQueuesAreBusy() throws Exception {
        int port = freeTcpPort();
        try (ServerProcess s = ServerProcess.start(dir, "pmem.path=" + dir.resolve("p.img"), "pmem.size=128M",
                "nbd.socket=" + dir.resolve("s"), "nbd.port=0", "queues=2", "metrics.port=" + port,
                "queue.buffer-bytes=32M")) {
            // fio's nbd engine opens one connection per job: two jobs, two connections, two queues
            ServerProcess.Run r = ServerProcess.run(List.of("fio", "--name=mq", "--ioengine=nbd", "--uri=" + s.unixUri(),
                    "--rw=randwrite", "--bsrange=4k-256k", "--size=48m", "--numjobs=2", "--offset_increment=64m",
                    "--iodepth=16", "--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1", "--do_verify=1"), 300);
            assertThat(r.exit()).as(r.out()).isZero();
            assertThat(r.out()).doesNotContain("verify failed", "bad magic");
            String m = metrics(port);
            assertThat(metric(m, "pmemblk_queue_requests_total{queue=\"0\"}")).isGreaterThan(100);
            assertThat(metric(m, "pmemblk_queue_requests_total{queue=\"1\"}")).isGreaterThan(100);
            assertThat(metric(m, "pmemblk_queue_inflight{queue=\"0\"}")).isZero();
            assertThat(metric(m, "pmemblk_request_duration_seconds_count{op=\"write\"}")).isGreaterThan(100);
            assertThat(metric(m, "pmemblk_request_duration_seconds_count{op=\"read\"}")).isGreaterThan(100);
            assertThat(s.terminate()).isZero();
        }
    }

    /**
     * A write answered on one connection is in the shared mapping when the server is killed after a FLUSH on
     * another: no acknowledged write waits in a queue's buffers. Not a durability test: the page cache
     * outlives the process, so this passes even if FLUSH does nothing; durability across connections is
     * asserted from the persistence record in the pmem module ({@code DurabilityRecordTest}).
     */
    @Test
    void aWriteOnOneQueueIsInTheMappingAfterAFlushFromAnotherAndKill() throws Exception {
        String[] settings = {"pmem.path=" + dir.resolve("p.img"), "pmem.size=64M", "nbd.socket=" + dir.resolve("s"),
                "nbd.port=0", "queues=2", "queue.buffer-bytes=32M"};
        // Two handles = two connections = queues 0 and 1 (round-robin). Writes without FUA on the first,
        // FLUSH on the second, then SIGKILL: every answered write must be in the mapping, not in server buffers.
        String script = """
                h2 = nbd.NBD()
                h2.connect_uri(h.get_uri())
                for i in range(32):
                    h.pwrite(bytes([i + 7]) * 65536, i * 65536)
                h2.flush()
                print("flushed-on-the-other-connection")
                """;
        try (ServerProcess s = ServerProcess.start(dir, settings)) {
            ServerProcess.Run r = ServerProcess.run(List.of("/usr/bin/python3", "-m", "nbd", "-u", s.unixUri(), "-c", script), 120);
            assertThat(r.out()).contains("flushed-on-the-other-connection");
            s.kill9();
        }
        String check = """
                bad = sum(1 for i in range(32) if h.pread(65536, i * 65536) != bytes([i + 7]) * 65536)
                print("bad", bad)
                """;
        try (ServerProcess s = ServerProcess.start(dir, settings)) {
            ServerProcess.Run r = ServerProcess.run(List.of("/usr/bin/python3", "-m", "nbd", "-u", s.unixUri(), "-c", check), 120);
            assertThat(r.out().trim()).as("answered writes missing from the mapping after kill -9").isEqualTo("bad 0");
            assertThat(s.terminate()).isZero();
        }
    }
}
