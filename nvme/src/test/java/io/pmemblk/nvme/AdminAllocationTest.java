package io.pmemblk.nvme;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.nvme.testing.RawHost;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.Closing;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Admin answers allocate nothing per command. The admin queue's reader thread builds every answer (Identify pages,
 * log pages, features) and writes it; the JVM's allocation counter of that thread is read across thousands of
 * commands after a warm-up (which lets the JIT compile the path and the JDK cache its temporary socket buffer).
 */
@Timeout(120)
class AdminAllocationTest {
    static final String NQN = "nqn.2026-12.io.pmemblk:allocation";
    static final int WARM_ROUNDS = 2000, ROUNDS = 1000;

    @TempDir
    Path dir;
    PmemBlockDriver driver;
    BlockLayer layer;
    NvmeTcpServer server;
    InetSocketAddress at;
    int cid;

    @BeforeEach
    void start() throws IOException {
        PmemRegion region = PmemRegion.open(dir.resolve("pmem.img"), 4L << 20, false, PmemRegion.Mapper.AUTO);
        driver = new PmemBlockDriver(region, new CopyStats());
        layer = new BlockLayer(driver, 1, 32, 8L << 20, 1 << 20);
        server = new NvmeTcpServer(new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of(), 1, 64, 8192, 1 << 20, 32 * 1024,
                false, false, "allocation-serial"), layer, true);
        at = server.start();
    }

    @AfterEach
    void stop() throws Exception {
        Closing.closeAll(server, layer, driver);
    }

    /** The reader thread of the one connection open (named by TcpQueue: nvme-q-N-rx). */
    static Thread adminReader() {
        List<Thread> readers = Thread.getAllStackTraces().keySet().stream()
                .filter(t -> t.getName().startsWith("nvme-q-") && t.getName().endsWith("-rx")).toList();
        assertThat(readers).as("one connection, one reader").hasSize(1);
        return readers.get(0);
    }

    static long allocatedBytes(Thread t) {
        var threads = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
        return threads.getThreadAllocatedBytes(t.threadId());
    }

    /** One round: Identify of each structure served, two log pages, two features, a Keep Alive; returns 9. */
    int round(RawHost a) throws IOException {
        a.identify(++cid & 0xFFFF, Nvme.CNS_CONTROLLER, 0);
        a.identify(++cid & 0xFFFF, Nvme.CNS_NAMESPACE, 1);
        a.identify(++cid & 0xFFFF, Nvme.CNS_NS_DESCRIPTORS, 1);
        a.identify(++cid & 0xFFFF, Nvme.CNS_ACTIVE_NS_LIST, 0);
        for (int lid : new int[] {Nvme.LID_SMART, Nvme.LID_FW_SLOT}) {
            ByteBuffer log = RawHost.sqe(Nvme.ADMIN_GET_LOG_PAGE, ++cid & 0xFFFF, 0xFFFFFFFF);
            log.putInt(Nvme.SQE_CDW10, lid | (512 / 4 - 1) << 16);
            Object[] r = a.dataCommand(log, 512);
            assertThat(((RawHost.Received) r[1]).cqeStatus()).as("Get Log Page %d", lid).isZero();
        }
        for (int fid : new int[] {Nvme.FID_VWC, Nvme.FID_NUM_QUEUES}) {
            ByteBuffer gf = RawHost.sqe(Nvme.ADMIN_GET_FEATURES, ++cid & 0xFFFF, 0);
            gf.putInt(Nvme.SQE_CDW10, fid);
            assertThat(a.command(gf, null).cqeStatus()).as("Get Features %d", fid).isZero();
        }
        assertThat(a.command(RawHost.sqe(Nvme.ADMIN_KEEP_ALIVE, ++cid & 0xFFFF, 0), null).cqeStatus())
                .as("Keep Alive").isZero();
        return 9;
    }

    @Test
    void adminAnswersAllocateNothingPerCommand() throws IOException {
        try (RawHost a = new RawHost(at)) {
            a.icReq(0, 0);
            a.enableAdmin(NQN);
            cid = 2;
            Thread reader = adminReader();
            for (int i = 0; i < WARM_ROUNDS; i++) {
                round(a);
            }
            // Every answer has been read: the reader waits for the next command and allocates nothing meanwhile
            long before = allocatedBytes(reader);
            int commands = 0;
            for (int i = 0; i < ROUNDS; i++) {
                commands += round(a);
            }
            long bytes = allocatedBytes(reader) - before;
            System.out.println("admin reader: " + bytes + " bytes allocated over " + commands + " admin commands");
            assertThat(bytes).as("bytes the admin reader allocated answering %d admin commands (Identify, log pages,"
                    + " features, Keep Alive): fewer than one per command", commands).isLessThan(commands);
        }
    }
}
