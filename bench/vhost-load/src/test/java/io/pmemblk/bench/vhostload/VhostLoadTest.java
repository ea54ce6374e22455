package io.pmemblk.bench.vhostload;

import io.pmemblk.queueing.BlockDriver;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.HardwareQueue;
import io.pmemblk.queueing.Op;
import io.pmemblk.queueing.Request;
import io.pmemblk.queueing.Status;
import io.pmemblk.queueing.testing.Closing;
import io.pmemblk.queueing.testing.MemoryBlockDriver;
import io.pmemblk.vhost.VhostUserBlkConfig;
import io.pmemblk.vhost.VhostUserBlkServer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The load against the real vhost-user-blk server in this process (its session, rings and queues, over the block
 * layer and an in-memory device): every request it counts was done, and done right. A server that acknowledges
 * writes it never did gets no throughput from it: verify mode reports the first sector that came back wrong.
 */
class VhostLoadTest {
    static final long DISK = 16L << 20;

    @TempDir
    Path dir;
    MemoryBlockDriver memory;
    BlockLayer layer;
    VhostUserBlkServer server;

    /** A server of 2 queues of 256 over {@code driver}; requests up to 256 KiB, so seg_max is 64 pages. */
    private Path serve(BlockDriver driver) throws IOException {
        Path socket = dir.resolve("vhost.sock");
        layer = new BlockLayer(driver, 2, 64, 16L << 20, 256 << 10);
        server = new VhostUserBlkServer(new VhostUserBlkConfig(socket, 2, 256), layer);
        assertThat(server.start()).isEqualTo(socket);
        return socket;
    }

    @AfterEach
    void stop() throws Exception {
        Closing.closeAll(server, layer, memory);
    }

    private static VhostLoad.Result run(Path socket, String job, boolean verify, boolean prefill) throws Exception {
        return VhostLoad.run(new VhostLoad.Options(socket, Job.parse(job), 1, -1, -1, verify, prefill, VhostLoad.RING));
    }

    @Test
    void everyRequestCountedWasDoneAndReadsBackAsWritten() throws Exception {
        memory = new MemoryBlockDriver(DISK);
        Path socket = serve(memory);
        VhostLoad.Result fill = run(socket, "write-2m-qd4-2j", false, true);
        assertThat(fill.errors()).as("prefill: %s", fill.firstError()).isZero();
        assertThat(fill.ios()).as("one pass of 2 MiB writes over the disk").isEqualTo(DISK / (2 << 20));
        assertThat(SectorStamp.check(memory.memory, 0, DISK, 0, 0)).as("every sector stamped by the prefill").isNull();
        for (String job : new String[]{"randwrite-4k-qd32-2j", "write-2m-qd4-2j", "randread-4k-qd32-2j", "read-64k-qd16-1j"}) {
            VhostLoad.Result r = run(socket, job, true, false);
            assertThat(r.errors()).as("%s: %s", job, r.firstError()).isZero();
            assertThat(r.ios()).as("%s completed requests", job).isPositive();
            assertThat(r.bytes()).as("%s bytes", job).isEqualTo(r.ios() * Job.parse(job).bytes());
        }
        assertThat(SectorStamp.check(memory.memory, 0, DISK, 0, -1)).as("the device after the verified writes").isNull();
    }

    @Test
    void aServerThatAcknowledgesWritesItNeverDidIsCaughtByVerify() throws Exception {
        memory = new MemoryBlockDriver(DISK);
        Path socket = serve(new DroppingWrites(memory));
        VhostLoad.Result r = run(socket, "randwrite-4k-qd8-2j", true, false);
        assertThat(r.errors()).as("every dropped write is an error").isPositive();
        assertThat(r.firstError()).startsWith("verify: sector ").contains("generation");
    }

    @Test
    void aJobNameOutsideTheShapeIsRefusedSayingWhatIsAllowed() {
        assertThatThrownBy(() -> Job.parse("randread-4k-32"))
                .hasMessage("job 'randread-4k-32' is not RW-BS-qdQD-Nj (RW read, write, randread or randwrite; BS in k or m),"
                        + " e.g. randread-4k-qd32-2j");
        assertThatThrownBy(() -> Job.parse("read-1k-qd0-1j")).hasMessageContaining("allowed qd 1..1024");
    }

    /** A device that acknowledges every WRITE without doing it, and does everything else. */
    private static final class DroppingWrites implements BlockDriver {
        private final MemoryBlockDriver inner;
        private final Request[] kept = new Request[4096];

        DroppingWrites(MemoryBlockDriver inner) {
            this.inner = inner;
        }

        @Override public long size() { return inner.size(); }
        @Override public boolean isPmem() { return false; }
        @Override public boolean canFlush() { return inner.canFlush(); }
        @Override public void attachQueue(HardwareQueue queue) { inner.attachQueue(queue); }
        @Override public MemorySegment allocateBuffers(long bytes, Arena owner) { return inner.allocateBuffers(bytes, owner); }
        @Override public void persistAll() throws IOException { inner.persistAll(); }
        @Override public void close() {}

        @Override
        public synchronized void queueRequests(int hwq, Request[] batch, int count) {
            int n = 0;
            for (int i = 0; i < count; i++) {
                if (batch[i].op == Op.WRITE) {
                    batch[i].complete(Status.OK);
                } else {
                    kept[n++] = batch[i];
                }
            }
            inner.queueRequests(hwq, kept, n);
        }
    }
}
