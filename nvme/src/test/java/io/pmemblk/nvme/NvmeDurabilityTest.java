package io.pmemblk.nvme;

import static org.assertj.core.api.Assertions.assertThat;

import io.pmemblk.nvme.testing.RawHost;
import io.pmemblk.pmem.CopyStats;
import io.pmemblk.pmem.CrashModel;
import io.pmemblk.pmem.PmemBlockDriver;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.queueing.BlockLayer;
import io.pmemblk.queueing.testing.Closing;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Random;
import java.util.Set;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * What the target promises durable survives a power cut, shown with data that can be lost: the target over the
 * real pmem driver on a page-cache mapping whose persistence port is the {@link CrashModel}. The cut taken here is
 * the worst one: every unit not made durable keeps its old bytes, so a write nothing persisted is gone from the
 * image. Each test first shows that (a plain write with the volatile write cache on, answered, is lost), then that
 * the path under test keeps its write: Write with FUA, a write answered before a Flush that was answered, and every
 * write once the host turned the write cache off (Set Features VWC, WCE=0: write-through).
 */
@Timeout(60)
class NvmeDurabilityTest {
    static final long SIZE = 4L << 20;
    static final int BLOCK = 512;
    static final String NQN = "nqn.2026-12.io.pmemblk:durability";
    /** FUA: bit 30 of a Write's CDW12 (NVM command set 1.0, figure 64). */
    static final int CDW12_FUA = 1 << 30;

    /** The worst power cut: nextBoolean is always false, so every unit not made durable keeps its old content. */
    static final Random WORST_CUT = new Random() {
        @Override
        protected int next(int bits) {
            return 0;
        }
    };

    @TempDir
    Path dir;
    CrashModel model;
    PmemBlockDriver driver;
    BlockLayer layer;
    NvmeTcpServer server;
    InetSocketAddress at;
    final Random rnd = new Random(45);
    int cid;

    @BeforeEach
    void start() throws IOException {
        CrashModel.Modelled m = CrashModel.open(dir.resolve("pmem.img"), SIZE, PmemRegion.Mapper.JAVA);
        model = m.model();
        driver = new PmemBlockDriver(m.region(), new CopyStats());
        assertThat(driver.isPmem()).as("a page-cache mapping: what is not persisted can be lost").isFalse();
        layer = new BlockLayer(driver, 2, 32, 8L << 20, 1 << 20);
        NvmeTcpConfig cfg = new NvmeTcpConfig("127.0.0.1", 0, NQN, Set.of(), 2, 64, 8192, 1 << 20, 32 * 1024, false,
                false, "durability-serial");
        server = new NvmeTcpServer(cfg, layer, true);
        at = server.start();
    }

    @AfterEach
    void stop() throws Exception {
        Closing.closeAll(server, layer, driver);
    }

    /** The device after the worst power cut now: [offset, offset + length). */
    byte[] afterPowerCut(long offset, int length) {
        byte[] image = model.atomically(() -> model.crashImage(WORST_CUT));
        return Arrays.copyOfRange(image, (int) offset, (int) offset + length);
    }

    /** Asserts that {@code data}, written at {@code slba}, is all in the image the worst power cut leaves now. */
    void survives(String what, long slba, byte[] data) {
        byte[] after = afterPowerCut(slba * BLOCK, data.length);
        int first = Arrays.mismatch(data, after);
        int lost = 0;
        for (int i = 0; i < data.length; i++) {
            lost += data[i] != after[i] ? 1 : 0;
        }
        assertThat(first).as("%s (%d bytes at LBA %d) after the power cut: %d bytes differ, the first at byte %d",
                what, data.length, slba, lost, first).isEqualTo(-1);
    }

    byte[] random(int length) {
        byte[] b = new byte[length];
        rnd.nextBytes(b);
        return b;
    }

    /** A write of {@code data} at {@code slba} in the capsule, with CDW12 flags {@code flags}; asserts its OK. */
    void write(RawHost io, long slba, byte[] data, int flags) throws IOException {
        ByteBuffer w = RawHost.rw(Nvme.IO_WRITE, ++cid, slba, data.length / BLOCK);
        w.putInt(Nvme.SQE_CDW12, w.getInt(Nvme.SQE_CDW12) | flags);
        RawHost.inCapsuleSgl(w, data.length);
        assertThat(io.command(w, data).cqeStatus()).as("Write at LBA %d status", slba).isZero();
    }

    void flush(RawHost io) throws IOException {
        assertThat(io.command(RawHost.sqe(Nvme.IO_FLUSH, ++cid, 1), null).cqeStatus()).as("Flush status").isZero();
    }

    /** A host with its admin queue (admin[0]) and one I/O queue up; returns the I/O queue's host. */
    RawHost connect(RawHost[] admin) throws IOException {
        RawHost a = new RawHost(at);
        admin[0] = a;
        a.icReq(0, 0);
        int cntlid = a.enableAdmin(NQN);
        RawHost io = new RawHost(at);
        io.icReq(0, 0);
        assertThat(io.connect(1, 1, 63, cntlid, NQN, RawHost.HOSTNQN, 0, 0).cqeStatus()).as("I/O Connect").isZero();
        return io;
    }

    /** The cut can lose data here: a plain write, answered, with the write cache on and no Flush, is gone. */
    void plainWriteIsLost(RawHost io, long slba) throws IOException {
        byte[] plain = random(4096);
        write(io, slba, plain, 0);
        assertThat(Arrays.equals(afterPowerCut(slba * BLOCK, plain.length), new byte[plain.length]))
                .as("a plain write, the cache on, is not durable yet: the cut loses it (else the test proves nothing)")
                .isTrue();
    }

    /** A test's steps on a host's I/O queue and its admin queue. */
    interface OnHost {
        void run(RawHost io, RawHost admin) throws IOException;
    }

    /**
     * Runs {@code steps} on a host connected with its admin queue and one I/O queue, once a plain write there has
     * been shown to be lost by the cut (else what the steps show survives proves nothing).
     */
    void withAPlainWriteLost(OnHost steps) throws IOException {
        RawHost[] admin = new RawHost[1];
        try (RawHost io = connect(admin); RawHost a = admin[0]) {
            plainWriteIsLost(io, 0);
            steps.run(io, a);
        }
    }

    @Test
    void aWriteWithFuaSurvivesThePowerCut() throws IOException {
        withAPlainWriteLost((io, a) -> {
            byte[] fua = random(8192);
            write(io, 64, fua, CDW12_FUA);
            survives("a write with FUA", 64, fua);
        });
    }

    @Test
    void aWriteAnsweredBeforeAFlushSurvivesThePowerCut() throws IOException {
        withAPlainWriteLost((io, a) -> {
            byte[] inCapsule = random(4096);
            byte[] byR2t = random(96 * 1024);
            write(io, 64, inCapsule, 0);
            NvmeTcpTargetTest.r2tWrite(io, ++cid, 256, byR2t);
            flush(io);
            survives("an in-capsule write answered before a Flush", 64, inCapsule);
            survives("an R2T write answered before a Flush", 256, byR2t);
        });
    }

    @Test
    void withTheWriteCacheOffEveryWriteSurvivesThePowerCut() throws IOException {
        withAPlainWriteLost((io, a) -> {
            // A pattern made durable first, for the Write Zeroes below to overwrite
            byte[] pattern = random(8192);
            write(io, 512, pattern, CDW12_FUA);
            ByteBuffer sf = RawHost.sqe(Nvme.ADMIN_SET_FEATURES, 3, 0);
            sf.putInt(Nvme.SQE_CDW10, Nvme.FID_VWC).putInt(Nvme.SQE_CDW11, 0);
            assertThat(a.command(sf, null).cqeStatus()).as("Set Features VWC WCE=0").isZero();

            byte[] inCapsule = random(4096);
            byte[] byR2t = random(64 * 1024);
            write(io, 64, inCapsule, 0);
            NvmeTcpTargetTest.r2tWrite(io, ++cid, 256, byR2t);
            ByteBuffer wz = RawHost.rw(Nvme.IO_WRITE_ZEROES, ++cid, 512, pattern.length / BLOCK);
            assertThat(io.command(wz, null).cqeStatus()).as("Write Zeroes status").isZero();
            survives("an in-capsule write without FUA, the cache off,", 64, inCapsule);
            survives("an R2T write without FUA, the cache off,", 256, byR2t);
            survives("Write Zeroes without FUA, the cache off,", 512, new byte[pattern.length]);
        });
    }
}
